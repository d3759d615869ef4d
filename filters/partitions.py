"""The engine by partition: what a runtime (Spark's per-key state, the service's incremental
checkpoints) uses to keep the engine's state as one record per profile partition.

An engine built once from the profiles (`Engine(profiles)`: the compiled profiles) runs the
state of one route (or of everything) at a time: `begin` with the route's header, `load` the
records of the partitions the step's events reach (`reached`) and of those due by its time
(`due_by` over the due times the caller keeps), `process`/`advance`, then `changed` gives the
record of every partition the step may have changed (None: delete it) and `end` the header,
leaving the engine with no state for the next route. Loading every record and the header is a
whole-engine restore, with the same results (tests/test_partitions.py runs every conformance
case one event per step through a key-value map and compares with one engine).

    >>> store: dict[str, bytes] = {}; dues: dict[PartId, float | None] = {}; out = []
    >>> pe = PartitionedEngine(Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s per r', "p")]))
    >>> for ev in [Event("a1", 0.0, {"k": "A", "r": 1}), Event("b1", 5.0, {"k": "B", "r": 1})]:
    ...     pe.begin(store.get("header"))
    ...     for part in {*pe.reached(ev), *due_by(dues, ev.ts)}:
    ...         if encode_id(part) in store:
    ...             ok = pe.load(part, store[encode_id(part)])
    ...     pe.process(ev)
    ...     for part, rec in pe.changed().items():  # None: the partition holds nothing now
    ...         if rec is None:
    ...             store.pop(encode_id(part), None), dues.pop(part, None)
    ...         else:
    ...             store[encode_id(part)], dues[part] = rec.data, rec.due
    ...     out += pe.take_notifications()
    ...     store["header"] = pe.end()
    >>> [n.to_json()["events"] for n in out], sorted(store)
    ([{'a': 'a1', 'b': 'b1'}], ['["p",[1]]', 'header'])
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from filters.engine import Engine
from filters.notification import Notification
from filters.partstate import PartId, known_order, part_counts
from filters.state import collector_paused, load_record
from profiles.events import Event

__all__ = [
    "PartId",
    "PartitionedEngine",
    "Record",
    "decode_id",
    "due_by",
    "encode_id",
    "part_counts",
]


@dataclass(frozen=True)
class Record:
    """A partition's stored state and its next due time (None: no timer; keep it in the
    caller's due map so that `due_by` finds it without reading the record)."""

    data: bytes
    due: float | None


def due_by(dues: Mapping[PartId, float | None], until: float) -> list[PartId]:
    """The partitions whose next timer is due by `until` (a step up to `until` may fire it)."""
    return [p for p, t in dues.items() if t is not None and t <= until]


def encode_id(part: PartId) -> str:
    """A partition id as a string (a state store's key): JSON ``[profile, [values]]``; a
    boolean value as ``{"bool": v}`` (`per` keys hold it as (bool, v)), a whole float as an
    int (1.0 and 1 are one partition, as in the engine)."""
    pid, key = part
    vals = [
        {"bool": v[1]}
        if isinstance(v, tuple)
        else int(v)
        if isinstance(v, float) and v.is_integer()
        else v
        for v in key
    ]
    return json.dumps([pid, vals], separators=(",", ":"), sort_keys=True)


def decode_id(text: str) -> PartId:
    """`encode_id` reversed."""
    pid, vals = json.loads(text)
    return (pid, tuple((bool, v["bool"]) if isinstance(v, dict) else v for v in vals))


class PartitionedEngine:
    """An engine whose state is loaded and stored per partition; marks what a step changes.

    `engine` holds the compiled profiles and no state yet (or all of it: the service keeps
    every partition loaded and stores only `changed` ones). Profiles are changed on the
    engine itself (`add_profile`, `remove_profile`) between steps.

    `shared`: the engine's compiled profiles run many routes' state, one step at a time, and
    an engine of the same profiles and plan reads the headers (a Spark Python worker's
    `compiled`): the header names the profile set's shape by a digest while it is the
    compiled one, and a step's `end` looks only at the profiles it loaded or changed
    partitions of, not at every profile of the engine.
    """

    def __init__(self, engine: Engine, shared: bool = False) -> None:
        engine.compiled()  # refuses an engine that re-plans online
        self.engine = engine
        self.shared = shared
        self._touched: set[str] = set()  # profiles of the partitions loaded or changed
        self._dirty: dict[PartId, None] = {}
        # what the events of the step reached, noted cheaply (`Engine.note_reach`)
        self._entries: dict[int, Any] = {}
        self._keys: dict[tuple[str, ...], set[Any]] = {}
        # profile id -> the partitions the caller's store holds as far as this engine knows
        # (loaded, or stored by `changed`), and the rare-first profiles' sweep times then: a
        # sweep drops buffered events of partitions no event reached (and empties some)
        self._known: dict[str, set[Any]] = {}
        self._sweeps: dict[str, float | None] = {}

    # --------------------------------------------------------------- state
    def begin(self, header: bytes | None = None) -> None:
        """Start a route's step: its header (None: a new route) into an engine holding none."""
        if header is not None:
            self.engine.load_header(header)

    def reached(self, event: Event) -> list[PartId]:
        """The partitions `event` may change (load their records before `process`)."""
        return self.engine.reached(event)

    def wanted(
        self,
        events: Iterable[Event],
        dues: Mapping[PartId, float | None],
        until: float,
        held: Iterable[PartId] | None = None,
    ) -> list[PartId]:
        """Every partition a step over `events` and up to `until` (its watermark) may change:
        those the events reach, those due by then (`dues`: the caller's due map) and those the
        header's clocks reach (after `begin`). Load the records of these before the step.
        `held`: the partitions that exist (stored or loaded): only those are given (the
        others have nothing to load), at a cost per event that does not grow with the
        partitions the events reach but that do not exist."""
        evs = list(events)
        horizon = max([until, *(ev.ts for ev in evs)])
        reach = self.engine.reached
        index = self.engine.held_index(held) if held is not None else None
        out = dict.fromkeys(p for ev in evs for p in reach(ev, index))
        out.update(dict.fromkeys(due_by(dues, horizon)))
        out.update(dict.fromkeys(self.engine.clock_parts(horizon)))
        return list(out)

    def load(self, part: PartId, record: bytes) -> bool:
        """One partition's record into the engine; False if its profile is not active here
        (removed, or a `once` profile that reported): delete the record."""
        if not self.engine.load_part(part, record):
            return False
        self._touched.add(part[0])
        self._known.setdefault(part[0], set()).add(part[1])
        if part[0] not in self._sweeps:
            self._sweeps[part[0]] = self.engine.sweep_at(part[0])
        return True

    def load_all(self, records: Iterable[tuple[PartId, bytes]]) -> list[PartId]:
        """`load` of many (a recovery), the collector paused throughout; returns the
        partitions not loaded (their profile is not active here: delete them)."""
        left: list[PartId] = []
        with collector_paused():
            for part, data in records:
                if not self.load(part, data):
                    left.append(part)
        return left

    def loaded(self) -> list[PartId]:
        """The partitions the engine holds."""
        return self.engine.part_ids()

    def drop(self, part: PartId) -> None:
        """The partition leaves the engine unstored (its record is the caller's to keep or
        delete); not reported by `changed`."""
        self._flush()
        self.engine.unload_parts([part])
        self._dirty.pop(part, None)
        known = self._known.get(part[0])
        if known is not None:
            known.discard(part[1])

    def changed(self) -> dict[PartId, Record | None]:
        """The record of every partition changed since the last call (a superset: those the
        events reached, whose timers fired, or all at the first event), None for those that
        hold nothing now (delete them); the engine keeps them loaded."""
        eng = self.engine
        self._flush()
        for pid, keys in self._known.items():  # swept since: every partition it knew
            t = eng.sweep_at(pid)
            if t is not None and t != self._sweeps.get(pid):
                self._sweeps[pid] = t
                self._mark((pid, k) for k in keys)
        dirty, self._dirty = self._dirty, {}
        self._touched.update(p[0] for p in dirty)
        out: dict[PartId, Record | None] = {}
        known = self._known
        for p, got in eng.store_parts(dirty).items():
            held = known.get(p[0])
            if got is None:
                out[p] = None
                if held is not None:
                    held.discard(p[1])
                continue
            out[p] = Record(*got)
            if held is None:
                held = known[p[0]] = set()
                self._sweeps[p[0]] = eng.sweep_at(p[0])
            held.add(p[1])
        return out

    def retired(self) -> list[str]:
        """Profiles a `once` retired: delete every stored record of theirs."""
        return self.engine.retired()

    def header(self) -> bytes:
        """The engine-level record (time, counters, clocks, pending notifications)."""
        if not self.shared:
            return self.engine.store_header()
        self._flush()
        self._touched.update(p[0] for p in self._dirty)
        return self.engine.store_header(True, self._touched)

    def end(self) -> bytes:
        """The header, then the engine holds no state again (store `changed` first)."""
        head = self.header()
        self.engine.reset_state(self._touched if self.shared else None)
        self._touched = set()
        self._dirty.clear()
        self._entries, self._keys = {}, {}
        self._known.clear()
        self._sweeps.clear()
        return head

    @staticmethod
    def profile_order(header: bytes) -> list[str]:
        """The active profiles of a header, in the engine's order (the order notifications of
        one event come in): build the engine of a restore in this order. Empty for a compact
        header (`shared`) whose shape this process has not seen: the order is then that of
        the compiled profiles the header's engine was built from."""
        order: list[str] | str = load_record(header, "header")["order"]
        if isinstance(order, str):
            return known_order(order) or []
        return order

    # ---------------------------------------------------------------- steps
    def _flush(self) -> None:
        """What the events reached, as partitions marked changed."""
        if self._entries:
            self._mark(self.engine.noted(self._entries, self._keys))
            self._entries, self._keys = {}, {}

    def _mark(self, parts: Iterable[PartId]) -> None:
        self._dirty.update(dict.fromkeys(parts))

    def process(self, event: Event) -> None:
        """`Engine.process`, marking the partitions it may change."""
        eng = self.engine
        first = eng.now is None
        if eng.timers.head <= event.ts:
            self._mark(eng.due_parts(event.ts))
        eng.note_reach(event, self._entries, self._keys)
        eng.process(event)
        if first:  # the first time: `absent` without `per` and clocks armed everywhere
            self._mark(eng.part_ids())

    def advance(self, now: float, *, inclusive: bool = False) -> None:
        eng = self.engine
        first = eng.now is None
        if eng.timers.head <= now:
            self._mark(eng.due_parts(now))
        eng.advance(now, inclusive=inclusive)
        if first:
            self._mark(eng.part_ids())

    def finish(self, until: float | None = None) -> None:
        end = until if until is not None else self.engine.now
        if end is not None:
            self.advance(end, inclusive=True)

    def take_notifications(self) -> list[Notification]:
        return self.engine.take_notifications()

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
