"""`ens serve | profile | subscriber | gateway | post` and `ens notifications tail`.

Mounted by the main CLI with ``register(app)``. The management commands talk to Redis directly
(``--redis-url`` / ``ENS_REDIS_URL``, else the embedded Redis of ``--data-dir``), so they work
whether the service is running or not; a running service picks profile changes up at once.
Only ``post`` goes through HTTP, like a gateway.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from adapters.service.settings import DEFAULTS, Option, ServiceSettings
from ens.commands import output
from ens.commands.output import Json
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module, parse_duration
from profiles.errors import ENSError, ProfileError

if TYPE_CHECKING:
    from rich.console import Console

# Loaded when a command uses them, not when `ens` starts (redis alone took ~0.2 s).
rs = lazy_module("adapters.service.redis_store")
store = lazy_module("notifiers.store")

profile_app = typer.Typer(help="Manage the service's profiles.", no_args_is_help=True)
subscriber_app = typer.Typer(help="Manage subscribers (e-mail, webhooks).", no_args_is_help=True)
gateway_app = typer.Typer(help="Manage gateway API keys.", no_args_is_help=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _console() -> Console:
    return output.console()


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


# ----------------------------------------------------------------------------- serve


def _serve_parameter(name: str, opt: Option) -> inspect.Parameter:
    """`ens serve`'s parameter for one setting: flags, variable, help and default from its
    declaration in `ServiceSettings`. Numbers and durations arrive as text and are checked by
    `ServiceSettings.load`, so every one fails the same way."""
    kind = opt.kind
    default: Any = opt.shown
    annotation: Any = str | None if default is None else str
    decls: tuple[str, ...] = opt.flags
    if kind == "switch":
        default = bool(getattr(DEFAULTS, name))
        annotation = bool
        if opt.switch_off:
            decls = (f"{opt.flags[0]}/{opt.switch_off}",)
    elif kind == "path":
        annotation, default = Path | None, None
    elif kind == "roles":
        annotation, default = list[str] | None, None
    info = typer.Option(*decls, envvar=opt.env, help=opt.help)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[annotation, info],
        default=default,
    )


def serve(**values: Any) -> None:
    """Run the service: HTTP API, engine worker and delivery worker, until Ctrl-C / SIGTERM."""
    from adapters.service.console import backtests, evidence
    from adapters.service.server import ServeConfig, run
    from ens.commands.backtest import console_backtest
    from ens.explain import explain

    # what the console (a layer below) runs from this one: backtests, an alarm's explain
    backtests.RUNNER = console_backtest
    evidence.EXPLAIN = explain
    from adapters.service.worker import WorkerConfig
    from ens.plans import check_plan, load_stats

    try:  # every value checked by the one settings object, naming its option
        settings = ServiceSettings.load(values, os.environ)
        check_plan(settings.plan)
        rates = load_stats(settings.stats)
        routing = None
        if settings.routing is not None:  # checked whole before anything starts
            from notifiers.routing import load_routing

            routing = load_routing(
                settings.routing, need_route=False, stored=lambda: _stored_schedules(settings)
            )
    except ENSError as e:
        raise _fail(str(e)) from None
    load_index: Callable[[str], list[Any]] | None = None
    if settings.index is not None:  # the Spark adapter only with --index
        from adapters.spark import index

        load_index = index.load_index
    if settings.reset_admin_token:
        st = Store(settings.redis_url, settings.data_dir, create=True)
        token = rs.reset_admin_token(st.r)
        typer.echo(f"new admin token (shown once, keep it): {token}", err=True)
    worker = WorkerConfig.from_settings(settings, rates, load_index, routing)
    raise typer.Exit(run(ServeConfig.from_settings(settings, worker)))


def _stored_schedules(settings: ServiceSettings) -> list[str]:
    """The stored schedules' ids: receivers a routing file that lists its `subscribers` may
    name (asked only when it names one it does not define)."""
    from notifiers.schedule_store import schedule_ids

    return schedule_ids(Store(settings.redis_url, settings.data_dir, create=True).r)


_SERVE_PARAMETERS = [
    _serve_parameter(name, opt) for name, opt in ServiceSettings.options() if opt.flags
]
serve.__signature__ = inspect.Signature(_SERVE_PARAMETERS)  # type: ignore[attr-defined]
serve.__annotations__ = {p.name: p.annotation for p in _SERVE_PARAMETERS}


# ----------------------------------------------------------------------------- profiles


def _read_text(file: Path) -> str:
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text()
    except OSError as exc:
        raise _fail(f"cannot read {file}: {exc.strerror}") from None


@profile_app.command("add")
def profile_add(
    file: Annotated[
        Path | None, typer.Argument(help="Profile file (YAML/JSON, as for ens check); '-' = stdin.")
    ] = None,
    pid: Annotated[str | None, typer.Option("--id", help="Profile id (with --expr).")] = None,
    expr: Annotated[str | None, typer.Option("--expr", help="Profile expression.")] = None,
    subscriber: Annotated[str | None, typer.Option(help="Subscriber id (with --expr).")] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace stored profiles and subscribers of the same id whose definition differs.",
        ),
    ] = False,
    severity: Annotated[
        str | None,
        typer.Option(
            help="With --expr: the profile is an alarm of this severity "
            "(critical, major, minor, warning, info; docs/alarms.md)."
        ),
    ] = None,
    clear: Annotated[
        str | None,
        typer.Option(
            help="With --expr: how the alarm clears: 'after 30m', 'manual', or a filter "
            "(an event of the alarm's partition that clears it)."
        ),
    ] = None,
    notify: Annotated[
        list[str] | None,
        typer.Option(
            help="With --expr: a transition delivered (raise, repeat, ack, clear); repeatable "
            "(default raise and clear)."
        ),
    ] = None,
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
        raise _fail("give a profile FILE or --id ID --expr EXPR (not both)")
    if file is None and (pid is None or expr is None):
        raise _fail("--id and --expr go together")
    # everything that needs no Redis first: a refused input starts and creates nothing
    if file is not None and (severity or clear or notify):
        raise _fail("--severity, --clear and --notify go with --expr (a file has alarm: blocks)")
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
            _when(p.get("created")),
            " ".join(p["expr"].split()),
        )
    _console().print(table)


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
        raise _fail(f"no profile {pid!r}")
    typer.echo(f"id:         {rec['id']}")
    typer.echo(f"subscriber: {rec.get('subscriber') or '-'}")
    typer.echo(f"created:    {_when(rec.get('created'))}")
    typer.echo(f"updated:    {_when(rec.get('updated'))}")
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
        raise _fail(f"no profile {pid!r}")
    typer.echo(f"profile {pid} removed")


# ----------------------------------------------------------------------------- subscribers


@subscriber_app.command("add")
def subscriber_add(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    email: Annotated[list[str] | None, typer.Option(help="E-mail address (repeatable).")] = None,
    webhook: Annotated[list[str] | None, typer.Option(help="Webhook URL (repeatable).")] = None,
    slack: Annotated[
        list[str] | None,
        typer.Option(help="Slack (or compatible) incoming-webhook URL (repeatable)."),
    ] = None,
    teams: Annotated[
        list[str] | None,
        typer.Option(help="Microsoft Teams incoming-webhook URL: an Adaptive Card (repeatable)."),
    ] = None,
    template: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=FILE: a Jinja2 template for email_subject, email_text, email_html, "
            "webhook, slack or teams (repeatable; docs/notifiers.md#templates)."
        ),
    ] = None,
    secret: Annotated[
        str | None, typer.Option(help="Webhook signing secret [generated and shown once].")
    ] = None,
    digest: Annotated[
        str | None,
        typer.Option(
            help="E-mail digest window: notifications within it go out as one mail (e.g. 10m)."
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="Replace a stored subscriber of the same id whose definition differs."
        ),
    ] = False,
    rotate_secret: Annotated[
        bool,
        typer.Option(
            "--rotate-secret",
            help="Give the subscriber a new webhook signing secret (shown once) instead of "
            "keeping the stored one.",
        ),
    ] = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Store a subscriber.

    An id stored with another definition is replaced only with --replace (the change is
    shown either way); the same definition again changes nothing. A replaced subscriber keeps
    its webhook signing secret, so its receivers go on verifying, unless --rotate-secret or
    --secret is given.
    """
    from notifiers import subscriber_change as sc

    channels: list[dict[str, Any]] = [{"email": a} for a in email or []]
    channels += [{"webhook": u} for u in webhook or []]
    channels += [{"webhook": u, "format": "slack"} for u in slack or []]
    channels += [{"webhook": u, "format": "teams"} for u in teams or []]
    if not channels:
        raise _fail("give at least one --email, --webhook, --slack or --teams")
    if secret and rotate_secret:
        raise _fail("--secret and --rotate-secret both set the secret: give one")
    rec: dict[str, Any] = {"id": sid, "channels": channels}
    if secret:
        rec["secret"] = secret
    if template:
        rec["templates"] = _template_files(template)
    try:
        if digest is not None:
            rec["digest"] = parse_duration("--digest", digest)
    except ENSError as exc:
        raise _fail(str(exc)) from None
    try:
        rs.check_id(sid, "subscriber id")
        model = store.Subscriber.model_validate(rec)
    except store.ValidationError as exc:
        raise _fail(f"subscriber {sid!r}: {store.subscriber_error(exc)}") from None
    except (ProfileError, ValueError) as exc:
        raise _fail(str(exc)) from None
    st = Store(redis_url, data_dir, create=True)
    change = sc.plan(st.r, model, rotate=rotate_secret)
    if change.needs_replace and not replace:
        typer.echo(f"error: {change.refusal()}:", err=True)
        for line in change.lines:
            typer.echo(f"  {line}", err=True)
        typer.echo("nothing stored", err=True)
        raise typer.Exit(2)
    _, shown_secret = sc.apply(st.r, change)
    word = {"new": "stored", "changed": "replaced", "rotated": "secret rotated"}
    typer.echo(f"subscriber {sid} {word.get(change.status, change.status)}")
    for line in change.lines:
        typer.echo(f"  {line}")
    if shown_secret:
        typer.echo(f"webhook signing secret (shown once): {shown_secret}")


def _template_files(specs: list[str]) -> dict[str, str]:
    """``NAME=FILE`` options as name -> template text (checked with the record)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq or not name or not path:
            raise _fail(f"--template {spec!r}: give NAME=FILE, e.g. slack=alarm.slack.j2")
        try:
            out[name.strip()] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(f"--template {name}: cannot read {path}: {exc}") from None
    return out


@subscriber_app.command("preview")
def subscriber_preview(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    transition: Annotated[
        str,
        typer.Option(
            help="The sample message: notification (a profile match), raise, repeat, ack, "
            "clear (an alarm transition), group or digest (several alarms)."
        ),
    ] = "raise",
    channel: Annotated[
        int | None, typer.Option(help="Only this channel (its index, from 0).")
    ] = None,
    template: Annotated[
        list[str] | None,
        typer.Option(help="NAME=FILE: try a template instead of the stored one (not stored)."),
    ] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print what each channel of a subscriber would receive for a sample message, rendered
    with its templates (a template that fails on the sample is reported and the default shown,
    as delivery would send it)."""
    import logging

    from notifiers import template_samples, templates

    st = Store(redis_url, data_dir)
    sub = store.get_subscriber(st.r, sid)
    if sub is None:
        raise _fail(f"no subscriber {sid!r} (see ens subscriber list)")
    if template:
        merged = {**(sub.templates or {}), **_template_files(template)}
        try:
            sub = store.Subscriber.model_validate({**sub.model_dump(), "templates": merged})
        except store.ValidationError as exc:
            raise _fail(f"subscriber {sid!r}: {store.subscriber_error(exc)}") from None
    try:
        n = template_samples.sample(transition, sub.id)
    except ValueError as exc:
        raise _fail(f"--transition: {exc}") from None
    picked = list(enumerate(sub.channels))
    if channel is not None:
        if not 0 <= channel < len(picked):
            raise _fail(f"subscriber {sid!r} has channels 0..{len(picked) - 1}, not {channel}")
        picked = [picked[channel]]
    for name, source in sorted((sub.templates or {}).items()):
        try:
            templates.render(name, source, n)
        except Exception as exc:  # what delivery would meet: it sends the default instead
            typer.echo(
                f"warning: template {name} fails on the {transition} sample "
                f"({type(exc).__name__}: {exc}); the default is shown, as delivery sends it",
                err=True,
            )
    logging.getLogger("ens.notifiers").setLevel(logging.ERROR)  # reported just above
    for k, ch in picked:
        typer.echo(f"=== channel {k}: {store.describe_channel(ch.model_dump())}")
        if isinstance(ch, store.WebhookChannel):
            body = templates.webhook_body(sub.id, ch, sub.templates, n)
            typer.echo("Content-Type: application/json\n")
            typer.echo(body.decode())
        else:
            sender = os.environ.get("ENS_SMTP_FROM", "ens@localhost")
            msg = templates.email_message(sub.id, sub.templates, n, sender, ch.email)
            for header in ("Subject", "From", "To", "Content-Type"):
                typer.echo(f"{header}: {msg[header]}")
            for part in msg.walk():
                if not part.is_multipart():
                    typer.echo(f"\n--- {part.get_content_type()}")
                    typer.echo(part.get_content().rstrip("\n"))


@subscriber_app.command("templates")
def subscriber_templates(
    name: Annotated[
        str | None,
        typer.Argument(help="email_subject, email_text, email_html, webhook, slack or teams."),
    ] = None,
) -> None:
    """Print the default templates (all, or one by name): a starting point for --template."""
    from notifiers.templates import DEFAULT_TEMPLATES

    if name is not None and name not in DEFAULT_TEMPLATES:
        raise _fail(f"no template {name!r} (known: {', '.join(DEFAULT_TEMPLATES)})")
    for key, text in DEFAULT_TEMPLATES.items():
        if name is None:
            typer.echo(f"=== {key}")
        if name in (None, key):
            typer.echo(text.rstrip("\n"))


@subscriber_app.command("list")
def subscriber_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Show subscribers and their channels (secrets are never shown; a webhook URL is shown
    with its password and query values masked)."""
    st = Store(redis_url, data_dir)
    subs = sorted(
        (store.Subscriber.model_validate_json(v) for v in st.r.hgetall(store.SUBSCRIBERS).values()),
        key=lambda s: s.id,
    )
    if as_json:
        output.print_json(
            [
                {
                    "id": s.id,
                    "channels": [store.redact(c.model_dump(exclude_none=True)) for c in s.channels],
                    "digest": s.digest,
                    "templates": sorted(s.templates or {}),
                    "has_secret": bool(s.secret)
                    or any(getattr(c, "secret", None) for c in s.channels),
                    "profiles": rs.profiles_of_subscriber(st.r, s.id),
                }
                for s in subs
            ]
        )
        return
    from rich.table import Table

    table = Table(title=f"Subscribers ({len(subs)})")
    for col in ("id", "channels", "digest", "profiles"):
        table.add_column(col, overflow="fold")
    for s in subs:
        chans = "\n".join(store.describe_channel(c.model_dump()) for c in s.channels) or "-"
        users = ", ".join(rs.profiles_of_subscriber(st.r, s.id)) or "-"
        table.add_row(s.id, chans, f"{s.digest:g} s" if s.digest else "-", users)
    _console().print(table)


@subscriber_app.command("status")
def subscriber_status(
    sid: Annotated[str | None, typer.Argument(help="Subscriber id [all of them].")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Show delivery status per subscriber: delivered, retries, dead letters, what is
    pending or retrying now, circuit breakers of its destinations, last success and error.

    Counts are of outcomes since the store was created (a retried attempt counts once each);
    "now" columns are what the delivery schedule holds at this moment.
    """
    from notifiers.status import subscriber_status as status_of

    st = Store(redis_url, data_dir)
    if sid is not None:
        sub = store.get_subscriber(st.r, sid)
        if sub is None:
            raise _fail(f"no subscriber {sid!r} (see ens subscriber list)")
        subs = [sub]
    else:
        subs = sorted(
            (
                store.Subscriber.model_validate_json(v)
                for v in st.r.hgetall(store.SUBSCRIBERS).values()
            ),
            key=lambda s: s.id,
        )
    rows = status_of(st.r, subs)
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    def when(ts: float | None) -> str:
        return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")

    table = Table(title=f"Delivery status ({len(rows)} subscriber{'s' if len(rows) != 1 else ''})")
    for col in (
        "id",
        "delivered",
        "retried",
        "dead",
        "pending now",
        "retrying now",
        "dead letters now",
        "breakers",
        "last success",
        "last error",
    ):
        table.add_column(col, overflow="fold")
    for row in rows:
        breakers = "\n".join(
            f"{d} {b['state']}" + (f" until {when(b['until'])}" if b["state"] == "open" else "")
            for d, b in row["breakers"].items()
        )
        error = f"{when(row['last_error_at'])} {row['last_error']}" if row["last_error"] else "-"
        table.add_row(
            row["id"],
            str(row["delivered"]),
            str(row["retried"]),
            str(row["dead"]),
            str(row["pending"]),
            str(row["retrying"]),
            str(row["dead_letters"]),
            breakers or "-",
            when(row["last_success"]),
            error,
        )
    _console().print(table)


@subscriber_app.command("test")
def subscriber_test(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    channel: Annotated[
        int | None,
        typer.Option("--channel", min=0, help="Only this channel (0-based, as listed) [each]."),
    ] = None,
    deadline: Annotated[
        float, typer.Option("--deadline", min=0.1, max=60, help="Seconds each send may take.")
    ] = 10.0,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="ENS_NOTIFIERS_CONFIG",
            exists=True,
            dir_okay=False,
            help="YAML/JSON notifier config (SMTP relay, ...); ENS_SMTP_* etc. override it.",
        ),
    ] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Send a real signed test message to the subscriber's channels (or one) through the
    delivery senders, and show what each receiver answered (HTTP status, SMTP reply).
    Exit status 1 when a channel did not take it."""
    from notifiers.config import ConfigError, NotifierConfig
    from notifiers.probe import send_test

    st = Store(redis_url, data_dir)
    sub = store.get_subscriber(st.r, sid)
    if sub is None:
        raise _fail(f"no subscriber {sid!r} (see ens subscriber list)", 3)
    try:
        cfg = NotifierConfig.load(config)
        probes = send_test(sub, cfg, channel, deadline)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except IndexError as exc:
        raise _fail(f"--channel: {exc.args[0]}") from None
    if as_json:
        output.print_json([p.to_json() for p in probes])
    else:
        for p in probes:
            verdict = "delivered" if p.delivered else "FAILED"
            typer.echo(f"#{p.channel} {p.to}: {verdict} ({p.answer}, {p.seconds:.2f} s)")
    if not all(p.delivered for p in probes):
        raise typer.Exit(1)


@subscriber_app.command("rm")
def subscriber_rm(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a subscriber that no profile uses."""
    st = Store(redis_url, data_dir)
    users = rs.profiles_of_subscriber(st.r, sid)
    if users:
        raise _fail(f"subscriber {sid!r} is used by profiles {', '.join(users)}")
    if not st.r.hdel(store.SUBSCRIBERS, sid):
        raise _fail(f"no subscriber {sid!r}")
    typer.echo(f"subscriber {sid} removed")


# ----------------------------------------------------------------------------- gateways


Lateness = Annotated[
    str | None,
    typer.Option(
        help="How far out of ts order its events may arrive: 0 (in order: no wait), "
        "500ms, 2s, ... or `default` (the service's --default-lateness)."
    ),
]


def _lateness(text: str | None) -> float | None:
    from adapters.errors import Refused
    from adapters.service import admin

    try:
        return admin.parse_lateness(text)
    except Refused as exc:
        raise _fail(str(exc)) from None


@gateway_app.command("add")
def gateway_add(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    lateness: Lateness = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Create a gateway and print its API key (once: only a hash is stored)."""
    from adapters.errors import Refused
    from adapters.service import admin

    late = _lateness(lateness)
    try:
        rs.check_gateway_name(name)  # before a store is created for it
        key = admin.add_gateway(Store(redis_url, data_dir, create=True).r, name, late)
    except (Refused, ValueError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"gateway {name} created; its API key (shown once):", err=True)
    typer.echo(key)


@gateway_app.command("set")
def gateway_set(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    lateness: Lateness = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Change a gateway's settings; a running service applies them at once."""
    from adapters.errors import Refused
    from adapters.service import admin

    if lateness is None:
        raise _fail("nothing to set (give --lateness)")
    late = _lateness(lateness)
    try:
        admin.set_gateway(Store(redis_url, data_dir).r, name, late)
    except Refused as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"gateway {name}: lateness {'default' if late is None else f'{late:g} s'}")


@gateway_app.command("list")
def gateway_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Show gateways (names, creation, revocation)."""
    st = Store(redis_url, data_dir)
    gws = rs.list_gateways(st.r)
    if as_json:
        output.print_json(gws)
        return
    from rich.table import Table

    table = Table(title=f"Gateways ({len(gws)})")
    for col in ("name", "created", "status", "lateness"):
        table.add_column(col)
    for g in gws:
        status = f"revoked {_when(g['revoked'])}" if g["revoked"] else "active"
        late = "default" if g["lateness"] is None else f"{g['lateness']:g} s"
        table.add_row(g["name"], _when(g["created"]), status, late)
    _console().print(table)


@gateway_app.command("revoke")
def gateway_revoke(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a gateway's API key (its requests get 403 from now on)."""
    from adapters.errors import Refused
    from adapters.service import admin

    try:
        admin.revoke_gateway(Store(redis_url, data_dir).r, name)
    except Refused as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"gateway {name} revoked")


# ----------------------------------------------------------------------------- post


def retry_delay(attempt: int, retry_after: float | None, rng: Any = None) -> float:
    """`ens post`'s wait before a retry (`adapters.service.client.retry_delay`)."""
    from adapters.service.client import retry_delay as delay

    return delay(attempt, retry_after, rng)


def restamp(lines: list[str], now: float) -> list[str]:
    """`adapters.service.client.restamp` (``--now``)."""
    from adapters.service.client import restamp as shifted

    return shifted(lines, now)


def post(
    file: Annotated[str, typer.Argument(help="JSON-lines event file, '-' for stdin.")],
    url: Annotated[
        str, typer.Option(envvar="ENS_URL", help="Service base URL.")
    ] = "http://127.0.0.1:8080",
    api_key: Annotated[
        str | None, typer.Option(envvar="ENS_API_KEY", help="Gateway API key (ens gateway add).")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Events per request.")] = 500,
    timeout: Annotated[str, typer.Option(help="HTTP timeout (e.g. 30s).")] = "30s",
    retries: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Most retries of a request that nothing accepted "
            "(service down or restarting: connection refused, "
            "503, 429) [default: as many as --retry-for allows].",
        ),
    ] = None,
    retry_for: Annotated[
        str,
        typer.Option(
            help="Keep retrying such a request for up to this long (backoff with "
            "jitter, at least the service's Retry-After), e.g. 30s, 5m, 1h."
        ),
    ] = "5m",
    now: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Re-stamp the events so that the last one is now, "
            "keeping their spacing (for example files from the past, "
            "which the service's --max-past refuses).",
        ),
    ] = False,
) -> None:
    """Send events to the service like a gateway; report rejected events by line number.

    A request is retried only when the service surely accepted none of it (the connection
    was refused, or it answered 503/429), so a retry never posts an event twice.
    """
    try:
        http_timeout = parse_duration("--timeout", timeout, above=True, maximum=86400.0)
        patience = parse_duration("--retry-for", retry_for, maximum=7 * 86400.0)
    except ENSError as e:
        raise _fail(str(e)) from None
    assert http_timeout is not None and patience is not None
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from adapters.errors import PostFailed
    from adapters.service import client as cl

    if not api_key:
        raise _fail("give --api-key or set ENS_API_KEY")
    try:
        url = cl.service_url(url)
    except ValueError as exc:
        raise _fail(f"--url {url!r}: {exc}") from None
    if file == "-":
        fh: Any = sys.stdin
        total = None
    else:
        path = Path(file)
        if not path.exists():
            raise _fail(f"no such file: {file}")
        total = sum(1 for line in path.open(encoding="utf-8") if line.strip())
        fh = path.open(encoding="utf-8")
    if now:
        import io

        with fh:
            fh = io.StringIO("".join(cl.restamp(list(fh), time.time())))
    accepted = rejected = 0
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("posting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rejected]} rejected"),
        console=console,
        transient=False,
        disable=not console.is_terminal,  # a pipe or a log file gets no bar
    )

    def say(line: str) -> None:  # one line per retry, whatever the reason's length; the
        # service's reason is text, not rich markup
        progress.console.print(line, soft_wrap=True, markup=False, highlight=False)

    t0 = time.perf_counter()
    with fh, httpx.Client(timeout=http_timeout) as client, progress:
        poster = cl.EventPoster(client, url, api_key, patience, retries, say, retry_for)
        task = progress.add_task("post", total=total, rejected=0)
        try:
            for chunk in cl.batches(fh, batch):
                a, rj = poster.send(chunk)
                accepted += a
                rejected += rj
                progress.update(task, advance=len(chunk), rejected=rejected)
        except PostFailed as exc:
            raise _fail(str(exc), exc.exit_status) from None
    for lineno, msg in sorted(poster.problems):
        typer.echo(f"error: line {lineno}: {msg}", err=True)
    dt = time.perf_counter() - t0
    waited = poster.waited
    wait_note = f" ({waited:.1f} s of it waiting for the service)" if waited else ""
    typer.echo(f"{accepted} accepted, {rejected} rejected in {dt:.2f} s{wait_note}")
    if rejected:
        raise typer.Exit(2)


# ----------------------------------------------------------------------------- notifications


def tail(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new ones.")] = False,
    last: Annotated[int | None, typer.Option(help="Start with only the last N.")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print outbox notifications as JSON lines (oldest first)."""
    st = Store(redis_url, data_dir)
    r = st.r
    if last is not None:
        entries = list(reversed(r.xrevrange(store.OUTBOX, count=last))) if last > 0 else []
    else:
        entries = r.xrange(store.OUTBOX)
    cursor = "0-0"
    if not entries:
        top = r.xrevrange(store.OUTBOX, count=1)
        cursor = top[0][0] if top else "0-0"
    try:
        while True:
            for eid, fields in entries:
                typer.echo(fields.get(store.OUTBOX_FIELD, json.dumps(fields)))
                cursor = eid
            if not follow:
                break
            resp = r.xread({store.OUTBOX: cursor}, block=1000)
            entries = resp[0][1] if resp else []
    except KeyboardInterrupt:
        pass


# ----------------------------------------------------------------------------- mounting


def register(app: typer.Typer) -> None:
    """Add `serve`, `post`, `profile`, `subscriber`, `gateway` and `notifications tail`.

    ``tail`` joins the notifier team's ``notifications`` app (mounted here if it is not yet),
    since one CLI cannot have two groups of that name.
    """
    from ens.commands import notifications as notifier_cli

    app.command("serve")(serve)
    app.command("post")(post)
    app.add_typer(profile_app, name="profile")
    app.add_typer(subscriber_app, name="subscriber")
    app.add_typer(gateway_app, name="gateway")
    napp = notifier_cli.app
    if not any(c.name == "tail" for c in napp.registered_commands):
        napp.command("tail")(tail)
    if not any(g.name == "notifications" for g in app.registered_groups):
        app.add_typer(napp, name="notifications")
