"""Plans per profile, and moving a profile's state between the eager and rare-first runtimes.

`PlanSwitching` is the part of `filters.engine.Engine` that chooses, per composite profile,
eager or rare-first evaluation (`filters.plans.choose`, from given rates or rates counted
online on a sample of the events) and converts a runtime when its plan changes, its state
moving with it (`eager_to_lazy`, `lazy_to_eager`): no match in flight is lost or reported
twice.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from filters.eager.composite import CompositeRuntime
from filters.eager.matches import PartialMatch, Partition
from filters.pattern import Pattern
from filters.plans.choose import MODES, Plan, Rates, choose, lazy_shape
from filters.pool.primitive import PrimitivePool
from filters.rarefirst.lazy import LazySeqRuntime
from filters.rarefirst.lazy_base import LazyPartition
from filters.runtime import AbsentRuntime, Binding, FilterRuntime, Runtime, shared
from profiles.ast import Absent, Profile
from profiles.events import Event


def _drifted(old: Mapping[str, float], new: Mapping[str, float], factor: float) -> bool:
    """Did any component's rate move by `factor` or more (a rate from or to 0 always has)?"""
    for k, r in new.items():
        o = old.get(k, 0.0)
        lo, hi = min(o, r), max(o, r)
        if hi and (not lo or hi / lo >= factor):
            return True
    return False


class PlanSwitching:
    """Plan choice, online rates and runtime conversion of the engine (mixed into `Engine`)."""

    plan = "eager"  # class defaults: snapshots written before plans existed restore eager
    rates: Rates | None = None
    replan_every = 0
    drift = 4.0
    sample = 8
    _count_pool: PrimitivePool | None = None
    now: float | None
    tracer: Callable[[str, str, str], None] | None
    _rts: dict[int, Runtime]
    _by_id: dict[str, Runtime]
    _online: dict[str, dict[str, float]]  # profile id -> online rates its plan came from
    _counts: dict[Hashable, int]  # (runtime, leaf) -> sampled matches
    _count_since: float | None
    _counted: dict[int, tuple[str, ...]]  # runtime -> its counted components' names

    def _register_starts(self, rt: Runtime) -> None:
        raise NotImplementedError

    def _lazy_runtime(self, profile: Profile, idx: int, driver: int | None) -> LazySeqRuntime:
        raise NotImplementedError

    def _eager_runtime(self, profile: Profile, idx: int) -> CompositeRuntime:
        raise NotImplementedError

    def release_starts(self, rt: Runtime) -> None:
        raise NotImplementedError

    def trace(self, profile_id: str, action: str, detail: str) -> None:
        raise NotImplementedError

    def replan(self, plan: str | None = None, rates: Rates | None = None) -> list[str]:
        """Change the plan mode and/or the rates; convert the runtimes whose plan changes.

        The state moves with them (`filters.rarefirst.lazy.eager_to_lazy` / `lazy_to_eager`): no match
        in flight is lost or reported twice. Returns the ids of the profiles converted.
        """
        if plan is not None:
            if plan not in MODES:
                raise ValueError(f"unknown plan {plan!r} (one of {', '.join(MODES)})")
            self.plan = plan
        if rates is not None:
            self.rates = rates
        changed = []
        for idx, rt in list(self._rts.items()):
            if isinstance(rt, (FilterRuntime, AbsentRuntime)):
                continue
            if self._follow_plan(idx, rt):
                changed.append(rt.profile.id)
        return changed

    def _follow_plan(self, idx: int, rt: Runtime) -> bool:
        """Convert `rt` if its plan (eager, or rare-first and its driver) changed."""
        plan = self.plan_of(rt.profile) if self.plan != "eager" else None
        lazy = plan is not None and plan.lazy
        was_lazy = not isinstance(rt, CompositeRuntime)
        if lazy and was_lazy and rt.k != plan.driver:  # type: ignore[attr-defined, union-attr]
            self._swap(idx, rt, False)  # another driver: through the eager form
            rt, was_lazy = self._rts[idx], False
        if lazy == was_lazy:
            return False
        self._swap(idx, rt, lazy, plan.driver if plan is not None else None)
        return True

    def configure_plans(
        self, plan: str, rates: Rates | None, replan_every: int = 0, drift: float = 4.0
    ) -> list[str]:
        """Apply plan options to an engine restored from a snapshot taken under other ones.

        The state is converted where a profile's plan changes (`replan`); online counting
        starts afresh when it is switched on.
        """
        if replan_every < 0 or drift < 1.0:
            raise ValueError("replan_every >= 0 and drift >= 1 are required")
        if replan_every and self._count_pool is None:
            self._count_pool = PrimitivePool()
            self.replan_every = replan_every
            for rt in self._rts.values():
                self._count_leaves(rt, add=True)
        elif not replan_every:
            self._count_pool = None
            self._counts, self._count_since, self._online, self._counted = {}, None, {}, {}
        self.replan_every, self.drift = replan_every, drift
        self.rates = rates
        return self.replan(plan)

    def _swap(self, idx: int, rt: Runtime, lazy: bool, driver: int | None = None) -> None:
        self.release_starts(rt)
        new: Runtime
        if lazy:
            assert isinstance(rt, CompositeRuntime)
            new = self._lazy_runtime(rt.profile, idx, driver)
            eager_to_lazy(rt, new)
            rt.clear()  # terminators and auxiliary profiles out of the pools
        else:
            assert isinstance(rt, LazySeqRuntime)
            new = self._eager_runtime(rt.profile, idx)
            lazy_to_eager(rt, new, self.now)
        rt.active = False
        self._rts[idx] = new
        self._by_id[rt.profile.id] = new
        self._register_starts(new)

    def plan_of(self, profile: Profile) -> Plan:
        """How `profile` is (or would be) evaluated by this engine, and why (`ens explain`)."""
        if profile.is_filter or isinstance(profile.expr, Absent):
            return choose(profile, self.plan, [], [], self.rates)
        pat = Pattern.build(profile)
        leaves = [lf for lf in pat.leaves if lf.clock is None]
        rates = self.rates
        online = self._online.get(profile.id) if self._online else None
        if online is not None:
            rates = Rates(
                {"profiles": {profile.id: {k: {"rate_per_hour": r} for k, r in online.items()}}}
            )
        return choose(
            profile, self.plan, [lf.name for lf in leaves], [lf.filter for lf in leaves], rates
        )

    # ---------------------------------------------------------- online rates
    def _count_leaves(self, rt: Runtime, add: bool) -> None:
        """Keep the counting pool in step: the leaves of profiles that could go rare-first."""
        cp = self._count_pool
        if cp is None or isinstance(rt, (FilterRuntime, AbsentRuntime)) or lazy_shape(rt.profile):
            return
        leaves = Pattern.build(rt.profile).leaves
        for i, lf in enumerate(leaves):
            if add:
                cp.add(lf.filter, (rt.idx, i))
            else:
                cp.remove(lf.filter, (rt.idx, i))
                self._counts.pop((rt.idx, i), None)
        if add:
            self._counted[rt.idx] = shared(tuple(lf.name for lf in leaves))
        else:
            self._counted.pop(rt.idx, None)

    def _count(self, event: Event) -> None:
        if self._count_since is None:
            self._count_since = event.ts
        counts = self._counts
        for entry in self._count_pool.match(event.attrs):  # type: ignore[union-attr]
            for owner in entry.owners:
                counts[owner] = counts.get(owner, 0) + 1

    def _online_replan(self, now: float) -> None:
        """Plan again every profile whose counted rates drifted by `drift` since its plan."""
        since = self._count_since
        if since is None or now <= since:
            return
        scale = self.sample * 3600.0 / (now - since)
        changed = []
        for idx, names in list(self._counted.items()):  # the profiles that could go rare-first
            rt = self._rts[idx]
            rates = {name: self._counts.get((idx, i), 0) * scale for i, name in enumerate(names)}
            old = self._online.get(rt.profile.id)
            if old is not None and not _drifted(old, rates, self.drift):
                continue
            self._online[rt.profile.id] = rates
            if self.plan != "eager" and self._follow_plan(idx, rt):
                changed.append(rt.profile.id)
        self._counts.clear()
        self._count_since = now
        if changed and self.tracer is not None:
            for pid in changed:
                self.trace(pid, "replanned", self.plan_of(self._by_id[pid].profile).reason)


# ------------------------------------------------------------------ re-planning


def eager_to_lazy(old: CompositeRuntime, new: LazySeqRuntime) -> None:
    """Move an eager runtime's partial matches into `new`'s buffers (the engine re-plans).

    Lossless: under `each` the eager PMs are every valid prefix of buffered events, so the
    events they bind, per component, are the buffers (an event bound by no PM can never
    be: every earlier event it could follow was there when it arrived); under `first` the
    one PM is the opener and its bindings. `old` is cleared afterwards by the caller.
    """
    n = new.n
    for key, part in old.parts.items():
        pms = [pm for pm in part.pms if pm.alive]
        if not pms:
            continue
        lp = LazyPartition(part.values, n)
        if new.each:
            k = new.k
            ahead = [pm for pm in pms if pm.binds[k] is None]  # before the driver: buffered
            for j in range(k):
                seen: dict[int, Binding] = {}
                for pm in ahead:
                    x = pm.binds[j]
                    if x is not None:
                        seen[x.seq] = x
                lp.bufs[j] = [seen[s] for s in sorted(seen)]
            lp.pend = [
                [x for x in pm.binds if x is not None] for pm in pms if pm.binds[k] is not None
            ]
        else:
            pm = pms[0]
            lp.opener = pm.binds[0]
            for j in range(1, n - 1):
                x = pm.binds[j]
                if x is None:
                    break
                lp.bufs[0].append(x)
        new.parts[key] = lp


def lazy_to_eager(old: LazySeqRuntime, new: CompositeRuntime, now: float | None) -> None:
    """Rebuild, in the eager runtime `new`, the partial matches `old`'s state stands for.

    Every PM alive at `now` (first.ts + T >= now): under `first` the tracked one, under
    `each` every valid prefix of buffered events in arrival order (the conjuncts checked at
    each binding). `new.add_pm` gives each its terminator and auxiliary profiles.
    """
    n, w = old.n, old.window
    for key, lp in old.parts.items():
        part = Partition(key, lp.values)
        made: list[list[Binding]] = []
        if not old.each:
            op = lp.opener
            if op is not None and (now is None or op.ev.ts + w >= now):
                made.append([op, *lp.bufs[0]])
        else:
            made = _prefixes(old, lp.bufs, now)
            made.extend(pm for pm in lp.pend if now is None or min(x.ev.ts for x in pm) + w >= now)
        if not made:
            continue
        new.parts[key] = part
        for binds in made:
            pm = PartialMatch(n, part)
            for j, x in enumerate(binds):
                pm.binds[j] = x
            pm.mask = (1 << len(binds)) - 1
            new.add_pm(part, pm)


def _prefixes(
    rt: LazySeqRuntime, bufs: list[list[Binding]], now: float | None
) -> list[list[Binding]]:
    """Every valid prefix (components 0..j, j < the driver) of buffered events alive at `now`."""
    n, w, names, conjs = rt.k + 1, rt.window, rt.names, rt.conjs
    made: list[list[Binding]] = []
    stack: list[Binding] = []
    attrs: dict[str, dict[str, Any]] = {}

    def dfs(j: int, prev: int) -> None:
        if j == n - 1:
            return
        for x in bufs[j]:
            if x.seq <= prev:
                continue
            if j == 0 and now is not None and x.ev.ts + w < now:
                continue  # its window ended: eagerly, its PMs expired
            attrs[names[j]] = x.ev.attrs
            if conjs[j] and not all(c.fn(attrs) for c in conjs[j]):
                continue
            stack.append(x)
            made.append(list(stack))
            dfs(j + 1, x.seq)
            stack.pop()
        attrs.pop(names[j], None)

    dfs(0, -1)
    return made
