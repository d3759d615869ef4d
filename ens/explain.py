"""`ens explain`: the engine's trace of one profile, event by event."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from ens.replay import order_events
from filters.compile import evaluate
from filters.engine import Engine, _CompositeRuntime
from profiles.ast import Profile
from profiles.events import Event


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" + f" (ts={ts:.3f})".replace(".000)", ")")


def _duplicate(eng: Engine, profile_id: str, ev: Event) -> str | None:
    """Why an event the profile did not react to was not even awaited: it matches a component
    that a partial match of its partition has bound already. Single step, the pool then no
    longer holds that component's auxiliary profile, so the engine never sees the duplicate."""
    rt = eng._by_id.get(profile_id)
    if not isinstance(rt, _CompositeRuntime) or not rt.active:
        return None
    part_kv = rt.partition_of(ev.attrs)
    part = rt.parts.get(part_kv[0]) if part_kv is not None else None
    if part is None:
        return None
    for pm in part.pms:
        if not pm.alive:
            continue
        for i, b in enumerate(pm.binds):
            leaf = rt.pat.leaves[i]
            if b is not None and b.ev is not ev and leaf.clock is None and evaluate(leaf.filter, ev.attrs):
                return f"{ev.id} as a duplicate of {leaf.name} for {rt._desc(pm)} (not awaited any more)"
    return None


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

    def trace(pid: str, action: str, detail: str) -> None:
        lines.append(f"    {action:<9} {detail}")

    eng.tracer = trace
    eng.trace_only = profile_id
    echo(f"profile {profile_id}: {wanted[0].source.strip()}")
    reported = 0

    def flush(header: str) -> None:
        nonlocal reported
        notes = iter(eng.take_notifications())  # only this profile's, in the order reported
        if lines:
            echo(header)
            for line in lines:
                if line.lstrip().startswith("reported"):
                    reported += 1
                    # the engine's trace gives the time as %g (1.70933e+09): show it in full
                    line = line.rsplit(" at ", 1)[0] + f" at {_when(next(notes).ts)}"
                echo(line)
            lines.clear()

    for ev in order_events(events):
        eng.advance(ev.ts)
        flush(f"  time passes to {_when(ev.ts)}")
        eng.process(ev)
        if not lines and (dup := _duplicate(eng, profile_id, ev)) is not None:
            trace(profile_id, "ignored", dup)
        attrs = ", ".join(f"{k}={v!r}" for k, v in ev.attrs.items())
        flush(f"{ev.id} @ {_when(ev.ts)}: {attrs}")
    if eng.now is not None or until is not None:
        eng.finish(until)
        flush(f"  end of stream{f' (until {_when(until)})' if until is not None else ''}")
    echo(f"{reported} notification(s); live partial matches at the end: {eng.stats()['partial_matches']}")
    return reported
