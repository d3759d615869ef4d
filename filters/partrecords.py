"""Partition records and the engine header: the encoding half of `filters.partstate`.

A *partition record* (`filters.state.dump_record`, kind "partition") is one profile
partition's runtime state (its partial matches, bindings, counters, auxiliary registrations)
and its timers; the *header* record is the engine-level state (time, arrival and
notification numbers, the timers' tie number, clocks, PM counts per profile, profiles a `once`
retired, the notifications not taken yet). `PartitionRecords` writes and reads them;
`filters.partstate.PartitionState` (which derives from it) keeps the bookkeeping: what an
event reaches, which partitions exist, unloading and resetting.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from filters import state as state_format
from filters.eager.composite import CompositeRuntime
from filters.eager.matches import PartialMatch, Partition
from filters.notification import Notification
from filters.rarefirst.lazy import LazySeqRuntime
from filters.rarefirst.lazy_base import LazyPartition
from filters.runtime import AbsentRuntime, Handle, PartKey, Runtime
from filters.temporal import TIMER, TemporalPool
from profiles.ast import Clock

PartId = tuple[str, PartKey]  # (profile id, partition key: its `per` values, normalised)

# the record kind of each stateful runtime class
KINDS: dict[type, str] = {
    CompositeRuntime: "composite",
    LazySeqRuntime: "lazy",
    AbsentRuntime: "absent",
}


def stateful(rt: Runtime) -> bool:
    """Whether `rt` keeps state by partition (a record kind of its own)."""
    return rt.__class__ in KINDS


def part_counts(data: bytes) -> dict[str, int]:
    """What a partition record holds ("partial_matches", "partitions", "timers", as
    `filters.restore.Skipped` counts it), read without an engine (its runtime is None)."""
    body = state_format.load_record(data, "partition", refs={"runtime": None})
    st = body["state"]
    if isinstance(st, Partition):
        pms = sum(1 for pm in st.pms if pm.alive)
    elif isinstance(st, LazyPartition):
        pms = st.size()
    else:  # `absent`: its silence timer
        pms = 1
    return {"partial_matches": pms, "partitions": 1, "timers": len(body["timers"])}


def timer_part(h: Handle) -> tuple[Runtime, PartKey] | None:
    """The runtime and partition a timer belongs to, if that partition is the runtime's
    current one (a finished PM's terminator of a partition since dropped fires as a no-op)."""
    if h[1] != TIMER:
        return None
    rt, x = h[3]
    if not rt.active:
        return None
    cls = x.__class__
    if cls is PartialMatch:
        part = x.part
        return (rt, part.key) if rt.parts.get(part.key) is part else None
    if cls is Partition:
        return (rt, x.key) if rt.parts.get(x.key) is x else None
    st = rt.parts.get(x)  # `absent`: its key
    return (rt, x) if st is not None and st[1] is h else None


class PartitionRecords:
    """Partition records and the header record of the engine (the base of
    `filters.partstate.PartitionState`, mixed into `Engine`)."""

    now: float | None
    timers: TemporalPool
    _rts: dict[int, Runtime]
    _by_id: dict[str, Runtime]
    _seq: int
    _clocks: dict[Clock, Handle | None]

    # the engine's (`Engine`, `NotificationOutput`, `PlanSwitching`) and the bookkeeping's
    def deactivate(self, rt: Runtime) -> None:
        raise NotImplementedError

    def output_state(self) -> tuple[int, list[Notification]]:
        raise NotImplementedError

    def restore_output(self, counter: int, pending: Iterable[Notification]) -> None:
        raise NotImplementedError

    def reset_output(self) -> None:
        raise NotImplementedError

    def _swap(self, idx: int, rt: Runtime, lazy: bool, driver: int | None = None) -> None:
        raise NotImplementedError

    def compiled(self) -> dict[int, Runtime]:
        raise NotImplementedError

    def _compiled_now(self) -> dict[int, Runtime]:
        raise NotImplementedError

    def shape(self) -> tuple[str, list[str], dict[str, int]]:
        raise NotImplementedError

    def store_parts(self, ids: Iterable[PartId]) -> dict[PartId, tuple[bytes, float | None] | None]:
        """Each partition as (record, its next due time), or None: it holds nothing (its
        stored record goes)."""
        want = list(ids)
        wanted = set(want)
        timers: dict[PartId, list[Handle]] = {i: [] for i in want}
        if wanted:
            for h in self.timers.handles():
                got = timer_part(h)
                if got is not None:
                    pid = (got[0].pid, got[1])
                    if pid in wanted:
                        timers[pid].append(h)
        out: dict[PartId, tuple[bytes, float | None] | None] = {}
        for part_id in want:
            rt = self._by_id.get(part_id[0])
            st = None
            if rt is not None and rt.active and stateful(rt):
                st = rt.parts.get(part_id[1])  # type: ignore[attr-defined]
            if st is None:
                out[part_id] = None
                continue
            hs = sorted(timers[part_id], key=lambda h: (h[0], h[1], h[2]))
            due = hs[0][0] if hs else None
            body = {
                "profile": part_id[0],
                "key": part_id[1],
                "kind": KINDS[rt.__class__],  # type: ignore[union-attr]
                "state": st,
                "timers": hs,
                "due": due,
            }
            out[part_id] = (state_format.dump_record("partition", body, {id(rt): "runtime"}), due)
        return out

    def load_part(self, part_id: PartId, data: bytes) -> bool:
        """A stored partition into the engine; False (nothing loaded) if its profile is not
        active here (removed, or retired by `once`): its record can go."""
        self.compiled()
        rt = self._by_id.get(part_id[0])
        if rt is None or not rt.active or not stateful(rt):
            return False
        body = state_format.load_record(data, "partition", refs={"runtime": rt})
        if body["profile"] != part_id[0] or body["key"] != part_id[1]:
            raise state_format.StateError(
                f"the record of partition {body['key']!r} of profile {body['profile']!r} was "
                f"given as that of {part_id[1]!r} of {part_id[0]!r}"
            )
        kind = KINDS[rt.__class__]
        if body["kind"] != kind:
            raise state_format.StateError(
                f"the record of profile {part_id[0]!r} holds {body['kind']} state, but the "
                f"profile runs {kind} here (its plan changed): the record cannot be loaded"
            )
        rt.load_partition(part_id[1], body["state"])  # type: ignore[attr-defined]
        put = self.timers.put
        for h in body["timers"]:
            put(h)
        return True

    def store_header(self, compact: bool = False, touched: Collection[str] | None = None) -> bytes:
        """The engine-level state (`filters.state.RECORDS["header"]`).

        `compact` (an engine of compiled profiles shared by many routes, `Engine(profiles)`
        built alike wherever the header is read): while the profile set's shape (order,
        rare-first drivers) is the one it was compiled with, the header holds the shape's
        digest instead of the list of every profile. `touched` (the profiles the step loaded
        or changed partitions of, `PartitionedEngine`): only their PM counts are looked at,
        the others are those `load_header` read."""
        base = self._compiled_now()
        pm_counts: dict[str, int]
        sweeps: dict[str, float] = {}
        digest, order, lazy = self.shape()
        inf = float("-inf")
        if touched is None:
            pm_counts = {}
            for rt in self._rts.values():
                if isinstance(rt, CompositeRuntime) and rt.pm_count:
                    pm_counts[rt.pid] = rt.pm_count
                elif isinstance(rt, LazySeqRuntime) and rt.sweep_at != inf:
                    sweeps[rt.pid] = rt.sweep_at
        else:
            pm_counts = dict(self.__dict__.get("_pm_read", {}))
            by_id = self._by_id
            for pid in touched:
                comp = by_id.get(pid)
                if isinstance(comp, CompositeRuntime) and comp.pm_count:
                    pm_counts[pid] = comp.pm_count
                else:
                    pm_counts.pop(pid, None)
            for pid in lazy:  # (rare-first runtimes: few, and a sweep may touch any)
                lz = by_id[pid]
                if lz.sweep_at != inf:  # type: ignore[attr-defined]
                    sweeps[pid] = lz.sweep_at  # type: ignore[attr-defined]
        gone = base.keys() - self._rts.keys()
        nseq, pending = self.output_state()
        pristine = compact and digest == self.__dict__.get("_pristine")
        body = {
            "now": self.now,
            "seq": self._seq,
            "nseq": nseq,
            "tie": self.timers.tie,
            "clocks": dict(self._clocks),
            "inactive": sorted(base[i].pid for i in gone),
            "pm_counts": pm_counts,
            "sweeps": sweeps,
            "out": pending,
            "order": digest if pristine else order,
            "lazy": lazy,
        }
        return state_format.dump_record("header", body)

    def load_header(self, data: bytes) -> None:
        """The engine-level state of a `store_header` into an engine holding none
        (`reset_state`), before its partitions are loaded."""
        body = state_format.load_record(data, "header")
        base = self._compiled_now()
        lazy: dict[str, int] = body["lazy"]
        same = lazy == self.shape()[2]  # (no profile's plan to change: no loop over them)
        for idx, rt in list(base.items()) if not same else ():
            if not rt.active or not isinstance(rt, (CompositeRuntime, LazySeqRuntime)):
                continue  # (each profile's plan as stored: its records' kind)
            k = lazy.get(rt.pid)  # type: ignore[union-attr]
            if isinstance(rt, LazySeqRuntime) != (k is not None) or (
                isinstance(rt, LazySeqRuntime) and rt.k != k
            ):
                if isinstance(rt, LazySeqRuntime) and k is not None:  # another driver
                    self._swap(idx, rt, False)
                    rt = self._rts[idx]
                self._swap(idx, rt, k is not None, k)
                base[idx] = self._rts[idx]
        for pid in body["inactive"]:
            gone = self._by_id.get(pid)
            if gone is not None:
                self.deactivate(gone)
        self.now = body["now"]
        self._seq = body["seq"]
        self.timers.tie = body["tie"]
        for clock, h in body["clocks"].items():
            if clock in self._clocks:
                self._clocks[clock] = h
                if h is not None:
                    self.timers.put(h)
        for pid, n in body["pm_counts"].items():
            comp = self._by_id.get(pid)
            if isinstance(comp, CompositeRuntime):
                comp.pm_count = n
        self.__dict__["_pm_read"] = body["pm_counts"]
        for pid, t in body["sweeps"].items():
            lz = self._by_id.get(pid)
            if isinstance(lz, LazySeqRuntime):
                lz.sweep_at = t
        self.restore_output(body["nseq"], body["out"])
