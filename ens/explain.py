"""`ens explain`: the engine's trace of one profile, event by event."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from ens.replay import order_events
from filters.engine import Engine
from profiles.ast import Profile
from profiles.events import Event


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" + f" (ts={ts:.3f})".replace(".000)", ")")


def explain(
    profiles: Iterable[Profile],
    events: Iterable[Event],
    profile_id: str,
    until: float | None = None,
    *,
    tz: str = "UTC",
    echo: Callable[[str], None] = print,
) -> int:
    """Print what `profile_id`'s partial matches do; return the number of notifications."""
    wanted = [p for p in profiles if p.id == profile_id]
    eng = Engine(wanted, tz=tz)
    lines: list[str] = []
    eng.tracer = lambda pid, action, detail: lines.append(f"    {action:<9} {detail}")
    eng.trace_only = profile_id
    echo(f"profile {profile_id}: {wanted[0].source.strip()}")
    reported = 0

    def flush(header: str) -> None:
        nonlocal reported
        if lines:
            echo(header)
            for line in lines:
                echo(line)
                if line.lstrip().startswith("reported"):
                    reported += 1
            lines.clear()

    for ev in order_events(events):
        eng.advance(ev.ts)
        flush(f"  time passes to {_when(ev.ts)}")
        eng.process(ev)
        attrs = ", ".join(f"{k}={v!r}" for k, v in ev.attrs.items())
        flush(f"{ev.id} @ {_when(ev.ts)}: {attrs}")
    if eng.now is not None or until is not None:
        eng.finish(until)
        flush(f"  end of stream{f' (until {_when(until)})' if until is not None else ''}")
    echo(f"{reported} notification(s); live partial matches at the end: {eng.stats()['partial_matches']}")
    return reported
