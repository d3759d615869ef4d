"""The engine's state per profile partition: what the event reaches, records, load and unload.

Compiled profiles (the primitive pool's starting entries, patterns, plans) are built once per
profile set by `Engine(profiles)`; the runtime state of one profile partition (its partial
matches, bindings, counters, auxiliary registrations and timers) is a *record*
(`filters.state.dump_record`, kind "partition") that can be loaded into such an engine,
changed by events and stored again, alone. The engine-level counters (time, arrival and
notification numbers, the timers' tie number, clocks, PM counts per profile, profiles a `once`
retired) are the *header* record. Writing and reading both records is
`filters.partrecords.PartitionRecords`, the base of `PartitionState` (the bookkeeping here). Storing every partition and the header and loading them into
a fresh engine is a whole-engine snapshot and restore (same semantics: dormant auxiliary
profiles are not stored, `Engine.__setstate__`).

An event can change only the partitions of the profiles one of whose components it matches
(`reached`: a pool of every component's filter, the partition from the event's `per` values)
and those whose timers are due before it (`due_parts`). Mixed into `filters.engine.Engine`;
`filters.partitions.PartitionedEngine` is the interface runtimes use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Container, Iterable, Mapping
from typing import Any

from filters.eager.composite import CompositeRuntime
from filters.eager.matches import PartialMatch
from filters.localclock import LocalClock
from filters.partrecords import KINDS, PartitionRecords, stateful, timer_part
from filters.partrecords import PartId as PartId
from filters.partrecords import part_counts as part_counts
from filters.pool.primitive import PrimitivePool
from filters.rarefirst.lazy import LazySeqRuntime
from filters.runtime import AbsentRuntime, Handle, PartKey, Runtime
from filters.temporal import CLOCK, TIMER, TemporalPool
from profiles.ast import Absent, Clock, Profile
from profiles.events import Event

# profile set shapes by digest (`PartitionState.shape`): the order and rare-first drivers a
# compact header names; every shape this process computed, the latest kept
_SHAPES: dict[str, tuple[list[str], dict[str, int]]] = {}
Shape = tuple[str, list[str], dict[str, int]]  # digest, profile order, rare-first drivers


def known_order(digest: str) -> list[str] | None:
    """The profile order of a shape's digest (a compact header's), if this process saw it."""
    got = _SHAPES.get(digest)
    return list(got[0]) if got is not None else None


class PartitionState(PartitionRecords):
    """Partitions of the engine: what an event reaches, which exist, unload and reset (mixed
    into `Engine`; see the module docstring). Their records: `PartitionRecords`."""

    now: float | None
    timers: TemporalPool
    replan_every: int
    _rts: dict[int, Runtime]
    _by_id: dict[str, Runtime]
    _seq: int
    _clocks: dict[Clock, Handle | None]
    _clock_users: dict[Clock, dict[int, CompositeRuntime]]
    _local: LocalClock | None

    def add_profile(self, profile: Profile) -> None:
        raise NotImplementedError

    def _runtime(self, profile: Profile, idx: int) -> Runtime:
        raise NotImplementedError

    def _add_starts(self, rt: Runtime) -> None:
        raise NotImplementedError

    def _register_starts(self, rt: Runtime) -> None:
        raise NotImplementedError

    def _swap(self, idx: int, rt: Runtime, lazy: bool, driver: int | None = None) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- reach
    def compiled(self) -> dict[int, Runtime]:
        """The runtimes of the compiled profile set (those a `once` retired included): taken
        the first time the engine is used by partition, again after a profile change."""
        base: dict[int, Runtime] | None = self.__dict__.get("_base")
        if base is None:
            if self.replan_every:
                raise ValueError(
                    "an engine that re-plans online (replan_every > 0) cannot keep its state "
                    "by partition: a re-plan moves a whole profile's state"
                )
            base = self.__dict__["_base"] = dict(self._rts)
            reach = PrimitivePool()
            pers: dict[tuple[str, ...], None] = {}
            for idx, rt in base.items():
                for f in _leaf_filters(rt):
                    reach.add(f, idx)
                if stateful(rt):
                    pers[rt.per] = None
            self.__dict__["_reach"] = reach
            self.__dict__["_pers"] = pers
            self.__dict__["_pristine"] = self.shape()[0]
        return base

    def shape(self) -> Shape:
        """The profile set's shape: its order (that of one event's notifications) and the
        rare-first runtimes' drivers, with a digest of both. Computed again only when the
        runtimes changed (a comparison of their identities, at C speed)."""
        rts = tuple(self._rts.values())
        got: tuple[tuple[Runtime, ...], Shape] | None = self.__dict__.get("_shape")
        if got is not None and got[0] == rts:
            return got[1]
        order = [rt.pid for rt in rts]
        lazy = {rt.pid: rt.k for rt in rts if isinstance(rt, LazySeqRuntime)}
        text = json.dumps([order, sorted(lazy.items())], separators=(",", ":"))
        digest = hashlib.sha1(text.encode()).hexdigest()[:20]
        if len(_SHAPES) >= 64:
            _SHAPES.pop(next(iter(_SHAPES)))
        _SHAPES[digest] = (order, lazy)
        out = (digest, order, lazy)
        self.__dict__["_shape"] = (rts, out)
        return out

    def note_reach(
        self, event: Event, entries: dict[int, Any], keys: dict[tuple[str, ...], set[PartKey]]
    ) -> None:
        """`reached`, cheaply, for marking what a step changed: notes the reach pool's entries
        the event matches and its partition key under each `per` of the profiles; `noted`
        makes partitions of them (a superset: every noted key of a profile's `per`)."""
        self.compiled()
        if self._local is not None:
            event = self._local.event(event)
        attrs = event.attrs
        got = self.__dict__["_reach"].match(attrs)
        if got:
            for entry in got:
                entries[id(entry)] = entry
            for per in self.__dict__["_pers"]:
                key = _key_of(per, attrs)
                if key is not None:
                    held = keys.get(per)
                    if held is None:
                        keys[per] = {key}
                    else:
                        held.add(key)

    def noted(
        self, entries: dict[int, Any], keys: dict[tuple[str, ...], set[PartKey]]
    ) -> list[PartId]:
        """The partitions of what `note_reach` noted."""
        idxs: set[int] = set()
        for entry in entries.values():
            idxs.update(entry.owners)
        out: list[PartId] = []
        rts = self._rts
        for idx in idxs:
            rt = rts.get(idx)
            if rt is not None and rt.active:
                out += [(rt.pid, k) for k in keys.get(rt.per, ())]
        return out

    def profile_added(self, rt: Runtime) -> None:
        """A profile joined the compiled set (`Engine.add_profile`, once it is in use)."""
        base: dict[int, Runtime] | None = self.__dict__.get("_base")
        if base is not None:
            base[rt.idx] = rt
            reach: PrimitivePool = self.__dict__["_reach"]
            for f in _leaf_filters(rt):
                reach.add(f, rt.idx)
            if stateful(rt):
                self.__dict__["_pers"][rt.per] = None

    def profile_removed(self, rt: Runtime) -> None:
        """A profile left the compiled set (`Engine.remove_profile`)."""
        base: dict[int, Runtime] | None = self.__dict__.get("_base")
        if base is not None and base.pop(rt.idx, None) is not None:
            reach: PrimitivePool = self.__dict__["_reach"]
            for f in _leaf_filters(rt):
                reach.remove(f, rt.idx)

    def sweep_at(self, profile_id: str) -> float | None:
        """A rare-first profile's next sweep of quiet partitions (None: not rare-first): a
        sweep changes partitions no event reached (`PartitionedEngine.changed`)."""
        rt = self._by_id.get(profile_id)
        return rt.sweep_at if isinstance(rt, LazySeqRuntime) else None

    def reached(
        self, event: Event, held: Mapping[int, Container[PartKey]] | None = None
    ) -> list[PartId]:
        """The partitions `event` may change (a superset): of each stateful profile one of
        whose components' filters it matches, the partition of its `per` values. With `held`
        (`held_index`: the partitions that exist, stored or loaded), only those of them: the
        others have no record to load (a `per room` sequence's later component reaches every
        such profile, nearly all without a partition in the event's room)."""
        self.compiled()
        reach: PrimitivePool = self.__dict__["_reach"]
        if self._local is not None:
            event = self._local.event(event)
        attrs = event.attrs
        out: list[PartId] = []
        idxs: set[int] = set()
        for entry in reach.match(attrs):
            idxs.update(entry.owners)  # type: ignore[arg-type]  # owners: runtime indices
        rts = self._rts
        if held is not None:
            idxs.intersection_update(held)
            for idx in sorted(idxs):
                rt = rts.get(idx)
                if rt is not None and rt.active:
                    key = rt.partition_key(attrs)
                    if key is not None and key in held[idx]:
                        out.append((rt.pid, key))
            return out
        for idx in sorted(idxs):
            rt = rts.get(idx)
            if rt is not None and rt.active:
                key = rt.partition_key(attrs)
                if key is not None:
                    out.append((rt.pid, key))
        return out

    def held_index(self, held: Iterable[PartId]) -> dict[int, set[PartKey]]:
        """Partitions by runtime index, for `reached`."""
        out: dict[int, set[PartKey]] = {}
        by_id = self._by_id
        for pid, key in held:
            rt = by_id.get(pid)
            if rt is not None:
                got = out.get(rt.idx)
                if got is None:
                    out[rt.idx] = {key}
                else:
                    got.add(key)
        return out

    def due_parts(self, until: float) -> list[PartId]:
        """The loaded partitions whose timers are due by `until` (a clock due: every loaded
        partition of its profiles, and the one of a profile without `per`)."""
        out: dict[PartId, None] = {}
        for h in self.timers.due_handles(until):
            if h[1] == CLOCK:
                for rt in self._clock_users.get(h[3], {}).values():
                    if rt.active:
                        out.update(dict.fromkeys((rt.pid, k) for k in rt.parts))
                        if not rt.per:
                            out[(rt.pid, ())] = None
                continue
            got = timer_part(h)
            if got is not None:
                out[(got[0].pid, got[1])] = None
        return list(out)

    def clock_parts(self, until: float) -> list[PartId]:
        """The partitions the clocks due by `until` reach: of each profile waiting for one,
        its partition without `per` (a clock event has no attributes)."""
        out: list[PartId] = []
        for clock, h in self._clocks.items():
            if h is not None and h[0] <= until:
                for rt in self._clock_users.get(clock, {}).values():
                    if rt.active and not rt.per:
                        out.append((rt.pid, ()))
        return out

    def part_ids(self) -> list[PartId]:
        """Every partition the engine holds."""
        out: list[PartId] = []
        for rt in self._rts.values():
            if stateful(rt):
                parts: dict[PartKey, Any] = rt.parts  # type: ignore[attr-defined]
                out += [(rt.pid, k) for k in parts]
        return out

    def retired(self) -> list[str]:
        """Profiles of the compiled set that are no longer active (`once`, reported): every
        stored partition of theirs goes."""
        base = self._compiled_now()
        return sorted(base[i].pid for i in base.keys() - self._rts.keys())

    def _compiled_now(self) -> dict[int, Runtime]:
        """`compiled`, runtimes a plan change replaced (`_swap`) taken as their successors
        (looked for only when the runtimes changed). An inactive runtime is one `_rts` no
        longer holds (`deactivate`; `_swap` replaces it)."""
        base = self.compiled()
        rts = self._rts
        cur = tuple(rts.values())
        if self.__dict__.get("_seen") != cur:
            for idx, rt in rts.items():
                if base.get(idx) is not rt:
                    base[idx] = rt
            self.__dict__["_seen"] = cur
        return base

    def unload_parts(self, ids: Iterable[PartId]) -> None:
        """The partitions leave the engine (store them first: their PMs end here)."""
        objs: set[int] = set()
        for pid, key in ids:
            rt = self._by_id.get(pid)
            if rt is None or not stateful(rt):
                continue
            st = rt.parts.get(key)  # type: ignore[attr-defined]
            if st is not None:
                objs.add(id(st))
                rt.unload_partition(key)  # type: ignore[attr-defined]
        if objs:  # the terminators its finished PMs left
            self.timers.drop_where(
                lambda h: (
                    h[1] == TIMER and h[3][1].__class__ is PartialMatch and id(h[3][1].part) in objs
                )
            )

    def reset_state(self, touched: Collection[str] | None = None) -> None:
        """Back to the compiled profiles holding no state (as `Engine(profiles)` built them):
        every partition out, retired profiles back, time unset. Take the notifications and
        store what is to be kept first. `touched`: as for `store_header` (the profiles whose
        partitions the step loaded or changed: the others hold none)."""
        base = self._compiled_now()
        self.timers.clear()
        fresh_idx: set[int] = set()
        for idx in sorted(base.keys() - self._rts.keys()):  # retired (`once`): built again
            rt = base[idx]
            fresh = self._runtime(rt.profile, idx)
            base[idx] = self._rts[idx] = self._by_id[rt.pid] = fresh
            self._register_starts(fresh)
            if isinstance(fresh, CompositeRuntime):
                for clock in fresh.clocks:
                    self._clock_users.setdefault(clock, {})[idx] = fresh
            fresh_idx.add(idx)
        inf = float("-inf")
        if touched is None:
            rts: Iterable[tuple[int, Runtime]] = base.items()
        else:
            by_id = self._by_id
            pids = {*touched, *self.__dict__.get("_pm_read", ()), *self.shape()[2]}
            rts = [(rt.idx, rt) for rt in (by_id.get(p) for p in pids) if rt is not None]
        for idx, rt in rts:  # (a loop per step: kept lean)
            cls = rt.__class__
            if cls not in KINDS or idx in fresh_idx:
                continue
            parts = rt.parts  # type: ignore[attr-defined]
            if parts:
                for key in list(parts):
                    rt.unload_partition(key, False)  # type: ignore[attr-defined]
            if cls is CompositeRuntime:
                rt.pm_count = 0  # type: ignore[attr-defined]
                if not rt.starts:  # type: ignore[attr-defined]  # `opens_once` let them go
                    self._add_starts(rt)
            elif cls is LazySeqRuntime:
                rt.sweep_at = inf  # type: ignore[attr-defined]
        self.__dict__["_pm_read"] = {}
        rts_ = self._rts
        keys = list(rts_)
        if keys != sorted(keys):  # (a profile re-added since: in index order again)
            self._rts = dict(sorted(rts_.items()))
        self._clocks = dict.fromkeys(self._clocks)
        for clock in self._clock_users:
            self._clocks.setdefault(clock, None)
        self.now = None
        self._seq = 0
        self.reset_output()


def _key_of(per: tuple[str, ...], attrs: dict[str, Any]) -> PartKey | None:
    """`Runtime.partition_key` for a `per`."""
    vals = []
    for a in per:
        v = attrs.get(a)
        if v is None:
            return None
        vals.append((bool, v) if v.__class__ is bool else v)
    return tuple(vals)


def _leaf_filters(rt: Runtime) -> list[Any]:
    """The filters of every component of a stateful runtime (clock components have none)."""
    if isinstance(rt, (CompositeRuntime, LazySeqRuntime)):
        return [lf.filter for lf in rt.pat.leaves if lf.clock is None]
    if isinstance(rt, AbsentRuntime):
        expr = rt.profile.expr
        assert isinstance(expr, Absent)
        return [expr.filter]
    return []
