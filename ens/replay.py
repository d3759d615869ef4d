"""`ens replay`: profiles + a JSON-lines event file -> notifications (docs/language.md §7)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from filters.engine import Engine
from filters.interface import DetectionEngine
from filters.notification import Notification
from profiles.ast import Profile
from profiles.events import Event


def order_events(events: Iterable[Event]) -> list[Event]:
    """The one total order: by ts, ties by arrival (sorted() is stable)."""
    return sorted(events, key=lambda e: e.ts)


def replay(
    profiles: Iterable[Profile],
    events: Iterable[Event],
    until: float | None = None,
    *,
    engine: DetectionEngine | None = None,
    tz: str = "UTC",
    progress: Callable[[int], None] | None = None,
) -> list[Notification]:
    """Run the events through an engine and return every notification in output order.

    ``progress(events done)`` is called every 4096 events, if given (the CLI's bar).
    """
    eng: DetectionEngine = engine if engine is not None else Engine(profiles, tz=tz)
    out: list[Notification] = []
    for i, ev in enumerate(order_events(events)):
        if progress is not None and not i & 4095:
            progress(i)
        eng.process(ev)
        if eng.pending():
            out.extend(eng.take_notifications())
    if until is not None or eng.now is not None:
        eng.finish(until)
    out.extend(eng.take_notifications())
    out.sort(key=lambda n: (n.ts, n.seq))
    return out


def replay_json(
    profiles: Iterable[Profile], events: Iterable[Event], until: float | None = None, **kw: Any
) -> list[dict[str, Any]]:
    return [n.to_json() for n in replay(profiles, events, until, **kw)]
