"""Event-time watermarks per source (gateway): which held events the engine may take next.

Pure and deterministic: no Redis, no clock; the wall time is passed in. The worker owns one
`Watermarks` and journals what `release` hands it, so its crash recovery does not depend on
this module deciding the same way twice.

The model is Flink's and Beam's. Each source's **watermark** is its newest ``ts`` minus its
allowed **lateness**: a source promises (by its configuration) that it will not send anything
older. An event is released once the smallest watermark of the *active* sources has reached
it, so a source that sends in order with lateness 0 holds nothing back beyond the others'
progress. A source whose last event arrived more than ``idle_timeout`` (wall time) ago is
**idle** and does not hold the others back (Flink's ``withIdleness``); when every source is
idle, everything held is released. Ties in ``ts`` go in arrival order, so for sources that keep
their promise the release order is the ``ts``-sorted stream (ties in arrival order).

`ens spark stream` applies the same rule (`Watermarks.bound`) to the gateways' progress its
tasks report (`Watermarks.from_progress`), in whole milliseconds: Spark's watermark unit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

_NEG_INF = float("-inf")
_INF = float("inf")


class Held(NamedTuple):
    """A held event; a tuple so the heap compares (ts, seq) in C."""

    ts: float
    seq: int  # arrival number, unique: the comparison never reaches the fields below
    source: str
    wall: float  # arrival wall time
    item: Any  # the caller's payload


def whole(t: float, newest: float, per_second: int) -> float:
    """`t` in whole units of ``1 / per_second`` s (a clock that counts in units: Spark keeps
    its watermark in ms): rounded down, never past what a source promised, or up when it is
    at least the `newest` ts of all (every source idle: everything is released, and an event
    stamped with digits below the unit must not stay held for the lack of a fraction)."""
    if not math.isfinite(t):
        return t
    n = round(t * per_second, 3)  # float noise of a value already whole
    up = newest > _NEG_INF and t >= newest
    return (math.ceil(n) if up else math.floor(n)) / per_second


@dataclass
class Source:
    lateness: float | None = None  # None: the default lateness
    newest: float = _NEG_INF  # newest ts seen
    last_wall: float = _NEG_INF  # wall time of its last event
    skewed_wall: float = _NEG_INF  # wall time of its last early event (ts ahead of the wall clock)


class Watermarks:
    """Held events of several sources, released in ``ts`` order behind the sources' watermarks."""

    def __init__(
        self, default_lateness: float, idle_timeout: float, max_held: int, max_skew: float = _INF
    ) -> None:
        self.default_lateness = default_lateness
        self.idle_timeout = idle_timeout
        self.max_held = max_held
        # an event stamped more than this ahead of the wall clock when it arrived is *early*
        # (its source's clock runs fast): it is held until the wall clock, less the default
        # lateness, reaches its ts, so one fast clock cannot move engine time past the others
        self.max_skew = max_skew
        self.sources: dict[str, Source] = {}
        self.heap: list[Held] = []
        self.seq = 0

    # ----------------------------------------------------------------- configuration
    def lateness(self, source: str) -> float:
        src = self.sources.get(source)
        if src is None or src.lateness is None:
            return self.default_lateness
        return src.lateness

    def set_lateness(self, source: str, lateness: float | None) -> None:
        """A source's own allowed lateness (s); None: the default."""
        self.sources.setdefault(source, Source()).lateness = lateness

    # ----------------------------------------------------------------- events
    def observe(self, source: str, ts: float, wall: float) -> None:
        """Note that `source` sent an event (also for events that are not held: late ones)."""
        src = self.sources.get(source)
        if src is None:
            src = self.sources[source] = Source()
        if ts > src.newest:
            src.newest = ts
        if wall > src.last_wall:
            src.last_wall = wall
        if ts - wall > self.max_skew:
            src.skewed_wall = wall

    def early(self, h: Held) -> bool:
        """Whether a held event was stamped further ahead of its arrival than ``max_skew``."""
        return h.ts - h.wall > self.max_skew

    def skewed(self, now_wall: float, within: float = 60.0) -> list[str]:
        """Sources that sent an early event within the last ``within`` seconds (wall)."""
        limit = now_wall - within
        return sorted(n for n, s in self.sources.items() if s.skewed_wall > limit)

    def hold(self, source: str, ts: float, wall: float, item: Any) -> Held:
        """Hold an event (call `observe` first). Returns the held record."""
        self.seq += 1
        h = Held(ts, self.seq, source, wall, item)
        heapq.heappush(self.heap, h)
        return h

    def active(self, now_wall: float) -> list[str]:
        """Sources that spoke within the idle timeout."""
        limit = now_wall - self.idle_timeout
        return [name for name, s in self.sources.items() if s.last_wall > limit]

    def watermark(self, now_wall: float) -> float:
        """The smallest watermark of the active sources (+inf when all are idle)."""
        limit = now_wall - self.idle_timeout
        wm = float("inf")
        default = self.default_lateness
        for s in self.sources.values():
            if s.last_wall > limit:
                w = s.newest - (default if s.lateness is None else s.lateness)
                if w < wm:
                    wm = w
        return wm

    def bound(
        self, now_wall: float, floor: float = _NEG_INF, per_second: int | None = None
    ) -> float:
        """How far held events may be released: the watermark, at least ``floor`` (the wall
        clock's engine time). With `per_second` (a clock in whole units, `whole`) it is finite:
        when every source is idle, the newest ts of all instead of +inf (-inf before any)."""
        wm = self.watermark(now_wall)
        if per_second is None:
            return max(wm, floor)
        newest = max((s.newest for s in self.sources.values()), default=_NEG_INF)
        if wm == _INF:
            wm = newest
        return whole(max(wm, floor), newest, per_second)

    def max_active_lateness(self, now_wall: float) -> float:
        """The largest lateness of the active sources, at least the default."""
        limit = now_wall - self.idle_timeout
        out = self.default_lateness
        for s in self.sources.values():
            if s.last_wall > limit and s.lateness is not None and s.lateness > out:
                out = s.lateness
        return out

    def next_due(self, now_wall: float, floor_lag: float | None) -> float | None:
        """Wall time at which the oldest held event may next be released without new input.

        Either the wall-clock floor (``ts + floor_lag``; None: no floor) passes it, or an active
        source turns idle and stops holding it back. None when nothing is held. The worker
        sleeps until then rather than a whole tick, so the floor is not rounded up to a tick.
        """
        if not self.heap:
            return None
        top = self.heap[0]
        due = _INF if floor_lag is None else top.ts + floor_lag
        limit = now_wall - self.idle_timeout
        for s in self.sources.values():
            if s.last_wall > limit:
                t = s.last_wall + self.idle_timeout
                if t < due:
                    due = t
        if self.early(top):  # it waits for the wall clock whatever the watermarks say
            due = max(due, top.ts + self.default_lateness)
        return due

    def release(self, now_wall: float, floor: float = _NEG_INF) -> list[Held]:
        """Pop the events the watermark (or ``floor``) has passed, and those beyond the cap.

        ``floor`` is an extra bound from the caller (the wall clock's engine time).
        """
        heap = self.heap
        if not heap:
            return []
        bound = self.bound(now_wall, floor)
        out: list[Held] = []
        early_until = now_wall - self.default_lateness  # an early event waits for the wall clock
        skew = self.max_skew
        while heap:
            top = heap[0]
            if len(heap) <= self.max_held and (
                top.ts > bound or (top.ts - top.wall > skew and top.ts > early_until)
            ):
                break
            out.append(heapq.heappop(heap))
        return out

    def discard(self, gone: Callable[[Held], bool]) -> None:
        """Forget the held events for which ``gone`` is true (fed by a journal replay)."""
        self.heap = [h for h in self.heap if not gone(h)]
        heapq.heapify(self.heap)

    # ----------------------------------------------------------------- persistence
    def state(self) -> dict[str, Any]:
        """Per-source progress as JSON (the held events are the caller's to store)."""
        return {
            "seq": self.seq,
            "sources": {
                n: [
                    None if s.newest == _NEG_INF else s.newest,
                    None if s.last_wall == _NEG_INF else s.last_wall,
                ]
                for n, s in self.sources.items()
            },
        }

    def progress(self) -> dict[str, list[float]]:
        """Per-source [newest ts, wall time of its last event], of the sources that sent one
        (`ens spark stream` carries it from its tasks to the driver, ``ens:spark:gateways``)."""
        return {n: [s.newest, s.last_wall] for n, s in self.sources.items() if s.newest > _NEG_INF}

    @classmethod
    def from_progress(
        cls,
        progress: Mapping[str, Sequence[float]],
        lateness: Mapping[str, float | None],
        default_lateness: float,
        idle_timeout: float,
    ) -> Watermarks:
        """The watermarks of sources known by their progress (`progress`) and own lateness."""
        w = cls(default_lateness, idle_timeout, 0)
        for name, lat in lateness.items():
            w.set_lateness(name, None if lat is None else float(lat))
        for name, (newest, last_wall) in progress.items():
            w.observe(name, newest, last_wall)
        return w

    def restore(self, state: dict[str, Any], held: Iterable[Held]) -> None:
        """Undo `state` (keeping configured latenesses) and put `held` back."""
        self.seq = int(state.get("seq", 0))
        for name, (newest, last_wall) in state.get("sources", {}).items():
            src = self.sources.setdefault(name, Source())
            src.newest = _NEG_INF if newest is None else newest
            src.last_wall = _NEG_INF if last_wall is None else last_wall
        self.heap = list(held)
        heapq.heapify(self.heap)
        if self.heap:
            self.seq = max(self.seq, max(h.seq for h in self.heap))
