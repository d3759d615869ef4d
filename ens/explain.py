"""`ens explain`: the engine's trace of one profile, event by event."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from ens.replay import order_events
from filters.caps import CapHits, Caps
from filters.engine import Engine
from filters.plans.choose import Rates
from profiles.ast import Profile
from profiles.events import Event


def _when(ts: float) -> str:
    return (
        dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        + "Z"
        + f" (ts={ts:.3f})".replace(".000)", ")")
    )


def explain(
    profiles: Iterable[Profile],
    events: Iterable[Event],
    profile_id: str,
    until: float | None = None,
    *,
    tz: str = "UTC",
    echo: Callable[[str], None] = print,
    plan: str = "eager",
    rates: Rates | None = None,
    caps: Caps | None = None,
) -> int:
    """Print the profile's plan and what its partial matches do; return the number of notifications.

    `caps` (`filters.caps`, the defaults of `ens serve` if None): the trace shows each partial
    match a cap dropped and each event whose notifications it cut, and a last line the caps
    and what they dropped, if they were reached.
    """
    wanted = [p for p in profiles if p.id == profile_id]
    eng = Engine(wanted, tz=tz, plan=plan, rates=rates, caps=caps)
    lines: list[str] = []

    def trace(pid: str, action: str, detail: str) -> None:
        lines.append(f"    {action:<9} {detail}")

    eng.tracer = trace
    eng.trace_only = profile_id
    echo(f"profile {profile_id}: {wanted[0].source.strip()}")
    echo(eng.plan_of(wanted[0]).describe())
    reported = 0

    def flush(header: str) -> None:
        nonlocal reported
        notes = iter(eng.take_notifications())  # only this profile's, in the order reported
        if lines:
            echo(header)
            for line in lines:
                if line.lstrip().startswith("reported"):
                    reported += 1
                    # the engine's trace gives the time in seconds: show it as the other lines do
                    line = line.rsplit(" at ", 1)[0] + f" at {_when(next(notes).ts)}"
                echo(line)
            lines.clear()

    for ev in order_events(events):
        eng.advance(ev.ts)
        flush(f"  time passes to {_when(ev.ts)}")
        eng.process(ev)
        if not lines and (dup := eng.bound_duplicate(profile_id, ev)) is not None:
            # single step, a duplicate of a bound component is not awaited: the profile never saw it
            trace(profile_id, "ignored", f"{ev.id} as a duplicate of {dup}")
        attrs = ", ".join(f"{k}={v!r}" for k, v in ev.attrs.items())
        flush(f"{ev.id} @ {_when(ev.ts)}: {attrs}")
    if eng.now is not None or until is not None:
        eng.finish(until)
        flush(f"  end of stream{f' (until {_when(until)})' if until is not None else ''}")
    live = eng.stats()["partial_matches"]
    what = "buffered events" if eng.plan_of(wanted[0]).lazy else "partial matches"
    echo(f"{reported} notification(s); live {what} at the end: {live}")
    hits = eng.take_cap_hits().get(profile_id)
    if hits is not None:  # (a line only then: a profile within its caps prints as before)
        echo(_caps_line(eng.caps, hits))
    return reported


def _caps_line(caps: Caps, hits: CapHits) -> str:
    limits = (
        f"at most {caps.partition} partial matches per partition, {caps.profile} per profile, "
        f"{caps.notifications} notifications per event"
    )
    return (
        f"caps ({limits}): REACHED, {hits.partial_matches} partial match(es) dropped, "
        f"{hits.notifications} notification(s) dropped (see `ens check`; raise them with "
        "ens serve --max-partial-matches, --max-profile-partial-matches, "
        "--max-notifications-per-event)"
    )
