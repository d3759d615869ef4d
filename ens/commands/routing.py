"""`ens schedule add|list|show|rm|who` and `ens route test|check`.

`route` and `schedule who --config` read a routing file (docs/routing.md) and need no service:
what a schedule, the route tree and the escalation policies decide at a given time, and why.
`schedule add|list|show|rm` (and `who` without `--config`) use the schedules stored in the
service's Redis (`notifiers.schedule_store`), like `ens subscriber`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ens.commands import output
from ens.commands.store import DataDir, RedisUrl
from profiles.errors import ENSError

if TYPE_CHECKING:
    from notifiers.routing import Decision, Routing, Schedule

schedule_app = typer.Typer(
    help="On-call schedules: store them in the service, or see who is on call.",
    no_args_is_help=True,
)
route_app = typer.Typer(
    help="The routing tree: check a routing file, test who an alarm reaches and why.",
    no_args_is_help=True,
)

ConfigOpt = Annotated[str, typer.Option("--config", "-c", help="The routing file (YAML).")]
AtOpt = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="When (RFC 3339 or epoch seconds; without an offset: in the file's tz). Default: now.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _at(routing: Routing, text: str | None, option: str = "--at") -> float:
    from notifiers.routing import RoutingError
    from notifiers.routing.times import local_time, tz

    if text is None:
        return time.time()
    try:
        return local_time(float(text), tz(routing.tz, ()), (option,))
    except ValueError:
        pass
    try:
        return local_time(text, tz(routing.tz, ()), ())
    except RoutingError as e:
        raise RoutingError(f"{option}: {e.message}") from None


def _console(width: int = 130) -> Any:
    from rich.console import Console

    console = Console(markup=False, highlight=False)  # "not in [raise]" is text, not markup
    console.width = max(console.width, width)  # a pipe or a log gets the whole table too
    return console


def _local(t: float | None, tzname: str) -> str:
    from notifiers.routing.schedules import describe_time

    return "open" if t is None else describe_time(t, tzname)


@schedule_app.command("who")
def schedule_who(
    schedule: Annotated[str, typer.Argument(help="The schedule id.")],
    config: Annotated[
        str | None,
        typer.Option(
            "--config", "-c", help="A routing file (YAML) [the schedules stored in the service]."
        ),
    ] = None,
    at: AtOpt = None,
    as_json: JsonOpt = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Who is on call at a time, from which layer or override, and until when."""
    from notifiers.routing import Routing, RoutingError, load_routing, on_call
    from notifiers.routing.routes import Route

    try:
        if config is not None:
            routing = load_routing(config, need_route=False)
            s = routing.schedules.get(schedule)
            where = config
        else:
            s = _stored(redis_url, data_dir).get(schedule)
            routing = Routing(Route("root"), tz=s.tz if s is not None else "UTC")
            where = "the service"
        if s is None:
            known = ", ".join(sorted(routing.schedules)) if config else "ens schedule list"
            raise RoutingError(
                f"no schedule {schedule!r} in {where} (schedules: {known or 'none'})"
            )
        t = _at(Routing(routing.root, tz=s.tz), at)
    except ENSError as e:
        raise output.fail_all(e) from None
    shift = on_call(s, t)
    if as_json:
        out: dict[str, Any] = {"schedule": s.id, "at": t, "who": [], "source": None}
        if shift is not None:
            out.update(who=list(shift.who), source=shift.source, since=shift.start, until=shift.end)
        typer.echo(json.dumps(out))
        return
    when = _local(t, s.tz)
    if shift is None:
        typer.echo(f"{s.id} at {when}: nobody on call")
        return
    typer.echo(
        f"{s.id} at {when}: {', '.join(shift.who)} ({shift.source}, "
        f"since {_local(shift.start, s.tz)}, until {_local(shift.end, s.tz)})"
    )


class _Stored:
    """The schedules of the service's store (one Redis client for the command)."""

    def __init__(self, redis_url: str | None, data_dir: Path | None, create: bool = False) -> None:
        from ens.commands.store import Store

        self.r = Store(redis_url, data_dir, create=create).r

    def get(self, sid: str) -> Schedule | None:
        from notifiers.schedule_store import get_schedule

        return get_schedule(self.r, sid)


def _stored(redis_url: str | None, data_dir: Path | None, create: bool = False) -> _Stored:
    return _Stored(redis_url, data_dir, create)


@schedule_app.command("add")
def schedule_add(
    file: Annotated[
        str, typer.Argument(help="A YAML file with `schedules:` (and `tz:`), e.g. a routing file.")
    ],
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace stored schedules whose definition differs.")
    ] = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Store the schedules of a file in the service: all of them or, on any problem (reported
    with FILE:LINE:COL), none. A running `ens serve --routing` resolves receivers with them at
    once (its routing file's own schedules win on an id clash)."""
    from notifiers.routing import RoutingError, load_routing
    from notifiers.schedule_store import put_schedules

    try:
        routing = load_routing(file, need_route=False)
        if not routing.schedules:
            raise RoutingError(f"{file}: no schedules in it (schedules: [...])")
        changes = put_schedules(
            _stored(redis_url, data_dir, create=True).r, routing.schedules.values(), replace
        )
    except ENSError as e:
        raise output.fail_all(e) from None
    for sid, change in changes:
        typer.echo(f"{change}: schedule {sid}")


@schedule_app.command("list")
def schedule_list(
    as_json: JsonOpt = False, redis_url: RedisUrl = None, data_dir: DataDir = None
) -> None:
    """The stored schedules: zone, layers, overrides and who is on call now."""
    from rich.table import Table

    from notifiers.routing import who
    from notifiers.schedule_store import all_schedules

    try:
        items = all_schedules(_stored(redis_url, data_dir).r)
    except ENSError as e:
        raise output.fail_all(e) from None
    now = time.time()
    rows: list[dict[str, Any]] = [
        {
            "id": s.id, "tz": s.tz, "layers": [x.name for x in s.layers],
            "overrides": len(s.overrides), "on_call": who(s, now),
        }
        for s in items.values()
    ]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"Schedules ({len(rows)})", title_justify="left")
    for col in ("id", "tz", "layers", "overrides", "on call now"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row["id"], row["tz"], ", ".join(row["layers"]), str(row["overrides"]),
            ", ".join(row["on_call"]) or "nobody",
        )  # fmt: skip
    _console().print(table)


@schedule_app.command("show")
def schedule_show(
    schedule: Annotated[str, typer.Argument(help="The schedule id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """A stored schedule's definition (JSON: first handoffs as start + handoff, overrides in
    epoch seconds)."""
    from notifiers.schedule_store import schedule_definition

    d = schedule_definition(_stored(redis_url, data_dir).r, schedule)
    if d is None:
        raise output.fail_all(ENSError(f"no schedule {schedule!r} stored (ens schedule list)"))
    typer.echo(json.dumps(d, indent=2))


@schedule_app.command("rm")
def schedule_rm(
    schedule: Annotated[str, typer.Argument(help="The schedule id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a stored schedule."""
    from notifiers.schedule_store import remove_schedule

    if not remove_schedule(_stored(redis_url, data_dir).r, schedule):
        raise output.fail_all(ENSError(f"no schedule {schedule!r} stored (ens schedule list)"))
    typer.echo(f"removed: schedule {schedule}")


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ENSError(f"--labels: {part!r}: expected LABEL=VALUE (room=101,severity=major)")
        out[key.strip()] = value.strip()
    return out


def _decision_json(d: Decision) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "tried": [asdict(x) for x in d.tried],
        "deliveries": [asdict(x) for x in d.deliveries],
        "escalations": [
            {"policy": p, "route": r, "starts": i == 0} for i, (p, r) in enumerate(d.escalations)
        ],
        "receivers": d.receivers,
    }


@route_app.command("test")
def route_test(
    config: ConfigOpt,
    labels: Annotated[
        str, typer.Option("--labels", "-l", help="The alarm's labels: room=101,severity=major.")
    ],
    transition: Annotated[
        str, typer.Option("--transition", "-t", help="raise, repeat, ack or clear.")
    ] = "raise",
    at: AtOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Which subscribers an alarm's transition reaches at a time, and why: every route tried
    (matched or not, and the reason), every receiver resolved (schedules, quiet hours), and the
    escalation it starts."""
    from notifiers.routing import TRANSITIONS, RoutingError, explain, load_routing

    try:
        routing = load_routing(config)
        got = _labels(labels)
        if transition not in TRANSITIONS:
            raise RoutingError(f"--transition: {transition!r} (one of {', '.join(TRANSITIONS)})")
        t = _at(routing, at)
    except ENSError as e:
        raise output.fail_all(e) from None
    d = explain(routing, got, transition, t)
    if as_json:
        typer.echo(
            json.dumps({"at": t, "labels": got, "transition": transition, **_decision_json(d)})
        )
        return
    _print_decision(routing, d, got, transition, t)


def _print_decision(
    routing: Routing, d: Decision, labels: dict[str, str], transition: str, t: float
) -> None:
    from rich.table import Table

    from notifiers.routing import tell
    from notifiers.routing.escalation import timeline

    console = _console()
    head = ", ".join(f"{k}={v}" for k, v in labels.items())
    console.print(f"{transition} of an alarm with {head} at {_local(t, routing.tz)}")
    tried = Table(title="routes tried", title_justify="left")
    for col in ("route", "matched", "why"):
        tried.add_column(col)
    for x in d.tried:
        tried.add_row("  " * x.depth + x.route, "yes" if x.matched else "no", x.reason)
    console.print(tried)
    told = Table(title="receivers", title_justify="left")
    for col in ("subscriber", "receiver", "via", "route", "told", "why not"):
        told.add_column(col)
    for y in d.deliveries:
        told.add_row(
            y.subscriber or "-", y.receiver or "-", y.via or "-", y.route,
            "yes" if y.told else "no", y.reason,
        )  # fmt: skip
    if d.deliveries:
        console.print(told)
    elif d.escalations:
        console.print("receivers: none directly; the escalation below tells its first level")
    else:
        console.print("receivers: nobody is told")
    for i, (policy, route) in enumerate(d.escalations):
        pol = routing.policies[policy]
        if i:
            first, by = d.escalations[0]
            console.print(
                f"escalation {policy} (route {route}): not started — an alarm occurrence has "
                f"one escalation, the first matching route's ({first}, route {by})"
            )
            continue
        if transition != "raise":
            console.print(f"escalation {policy} (route {route}): started by a raise only")
            continue
        esc = Table(
            title=f"escalation {policy} (route {route}) while nobody acknowledges",
            title_justify="left",
        )
        for col in ("when", "level", "receivers", "on call then"):
            esc.add_column(col)
        for cycle, level, due, receivers in timeline(pol, t, limit=12):
            people = [
                x.subscriber if x.told else f"{x.subscriber or 'nobody'} (not told: {x.reason})"
                for x in tell(routing, receivers, labels.get("severity", ""), due)
            ]
            esc.add_row(
                _local(due, routing.tz), f"{level + 1}" + (f" (repeat {cycle})" if cycle else ""),
                ", ".join(receivers), "; ".join(people),
            )  # fmt: skip
        console.print(esc)


@route_app.command("check")
def route_check(
    file: Annotated[str, typer.Argument(help="The routing file (YAML).")],
) -> None:
    """Validate a routing file: every problem with FILE:LINE:COL; exit status 2 if any."""
    from notifiers.routing import load_routing
    from notifiers.routing.config import walk
    from notifiers.routing.routes import escalation_clashes

    try:
        routing = load_routing(file)
    except ENSError as e:
        raise output.fail_all(e) from None
    from notifiers.routing.schedules import uncovered

    for s in routing.schedules.values():
        spans = uncovered(s)
        if spans:
            more = f" and {len(spans) - 3} more" if len(spans) > 3 else ""
            typer.echo(
                f"warning: schedule {s.id!r}: nobody on call {', '.join(spans[:3])}{more} "
                f"({s.tz}; unless an override says so)",
                err=True,
            )
    for a, b in escalation_clashes(routing.root):
        typer.echo(
            f"warning: routes {a.name!r} ({a.escalation}) and {b.name!r} ({b.escalation}) may "
            f"both match an alarm: only {a.name!r}'s escalation would start (one per alarm "
            "occurrence; name both teams in one policy's levels to page both)",
            err=True,
        )
    routes = len(walk(routing.root))
    typer.echo(
        f"{file}: ok ({len(routing.schedules)} schedule(s), {routes} route(s), "
        f"{len(routing.policies)} escalation polic(ies), {len(routing.quiet)} quiet-hours entries, "
        f"{len(routing.grouping)} grouping entries)"
    )


@route_app.command("replay")
def route_replay(
    transitions: Annotated[
        str,
        typer.Argument(
            help="Alarm transitions as JSON lines: the output of `ens replay --alarms` ('-': stdin)."
        ),
    ],
    config: ConfigOpt,
    until: Annotated[
        str | None,
        typer.Option(
            "--until", help="Fire the escalation steps due by then [the last transition]."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
) -> None:
    """Who would have been told what, and when: a history of alarm transitions through the
    route tree, the schedules, quiet hours and escalation, in the transitions' own time."""
    import sys
    from dataclasses import asdict

    from notifiers.alarms import Transition
    from notifiers.routing import RoutingError, load_routing
    from notifiers.routing.replay import replay_routing

    try:
        routing = load_routing(config)
        end = _at(routing, until, "--until") if until is not None else None
        src = sys.stdin if transitions == "-" else open(transitions, encoding="utf-8")  # noqa: SIM115
        items: list[Transition] = []
        with src:
            for n, line in enumerate(src, 1):
                if not line.strip():
                    continue
                try:
                    items.append(Transition.from_json(json.loads(line)))
                except (ValueError, TypeError) as e:
                    raise RoutingError(
                        f"{transitions}:{n}: not an alarm transition ({e}); "
                        "expected the JSON lines of `ens replay --alarms`"
                    ) from None
    except OSError as e:
        raise output.fail_all(ENSError(f"cannot read {transitions}: {e.strerror}")) from None
    except ENSError as e:
        raise output.fail_all(e) from None
    items.sort(key=lambda t: (t.ts, t.seq))
    rows, esc = replay_routing(routing, items, end)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(asdict(row)))
        return
    console = _console(170)
    print_timeline(routing, rows, console)
    if esc.pending:
        console.print(f"{len(esc.pending)} escalation(s) still pending at the end")


def print_timeline(routing: Any, rows: list[Any], console: Any) -> None:
    """The timeline (`notifiers.routing.replay.Told` rows) as a table in the routing file's
    zone, and how many were told or held back per subscriber (`ens route replay`, `ens replay
    --alarms --routing`)."""
    from rich.table import Table

    from notifiers.alarms.intervals import zone

    z = zone(routing.tz)
    table = Table(title=f"who is told, when ({routing.tz})", title_justify="left")
    for col in ("when", "alarm", "what", "subscriber", "told", "through", "why not"):
        table.add_column(col)
    for x in rows:
        hidden = ("profile", "severity", "subscriber", "building")
        where = " ".join(f"{k}={v}" for k, v in x.labels.items() if k not in hidden)
        alarm = f"{x.labels.get('profile', x.alarm)} ({x.labels.get('severity', '?')}) {where}"
        table.add_row(
            datetime.fromtimestamp(x.ts, z).strftime("%m-%d %H:%M"), alarm.strip(), x.what,
            x.subscriber or "-", "yes" if x.told else "no", x.through, x.reason,
        )  # fmt: skip
    console.print(table)
    per: dict[str, list[int]] = {}
    for x in rows:
        if x.subscriber:
            per.setdefault(x.subscriber, [0, 0])[0 if x.told else 1] += 1
    summary = Table(title="per subscriber", title_justify="left")
    for col in ("subscriber", "told", "held back"):
        summary.add_column(col)
    for sub, (told, held) in sorted(per.items()):
        summary.add_row(sub, str(told), str(held))
    console.print(summary)
