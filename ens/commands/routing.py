"""`ens schedule who` and `ens route test|check`: the routing layer, offline, on a file.

They read a routing file (docs/routing.md) and need no service: what a schedule, the route
tree and the escalation policies decide at a given time, and why.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from profiles.errors import ENSError, ManyErrors

if TYPE_CHECKING:
    from notifiers.routing import Decision, Routing

schedule_app = typer.Typer(
    help="On-call schedules: who is on call (offline, from a routing file).", no_args_is_help=True
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


def _fail(err: ENSError) -> typer.Exit:
    errors = err.errors if isinstance(err, ManyErrors) else [err]
    for e in errors:
        typer.echo(f"error: {e}", err=True)
    if len(errors) > 1:
        typer.echo(f"{len(errors)} problems", err=True)
    return typer.Exit(2)


def _at(routing: Routing, text: str | None) -> float:
    from notifiers.routing import RoutingError
    from notifiers.routing.times import local_time, tz

    if text is None:
        return time.time()
    try:
        return local_time(float(text), tz(routing.tz, ()), ("--at",))
    except ValueError:
        pass
    try:
        return local_time(text, tz(routing.tz, ()), ())
    except RoutingError as e:
        raise RoutingError(f"--at: {e.message}") from None


def _console() -> Any:
    from rich.console import Console

    console = Console(markup=False, highlight=False)  # "not in [raise]" is text, not markup
    console.width = max(console.width, 130)  # a pipe or a log gets the whole table too
    return console


def _local(t: float | None, tzname: str) -> str:
    from notifiers.routing.schedules import describe_time

    return "open" if t is None else describe_time(t, tzname)


@schedule_app.command("who")
def schedule_who(
    schedule: Annotated[str, typer.Argument(help="The schedule id.")],
    config: ConfigOpt,
    at: AtOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Who is on call at a time, from which layer or override, and until when."""
    from notifiers.routing import RoutingError, load_routing, on_call

    try:
        routing = load_routing(config)
        s = routing.schedules.get(schedule)
        if s is None:
            known = ", ".join(sorted(routing.schedules)) or "none"
            raise RoutingError(f"no schedule {schedule!r} in {config} (schedules: {known})")
        t = _at(routing, at)
    except ENSError as e:
        raise _fail(e) from None
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
        "escalations": [{"policy": p, "route": r} for p, r in d.escalations],
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
        raise _fail(e) from None
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
    for policy, route in d.escalations:
        pol = routing.policies[policy]
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
            people = [", ".join(routing.resolve(r, due)[0]) or "nobody" for r in receivers]
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

    try:
        routing = load_routing(file)
    except ENSError as e:
        raise _fail(e) from None
    routes = len(walk(routing.root))
    typer.echo(
        f"{file}: ok ({len(routing.schedules)} schedule(s), {routes} route(s), "
        f"{len(routing.policies)} escalation polic(ies), {len(routing.quiet)} quiet-hours entries)"
    )
