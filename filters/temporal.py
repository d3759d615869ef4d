"""The temporal pool: every deadline the engine must act on, in time order.

Entries are terminators (a partial match's window ends), trailing-negation
timeouts, `absent` timers, partition clean-ups and clock events. Time is
passed in; nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from typing import Any

from sortedcontainers import SortedList

CLOCK = 0  # a clock event at t is processed before any event with ts >= t
TIMER = 1  # a timer with deadline d fires once time passes d (d < ts of the next event)


class TemporalPool:
    __slots__ = ("_items", "_tie")

    def __init__(self) -> None:
        self._items: SortedList = SortedList()
        self._tie = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, when: float, kind: int, payload: Any) -> tuple:
        """Schedule `payload`; the returned handle removes it again."""
        item = (when, kind, next(self._tie), payload)
        self._items.add(item)
        return item

    def discard(self, handle: tuple | None) -> None:
        if handle is not None:
            self._items.discard(handle)

    def pop_due(self, now: float, inclusive: bool) -> tuple | None:
        """The next entry due at `now`: clocks at <= now, timers at < now (<= now if inclusive)."""
        items = self._items
        if not items:
            return None
        item = items[0]
        when, kind = item[0], item[1]
        if when < now or (when == now and (inclusive or kind == CLOCK)):
            items.pop(0)
            return item
        return None

    def due(self, now: float) -> bool:
        """Is anything due at `now` (cheap check before `pop_due`)?"""
        items = self._items
        return bool(items) and items[0][0] <= now

    def next_time(self) -> float | None:
        return self._items[0][0] if self._items else None
