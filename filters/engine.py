"""The single-step composite engine (CompAS).

Only the components that can *start* a profile sit in the primitive pool
permanently. When a partial match (PM) advances, the components it now waits
for are inserted as *auxiliary profiles*: the component's filter plus the
partition's values (`per`) and the where-equalities bound so far, as indexed
equality predicates. The PM's window end goes into the temporal pool as a
*terminator*. When the last component's event is filtered, the pool hands it
straight to the waiting PM and the notification is produced in the same
step — there is no separate composite pool.

The engine is pure: no I/O and no clock. Time advances with the events and
with `advance()`. Semantics: docs/language.md and docs/semantics.md.
"""

from __future__ import annotations

import datetime as dt
import io
import pickle
from collections.abc import Callable, Hashable, Iterable, Mapping
from operator import itemgetter
from typing import Any
from zoneinfo import ZoneInfo

from filters import state as state_format
from filters.caps import CapCounts, Caps
from filters.eager.auxiliary import VARIANTS, AuxiliaryRegistrations
from filters.eager.composite import CompositeRuntime
from filters.eager.matches import PartialMatch, Partition
from filters.localclock import LocalClock
from filters.notification import Notification
from filters.output import NotificationOutput
from filters.partstate import PartitionState
from filters.pattern import Pattern as Pattern  # re-exported: adapters.spark.live shares it
from filters.plans.choose import MODES, Rates
from filters.plans.replan import PlanSwitching
from filters.pool.primitive import Entry, PrimitivePool, owners_by_profile
from filters.rarefirst.lazy import LazySeqRuntime
from filters.rarefirst.lazy_base import LazyPartition
from filters.restore import Skipped, leave_out_gone
from filters.runtime import AbsentRuntime, Binding, FilterRuntime, Handle, Runtime
from filters.temporal import TemporalPool, TimeDriven
from profiles.ast import Absent, Clock, Profile
from profiles.events import Event

Tracer = Callable[[str, str, str], None]  # (profile id, action, detail)

# `[leaf]` for the usual leaf numbers, shared: the `leaves` of an event that matched one leaf
# of a profile (runtimes never change them, see `Engine._fan_out`)
_NONE = 64
_ONE: tuple[list[int], ...] = tuple([i] for i in range(_NONE))
_first = itemgetter(0)
_ASK = 32  # the events an entry with one owner sees before `Engine.process` asks for its `sink`


class ProfileRefPickler(pickle.Pickler):
    """Stores profiles as references to their id."""

    def persistent_id(self, obj: Any) -> str | None:
        return obj.id if obj.__class__ is Profile else None


class _ProfileRefUnpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, profiles: Mapping[str, Profile]) -> None:
        super().__init__(f)
        self.profiles = profiles

    def find_class(self, module: str, name: str) -> Any:
        """Version 1 names classes by their Python path: those of ENS 0.1 map to this release's."""
        moved = _V1_CLASSES.get((module, name))
        return moved if moved is not None else super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Profile:
        try:
            return self.profiles[pid]
        except KeyError:
            raise KeyError(
                f"the snapshot refers to profile {pid!r}, which was not supplied"
            ) from None


def load_pickle(data: bytes, profiles: Mapping[str, Profile]) -> Engine:
    """Version 1 of the state format: the pickled engine (ENS 0.1)."""
    eng = _ProfileRefUnpickler(io.BytesIO(data), profiles).load()
    if not isinstance(eng, Engine):
        raise TypeError("not an engine snapshot")
    return eng


class Engine(PlanSwitching, TimeDriven, NotificationOutput, CapCounts, PartitionState):
    """Deterministic event filtering: add/remove profiles, process events, advance time, take notifications.

    >>> eng = Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")])
    >>> eng.process(Event("a1", 0.0, {"k": "A"})); eng.process(Event("b1", 5.0, {"k": "B"}))
    >>> [n.to_json() for n in eng.take_notifications()]
    [{'profile': 'p', 'ts': 5.0, 'events': {'a': 'a1', 'b': 'b1'}}]
    """

    VARIANTS = ("dynamic", "marking", "references")
    DEFAULT_VARIANT = "references"  # the fastest: docs/benchmarks.md, docs/paper.md
    tz: ZoneInfo

    def __init__(
        self,
        profiles: Iterable[Profile] = (),
        *,
        tz: str = "UTC",
        variant: str = DEFAULT_VARIANT,
        plan: str = "eager",
        rates: Rates | None = None,
        replan_every: int = 0,
        drift: float = 4.0,
        sample: int = 8,
        timers: TemporalPool | None = None,
        caps: Caps | None = None,
    ) -> None:
        """`plan`: eager, rare-first or auto (chosen from `rates`), per profile: docs/plans.md.

        Online rates (plan auto): with `replan_every` > 0 the engine counts, for one event in
        `sample`, which components of the profiles that could go rare-first it matches; every
        `replan_every` events, a profile whose rates moved by `drift` (a factor) since its plan
        was chosen is planned again from them (`replan`: its state moves with it). Counting
        is by arrival number, so a replay decides the same way.

        `timers`: the temporal pool to schedule in (an empty one; Spark's slices give their own).
        `caps`: the limits on each profile's partial matches and notifications per event
        (`filters.caps`; not stored in snapshots: `set_caps` after a restore).
        """
        if variant not in self.VARIANTS:
            raise ValueError(f"unknown variant {variant!r} (one of {', '.join(self.VARIANTS)})")
        if plan not in MODES:
            raise ValueError(f"unknown plan {plan!r} (one of {', '.join(MODES)})")
        self.variant = variant
        self.plan = plan
        self.rates = rates
        if replan_every < 0 or sample < 1 or drift < 1.0:
            raise ValueError("replan_every >= 0, sample >= 1 and drift >= 1 are required")
        self.replan_every, self.drift, self.sample = replan_every, drift, sample
        self._online: dict[
            str, dict[str, float]
        ] = {}  # profile id -> online rates its plan came from
        self._counts: dict[Hashable, int] = {}  # (runtime, leaf) -> sampled matches
        self._count_since: float | None = None
        self._counted: dict[int, tuple[str, ...]] = {}  # runtime -> its counted components' names
        self._count_pool = PrimitivePool() if replan_every else None
        self.pool = PrimitivePool()
        # how auxiliary profiles enter and leave the pool (`filters.eager.auxiliary`)
        self.aux: AuxiliaryRegistrations = VARIANTS[variant](self.pool)
        self.timers = timers if timers is not None else TemporalPool()
        self.tz = ZoneInfo(tz)
        self._local: LocalClock | None = None  # localtime/weekday, once a profile uses them
        self.now: float | None = None
        self.tracer: Tracer | None = None
        self.trace_only: str | None = None
        self._rts: dict[int, Runtime] = {}
        self._by_id: dict[str, Runtime] = {}
        self._next_idx = 0
        self._seq = 0
        NotificationOutput.__init__(self)
        CapCounts.__init__(self, caps)
        self._clocks: dict[Clock, Handle | None] = {}  # clock -> its scheduled temporal entry
        self._clock_users: dict[Clock, dict[int, CompositeRuntime]] = {}
        for p in profiles:
            self.add_profile(p)

    # ------------------------------------------------------------ profiles
    def add_profile(self, profile: Profile) -> None:
        if profile.id in self._by_id:
            raise ValueError(f"profile {profile.id!r} is already active")
        idx = self._next_idx
        self._next_idx += 1
        self._local = LocalClock.of(self._local, self.tz, (profile,))
        rt = self._runtime(profile, idx)
        self._rts[idx] = rt
        self._by_id[profile.id] = rt
        self._register_starts(rt)
        self._count_leaves(rt, add=True)
        if isinstance(rt, CompositeRuntime):
            for clock in rt.clocks:
                self._clock_users.setdefault(clock, {})[idx] = rt
                if clock not in self._clocks:
                    self._clocks[clock] = None
                    if self.now is not None:
                        self._schedule_clock(clock, self.now)
        rt.activate(self.now)
        if "_base" in self.__dict__:  # used by partition (`filters.partstate`)
            self.profile_added(rt)

    def _register_starts(self, rt: Runtime) -> None:
        """The profile's starting components into the pool, then (a composite) its auxiliary
        profiles prepared or pinned (after: a start's filter is then the pool's own entry)."""
        self._add_starts(rt)
        if isinstance(rt, CompositeRuntime):
            rt.prepare_aux(self.aux)

    def _add_starts(self, rt: Runtime) -> None:
        """The profile's starting components into the pool."""
        pool, idx = self.pool, rt.idx
        # one owner object per leaf, the one the pool keeps: a release then finds it in the
        # owners dict by identity (no second tuple to read and compare); a composite's own
        # (`owners`), which its auxiliary registrations use too
        mine = rt.owners if isinstance(rt, CompositeRuntime) else None
        held = []
        for f, leaf in rt.start_registrations():
            owner = mine[leaf] if mine is not None else (idx, leaf)
            held.append((pool.add(f, owner), owner))
        rt.starts = tuple(held)

    def release_starts(self, rt: Runtime) -> None:
        """`rt`'s starting entries leave the pool: the profile goes, changes plan, or (its
        runtime's `opens_once`) stays but no starting event can do anything for it any more."""
        held = rt.starts
        if held:
            rt.starts = ()
            self.pool.release_all(held)

    def _runtime(self, profile: Profile, idx: int) -> Runtime:
        if profile.is_filter:
            return FilterRuntime(self, profile, idx)
        if isinstance(profile.expr, Absent):
            return AbsentRuntime(self, profile, idx)
        plan = self.plan_of(profile) if self.plan != "eager" else None
        if plan is not None and plan.lazy:
            return self._lazy_runtime(profile, idx, plan.driver)
        return self._eager_runtime(profile, idx)

    def _lazy_runtime(self, profile: Profile, idx: int, driver: int | None) -> LazySeqRuntime:
        return LazySeqRuntime(self, profile, idx, driver)

    def _eager_runtime(self, profile: Profile, idx: int) -> CompositeRuntime:
        return CompositeRuntime(self, profile, idx)

    def remove_profile(self, profile_id: str) -> None:
        rt = self._by_id.get(profile_id)
        if rt is None:
            raise KeyError(f"no active profile {profile_id!r}")
        if "_base" in self.__dict__:
            self.profile_removed(rt)
        self.deactivate(rt)

    def deactivate(self, rt: Runtime) -> None:
        """Take `rt` out: starting entries, state (`clear`), clocks. A `once` profile calls it
        when it reports (a paper closing event completes 2,000-10,000): few, direct steps."""
        if not rt.active:
            return
        rt.active = False
        idx = rt.idx
        del self._by_id[rt.pid]
        del self._rts[idx]
        self.release_starts(rt)
        if self._count_pool is not None:  # online re-planning counts the profile's leaves
            self._count_leaves(rt, add=False)
        if self._online:
            self._online.pop(rt.pid, None)
        rt.clear()
        if isinstance(rt, CompositeRuntime) and rt.clock_leaves:
            _drop_clock_user(self, rt)

    @property
    def profiles(self) -> list[Profile]:
        return [rt.profile for rt in self._rts.values()]

    # ---------------------------------------------------------------- time
    def _start(self, t: float) -> None:
        self.now = t
        for clock in self._clocks:
            self._schedule_clock(clock, t)
        for rt in list(self._rts.values()):
            rt.activate(t)

    def _fire_clock(self, clock: Clock, when: float) -> None:
        self._clocks[clock] = None
        utc = dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ev = Event(f"clock:{utc}", when, {})
        self._seq += 1
        seq = self._seq
        for idx in sorted(self._clock_users.get(clock, {})):
            rt = self._rts.get(idx)
            if rt is not None and isinstance(rt, CompositeRuntime):
                if self.tracer is not None:
                    self._current = ev
                rt.on_clock(ev, seq, clock)
        if clock in self._clock_users:
            self._schedule_clock(clock, when + 60.0)

    # --------------------------------------------------------------- events
    def process(self, event: Event) -> None:
        """Filter one event (after firing everything that is due before it)."""
        ts = event.ts
        now = self.now
        if now is None or self.timers.head <= ts:
            self.advance(ts)
        elif ts > now:
            self.now = ts
        seq = self._seq = self._seq + 1
        if self._local is not None:  # localtime/weekday as attributes (filters.localclock)
            event = self._local.event(event)
        if self._count_pool is not None:
            self._sampled(event, seq)
        tracer = self.tracer
        if tracer is not None:
            self._current = event
        entries = self.pool.match(event.attrs)
        if not entries:
            return
        if len(entries) == 1:
            entry = entries[0]
            solo = entry.solo  # set only while the entry has one owner
            if solo and tracer is None and solo(event, seq):
                return
            owners = entry.owners
            if len(owners) == 1:
                idx: int
                leaf: int
                ((idx, leaf),) = owners  # type: ignore[misc]  # owners: (profile index, leaf)
                rt = self._rts.get(idx)
                if rt is not None:
                    if solo is None:  # a handler (`sink`) from an entry's _ASK-th event on:
                        hits = entry.hits = entry.hits + 1  # most entries of a spread
                        if hits >= _ASK:  # workload see a few, and one costs a closure
                            solo = entry.solo = (rt.has_sink and rt.sink(leaf)) or False
                            if solo and solo(event, seq):  # (made once per leaf, asked again
                                return  # after every change of the entry's owners)
                    rt.on_event(event, seq, _ONE[leaf] if leaf < _NONE else [leaf])
                return
            if not owners:  # an auxiliary profile kept in the pool while nobody waits on it
                return
        if tracer is None and self._report_plain(entries, event):
            return
        self._fan_out(entries, event, seq)

    def _sampled(self, event: Event, seq: int) -> None:
        """Online rates (``replan_every`` > 0): count one event in ``sample``, re-plan every
        ``replan_every`` events."""
        if not seq % self.sample:
            self._count(event)
        if not seq % self.replan_every:
            self._online_replan(event.ts)  # between events: the state moves with a re-plan

    def _fan_out(self, entries: list[Entry], event: Event, seq: int) -> None:
        """The event to each owner profile once, with the leaves it matched (sorted), in profile
        order (the notifications' order). One leaf: a shared `[leaf]` (`_ONE`; a closing event
        reaches thousands of profiles): runtimes only read `leaves`, never change or keep it."""
        rts = self._rts
        if len(entries) > 1:
            for idx, leaves in owners_by_profile(entries):
                rt = rts.get(idx)
                if rt is not None and rt.active:
                    rt.on_event(event, seq, leaves)
            return
        # one filter (a closing event waited for by many): `owners_by_profile` without a list
        # per profile; sorted by profile index alone (ints: the sort's fast path), leaves below
        owners: list[tuple[int, int]] = sorted(entries[0].owners, key=_first)  # type: ignore[arg-type]
        i, n = 0, len(owners)
        while i < n:
            idx, leaf = owners[i]
            i += 1
            if i < n and owners[i][0] == idx:
                leaves = [leaf]
                while i < n and owners[i][0] == idx:
                    leaves.append(owners[i][1])
                    i += 1
                leaves.sort()
            else:
                leaves = _ONE[leaf] if leaf < _NONE else [leaf]
            rt = rts.get(idx)
            if rt is not None and rt.active:
                rt.on_event(event, seq, leaves)

    def _report_plain(self, entries: list[Entry], event: Event) -> bool:
        """The reporting fast path: when every matched entry is owned by plain filter profiles
        only (no `once`), their notifications are built here in one pass, in profile order (what
        the general dispatch produces, without a runtime call per profile). False: not the case."""
        hits: list[tuple[int, str, str | None]] = []
        for entry in entries:
            owners = entry.fanout
            if owners is None:
                owners = entry.fanout = self._plain_owners(entry)
            if owners is False:  # (`()`: an entry nobody owns, e.g. a pinned one, adds nothing)
                return False
            hits += owners
        if len(hits) > 1:
            hits.sort()  # profile indices are unique: tuples compare on them alone
        out = self._out
        n = self._nseq
        ts = event.ts
        for _, pid, subscriber in hits:
            n += 1
            out.append(Notification(pid, ts, {"e": event}, None, n, subscriber))
        self._nseq = n
        return True

    def _plain_owners(self, entry: Entry) -> tuple[tuple[int, str, str | None], ...] | bool:
        """(profile index, id, subscriber) of the entry's owners if all are plain filter
        profiles that report every match; False otherwise."""
        out = []
        idx: int
        for idx, _leaf in entry.owners:  # type: ignore[misc]  # owners: (profile index, leaf)
            rt = self._rts.get(idx)
            if rt is None or rt.__class__ is not FilterRuntime or rt.once or not rt.active:
                return False
            out.append((idx, rt.pid, rt.subscriber))
        return tuple(out)

    def bound_duplicate(self, profile_id: str, event: Event) -> str | None:
        """Which bound component of which partial match `event` duplicates (see `ens explain`)."""
        rt = self._by_id.get(profile_id)
        if self._local is not None:
            event = self._local.event(event)
        return rt.bound_duplicate(event) if isinstance(rt, CompositeRuntime) and rt.active else None

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, int]:
        pms = parts = 0
        for rt in self._rts.values():
            a, b = rt.live()
            pms += a
            parts += b
        return {
            "profiles": len(self._rts),
            "partial_matches": pms,
            "partitions": parts,
            "pool_filters": len(self.pool),
            "pool_owners": self.pool.owner_count,
            "timers": len(self.timers),
        }

    # ------------------------------------------------------------ snapshots
    def snapshot(self, *, profiles_apart: bool = False) -> bytes:
        """The whole engine state (partial matches, timers, profiles) as versioned plain data
        (`filters.state`: a header with the format's name and version, no pickled classes).

        With `profiles_apart` the profiles are referred to by id and not stored (they do not
        change between snapshots; with 10^6 profiles they are most of the bytes): `restore`
        then needs them passed in.
        """
        return state_format.dump(self, profiles_apart=profiles_apart)

    @staticmethod
    def restore(data: bytes, profiles: Mapping[str, Profile] | None = None) -> Engine:
        """An engine from `snapshot()` (any version this release reads, the old pickle included);
        the pool is rebuilt from the state. `profiles` (id -> profile) resolves a `profiles_apart`
        snapshot; state of a profile it lacks is left out (`restore_reporting`). Unreadable
        state raises `StateError`."""
        return Engine.restore_reporting(data, profiles)[0]

    @staticmethod
    def restore_reporting(
        data: bytes, profiles: Mapping[str, Profile] | None = None
    ) -> tuple[Engine, Skipped]:
        """`restore`, and what it left out (`filters.restore`): the caller logs and counts it."""
        eng = state_format.load(data, profiles, legacy=load_pickle, missing={})
        if not isinstance(eng, Engine):
            raise state_format.StateError("not an engine snapshot")
        skipped = eng.__dict__.pop("_skipped", None)
        return eng, skipped if isinstance(skipped, Skipped) else Skipped()

    def __getstate__(self) -> dict[str, Any]:
        return _snapshot_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        _rebuild(self, state)

    def trace(self, profile_id: str, action: str, detail: str) -> None:
        """Report one step of `profile_id` to the tracer (`ens explain`), if it is traced."""
        if self.tracer is not None and (self.trace_only is None or self.trace_only == profile_id):
            self.tracer(profile_id, action, detail)


def _drop_clock_user(eng: Engine, rt: CompositeRuntime) -> None:
    """A removed profile's clocks: a clock nobody waits for any more leaves the timers."""
    for clock in rt.clocks:
        users = eng._clock_users.get(clock)
        if users is not None:
            users.pop(rt.idx, None)
            if not users:
                del eng._clock_users[clock]
                eng.timers.discard(eng._clocks.pop(clock, None))


for _name, _cls in (
    ("engine", Engine),
    ("binding", Binding),
    ("partial-match", PartialMatch),
    ("partition", Partition),
    ("filter-runtime", FilterRuntime),
    ("absent-runtime", AbsentRuntime),
    ("composite-runtime", CompositeRuntime),
    ("lazy-seq-runtime", LazySeqRuntime),
    ("lazy-partition", LazyPartition),
):
    state_format.register(_name, _cls)

# Version 1 snapshots (pickles) name classes by Python path: where ENS 0.1 had them.
_V1_CLASSES: dict[tuple[str, str], type] = {
    ("filters.engine", "_B"): Binding,
    ("filters.engine", "_PM"): PartialMatch,
    ("filters.engine", "_Partition"): Partition,
    ("filters.engine", "_FilterRuntime"): FilterRuntime,
    ("filters.engine", "_AbsentRuntime"): AbsentRuntime,
    ("filters.engine", "_CompositeRuntime"): CompositeRuntime,
    ("filters.lazy", "_LPart"): LazyPartition,
    # modules moved into subpackages (issue 38): a v1 pickle names them where they were
    ("filters.lazy", "LazySeqRuntime"): LazySeqRuntime,
    ("filters.plans", "Rates"): Rates,
}


def _snapshot_state(eng: Engine) -> dict[str, Any]:
    """`Engine.__getstate__`: The state without what can be rebuilt: the pool, and runtimes that hold only a profile
    (most of them, with many profiles: a snapshot then costs what is in flight)."""
    state = eng.__dict__.copy()
    state.pop("_skipped", None)  # (a restore's report, taken by `restore_reporting`)
    state.pop("_base", None)  # compiled set and reach pool (`filters.partstate`): rebuilt
    state.pop("_reach", None)
    state.pop("_pers", None)
    del state["pool"]
    del state["aux"]
    del state["_by_id"]
    state.pop("_count_pool", None)
    for k in ("cap_partition", "cap_profile", "cap_notifications", "cap_hits"):
        del state[k]  # configuration and counts taken per batch, not state
    state["tracer"] = None
    state["tz"] = eng.tz.key
    del state["_local"]  # rebuilt from the profiles
    kept: dict[int, Runtime] = {}
    fresh: list[tuple[int, Profile]] = []
    for idx, rt in eng._rts.items():
        if rt.fresh():
            fresh.append((idx, rt.profile))
        else:
            kept[idx] = rt
    state["_rts"], state["_fresh"] = kept, fresh
    return state


def _rebuild(eng: Engine, state: dict[str, Any]) -> None:
    """`Engine.__setstate__`: the state back, and what `_snapshot_state` left out rebuilt."""
    skipped = leave_out_gone(state)  # profiles not supplied: before the pool is rebuilt
    if skipped:
        state["_skipped"] = skipped
    fresh = state.pop("_fresh", ())
    eng.__dict__.update(state)
    for k, v in (
        ("_online", {}),
        ("_counts", {}),
        ("_count_since", None),
        ("_counted", {}),
    ):  # older
        eng.__dict__.setdefault(k, v)
    eng.tz = ZoneInfo(state["tz"])
    CapCounts.__init__(eng)
    eng.pool = PrimitivePool()
    eng.aux = VARIANTS[eng.variant](eng.pool)
    for idx, profile in fresh:
        eng._rts[idx] = eng._runtime(profile, idx)
    eng._rts = dict(sorted(eng._rts.items()))
    eng._by_id = {rt.profile.id: rt for rt in eng._rts.values()}
    eng._local = LocalClock.of(None, eng.tz, (rt.profile for rt in eng._rts.values()))
    eng._count_pool = PrimitivePool() if eng.replan_every else None
    eng._counted = {}
    for rt in eng._rts.values():
        eng._count_leaves(rt, add=True)
        eng._register_starts(rt)
        if isinstance(rt, CompositeRuntime):
            rt.restore_registrations(eng.aux)
