"""The temporal pool: every deadline the engine must act on, in time order.

Entries are terminators (a partial match's window ends), trailing-negation
timeouts, `absent` timers, partition clean-ups and clock events. Time is
passed in; nothing here reads a clock.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

from sortedcontainers import SortedList

_INF = float("inf")
CLOCK = 0  # a clock event at t is processed before any event with ts >= t
TIMER = 1  # a timer with deadline d fires once time passes d (d < ts of the next event)

Handle = tuple[float, int, Any, Any]  # (deadline, CLOCK or TIMER, tie-breaker, payload)


class TemporalPool:
    """Deadlines in time order; `head` (the earliest, inf if none) is what every event checks."""

    __slots__ = ("_items", "_tie", "head")

    def __init__(self) -> None:
        self._items: SortedList = SortedList()
        self._tie = itertools.count()
        self.head = _INF

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        # (instance dict of a subclass, slots), pickle's own form for slotted classes
        return getattr(self, "__dict__", None), {"_items": self._items, "_tie": self._tie}

    def __setstate__(self, state: tuple[dict[str, Any] | None, dict[str, Any]]) -> None:
        inst, slots = state
        if inst:
            self.__dict__.update(inst)
        for k, v in slots.items():
            setattr(self, k, v)
        self._reset_head()  # not stored: snapshots from before it existed restore too

    def _reset_head(self) -> None:
        items = self._items
        self.head = items[0][0] if items else _INF

    def _insert(self, item: Handle) -> Handle:
        self._items.add(item)
        if item[0] < self.head:
            self.head = item[0]
        return item

    def add(self, when: float, kind: int, payload: Any) -> Handle:
        """Schedule `payload`; the returned handle removes it again."""
        return self._insert((when, kind, next(self._tie), payload))

    def discard(self, handle: Handle | None) -> None:
        if handle is not None:
            self._items.discard(handle)
            if handle[0] <= self.head:
                self._reset_head()

    def pop_due(self, now: float, inclusive: bool) -> Handle | None:
        """The next entry due at `now`: clocks at <= now, timers at < now (<= now if inclusive)."""
        if self.head > now:
            return None
        items = self._items
        item: Handle = items[0]
        when, kind = item[0], item[1]
        if when < now or (when == now and (inclusive or kind == CLOCK)):
            items.pop(0)
            self._reset_head()
            return item
        return None

    def due(self, now: float) -> bool:
        """Is anything due at `now` (cheap check before `pop_due`)?"""
        return self.head <= now

    def next_time(self) -> float | None:
        return self.head if self._items else None


class TimeDriven:
    """Engine time for both engines: fire what the temporal pool holds, in order, as time passes.

    The engine supplies `now`, `timers`, `tz`, `_clocks`, `_start` (first time seen) and
    `_fire_clock` (deliver one clock event); timer payloads are `(runtime, arg)`.
    """

    now: float | None
    timers: TemporalPool
    tz: dt.tzinfo
    _clocks: dict[Any, Any]

    def _start(self, now: float) -> None:
        raise NotImplementedError

    def _fire_clock(self, clock: Any, when: float) -> None:
        raise NotImplementedError

    def _schedule_clock(self, clock: Any, after: float) -> None:
        """Schedule the first occurrence of `clock` (hour, minute in `tz`) at or after `after`."""
        local = dt.datetime.fromtimestamp(after, self.tz)
        at = local.replace(hour=clock.hour, minute=clock.minute, second=0, microsecond=0)
        if at.timestamp() < after:
            nxt = local + dt.timedelta(days=1)
            at = nxt.replace(hour=clock.hour, minute=clock.minute, second=0, microsecond=0)
        self._clocks[clock] = self.timers.add(at.timestamp(), CLOCK, clock)

    def advance(self, now: float, *, inclusive: bool = False) -> None:
        """Move time to `now`: fire clocks at <= now and timers at < now (<= now if inclusive)."""
        if self.now is None:
            self._start(now)
        timers = self.timers
        while True:
            item = timers.pop_due(now, inclusive)
            if item is None:
                break
            when, kind, _, payload = item
            if when > self.now:  # type: ignore[operator]
                self.now = when
            if kind == CLOCK:
                self._fire_clock(payload, when)
            else:
                rt, arg = payload
                if rt.active:
                    rt.on_timer(when, arg)
        if now > self.now:  # type: ignore[operator]
            self.now = now

    def finish(self, until: float | None = None) -> None:
        """End of a replay: fire everything due up to `until` (default: the last event's time)."""
        end = until if until is not None else self.now
        if end is not None:
            self.advance(end, inclusive=True)
