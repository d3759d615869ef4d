"""`ens alarms list|show|ack|clear|history`, `ens silence add|list|expire` and
`ens token add|list|revoke` (docs/alarms.md).

Like the other management commands they talk to Redis directly (``--redis-url`` /
``ENS_REDIS_URL``, else the embedded Redis of ``--data-dir``). Reads come from the alarm index
and history; changes are commands to the running engine worker, which owns the alarm state
(`adapters.service.alarm_store`): the command waits for its answer (exit 3 if the alarm is
unknown or already in that state, 2 for bad input, 1 if no engine worker answered).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ens.commands import output
from ens.commands.output import Json
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module

als = lazy_module("adapters.service.alarm_store")

alarms_app = typer.Typer(
    help="List, acknowledge and clear alarms; their history.", no_args_is_help=True
)
silence_app = typer.Typer(help="Silences: hold back alarm deliveries.", no_args_is_help=True)
token_app = typer.Typer(
    help="Scoped API tokens (scope ack: list and acknowledge alarms only).", no_args_is_help=True
)

Match = Annotated[
    list[str] | None,
    typer.Option(
        "--match", help="A label matcher: room=101, building!=B, room=~1[0-9]{2} (repeat)."
    ),
]
Wait = Annotated[float, typer.Option(help="Seconds to wait for the engine worker's answer.")]


def _matchers(match: list[str] | None) -> list[Any]:
    from notifiers.alarms import SilenceError

    try:
        return list(als.parse_matchers(match or []))
    except SilenceError as exc:
        raise output.fail(f"--match: {exc}") from None


def _send(st: Store, op: str, args: dict[str, Any], wait: float) -> dict[str, Any]:
    """Send a command; a refusal is an error naming why (exit 3 for 404/409, 2 for 422)."""
    try:
        reply: dict[str, Any] = als.send_command(st.r, op, args, wait)
    except als.WorkerUnavailable as exc:
        raise output.fail(str(exc), 1) from None
    status = reply.get("status")
    if status == 409:
        raise output.fail(f"{reply['error']} (state: {reply['state']})", 3)
    if status == 404:
        raise output.fail(reply["error"], 3)
    if status != 200:
        raise output.fail(reply.get("error", f"refused ({status})"))
    for w in reply.get("warnings", []):
        typer.echo(f"warning: {w}", err=True)
    return reply


def _kind(rec: dict[str, Any]) -> str:
    """A history entry's kind; coalesced repeats with their number (``repeat x12``)."""
    k = rec.get("repeats", 1)
    return f"{rec['kind']} x{k}" if k > 1 else str(rec["kind"])


def _labels(rec: dict[str, Any]) -> str:
    skip = {"profile", "severity", "subscriber"}
    return ", ".join(f"{k}={v}" for k, v in sorted(rec["labels"].items()) if k not in skip)


# ----------------------------------------------------------------------------- alarms


@alarms_app.command("list")
def alarms_list(
    state: Annotated[
        str | None,
        typer.Option(
            help="active-unacknowledged, active-acknowledged, cleared-unacknowledged or cleared-acknowledged."
        ),
    ] = None,
    severity: Annotated[
        str | None, typer.Option(help="critical, major, minor, warning, info.")
    ] = None,
    match: Match = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Alarms (the current occurrence of each alarm key), most recently seen first."""
    from notifiers.alarms import STATES
    from profiles.alarm import SEVERITIES

    if state is not None and state not in STATES:
        raise output.fail(f"--state: {state!r} is not one of {', '.join(STATES)}")
    if severity is not None and severity not in SEVERITIES:
        raise output.fail(f"--severity: {severity!r} is not one of {', '.join(SEVERITIES)}")
    matchers = _matchers(match)
    st = Store(redis_url, data_dir)
    rows = als.list_alarms(st.r, state, severity, matchers)
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"Alarms ({len(rows)})")
    for col in ("id", "profile", "labels", "severity", "state", "count", "last seen"):
        table.add_column(col)
    for a in rows:
        table.add_row(
            f"{a['id']}.{a['occurrence']}", a["profile"], _labels(a), a["severity"], a["state"],
            str(a["count"]), output.when(a["last_seen"]),
        )  # fmt: skip
    output.console().print(table)


@alarms_app.command("show")
def alarms_show(
    aid: Annotated[str, typer.Argument(metavar="ID", help="Alarm id (or ID.N).")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """One alarm (JSON): its record, its next escalation step (with --routing) and history."""
    st = Store(redis_url, data_dir)
    rec = als.get_alarm(st.r, aid)
    if rec is None:
        raise output.fail(f"no alarm {aid!r}", 3)
    rec["escalation"] = als.next_escalation(st.r, rec)
    rec["history"] = als.history(st.r, alarm=rec["id"])
    typer.echo(json.dumps(rec, indent=2, ensure_ascii=False))
    if rec["escalation"] is not None:  # the line people look for, on stderr (JSON stays clean)
        e = rec["escalation"]
        typer.echo(
            f"next escalation: {e['policy']} level {e['level']}/{e['levels']} to "
            f"{', '.join(e['receivers'])} at {output.when(e['due_at'])}",
            err=True,
        )


@alarms_app.command("ack")
def alarms_ack(
    aid: Annotated[str, typer.Argument(metavar="ID", help="Alarm id (or ID.N).")],
    note: Annotated[str, typer.Option(help="A note kept in the history.")] = "",
    actor: Annotated[str, typer.Option(help="Who acknowledges (history).")] = "cli",
    wait: Wait = 10.0,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Acknowledge an alarm (exit 3: unknown, or acknowledged already)."""
    st = Store(redis_url, data_dir)
    reply = _send(st, "ack", {"id": aid, "actor": actor, "note": note}, wait)
    typer.echo(f"alarm {aid} acknowledged: {reply['alarm']['state']}")


@alarms_app.command("clear")
def alarms_clear(
    aid: Annotated[str, typer.Argument(metavar="ID", help="Alarm id (or ID.N).")],
    reason: Annotated[str, typer.Option(help="Why it is cleared (history).")],
    actor: Annotated[str, typer.Option(help="Who clears it (history).")] = "cli",
    wait: Wait = 10.0,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Clear an active alarm by hand (exit 3: unknown, or cleared already)."""
    if not reason.strip():
        raise output.fail("--reason: give a reason")
    st = Store(redis_url, data_dir)
    reply = _send(st, "clear", {"id": aid, "actor": actor, "reason": reason}, wait)
    typer.echo(f"alarm {aid} cleared: {reply['alarm']['state']}")


@alarms_app.command("history")
def alarms_history(
    match: Match = None,
    since: Annotated[
        str | None, typer.Option(help="How far back: 7d, 12h, or an RFC 3339 time.")
    ] = None,
    alarm: Annotated[str | None, typer.Option(help="Only this alarm (ID or ID.N).")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Alarm transitions, oldest first: time, kind, actor, reason, state, delivery."""
    matchers = _matchers(match)
    try:
        start = als.parse_since(since)
    except ValueError as exc:
        raise output.fail(f"--since: {exc}") from None
    st = Store(redis_url, data_dir)
    rows = als.history(st.r, matchers, start, alarm)
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"Alarm history ({len(rows)})")
    for col in ("time", "transition", "kind", "actor", "reason", "state", "labels", "delivery"):
        table.add_column(col)
    for t in rows:
        table.add_row(
            output.when(t["ts"]), t["id"], _kind(t), t["actor"], t["reason"], t["after"],
            _labels(t), t["delivery"],
        )  # fmt: skip
    output.console().print(table)


# ----------------------------------------------------------------------------- silences


@silence_app.command("add")
def silence_add(
    match: Match = None,
    for_: Annotated[
        str | None, typer.Option("--for", help="From now (or --from) for this long: 2h.")
    ] = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="Start: RFC 3339 (default now).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="End: RFC 3339.")] = None,
    weekly: Annotated[
        str | None, typer.Option(help='A weekly window: "Mon-Fri 07:00-09:00".')
    ] = None,
    tz: Annotated[str | None, typer.Option(help="Time zone of --weekly: Europe/Berlin.")] = None,
    comment: Annotated[str, typer.Option(help="Why (shown in the list).")] = "",
    creator: Annotated[str, typer.Option(help="Who.")] = "cli",
    notify_after: Annotated[
        bool,
        typer.Option(help="When it ends, deliver the alarms it held back that are still active."),
    ] = True,
    wait: Wait = 10.0,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Hold back deliveries of the alarms every --match matches, for a range or a weekly
    window. A bad field is an error naming it; nothing is stored."""
    if not match:
        raise output.fail("--match: give at least one matcher (e.g. --match building=A)")
    _matchers(match)
    data: dict[str, Any] = {"matchers": match, "comment": comment, "creator": creator}
    data["notify_after"] = notify_after
    for key, value in (
        ("for", for_),
        ("from", from_),
        ("until", until),
        ("weekly", weekly),
        ("tz", tz),
    ):
        if value is not None:
            data[key] = value
    st = Store(redis_url, data_dir)
    reply = _send(st, "silence", {"actor": creator, "silence": data}, wait)
    s = reply["silence"]
    typer.echo(f"silence {s['id']} added: {', '.join(s['matchers'])}")


@silence_app.command("list")
def silence_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Silences, expired ones too."""
    st = Store(redis_url, data_dir)
    rows = als.list_silences(st.r)
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"Silences ({len(rows)})")
    for col in ("id", "matchers", "when", "creator", "comment", "expired"):
        table.add_column(col)
    for s in rows:
        when = (
            f"{s['weekly']} {s.get('tz', 'UTC')}"
            if s.get("weekly")
            else f"{output.when(s['starts_at'])} - {output.when(s.get('ends_at'))}"
        )
        table.add_row(
            s["id"], ", ".join(s["matchers"]), when, s.get("creator", ""), s.get("comment", ""),
            output.when(s.get("expired_at")),
        )  # fmt: skip
    output.console().print(table)


@silence_app.command("expire")
def silence_expire(
    sid: Annotated[str, typer.Argument(metavar="ID", help="Silence id (s1, ...).")],
    wait: Wait = 10.0,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """End a silence now (it stays in the list, expired)."""
    st = Store(redis_url, data_dir)
    _send(st, "expire", {"id": sid}, wait)
    typer.echo(f"silence {sid} expired")


# ----------------------------------------------------------------------------- tokens


@token_app.command("add")
def token_add(
    name: Annotated[str, typer.Argument(help="Who uses it (e.g. a technician's phone).")],
    scope: Annotated[str, typer.Option(help="ack: list and acknowledge alarms only.")] = "ack",
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Create a scoped token (shown once; replaces a token of the same name)."""
    from profiles.errors import ENSError

    st = Store(redis_url, data_dir, create=True)
    try:
        token = als.add_token(st.r, name, scope)
    except ENSError as exc:
        raise output.fail(f"--scope: {exc}") from None
    typer.echo(f"token {name} (scope {scope}; shown once, keep it): {token}")


@token_app.command("list")
def token_list(redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False) -> None:
    """Scoped tokens (names and scopes; never the tokens)."""
    st = Store(redis_url, data_dir)
    rows = als.list_tokens(st.r)
    if as_json:
        output.print_json(rows)
        return
    for t in rows:
        typer.echo(f"{t['name']}\t{t['scope']}\t{output.when(t['created'])}")


@token_app.command("revoke")
def token_revoke(
    name: Annotated[str, typer.Argument(help="Token name.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a scoped token (its requests get 403 from now on)."""
    st = Store(redis_url, data_dir)
    if not als.revoke_token(st.r, name):
        raise output.fail(f"no token {name!r}")
    typer.echo(f"token {name} revoked")


def register(app: typer.Typer) -> None:
    app.add_typer(alarms_app, name="alarms")
    app.add_typer(silence_app, name="silence")
    app.add_typer(token_app, name="token")
