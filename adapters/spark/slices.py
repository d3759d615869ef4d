"""Run engines on slices of one stream and merge their output in the single-engine order.

`ens replay` runs one engine over the whole stream and orders notifications by
(ts, detection counter). A distributed replay runs many engines (one per key
value, one for the global profiles), each with its own counter, so the counter
cannot be compared across engines. This module gives every notification a
*detection key* that sorts exactly like the single engine's counter would.

The single engine executes a sequence of *steps*, in this order:

- a clock firing at `c`:          step key `(c, 0, tie)`
- processing the event `a`:       step key `(ts_a, 1, arrival_a)`
- a timer firing at deadline `d`: step key `(d, 2, tie)`

(clocks at `c` fire before events with `ts >= c`; timers at `d` fire once an
event with `ts > d` arrives, so after every event at `d`; equal deadlines fire
in insertion order.) A timer's `tie` is where it was inserted:
`(step key, sub, profile position, counter)` with `sub` 0 for activation, 1
for event processing. Inside a step, profiles act in profile-file order. So a
notification's position in the single engine is
`(ts, step key, sub, profile position, local counter)` — computable inside any
engine that sees the same events of that profile, because profiles do not
interact and partitions of one profile do not interact.

The engine is not modified: `StepTimers` replaces the engine's temporal pool
with one whose ties are these keys (a pool is just an ordered container) and
which notes, each time the engine asks it for the next due entry, which step
the notifications produced since the last ask belong to.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from filters.engine import Engine
from filters.notification import Notification
from filters.temporal import CLOCK, TIMER, TemporalPool
from profiles.ast import Profile
from profiles.events import Event

if TYPE_CHECKING:
    import pyarrow as pa

Key = tuple[Any, ...]


class StepTimers(TemporalPool):
    """A temporal pool whose ties are global step keys (see the module doc)."""

    def __init__(self, positions: dict[str, int]) -> None:
        super().__init__()
        self.engine: Engine | None = None  # the engine scheduling here (set once it exists)
        self.positions = positions  # profile id -> position in the whole profile list
        self.step: Key = (float("-inf"), 1, -1)
        self.sub = 0
        self.event_step: Key = self.step
        self.tags: list[tuple[Key, int]] = []  # (step, sub) of each notification the engine holds

    def _attribute(self) -> None:
        """Notifications the engine produced since the last call belong to the current step."""
        missing = self.engine.pending() - len(self.tags)  # type: ignore[union-attr]
        if missing > 0:
            self.tags.extend([(self.step, self.sub)] * missing)

    def add(self, when: float, kind: int, payload: Any) -> tuple:
        owner = -1 if kind == CLOCK else self.positions[payload[0].profile.id]
        return self._insert((when, kind, (self.step, self.sub, owner, next(self._tie)), payload))

    def add_ordered(self, lane: Any, when: float, payload: Any) -> tuple:
        """No lanes: step keys as ties do not follow the deadlines' order."""
        return self.add(when, TIMER, payload)

    def pop_due(self, now: float, inclusive: bool) -> tuple | None:
        item = super().pop_due(now, inclusive)
        self._attribute()
        if item is None:  # the loop in Engine.advance is over: the event itself comes next
            self.step, self.sub = self.event_step, 1
        else:
            when, kind, tie, _ = item
            self.step, self.sub = (when, 0 if kind == CLOCK else 2, tie), 0
        return item


class SliceRunner:
    """An engine over one slice of the stream; its notifications carry detection keys."""

    def __init__(
        self,
        profiles: Iterable[Profile],
        positions: dict[str, int],
        tz: str = "UTC",
        plans: tuple[str, Any] = ("eager", None),
    ) -> None:
        self.timers = StepTimers(positions)
        self.engine = Engine(profiles, tz=tz, plan=plans[0], rates=plans[1], timers=self.timers)
        self.timers.engine = self.engine
        self.positions = positions

    def _enter(self, ts: float, arrival: int) -> None:
        t = self.timers
        t.event_step = (ts, 1, arrival)
        t.step = t.event_step
        t.sub = 0 if self.engine.now is None else 1  # sub 0: activation, before the first event

    def start(self, t0: float, arrival: int) -> None:
        """Activate at the stream's first event (absent without per and clocks start here)."""
        self._enter(t0, arrival)
        self.engine.advance(t0)

    def process(self, event: Event, arrival: int) -> None:
        self._enter(event.ts, arrival)
        self.engine.process(event)

    def finish(self, end: tuple[float, bool]) -> None:
        """Fire what the single engine fires after its last event (see `end_of`)."""
        self.engine.advance(end[0], inclusive=end[1])

    def take(self) -> list[tuple[Key, Notification]]:
        """Notifications so far, each with its detection key `(ts, step, sub, position, seq)`."""
        self.timers._attribute()
        notes = self.engine.take_notifications()
        tags, self.timers.tags = self.timers.tags, []
        pos = self.positions
        return [
            ((n.ts, step, sub, pos[n.profile], n.seq), n)
            for n, (step, sub) in zip(notes, tags, strict=True)
        ]


# ------------------------------------------------------------ key encoding

_NEG = 0x10
_FLOAT = 0x20
_INT = 0x30
_TUPLE = 0x40


def _float_bytes(x: float) -> bytes:
    (bits,) = struct.unpack(
        ">Q", struct.pack(">d", x + 0.0)
    )  # -0.0 + 0.0 is 0.0: they compare equal
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return struct.pack(">Q", bits)


def encode_key(key: Any) -> bytes:
    """Bytes that sort (unsigned, lexicographically — as Spark sorts binary) like the tuple.

    Floats, ints and nested tuples only; -inf is encoded below every float. A
    tuple ends with 0x00, below every element tag, so a prefix sorts first.
    """
    out = bytearray()
    _enc(key, out)
    return bytes(out)


def _enc(v: Any, out: bytearray) -> None:
    if isinstance(v, tuple):
        out.append(_TUPLE)
        for x in v:
            _enc(x, out)
        out.append(0)
    elif isinstance(v, float):
        if v == float("-inf"):
            out.append(_NEG)
        else:
            out.append(_FLOAT)
            out += _float_bytes(v)
    elif isinstance(v, int):
        out.append(_INT)
        out += struct.pack(">Q", (v + (1 << 63)) & 0xFFFFFFFFFFFFFFFF)
    else:  # pragma: no cover - keys are built above
        raise TypeError(f"cannot encode {type(v).__name__} in a detection key")


# ------------------------------------------------------------------- tasks
# What one Spark task does, on plain Python iterables (so tests need no Spark).

Tagged = tuple[Key, Notification]


def run_stateless(
    profiles: list[Profile],
    positions: dict[str, int],
    events: Iterable[tuple[int, Event]],
    tz: str = "UTC",
) -> Iterable[Tagged]:
    """Bare filters: each event on its own, in any order."""
    runner = SliceRunner(profiles, positions, tz)  # filters: the plan does not apply
    for arrival, ev in events:
        runner.process(ev, arrival)
        if runner.engine.pending():
            yield from runner.take()


def end_of(until: float | None, last_ts: float) -> tuple[float, bool]:
    """How a slice ends: (time, inclusive) such that it fires what `replay` fires.

    The single engine saw the stream's last event at `last_ts`, which fired
    every timer due before it, then `finish(until)` fired those at `<= until`
    (default `last_ts`). A slice may stop earlier, so it advances to the later
    of the two, inclusive only when `until` is the later one (or not given).
    """
    if until is None or until >= last_ts:
        return (last_ts if until is None else until, True)
    return (last_ts, False)


def run_stream(
    profiles: list[Profile],
    positions: dict[str, int],
    events: Iterable[tuple[int, Event]],
    end: tuple[float, bool] | None,
    start: tuple[float, int] | None = None,
    tz: str = "UTC",
    plans: tuple[str, Any] = ("eager", None),
) -> Iterable[Tagged]:
    """One engine over events in stream order (ts, arrival), finished at `end` (`end_of`).

    `start` = (ts, arrival) of the stream's first event, for engines that may
    not see that event but whose activation time matters (global profiles).
    """
    runner = SliceRunner(profiles, positions, tz, plans)
    if start is not None:
        runner.start(*start)
    for arrival, ev in events:
        runner.process(ev, arrival)
        if runner.engine.pending():
            yield from runner.take()
    if end is not None:
        runner.finish(end)
    yield from runner.take()


def split_replay(
    profiles: list[Profile],
    events: list[Event],
    until: float | None,
    key: str,
    plans: tuple[str, Any] = ("eager", None),
) -> list[Notification]:
    """`ens.replay.replay` computed the way the Spark job computes it (the test oracle's twin)."""
    from adapters.spark.plan import Relevance, make_plan, route_key

    plan = make_plan(profiles, key)
    order = sorted(range(len(events)), key=lambda i: events[i].ts)
    stream = [(i + 1, events[i]) for i in order]
    if stream:
        end: tuple[float, bool] | None = end_of(until, stream[-1][1].ts)
    else:
        end = (until, True) if until is not None else None
    tagged: list[Tagged] = []
    if plan.stateless:
        tagged += run_stateless(plan.stateless, plan.positions, reversed(stream))
    if plan.keyed:
        rel = Relevance(plan.keyed)
        groups: dict[str, list[tuple[int, Event]]] = {}
        for arrival, ev in stream:
            rk = route_key(ev.attrs.get(key))
            if rk is not None and rel(ev.attrs):
                groups.setdefault(rk, []).append((arrival, ev))
        for rk in sorted(groups, reverse=True):
            tagged += run_stream(plan.keyed, plan.positions, groups[rk], end, plans=plans)
    if plan.global_:
        rel = Relevance(plan.global_)
        first = (stream[0][1].ts, stream[0][0]) if stream else None
        evs = [(a, ev) for a, ev in stream if rel(ev.attrs)]
        tagged += run_stream(plan.global_, plan.positions, evs, end, first, plans=plans)
    tagged.sort(key=lambda t: encode_key(t[0]))
    return [n for _, n in tagged]


def note_batch(tagged: list[Tagged]) -> pa.RecordBatch:
    """Notifications with their slice keys as one Arrow batch of the NOTE_DDL rows."""
    import json

    import pyarrow as pa

    cols: list[list[Any]] = [[], [], [], [], [], []]
    for key, n in tagged:
        rec = n.to_json()
        cols[0].append(encode_key(key))
        cols[1].append(n.ts)
        cols[2].append(n.profile)
        cols[3].append(list(rec["events"].items()))
        cols[4].append(json.dumps(rec["partition"]) if "partition" in rec else None)
        cols[5].append(json.dumps(rec, separators=(", ", ": ")))
    types = [
        pa.binary(),
        pa.float64(),
        pa.string(),
        pa.map_(pa.string(), pa.string()),
        pa.string(),
        pa.string(),
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, t) for c, t in zip(cols, types, strict=True)],
        names=["dkey", "ts", "profile", "events", "partition", "line"],
    )
