"""`ens profile add | list | show | rm`: the rules are `adapters.service.admin`'s (shared with
the HTTP routes); this module parses options and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ens.commands import output
from ens.commands.output import Json, fail, when
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module
from profiles.errors import ENSError, ProfileError

rs = lazy_module("adapters.service.redis_store")


profile_app = typer.Typer(help="Manage the service's profiles.", no_args_is_help=True)


def _read_text(file: Path) -> str:
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror}") from None


_Replace = Annotated[
    bool,
    typer.Option(
        "--replace",
        help="Replace stored profiles and subscribers of the same id whose definition differs.",
    ),
]
_Severity = Annotated[
    str | None,
    typer.Option(
        help="With --expr: the profile is an alarm of this severity "
        "(critical, major, minor, warning, info; docs/alarms.md)."
    ),
]
_Clear = Annotated[
    str | None,
    typer.Option(
        help="With --expr: how the alarm clears: 'after 30m', 'manual', or a filter "
        "(an event of the alarm's partition that clears it)."
    ),
]
_Notify = Annotated[
    list[str] | None,
    typer.Option(
        help="With --expr: a transition delivered (raise, repeat, ack, clear); repeatable "
        "(default raise and clear)."
    ),
]


@profile_app.command("add")
def profile_add(
    file: Annotated[
        Path | None, typer.Argument(help="Profile file (YAML/JSON, as for ens check); '-' = stdin.")
    ] = None,
    pid: Annotated[str | None, typer.Option("--id", help="Profile id (with --expr).")] = None,
    expr: Annotated[str | None, typer.Option("--expr", help="Profile expression.")] = None,
    subscriber: Annotated[str | None, typer.Option(help="Subscriber id (with --expr).")] = None,
    replace: _Replace = False,
    severity: _Severity = None,
    clear: _Clear = None,
    notify: _Notify = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Validate and store profiles (and the file's subscribers): all of them or none.

    Problems are reported like `ens check`: every one, with profile id, line and column. A
    profile or subscriber whose id is stored with another definition is replaced only with
    --replace; the changes are shown either way.
    """
    from adapters.service import admin
    from notifiers import subscriber_change as sc

    if (file is None) == (pid is None and expr is None):
        raise fail("give a profile FILE or --id ID --expr EXPR (not both)")
    if file is None and (pid is None or expr is None):
        raise fail("--id and --expr go together")
    # everything that needs no Redis first: a refused input starts and creates nothing
    if file is not None and (severity or clear or notify):
        raise fail("--severity, --clear and --notify go with --expr (a file has alarm: blocks)")
    if file is not None:
        got = _profiles_of_file(file)
    else:
        assert pid is not None and expr is not None
        got = _profile_of_options(
            pid, expr, subscriber, admin.alarm_options(severity, clear, notify)
        )
    name, pset, parsed, alarms, subs, errors = got
    errors += admin.check_ids(parsed, subs)
    if errors:
        _refuse(name, errors, pset, len(parsed))
    st = Store(redis_url, data_dir, create=True)
    errors += _unknown_subscribers(st.r, pset, parsed, subs)
    if errors:
        _refuse(name, errors, pset, len(parsed))
    plans = [sc.plan(st.r, sub) for sub in subs]
    changes = [admin.plan_profile(st.r, prof, alarms.get(prof.id)) for prof in parsed]
    refused = [(f"profile {c.id}", c.lines) for c in changes if c.needs_replace] + [
        (f"subscriber {p.id}", p.lines) for p in plans if p.needs_replace
    ]
    if refused and not replace:
        _refuse_replacements(name, refused)
    recent = rs.recent_events(st.r)
    for prof in parsed:
        for w in admin.profile_warnings(st.r, prof, recent):
            typer.echo(f"warning: {w}", err=True)
    _store(st.r, plans, changes)


def _unknown_subscribers(
    r: Any, pset: Any, parsed: list[Any], subs: list[dict[str, Any]]
) -> list[ENSError]:
    """A profile whose subscriber is neither stored nor in the file; counted like `ens check`
    counts it."""
    from adapters.service import admin

    unknown = set(admin.unknown_subscribers(r, parsed, {s["id"] for s in subs}))
    errors: list[ENSError] = []
    for prof in parsed:
        if prof.id in unknown:
            errors.append(admin.unknown_subscriber_error(prof))
            if pset is not None:
                pset.profiles = [p for p in pset.profiles if p.id != prof.id]
                pset.invalid += 1
                pset.profile_problems += 1
    return errors


def _store(r: Any, plans: list[Any], changes: list[Any]) -> None:
    """Subscribers first (a profile may name one), then profiles; what each did."""
    from adapters.service import admin
    from notifiers import subscriber_change as sc

    for plan in plans:  # a stored secret is kept: its receivers go on verifying with it
        _, shown_secret = sc.apply(r, plan)
        word = {"new": "stored", "changed": "replaced"}.get(plan.status, "unchanged")
        _say_stored(f"subscriber {plan.id} {word}", plan.lines)
        if shown_secret:
            typer.echo(f"  webhook signing secret (shown once): {shown_secret}")
    for change in changes:
        admin.apply_profile(r, change)
        word = {"new": "added", "changed": "replaced"}.get(change.status, change.status)
        _say_stored(f"profile {change.id} {word}", change.lines)


_Input = tuple[str, Any, list[Any], dict[str, dict[str, Any]], list[dict[str, Any]], list[ENSError]]


def _profiles_of_file(file: Path) -> _Input:
    """(name, the parsed file, its profiles, their alarms, its subscribers, the problems)."""
    from adapters.service import admin

    pset, errors = parse_profile_document(_read_text(file), str(file))
    errors += admin.zoned_profiles(pset)
    alarms = {pid: spec.to_json() for pid, spec in pset.alarms.items()}
    return str(file), pset, list(pset.profiles), alarms, pset.subscribers, errors


def _profile_of_options(
    pid: str, expr: str, subscriber: str | None, alarm: dict[str, Any] | None
) -> _Input:
    """As `_profiles_of_file`, for --id/--expr (and --severity/--clear/--notify)."""
    alarms: dict[str, dict[str, Any]] = {}
    try:
        prof = rs.validate_profile(None, pid, expr, subscriber)
        if alarm is not None:
            alarms[pid] = rs.validate_alarm(prof, alarm, "--expr").to_json()
    except ProfileError as exc:
        return "--expr", None, [], {}, [], [exc]
    return "--expr", None, [prof], alarms, [], []


def _refuse_replacements(name: str, refused: list[tuple[str, list[str]]]) -> None:
    for what, lines in refused:
        typer.echo(
            f"error: {what} is stored with another definition (--replace replaces it):", err=True
        )
        for line in lines:
            typer.echo(f"  {line}", err=True)
    typer.echo(f"{name}: {len(refused)} replacement(s) refused; nothing stored", err=True)
    raise typer.Exit(2)


def _say_stored(what: str, lines: list[str]) -> None:
    typer.echo(what)
    for line in lines:
        typer.echo(f"  {line}")


def _refuse(name: str, errors: list[ENSError], pset: Any, parsed: int) -> None:
    for e in errors:
        typer.echo(f"error: {e}", err=True)
    if pset is not None:
        typer.echo(f"{pset.summary(name, errors)}; nothing stored", err=True)
    else:
        typer.echo(f"{name}: {len(errors)} problem(s); nothing stored", err=True)
    raise typer.Exit(2)


def parse_profile_document(text: str, name: str) -> tuple[Any, list[ENSError]]:
    from profiles.profile_file import parse_profile_document as parse

    return parse(text, name)


@profile_app.command("list")
def profile_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Show the stored profiles."""
    st = Store(redis_url, data_dir)
    recs = rs.list_profiles(st.r)
    if as_json:
        output.print_json(recs)
        return
    from rich.table import Table

    table = Table(title=f"Profiles ({len(recs)})")
    for col in ("id", "subscriber", "created", "expr"):
        table.add_column(col, overflow="fold")
    for p in recs:
        table.add_row(
            p["id"],
            p.get("subscriber") or "-",
            when(p.get("created")),
            " ".join(p["expr"].split()),
        )
    output.console().print(table)


@profile_app.command("show")
def profile_show(
    pid: Annotated[str, typer.Argument(help="Profile id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print one profile."""
    st = Store(redis_url, data_dir)
    rec = rs.get_profile(st.r, pid)
    if rec is None:
        raise fail(f"no profile {pid!r}")
    typer.echo(f"id:         {rec['id']}")
    typer.echo(f"subscriber: {rec.get('subscriber') or '-'}")
    typer.echo(f"created:    {when(rec.get('created'))}")
    typer.echo(f"updated:    {when(rec.get('updated'))}")
    if alarm := rec.get("alarm"):  # docs/alarms.md
        clear = alarm["clear"] if isinstance(alarm["clear"], str) else f"on {alarm['clear']['on']}"
        typer.echo(
            f"alarm:      severity {alarm['severity']}, clear {clear}, "
            f"notify {', '.join(alarm['notify'])}"
        )
    typer.echo("expr:")
    for line in rec["expr"].rstrip().splitlines():
        typer.echo(f"  {line}")


@profile_app.command("rm")
def profile_rm(
    pid: Annotated[str, typer.Argument(help="Profile id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a profile (a running engine drops it at once)."""
    st = Store(redis_url, data_dir)
    if not rs.delete_profile(st.r, pid):
        raise fail(f"no profile {pid!r}")
    typer.echo(f"profile {pid} removed")
