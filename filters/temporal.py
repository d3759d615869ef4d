"""The temporal pool: every deadline the engine must act on, in time order.

Entries are terminators (a partial match's window ends), trailing-negation
timeouts, `absent` timers, partition clean-ups and clock events. Time is
passed in; nothing here reads a clock.
"""

from __future__ import annotations

import datetime as dt
import itertools
from bisect import bisect_left
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any

from sortedcontainers import SortedList

_INF = float("inf")
CLOCK = 0  # a clock event at t is processed before any event with ts >= t
TIMER = 1  # a timer with deadline d fires once time passes d (d < ts of the next event)

Handle = tuple[float, int, Any, Any]  # (deadline, CLOCK or TIMER, tie-breaker, payload)


class _Lane:
    """Timers added in nondecreasing (deadline, tie) order: a sorted list read from `start`.

    A composite's terminators of one window length arrive in the order of their deadlines
    (the window starts at the current event): appending and popping the front replaces a
    sorted-list insert and delete per partial match. A discarded entry is replaced by a
    tombstone of the same sort key (`_DEAD` payload), skipped when it reaches the front.
    """

    __slots__ = ("items", "start")

    def __init__(self) -> None:
        self.items: list[Handle] = []
        self.start = 0

    def front(self) -> Handle | None:
        """The first live entry (tombstones at the front are dropped)."""
        items = self.items
        i = self.start
        n = len(items)
        while i < n and items[i][3] is _DEAD:
            i += 1
        if i == n:
            items.clear()
            self.start = 0
            return None
        if i >= 32:  # compact: fired entries would keep their partial matches alive
            del items[:i]
            i = 0
        self.start = i
        return items[i]

    def find(self, handle: Handle) -> int:
        """The index of `handle` in the lane, -1 if it is not there."""
        items = self.items
        # by the sort key alone: a payload is never compared (a tombstone's is not comparable)
        i = bisect_left(items, (handle[0], handle[1], handle[2]), self.start)
        return i if i < len(items) and items[i] is handle else -1


_DEAD = object()  # a discarded lane entry's payload


def inert(h: Handle) -> bool:
    """A timer of a runtime no longer active (its profile removed, or `once` and reported): it
    fires as a no-op (`TimeDriven.advance`). A partial match that completed leaves its
    terminator in the pool (`filters.eager.lifecycle`), so a removed profile can leave some."""
    if h[1] != TIMER:
        return False
    payload = h[3]
    return payload.__class__ is tuple and getattr(payload[0], "active", True) is False


class TemporalPool:
    """Deadlines in time order; `head` (the earliest, inf if none) is what every event checks.

    Entries live in one sorted list, or, when added with `add_ordered`, in a lane of entries
    added in deadline order; `_heads` is a heap of (first entry, lane) over the lanes (an
    entry whose handle is no longer its lane's first is stale and skipped). Entries leave in
    (deadline, kind, tie) order whichever holds them. `_first` is the sorted list's first
    entry (None if empty), kept here: `SortedList`'s `len` and indexing are Python calls, and
    with lanes the sorted list is mostly empty.
    """

    __slots__ = ("_items", "_tie", "head", "_lanes", "_heads", "_nlane", "_first")

    def __init__(self) -> None:
        self._items: SortedList = SortedList()
        self._tie = itertools.count()
        self.head = _INF
        self._lanes: dict[Any, _Lane] = {}
        self._heads: list[tuple[Handle, _Lane]] = []
        self._nlane = 0  # live entries in lanes
        self._first: Handle | None = None

    def __len__(self) -> int:
        return len(self._items) + self._nlane

    def __getstate__(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        # (instance dict of a subclass, slots), pickle's own form for slotted classes; the
        # lanes' entries are stored in the sorted list (same format as without lanes). Timers
        # of runtimes no longer active are left out (`inert`): they would fire as no-ops, and
        # they would make the snapshot refer to a profile that no longer exists.
        items = self._items
        if self._nlane or any(map(inert, items)):
            items = SortedList(h for h in items if not inert(h))
            for lane in self._lanes.values():
                items.update(
                    h for h in lane.items[lane.start :] if h[3] is not _DEAD and not inert(h)
                )
        return getattr(self, "__dict__", None), {"_items": items, "_tie": self._tie}

    def drop_where(self, gone: Callable[[Handle], bool]) -> list[Handle]:
        """Take out every entry `gone` says goes (a restore leaving out a removed profile's
        timers); returns them, in time order per list.

        A pool not built yet (unpickled inside a reference cycle: a Spark task's runner whose
        pool refers back to its engine) is left alone: such a blob is this version's own, which
        stores no inert timers, and its profiles are all supplied."""
        if not hasattr(self, "_items"):
            return []
        out = [h for h in self._items if gone(h)]
        for h in out:
            self._items.discard(h)
        for ln in self._lanes.values():
            items = ln.items
            for i in range(ln.start, len(items)):
                h = items[i]
                if h[3] is not _DEAD and gone(h):
                    out.append(h)
                    items[i] = (h[0], h[1], h[2], _DEAD)
                    self._nlane -= 1
        self._first = self._items[0] if self._items else None
        heads = [(h, ln) for ln in self._lanes.values() if (h := ln.front()) is not None]
        heapify(heads)
        self._heads = heads
        self._reset_head()
        return out

    def __setstate__(self, state: tuple[dict[str, Any] | None, dict[str, Any]]) -> None:
        inst, slots = state
        if inst:
            self.__dict__.update(inst)
        self._lanes, self._heads, self._nlane = {}, [], 0
        for k, v in slots.items():
            setattr(self, k, v)
        self._first = self._items[0] if self._items else None
        self._reset_head()  # not stored: snapshots from before it existed restore too

    def _reset_head(self) -> None:
        heads = self._heads
        while heads:  # drop stale lane heads
            h, lane = heads[0]
            if lane.start < len(lane.items) and lane.items[lane.start] is h:
                break
            heappop(heads)
        first = self._first
        head = first[0] if first is not None else _INF
        if heads and heads[0][0][0] < head:
            head = heads[0][0][0]
        self.head = head

    def _insert(self, item: Handle) -> Handle:
        self._items.add(item)
        first = self._first
        if first is None or item < first:
            self._first = item
        if item[0] < self.head:
            self.head = item[0]
        return item

    def add(self, when: float, kind: int, payload: Any) -> Handle:
        """Schedule `payload`; the returned handle removes it again."""
        return self._insert((when, kind, next(self._tie), payload))

    def add_ordered(self, lane: Any, when: float, payload: Any) -> Handle:
        """`add` of a timer in lane `lane`, whose deadlines usually come in nondecreasing
        order (a window length's terminators); one that does not goes to the sorted list."""
        ln = self._lanes.get(lane)
        if ln is None:
            ln = self._lanes[lane] = _Lane()
        items = ln.items
        if items and items[-1][0] > when:
            return self.add(when, TIMER, payload)
        item = (when, TIMER, next(self._tie), payload)
        if len(items) == ln.start:  # empty: the new entry heads the lane
            heappush(self._heads, (item, ln))
            if when < self.head:
                self.head = when
        items.append(item)
        self._nlane += 1
        return item

    def discard(self, handle: Handle | None) -> None:
        if handle is not None:
            if self._nlane and self._discard_laned(handle):
                return
            items = self._items
            items.discard(handle)
            self._first = items[0] if items else None
            if handle[0] <= self.head:
                self._reset_head()

    def discard_ordered(self, lane: Any, handle: Handle | None) -> None:
        """`discard` of a handle from `add_ordered(lane, ...)` (found without a search)."""
        if handle is not None:
            ln = self._lanes.get(lane)
            if ln is not None and self._discard_in(ln, handle):
                return
            self.discard(handle)

    def _discard_laned(self, handle: Handle) -> bool:
        for ln in self._lanes.values():
            if self._discard_in(ln, handle):
                return True
        return False

    def _discard_in(self, ln: _Lane, handle: Handle) -> bool:
        i = ln.find(handle)
        if i < 0:
            return False
        ln.items[i] = (handle[0], handle[1], handle[2], _DEAD)
        self._nlane -= 1
        if i == ln.start:  # it headed the lane: the next entry does
            new = ln.front()
            if new is not None:
                heappush(self._heads, (new, ln))
            self._reset_head()
        return True

    def pop_due(self, now: float, inclusive: bool) -> Handle | None:
        """The next entry due at `now`: clocks at <= now, timers at < now (<= now if inclusive)."""
        if self.head > now:
            return None
        first = self._first
        heads = self._heads
        ln: _Lane | None
        if heads and (first is None or heads[0][0] < first):
            item, ln = heads[0]
        elif first is not None:
            item, ln = first, None
        else:  # empty (`now` is inf)
            return None
        when, kind = item[0], item[1]
        if when < now or (when == now and (inclusive or kind == CLOCK)):
            if ln is None:
                items = self._items
                items.pop(0)
                self._first = items[0] if items else None
            else:  # the lane's first off; `_Lane.front`'s common case inline (every terminator)
                ln.start = i = ln.start + 1
                self._nlane -= 1
                items = ln.items
                if i < 32 and i < len(items) and items[i][3] is not _DEAD:
                    heapreplace(heads, (items[i], ln))
                else:
                    new = ln.front()
                    if new is None:
                        heappop(heads)
                    else:
                        heapreplace(heads, (new, ln))
            self._reset_head()
            return item
        return None

    # ------------------------------------------------ partition records (filters.partstate)
    def handles(self) -> list[Handle]:
        """Every scheduled entry (sorted list, then each lane's, in order; no tombstones)."""
        out = list(self._items)
        for ln in self._lanes.values():
            out += [h for h in ln.items[ln.start :] if h[3] is not _DEAD]
        return out

    def due_handles(self, now: float) -> list[Handle]:
        """The entries with a deadline <= `now` (what `advance(now, inclusive=True)` fires
        first; entries the firing adds are not in it)."""
        out = list(self._items.irange(maximum=(now, TIMER + 1)))
        for ln in self._lanes.values():
            items = ln.items
            for i in range(ln.start, len(items)):
                h = items[i]
                if h[0] > now:
                    break
                if h[3] is not _DEAD:
                    out.append(h)
        return out

    def put(self, handle: Handle) -> Handle:
        """Schedule a stored entry again as it was (its tie number too: same firing order)."""
        return self._insert(handle)

    @property
    def tie(self) -> int:
        """The next tie number (stored with a partitioned engine's header)."""
        return int(repr(self._tie)[6:-1])

    @tie.setter
    def tie(self, n: int) -> None:
        self._tie = itertools.count(n)

    def clear(self) -> None:
        """Nothing scheduled (a partitioned engine that stored its state and starts another)."""
        self._items.clear()
        self._lanes, self._heads, self._nlane, self._first = {}, [], 0, None
        self._tie = itertools.count()
        self.head = _INF

    def due(self, now: float) -> bool:
        """Is anything due at `now` (cheap check before `pop_due`)?"""
        return self.head <= now

    def next_time(self) -> float | None:
        return self.head if len(self) else None


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
