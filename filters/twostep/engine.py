"""The classic two-step engine: the baseline CompAS is measured against.

Step 1 filters every event against *all* component filters of every profile
(every leaf, positive and negated), which stay in the primitive pool for the
profile's whole life. Step 2 hands the matches to a separate composite pool:
per profile and partition it keeps *binding lists* (the events matched per
component inside the window; profiles without a window keep none, nothing
could prune them and events bind on arrival) and the partial matches (PMs),
and evaluates the composites. Nothing flows back into the primitive pool, so
an event that matches a component is evaluated for every profile that has
that component, whether or not a partial match waits for it: the cost the
single-step engine avoids.

Written from docs/language.md and docs/semantics.md only (not from filters/engine.py)
so that the differential tests compare two independent readings. The pattern
tree and the questions asked of a PM's bindings are in `filters.twostep.pattern`;
here are the runtimes: `_PartialMatches` keeps a composite's partitions, PMs and
timers, `_CompositeRuntime` evaluates an event in four phases on top of it.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable
from itertools import chain
from typing import Any
from zoneinfo import ZoneInfo

from filters.caps import CapCounts, Caps
from filters.compile import norm
from filters.localclock import LocalClock
from filters.output import NotificationOutput
from filters.pool.primitive import PrimitivePool, owners_by_profile
from filters.temporal import Handle, TemporalPool, TimeDriven
from filters.twostep.pattern import B, Binds, Node, TreePattern, holds, node_done, node_started
from profiles.ast import Absent, Clock, Profile, is_filter
from profiles.events import Event

# ------------------------------------------------------------ runtime state
Key = tuple[Any, ...]  # a partition key (normalised `per` values)
Values = dict[str, Any] | None  # a partition's `per` attributes as they came (None: no `per`)
Completion = tuple[tuple[float, ...], Binds]  # (report order, bindings)


class _PM:
    """A partial match: the positive leaves bound so far, plus negation candidates."""

    __slots__ = ("binds", "cands", "counts", "waiting", "alive", "timers", "part", "seen")

    def __init__(self, binds: Binds, part: _Part) -> None:
        self.binds = binds
        self.cands: list[tuple[int, B]] = []  # negation events waiting for their where verdict
        self.counts: dict[int, int] = {}  # nth: matching events seen per enabled leaf
        self.waiting = False  # all positives bound, waiting for a trailing negation's deadline
        self.alive = True
        self.timers: dict[int, Handle] = {}  # node id -> temporal handle (deadline first)
        self.part = part
        # select last: between-negation events seen while alive (bound or not), which a
        # replacement may put between its events (`_CompositeRuntime._replace`)
        self.seen: list[tuple[int, B]] = []

    def copy(self, binds: Binds) -> _PM:
        pm = _PM(binds, self.part)
        pm.cands = list(self.cands)
        pm.counts = dict(self.counts)
        pm.seen = list(self.seen)
        return pm

    def seqs(self) -> set[int]:
        return {b[0] for b in self.binds if b is not None}

    def empty(self) -> bool:
        return all(b is None for b in self.binds)


class _Part:
    """One partition of one profile: binding lists, partial matches, the nth start counter."""

    __slots__ = ("key", "values", "pms", "lists", "nth", "nth_timer", "npms")

    def __init__(self, key: Key, values: Values) -> None:
        self.key = key
        self.values = values
        self.pms: list[_PM] = []
        self.npms = 0  # alive PMs, `each` copies not merged yet included (the caps count them)
        self.lists: dict[int, deque[B]] = {}
        self.nth = 0
        self.nth_timer: Handle | None = None


class _Runtime:
    """One profile inside the two-step engine."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        self.engine = engine
        self.profile = profile
        self.idx = idx
        self.active = True

    def filters(self) -> Iterable[tuple[Any, int]]:
        """(filter, leaf) pairs that sit in the primitive pool for the profile's whole life."""
        return ()

    def clocks(self) -> Iterable[Clock]:
        return ()

    def activate(self, now: float | None) -> None:
        pass

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        raise NotImplementedError

    def on_timer(self, when: float, arg: Any) -> None:
        pass

    def clear(self) -> None:
        pass

    def live(self) -> tuple[int, int, int]:
        return (0, 0, 0)

    def partition(self, attrs: dict[str, Any]) -> tuple[Key, Values] | None:
        per = self.profile.per
        if not per:
            return (), None
        key = []
        for a in per:
            v = attrs.get(a)
            if v is None:
                return None
            key.append(norm(v))
        return tuple(key), {a: attrs[a] for a in per}

    def report(self, ts: float, events: dict[str, Event], partition: dict[str, Any] | None) -> None:
        eng = self.engine
        eng.emit(self.profile.id, ts, events, partition, self.profile.subscriber)
        if self.profile.once:
            eng._deactivate(self)


class _FilterRuntime(_Runtime):
    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((self.profile.expr, 0),)

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        self.report(ev.ts, {"e": ev}, None)


class _AbsentRuntime(_Runtime):
    """absent(F) within T: one timer per partition, restarted by every F event."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        assert isinstance(profile.expr, Absent) and profile.within is not None
        self.absent = profile.expr
        self.window = profile.within
        self.armed: dict[Key, tuple[Event | None, Values, Handle]] = {}
        self.started = False

    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((self.absent.filter, 0),)

    def activate(self, now: float | None) -> None:
        if now is not None and not self.started:
            self.started = True
            if not self.profile.per:
                self._arm((), None, None, now + self.window)

    def _arm(self, key: Key, values: Values, last: Event | None, at: float) -> None:
        old = self.armed.get(key)
        if old is not None:
            self.engine.timers.discard(old[2])
        self.armed[key] = (last, values, self.engine._timer(at, (self, key)))

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        part = self.partition(ev.attrs)
        if part is None:
            return
        key, values = part
        old = self.armed.get(key)
        if old is not None and old[1] is not None:
            values = old[1]
        self._arm(key, values, ev, ev.ts + self.window)

    def on_timer(self, when: float, key: Any) -> None:
        st = self.armed.pop(key, None)
        if st is None:
            return
        last, values, _ = st
        self.report(when, {"last": last} if last is not None else {}, values)

    def clear(self) -> None:
        for st in self.armed.values():
            self.engine.timers.discard(st[2])
        self.armed.clear()

    def live(self) -> tuple[int, int, int]:
        return (0, len(self.armed), 0)


class _PartialMatches(_Runtime):
    """A composite profile's partitions and partial matches: binding a leaf, timers, dropping,
    resetting and timing out (what `_CompositeRuntime` builds its evaluation on)."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        self.pat = TreePattern(profile)
        self.kind = profile.select.kind
        self.nth = profile.select.n
        self.unique = profile.consume == "unique"
        self.window = profile.within
        self.parts: dict[Key, _Part] = {}
        self.npms = 0  # alive PMs over all partitions (the profile's cap counts them)
        self.has_trailing = bool(self.pat.trailing)
        self.openers = self.pat.starts | frozenset(self.pat.leading)
        # select last: negations between positives, which a replacement must respect (§4.1)
        self.between = (
            frozenset(self.pat.neg - set(self.pat.leading) - set(self.pat.trailing))
            if self.kind == "last"
            else frozenset()
        )
        self.fast = (
            self.pat.flat
            and self.pat.root.kind == "seq"
            and self.kind == "first"
            and profile.where is None
        )

    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((lf.filter, lf.idx) for lf in self.pat.leaves if lf.clock is None)

    def clocks(self) -> Iterable[Clock]:
        return {c for lf in self.pat.leaves if (c := lf.clock) is not None}

    def clock_leaves(self, clock: Clock) -> list[int]:
        return [lf.idx for lf in self.pat.leaves if lf.clock == clock]

    # ------------------------------------------------------------ binding
    def _complete(self, binds: Binds) -> bool:
        """A match to report now (a trailing negation makes the PM wait instead)."""
        return not self.has_trailing and self.pat.done(binds)

    def _try(self, part: _Part, pm: _PM | None, leaf: int, b: B) -> Binds | None:
        """`pm`'s bindings with `leaf` bound to `b` (replacing a binding under `last`),
        or None when a where conjunct fails, a negation candidate blocks, or a leading
        negation blocks the completion."""
        pat = self.pat
        binds: Binds = list(pm.binds) if pm is not None else [None] * len(pat.leaves)
        binds[leaf] = b
        if pat.leaves[leaf].anys:
            pat.drop_losers(binds, leaf)
        env = None
        for c, poss in pat.pos_conj.get(leaf, ()):
            if all(binds[i] is not None for i in poss):
                if env is None:
                    env = pat.env(binds)
                if not holds(c, env):
                    return None
        if pm is None:
            for c in pat.const_conj:
                if not holds(c, {}):
                    return None
        else:
            for x, xb in pm.cands:
                if pat.neg_verdict(x, xb, binds) is True:
                    return None
        if pat.done(binds) and self._completion_blocked(part, binds):
            return None
        return binds

    def _completion_blocked(self, part: _Part, binds: Binds) -> bool:
        """A complete match that a where conjunct over the final match (dropped bindings
        absent) or a leading negation rules out."""
        pat = self.pat
        if pat.late_conj:
            env = pat.env(binds)
            for c, _, _ in pat.late_conj:
                if not holds(c, env):
                    return True
        return bool(pat.leading) and self._leading_blocks(part, binds)

    def _leading_blocks(self, part: _Part, binds: Binds) -> bool:
        """An x of a leading `not x` before the first positive event, within T of the last."""
        bound = [v for v in binds if v is not None]
        first = min(v[0] for v in bound)
        last_ts = max(v[1].ts for v in bound)
        assert self.window is not None  # the parser requires a window with a leading `not`
        lo = last_ts - self.window
        for x in self.pat.leading:
            for xb in part.lists.get(x, ()):
                if xb[0] < first and xb[1].ts >= lo and self.pat.neg_verdict(x, xb, binds) is True:
                    return True
        return False

    # ---------------------------------------------------- partial matches
    def _sync(self, pm: _PM) -> None:
        """Timers follow the bindings: the window from the first bound event, nested windows
        from their own first event (while they are incomplete)."""
        binds = pm.binds
        want: dict[int, float] = {}
        if self.window is not None:
            want[0] = min(b[1].ts for b in binds if b is not None) + self.window
        for n, within in self.pat.timed:
            if node_started(n, binds) and not node_done(n, binds):
                want[n.nid] = min(b[1].ts for i in n.leaves if (b := binds[i]) is not None) + within
        timers = self.engine.timers
        for nid, h in list(pm.timers.items()):
            if want.get(nid) != h[0]:
                timers.discard(h)
                del pm.timers[nid]
        for nid, when in want.items():
            if nid not in pm.timers:
                pm.timers[nid] = self.engine._timer(when, (self, ("pm", pm, nid)))

    def _set(self, pm: _PM, binds: Binds) -> None:
        pm.binds = binds
        pm.waiting = self.has_trailing and self.pat.done(binds)
        self._sync(pm)

    def _drop(self, pm: _PM) -> None:
        if pm.alive:
            pm.part.npms -= 1
            self.npms -= 1
        pm.alive = False
        for h in pm.timers.values():
            self.engine.timers.discard(h)
        pm.timers.clear()

    def _reset(self, pm: _PM, node: Node) -> None:
        """Forget the bindings of a nested composite (its negation fired or its window ended)."""
        if self.kind == "each":
            self._drop(pm)
            return
        binds = list(pm.binds)
        for i in node.leaves:
            binds[i] = None
        under = {lf.idx for lf in self.pat.leaves if node in lf.path}
        pm.cands = [c for c in pm.cands if c[0] not in under]
        pm.counts = {k: v for k, v in pm.counts.items() if k not in under}
        if all(v is None for v in binds):
            self._drop(pm)
        else:
            self._set(pm, binds)

    def _open(self, part: _Part, nb: Binds, b: B) -> bool:
        """Open a PM; one that is complete at once is reported and nothing of it remains."""
        if self._complete(nb):
            self.report(b[1].ts, self.pat.events(nb), part.values)
            if self.unique and self.active:
                for pm in part.pms:
                    if pm.alive and b[0] in pm.seqs():
                        self._drop(pm)
                part.pms = [pm for pm in part.pms if pm.alive]
            return True
        if not self._room(part, ()):
            return False
        if len(part.pms) > part.npms:  # the cap dropped one: keep the list to the alive
            part.pms = [pm for pm in part.pms if pm.alive]
        pm = _PM([None] * len(nb), part)
        self._set(pm, nb)
        part.pms.append(pm)
        self._kept(pm)
        return False

    def _room(self, part: _Part, fresh: Iterable[_PM]) -> bool:
        """Room for one more PM in `part` under the caps (`filters.caps`, the same rule as the
        single-step engine's): at a cap the partition's oldest alive PMs (its list, then the
        copies of this event) are dropped until one fits; a partition with none to drop
        refuses (False). Counted."""
        eng = self.engine
        pid = self.profile.id
        if part.npms < eng.cap_partition and self.npms < eng.cap_profile:
            return True
        for pm in chain(part.pms, fresh):
            if part.npms < eng.cap_partition and self.npms < eng.cap_profile:
                return True
            if pm.alive:
                self._drop(pm)
                eng.count_dropped_pm(pid)
        if self.npms < eng.cap_profile:
            return True
        eng.count_dropped_pm(pid)  # refused
        return False

    def _kept(self, pm: _PM) -> None:
        pm.part.npms += 1
        self.npms += 1

    def _forget_nth(self, part: _Part) -> None:
        part.nth = 0
        if part.nth_timer is not None:
            self.engine.timers.discard(part.nth_timer)
            part.nth_timer = None

    def _negate(self, pm: _PM, neg: list[int], b: B) -> None:
        pat = self.pat
        for x in neg:
            if not pm.alive:
                return
            if x in pat.leading or x not in pat.active_negs(pm.binds):
                continue
            verdict = pat.neg_verdict(x, b, pm.binds)
            if verdict is False:
                continue
            if verdict is None:
                pm.cands.append((x, b))
                continue
            node = pat.leaves[x].parent
            if node is pat.root:
                self._drop(pm)
            else:
                self._reset(pm, node)

    def _tidy(self, part: _Part) -> None:
        if part.pms:
            return
        if part.nth:
            return
        for x in list(part.lists):
            if x not in self.pat.leading or not part.lists[x]:
                del part.lists[x]
        if not part.lists:
            del self.parts[part.key]

    # -------------------------------------------------------------- timers
    def on_timer(self, when: float, arg: Any) -> None:
        if arg[0] == "nth":
            self._nth_timeout(arg[1])
        else:
            self._pm_timeout(when, arg[1], arg[2])

    def _nth_timeout(self, part: _Part) -> None:
        """select nth: the window of the first counted start ended; the count starts over."""
        part.nth_timer = None
        part.nth = 0
        if self.parts.get(part.key) is part:
            self._tidy(part)

    def _pm_timeout(self, when: float, pm: _PM, nid: int) -> None:
        """A PM's window (node 0) or a nested node's window ended: a PM waiting for a trailing
        negation's deadline is reported, others die; a nested node forgets its bindings."""
        h = pm.timers.get(nid)
        if not pm.alive or h is None or h[0] != when:
            return
        del pm.timers[nid]
        part = pm.part
        if nid == 0:
            self._drop(pm)
            if pm.waiting:
                self.report(when, self.pat.events(pm.binds), part.values)
                if not self.active:
                    return
                if self.unique:
                    used = pm.seqs()
                    for other in part.pms:
                        if other.alive and not used.isdisjoint(other.seqs()):
                            self._drop(other)
        else:
            self._reset(pm, self.pat.nodes[nid])
        part.pms = [p for p in part.pms if p.alive]
        if self.parts.get(part.key) is part:
            self._tidy(part)

    def clear(self) -> None:
        for part in self.parts.values():
            for pm in part.pms:
                self._drop(pm)
            self._forget_nth(part)
        self.parts.clear()
        self.npms = 0

    def live(self) -> tuple[int, int, int]:
        pms = sum(len(p.pms) for p in self.parts.values())
        evs = sum(len(lst) for p in self.parts.values() for lst in p.lists.values())
        return (pms, len(self.parts), evs)


class _CompositeRuntime(_PartialMatches):
    """Step 2 for one composite profile: binding lists and partial matches per partition.

    An event's matched leaves go through four phases (`_step`): extend the waiting PMs,
    report the completions, apply negations, open a new PM."""

    # ------------------------------------------------------------- events
    def on_clock(self, ev: Event, seq: int, clock: Clock) -> None:
        leaves = self.clock_leaves(clock)
        if leaves:
            self.on_event(ev, seq, leaves)

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        if self.profile.per:
            got = self.partition(ev.attrs)
            if got is None:
                return
            key, values = got
        else:
            key, values = (), None
        part = self.parts.get(key)
        if part is None:
            if self.openers.isdisjoint(leaves):
                return  # nothing waits for it and nothing can start: the evaluator drops it
            part = self.parts[key] = _Part(key, values)
        b: B = (seq, ev)
        if self.window is not None:
            # binding lists: the events matched per component inside the window (read by
            # leading negations; nothing else needs past events, events bind on arrival)
            lists = part.lists
            lo = ev.ts - self.window
            for i in leaves:
                lst = lists.get(i)
                if lst is None:
                    lst = lists[i] = deque()
                lst.append(b)
                while lst[0][1].ts < lo:
                    lst.popleft()
        if self.fast:
            self._step_fast(part, b, leaves)
        else:
            self._step(part, b, leaves)
        if self.active and not part.pms:
            self._tidy(part)

    def _step_fast(self, part: _Part, b: B, leaves: list[int]) -> None:
        """`_step` for the common shape: a flat seq of positive filters, select first, no where
        (at most one PM, no negations, no candidates). Checked against `_step` by the tests."""
        pms = part.pms
        if pms:
            pm = pms[0]
            binds = pm.binds
            i = binds.index(None)
            if i not in leaves:
                return
            nb = binds.copy()
            nb[i] = b
            if None in nb:
                self._set(pm, nb)
                return
            if self.unique:
                self._drop(pm)
                part.pms = []
            self.report(b[1].ts, self.pat.events(nb), part.values)
            return
        if 0 in leaves:
            nb = [None] * len(self.pat.leaves)
            nb[0] = b
            self._open(part, nb, b)

    def _step(self, part: _Part, b: B, leaves: list[int]) -> None:
        pat = self.pat
        if pat.neg:
            pos = [i for i in leaves if i not in pat.neg]
            neg = [i for i in leaves if i in pat.neg]
        else:
            pos, neg = leaves, []
        touched: set[int] = set()
        completions: list[Completion] = []
        fresh: list[_PM] = []
        if pos:
            self._extend(part, b, pos, touched, completions, fresh)
        consumed = False
        if completions:
            consumed = self._report(part, b, completions, fresh)
            if not self.active:
                return
        if neg:
            self._negate_all(part, b, neg, touched)
        if fresh or not all(pm.alive for pm in part.pms):
            part.pms = [pm for pm in part.pms if pm.alive] + [pm for pm in fresh if pm.alive]
        if consumed or not pos:
            return
        self._start(part, b, pos)

    # ------------------------------------------------------- 1. extend
    def _extend(
        self,
        part: _Part,
        b: B,
        pos: list[int],
        touched: set[int],
        completions: list[Completion],
        fresh: list[_PM],
    ) -> None:
        """Bind the event in the waiting PMs; complete ones go to `completions`, `each` copies
        to `fresh`, extended PMs' ids to `touched` (the event closed their negations' scope)."""
        pat = self.pat
        kind = self.kind
        for pm in part.pms:
            if not pm.alive:
                continue
            en = pat.enabled(pm.binds)
            hit = [i for i in en if i in pos]  # enabled leaves come in written order
            if kind == "each":
                self._extend_each(part, pm, b, hit, completions, fresh)
                continue
            if kind == "nth":
                nb = self._extend_nth(part, pm, b, hit)
            else:
                nb = self._extend_first(part, pm, b, hit, pos)
            if nb is None:
                continue
            if self._complete(nb):
                completions.append((pat.order_key(nb), nb))
                if self.unique:
                    self._drop(pm)  # the PM became the match (even if an any dropped events)
            else:
                touched.add(id(pm))
                self._set(pm, nb)
                if pm.seen:
                    self._forget_seen(pm)

    def _extend_each(
        self,
        part: _Part,
        pm: _PM,
        b: B,
        hit: list[int],
        completions: list[Completion],
        fresh: list[_PM],
    ) -> None:
        """select each: every leaf the event can bind makes a new PM (the original waits on);
        of one any's alternative leaves, the first that binds."""
        alts: set[int] = set()
        for i in hit:
            alt = self.pat.alt_of(i)
            if alt in alts:
                continue
            nb = self._try(part, pm, i, b)
            if nb is None:
                continue
            if alt is not None:
                alts.add(alt)
            if self._complete(nb):  # the original waits on: not exempt from the event
                completions.append((self.pat.order_key(nb), nb))
            elif self._room(part, fresh):
                cp = pm.copy(nb)
                cp.counts = {}
                self._set(cp, nb)
                fresh.append(cp)
                self._kept(cp)

    def _extend_nth(self, part: _Part, pm: _PM, b: B, hit: list[int]) -> Binds | None:
        """select nth: the event counts for the leaf it would bind under `first`; the N-th
        binds."""
        for i in hit:
            cand = self._try(part, pm, i, b)
            if cand is None:
                continue
            n = pm.counts.get(i, 0) + 1
            if n >= self.nth:
                if not self._complete(cand):  # a completed PM stays as it was
                    del pm.counts[i]
                return cand
            pm.counts[i] = n
            return None
        return None

    def _extend_first(
        self, part: _Part, pm: _PM, b: B, hit: list[int], pos: list[int]
    ) -> Binds | None:
        """select first (and last): the first enabled leaf the event can bind; under last,
        else a replacement."""
        nb = None
        for i in hit:
            nb = self._try(part, pm, i, b)
            if nb is not None:
                break
        if nb is None and self.kind == "last":
            nb, cands = self._replace(part, pm, b, pos)
            if nb is not None and not self._complete(nb):
                pm.cands = cands
        return nb

    # ------------------------------------------------------- 2. complete
    def _report(self, part: _Part, b: B, completions: list[Completion], fresh: list[_PM]) -> bool:
        """Report the completions in order; under `unique` only the first, whose events are
        consumed (then True: the PMs that share one are dropped and nothing opens)."""
        if len(completions) > 1:
            completions.sort(key=lambda c: c[0])
        if not self.unique:
            cap = self.engine.cap_notifications
            if len(completions) > cap:  # `filters.caps`: the first ones in report order are kept
                self.engine.count_capped_notifications(self.profile.id, len(completions) - cap)
                del completions[cap:]
            for _, nb in completions:
                self.report(b[1].ts, self.pat.events(nb), part.values)
                if not self.active:
                    return False
            return False
        _, nb = completions[0]
        used = {v[0] for v in nb if v is not None}
        self.report(b[1].ts, self.pat.events(nb), part.values)
        if not self.active:
            return True
        for pm in part.pms + fresh:
            if pm.alive and not used.isdisjoint(pm.seqs()):
                self._drop(pm)
        return True

    # --------------------------------------------------------- 3. negate
    def _negate_all(self, part: _Part, b: B, neg: list[int], touched: set[int]) -> None:
        seen = [x for x in neg if x in self.between]
        for pm in part.pms:
            if pm.alive:
                for x in seen:
                    self._see(pm, x, b)  # bound or not: a replacement may free it
                if id(pm) not in touched:
                    self._negate(pm, neg, b)

    # ----------------------------------------------------------- 4. open
    def _start(self, part: _Part, b: B, pos: list[int]) -> None:
        starts = [i for i in pos if i in self.pat.starts]
        if not starts:
            return
        if self.kind == "each":
            self._start_each(part, b, starts)
            return
        if part.pms:
            return
        if self.kind == "nth" and not self._count_nth(part, b, starts):
            return
        for i in starts:
            nb = self._try(part, None, i, b)
            if nb is not None:
                self._open(part, nb, b)
                return

    def _start_each(self, part: _Part, b: B, starts: list[int]) -> None:
        alts: set[int] = set()
        for i in starts:
            alt = self.pat.alt_of(i)
            if alt in alts:
                continue
            nb = self._try(part, None, i, b)
            if nb is not None:
                if alt is not None:
                    alts.add(alt)
                done = self._open(part, nb, b)
                if not self.active or (done and self.unique):
                    return  # a match reported at once consumed the event

    def _count_nth(self, part: _Part, b: B, starts: list[int]) -> bool:
        """select nth: a starting event counts if it could open a PM (its where conjuncts over
        the starting leaf alone hold, §4.1); the N-th opens the PM if it can bind (a leading
        negation may still block it), and the count starts over either way."""
        if not any(self.pat.may_open(i, b) for i in starts):
            return False
        part.nth += 1
        if part.nth == 1 and self.window is not None:
            part.nth_timer = self.engine._timer(b[1].ts + self.window, (self, ("nth", part)))
        if part.nth < self.nth:
            return False
        self._forget_nth(part)
        return True

    # ---------------------------------------------------- select last
    def _replace(
        self, part: _Part, pm: _PM, b: B, pos: list[int]
    ) -> tuple[Binds | None, list[tuple[int, B]]]:
        """select last: the event replaces the newest binding, or a bound leaf child of an
        incomplete all; of several such leaves the first in written order. (The new bindings,
        and the negation candidates that stay pending for them.)

        A replacement must leave a valid match (§4.1 item 1): besides `where`, every
        between-negation event seen by the PM that now lies inside its scope
        (`TreePattern.inside`) becomes a candidate that `_try` checks against the new
        bindings."""
        binds = pm.binds
        for i in sorted(self.pat.replaceable(binds)):
            if i not in pos:
                continue
            if not self.between:
                nb = self._try(part, pm, i, b)
                if nb is not None:
                    return nb, pm.cands
                continue
            new = list(binds)
            new[i] = b
            used = {v[0] for v in new if v is not None}
            rest = list(binds)
            rest[i] = None
            base = pm.copy(rest)
            base.cands = [
                (x, e) for x, e in pm.seen if e[0] not in used and self.pat.inside(x, e[0], new)
            ]
            nb = self._try(part, base, i, b)
            if nb is not None:
                return nb, base.cands
        return None, pm.cands

    def _see(self, pm: _PM, x: int, b: B) -> None:
        """Keep between-negation event b for later replacements, unless x has no where and an
        x event is kept already after the PM's latest binding (same scope, whatever happens)."""
        if x not in self.pat.neg_conj:
            latest = max(v[0] for v in pm.binds if v is not None)
            if any(y == x and e[0] > latest for y, e in pm.seen):
                return
        pm.seen.append((x, b))

    def _forget_seen(self, pm: _PM) -> None:
        """Drop seen negation events that no replacement can put in scope any more: those
        before the latest binding that can no longer be replaced."""
        binds = pm.binds
        repl = self.pat.replaceable(binds)
        lo = min((b[0] for i in repl if (b := binds[i]) is not None), default=-1)
        fixed = [
            b[0]
            for i in self.pat.pos
            if (b := binds[i]) is not None and i not in repl and b[0] < lo
        ]
        if fixed:
            p = max(fixed)
            pm.seen = [s for s in pm.seen if s[1][0] > p]


# ------------------------------------------------------------------ engine
class TwoStepEngine(TimeDriven, NotificationOutput, CapCounts):
    """Same interface as `filters.engine.Engine`; primitive filtering, then composite evaluation.

    >>> from profiles.parser import parse_profile
    >>> eng = TwoStepEngine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")])
    >>> eng.process(Event("a1", 0.0, {"k": "A"})); eng.process(Event("b1", 5.0, {"k": "B"}))
    >>> [n.to_json() for n in eng.take_notifications()]
    [{'profile': 'p', 'ts': 5.0, 'events': {'a': 'a1', 'b': 'b1'}}]
    """

    def __init__(
        self,
        profiles: Iterable[Profile] = (),
        *,
        tz: str = "UTC",
        timers: TemporalPool | None = None,
        caps: Caps | None = None,
    ) -> None:
        self.pool = PrimitivePool()
        self.timers = timers if timers is not None else TemporalPool()
        self.tz = ZoneInfo(tz)
        self._local: LocalClock | None = None  # localtime/weekday, once a profile uses them
        self.now: float | None = None
        self._rts: dict[int, _Runtime] = {}
        self._by_id: dict[str, _Runtime] = {}
        self._next = 0
        self._seq = 0
        NotificationOutput.__init__(self)
        CapCounts.__init__(self, caps)
        self._clocks: dict[Clock, Handle | None] = {}
        self._clock_users: dict[Clock, set[int]] = {}
        for p in profiles:
            self.add_profile(p)

    # ------------------------------------------------------------ profiles
    def add_profile(self, profile: Profile) -> None:
        if profile.id in self._by_id:
            raise ValueError(f"profile {profile.id!r} is already active")
        idx = self._next
        self._next += 1
        self._local = LocalClock.of(self._local, self.tz, (profile,))
        rt: _Runtime
        if is_filter(profile.expr):
            rt = _FilterRuntime(self, profile, idx)
        elif isinstance(profile.expr, Absent):
            rt = _AbsentRuntime(self, profile, idx)
        else:
            rt = _CompositeRuntime(self, profile, idx)
        self._rts[idx] = rt
        self._by_id[profile.id] = rt
        for f, leaf in rt.filters():
            self.pool.add(f, (idx, leaf))
        for clock in rt.clocks():
            self._clock_users.setdefault(clock, set()).add(idx)
            if clock not in self._clocks:
                self._clocks[clock] = None
                if self.now is not None:
                    self._schedule_clock(clock, self.now)
        rt.activate(self.now)

    def remove_profile(self, profile_id: str) -> None:
        rt = self._by_id.get(profile_id)
        if rt is None:
            raise KeyError(f"no active profile {profile_id!r}")
        self._deactivate(rt)

    def _deactivate(self, rt: _Runtime) -> None:
        if not rt.active:
            return
        rt.active = False
        del self._by_id[rt.profile.id]
        del self._rts[rt.idx]
        for f, leaf in rt.filters():
            self.pool.remove(f, (rt.idx, leaf))
        rt.clear()
        for clock in rt.clocks():
            users = self._clock_users.get(clock)
            if users is not None:
                users.discard(rt.idx)
                if not users:
                    del self._clock_users[clock]
                    self.timers.discard(self._clocks.pop(clock, None))

    @property
    def profiles(self) -> list[Profile]:
        return [rt.profile for rt in self._rts.values()]

    # ---------------------------------------------------------------- time
    def _timer(self, when: float, payload: tuple[Any, ...]) -> Handle:
        return self.timers.add(when, 1, payload)

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
        for idx in sorted(self._clock_users.get(clock, ())):
            rt = self._rts.get(idx)
            if isinstance(rt, _CompositeRuntime) and rt.active:
                rt.on_clock(ev, self._seq, clock)
        if clock in self._clock_users:
            self._schedule_clock(clock, when + 60.0)

    # --------------------------------------------------------------- events
    def process(self, event: Event) -> None:
        """Step 1: match the event against every component filter; step 2: evaluate."""
        if self.now is None or event.ts > self.now or self.timers:
            self.advance(event.ts)
        self._seq += 1
        seq = self._seq
        if self._local is not None:
            event = self._local.event(event)
        entries = self.pool.match(event.attrs)
        rts = self._rts
        if len(entries) == 1:
            # owners are registered once, when the profile is added, so they are in profile
            # order already (a profile's leaves on one filter are adjacent); copied because a
            # `once` profile leaves the pool while we walk them
            owners: list[Any] = list(entries[0].owners)  # (profile, leaf) pairs
            i, n = 0, len(owners)
            while i < n:
                idx, leaf = owners[i]
                i += 1
                leaves = [leaf]
                while i < n and owners[i][0] == idx:
                    leaves.append(owners[i][1])
                    i += 1
                rt = rts.get(idx)
                if rt is not None and rt.active:
                    rt.on_event(event, seq, leaves)
            return
        for idx, leaves in owners_by_profile(entries):
            rt = rts.get(idx)
            if rt is not None and rt.active:
                rt.on_event(event, seq, leaves)

    def stats(self) -> dict[str, int]:
        pms = parts = evs = 0
        for rt in self._rts.values():
            a, b, c = rt.live()
            pms += a
            parts += b
            evs += c
        return {
            "profiles": len(self._rts),
            "partial_matches": pms,
            "partitions": parts,
            "binding_events": evs,
            "pool_filters": len(self.pool),
            "pool_owners": self.pool.owner_count,
            "timers": len(self.timers),
        }
