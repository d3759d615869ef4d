"""The eager composite runtime (CompAS single-step detection) and its fast paths.

`CompositeRuntime` is what `filters.engine.Engine` runs for a composite profile evaluated
eagerly: the layers below it hold its tables and registrations (`filters.eager.composite_base`),
binding checks (`filters.eager.binding`), the life of a match (`filters.eager.lifecycle`) and the general
event step (`filters.eager.stepping`). Here are the event entry point and the fast paths for the
common shapes (no where, no negation, no any): one PM under first/last extended or completed
(`_fast_step`) or, under first, killed by a between-negation (`_fast_negate`), a starting
event (`_fast_open`), `select each` (`_fast_each`); each returns
the same results as the general step, written out because each call is a noticeable part of
a completion in CPython.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from filters.compile import evaluate
from filters.eager.matches import PartialMatch, Partition
from filters.eager.stepping import GeneralSteps
from filters.runtime import INF, Binding, PartKey
from profiles.ast import Clock
from profiles.events import Event

Done = tuple[PartialMatch, int, tuple[int, ...]]  # (PM, leaf, match leaves) an event completes


class CompositeRuntime(GeneralSteps):
    """A composite profile evaluated eagerly: partial matches, auxiliary profiles, terminators."""

    has_sink = True
    __slots__ = ("_sinks",)
    _DERIVED: ClassVar[tuple[str, ...]] = (*GeneralSteps._DERIVED, "_sinks")
    _sinks: dict[int, Callable[[Event, int], bool] | None]  # leaf -> its handler (`sink`)

    def _derive(self) -> None:
        super()._derive()
        self._sinks = {}

    def sink(self, leaf: int) -> Callable[[Event, int], bool] | None:
        """The engine's handler for an event that matched only `leaf` of this profile (one pool
        entry, one owner): `on_event` for that leaf with the fast shapes' common steps inline
        (`leaf_sink`). Made once per leaf; valid while no tracer is set (the engine checks)."""
        sinks = self._sinks
        if leaf in sinks:  # (None: this leaf has none)
            return sinks[leaf]
        made = sinks[leaf] = leaf_sink(self, leaf)
        return made

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        if self.per:
            key = self.partition_key(ev.attrs)
            if key is None:
                return
        else:
            key = ()
        part = self.parts.get(key)
        if part is not None and part.dormant:
            self._drop_dormant(part, leaves)
        if self.engine.tracer is None:
            if part is not None and part.pms:
                pms = part.pms
                if self.fast and len(pms) == 1:
                    if self.neg_set and not self.neg_set.isdisjoint(leaves):
                        if self._fast_negate(part, pms[0], ev, leaves):
                            return
                    elif self._fast_step(part, pms[0], ev, seq, leaves):
                        return
                elif self.fast_each:
                    self._fast_each(part, ev, seq, leaves)
                    return
            elif (self.fast or self.fast_each) and self._fast_open(part, key, ev, seq, leaves):
                return
        if (
            (part is None or not part.pms)
            and self.start_set.isdisjoint(leaves)
            and (not self.leading or self.leading.isdisjoint(leaves))
        ):  # nothing waits, nothing starts, no history to keep (a dormant auxiliary profile's event)
            if part is not None:
                self._tidy(part, ev.ts)
            return
        self._general(part, key, ev, seq, leaves)

    def _fast_step(
        self, part: Partition, pm: PartialMatch, ev: Event, seq: int, leaves: list[int]
    ) -> bool:
        """The common case in one place: a single PM (first/last) extended or completed by the event.

        Same semantics as the general path; returns False to hand anything
        else (replacements, duplicates under last) to it. This is the step
        that makes the last event of a composite cost about a primitive one,
        so the completion is written out here rather than called piecewise
        (`_unreg`, `report`, `_tidy`): each call is a
        noticeable part of it in CPython.
        """
        tr = self._trans.get(pm.mask)
        if tr is None:
            tr = self.pat.transitions(pm.mask)
        for i in leaves:
            t = tr.get(i)
            if t is not None:
                break
        else:
            return self.kind == "first"  # a duplicate: ignored (and a PM exists, so nothing opens)
        new_mask, order = t
        if order is None:
            pm.binds[i] = Binding(seq, ev)
            pm.mask = new_mask
            if self.flat and (pm.handle is not None or self.window is None):
                self._sync(pm)  # the first event, hence the deadline, stays
            else:
                self._changed(pm)
            return True
        binds = pm.binds
        names = self.names
        events = {}
        for j in order:  # a loop, not a comprehension: no closure cells on 3.11
            events[names[j]] = ev if j == i else binds[j].ev  # type: ignore[union-attr]
        eng = self.engine
        kept = False  # an auxiliary profile stays held: the partition stays (no `_tidy` needed)
        if self.once:
            self._retire(part, pm)
        elif self.unique:
            pm.alive = False  # its terminator stays and fires as a no-op (see `_drop`)
            pm.handle = None  # (as `_drop` does): no cycle pm -> terminator -> pm left for the GC
            d = pm.deadline
            if d is not None and d > part.until:
                part.until = d
            regs = pm.regs
            if regs:
                pm.regs = ()
                kept = self._unreg_done(part, regs)
            part.pms.clear()  # type: ignore[union-attr]  # a list: it held `pm` (no `cast` call)
            self.pm_count -= 1
        eng.emit(self.pid, ev.ts, events, part.values, self.subscriber)
        if self.once:
            eng.deactivate(self)
        elif self.unique and (
            not (kept or part.held or self.aux_pins) or (part.key and self.window is None)
        ):
            self._tidy(part, ev.ts)  # fast shapes keep no history or counts
        return True

    def _retire(self, part: Partition, pm: PartialMatch) -> None:
        """`_fast_step`'s completing PM of a `once` profile, which goes next (`Engine.deactivate`):
        its registrations leave the pool now, for good (`AuxiliaryRegistrations.retire`),
        instead of going dormant for `clear` to release them (a paper closing event completes
        10^4 such profiles). Its terminator stays and fires as a no-op."""
        pm.alive = False
        pm.handle = None
        regs = pm.regs
        if regs:
            pm.regs = ()
            counts = part.regs
            aux = self.engine.aux
            for key in regs:
                n = counts[key]
                if n > 1:
                    counts[key] = n - 1
                elif not (key[1] or part.values) and self._leave_pinned(key[0]):
                    del counts[key]  # (a pinned entry is not held: nothing else to retire)
                else:
                    aux.retire(self, part, key)
        part.pms.clear()  # type: ignore[union-attr]  # a list: it held `pm` (no `cast` call)
        self.pm_count -= 1

    def _fast_negate(self, part: Partition, pm: PartialMatch, ev: Event, leaves: list[int]) -> bool:
        """`on_event` for an event of a between-negation (`select first`, no where): it drops
        the PM if the negation is active (the general path's `_negate`); False for an event
        that is a positive component too (the general path orders those)."""
        neg_set = self.neg_set
        for i in leaves:
            if i not in neg_set:
                return False
        active = self.pat.info(pm.mask).negations_set
        for i in leaves:
            if i in active:
                self._drop(pm, "killed")  # traced only by the general path
                self._tidy(part, ev.ts)
                break
        return True

    def _fast_open(
        self, part: Partition | None, key: PartKey, ev: Event, seq: int, leaves: list[int]
    ) -> bool:
        """A starting event where no PM waits (the fast paths' shapes): open its PM(s) directly.

        What `_open` does for these shapes, without its general checks. Returns False to hand
        the general path anything else (an event that completes at once, or starts nothing).
        """
        tr = self._trans.get(0)
        if tr is None:
            tr = self.pat.transitions(0)
        if not self.fast_each:  # first/last: the first starting leaf opens one PM
            for i in leaves:
                t = tr.get(i)
                if t is not None:
                    if t[1] is not None:
                        return False
                    return self._fast_open_one(part, key, ev, seq, i, t[0])
            if part is not None:  # it starts nothing (see below)
                self._tidy(part, ev.ts)
            return True
        opened = []
        for i in leaves:
            t = tr.get(i)
            if t is None:
                continue
            if t[1] is not None:
                return False
            opened.append((i, t[0]))
        if not opened:  # it starts nothing (it reached a dormant auxiliary profile): what is
            if part is not None:  # left of the general path for it
                self._tidy(part, ev.ts)
            return True
        if len(opened) == 1:  # the usual case: what first/last do
            return self._fast_open_one(part, key, ev, seq, *opened[0])
        if part is None:
            part = self.parts[key] = Partition(key, self.partition_values(ev.attrs))
        b = Binding(seq, ev)
        pms = part.pms
        if not isinstance(pms, list):  # an idle partition's `()`
            pms = part.pms = []
        flat = self.flat
        window = self.window
        eng = self.engine
        for i, mask in opened:
            pm = PartialMatch(self.n, part)
            pm.binds[i] = b
            pm.mask = mask
            if not flat or len(pms) >= eng.cap_partition or self.pm_count >= eng.cap_profile:
                self.add_pm(part, pm)  # (and the caps, `filters.caps`)
                continue
            pms.append(pm)  # `add_pm` and `_changed`, inline: the deadline is known
            self.pm_count += 1
            if window is not None:
                pm.deadline = d = ev.ts + window
                pm.handle = self.engine.timers.add_ordered(window, d, (self, pm))
            self._sync(pm)
        return True

    def _fast_open_one(
        self, part: Partition | None, key: PartKey, ev: Event, seq: int, i: int, mask: int
    ) -> bool:
        """`_fast_open` under first/last: one PM, bound to leaf `i`; flat, it is registered
        here (`add_pm`, `_changed` and `_sync` of a new PM, inline: its deadline is known and
        it holds no registrations yet)."""
        if self.pm_count >= self.engine.cap_profile:  # the partition holds no PM: refused
            self._refuse(PartialMatch(self.n, part or Partition(key, None)))
            if part is not None:
                self._tidy(part, ev.ts)
            return True
        if part is None:
            values = self.partition_values(ev.attrs) if self.per else None
            part = self.parts[key] = Partition(key, values)
        pm = PartialMatch(self.n, part)
        pm.binds[i] = Binding(seq, ev)
        pm.mask = mask
        if not self.flat:
            self.add_pm(part, pm)
            return True
        pms = part.pms
        if isinstance(pms, list):  # (a new partition's empty list too: no second one)
            pms.append(pm)
        else:
            part.pms = [pm]
        self.pm_count += 1
        window = self.window
        if window is not None:
            pm.deadline = d = ev.ts + window
            pm.handle = self.engine.timers.add_ordered(window, d, (self, pm))
        wants = self._wants
        new = wants.get(mask) if wants is not None else None
        if new is None:
            new = self._wanted(pm)
        if new:
            counts = part.regs
            for rk in new:  # `_reg`, inline
                n = counts.get(rk)
                if n:
                    counts[rk] = n + 1
                elif n is None:
                    counts[rk] = 1
                    self.engine.aux.insert(self, part, rk)
                else:  # dormant (references): our owner never left the pool
                    counts[rk] = 1
                    part.dormant -= 1
            pm.regs = new
        if self.opens_once:
            self.engine.release_starts(self)
        return True

    def _fast_each(self, part: Partition, ev: Event, seq: int, leaves: list[int]) -> None:
        """`select each` without where/negations/any: the general path's steps, minus its bookkeeping."""
        trans = self._trans
        b = Binding(seq, ev)
        done: list[Done] = []
        # an event that extends no PM (a seq's first component) only opens one: no loop over
        # the partition's PMs (with thousands waiting, that loop was the cost of every event)
        for pm in list(part.pms) if not self.extenders.isdisjoint(leaves) else ():
            if not pm.alive:  # dropped by a cap (`_make_room`) during this event
                continue
            tr = trans.get(pm.mask)
            if tr is None:
                tr = self.pat.transitions(pm.mask)
            for i in leaves:
                t = tr.get(i)
                if t is None:
                    continue
                new_mask, order = t
                if order is not None:
                    done.append((pm, i, order))
                else:
                    new = pm.copy()
                    new.binds[i] = b
                    new.mask = new_mask
                    self.add_pm(part, new)
        consumed = False
        if done:
            consumed = self._report_each(part, done, ev, seq)
            if not self.active:  # `once`: reported, and gone
                return
        if not consumed:
            start_set = self.start_set
            for i in leaves:
                if i in start_set:
                    self._open(part, [i for i in leaves if i in start_set], b)
                    if not self.active:
                        return
                    break
        if part.history or part.starts or not part.pms:
            self._tidy(part, ev.ts)

    def _report_each(self, part: Partition, done: list[Done], ev: Event, seq: int) -> bool:
        """`_fast_each`'s completions, reported in the order of their events (under `unique`
        the earliest, its events consumed: returns True)."""
        if len(done) > 1:  # report in the order of the matches' events (their order keys)
            done.sort(
                key=lambda d: tuple(
                    seq if j == d[1] else (x.seq if x is not None else INF)
                    for j, x in enumerate(d[0].binds)
                )
            )
        eng = self.engine
        names = self.names
        values = part.values
        consumed = False
        if self.unique:
            done = done[:1]
        elif len(done) > eng.cap_notifications:  # `filters.caps`: the first ones are kept
            eng.count_capped_notifications(self.pid, len(done) - eng.cap_notifications)
            del done[eng.cap_notifications :]
        for pm, i, order in done:
            binds = pm.binds
            events = {}
            for j in order:
                events[names[j]] = ev if j == i else binds[j].ev  # type: ignore[union-attr]
            if self.unique:
                used = {x.seq for x in binds if x is not None}
                used.add(seq)
                self._consume(part, used)
                consumed = True
            eng.emit(self.pid, ev.ts, events, values, self.subscriber)
            if self.once:
                eng.deactivate(self)
                break
        return consumed

    def on_clock(self, ev: Event, seq: int, clock: Clock) -> None:
        leaves = [lf.idx for lf in self.clock_leaves if lf.clock == clock]
        if leaves:
            self.on_event(ev, seq, leaves)

    def bound_duplicate(self, ev: Event) -> str | None:
        """The partial match for which `ev` repeats an already bound component, described.

        Such an event never reaches the profile: the pool holds auxiliary profiles only
        for the components still awaited. `ens explain` asks, to say why nothing happened.
        """
        key = self.partition_key(ev.attrs)
        part = self.parts.get(key) if key is not None else None
        if part is None:
            return None
        for pm in part.pms:
            if not pm.alive:
                continue
            for i, b in enumerate(pm.binds):
                leaf = self.pat.leaves[i]
                if (
                    b is not None
                    and b.ev is not ev
                    and leaf.clock is None
                    and evaluate(leaf.filter, ev.attrs)
                ):
                    return f"{leaf.name} for {self._desc(pm)}"
        return None


def leaf_sink(rt: CompositeRuntime, i: int) -> Callable[[Event, int], bool] | None:
    """`rt.on_event(ev, seq, [i])` without a tracer, for the fast shapes under first/last (None
    for other shapes, negated and clock leaves): the engine calls it instead of dispatching to
    `on_event` (an entry with one owner, `Engine.process`). Each event of a growth or keyed
    workload is one of four cases, done here with the profile's tables in locals: a duplicate
    of a bound component (ignored), an extension or completion (`_fast_step`), an opening
    (`_fast_open_one`, this leaf's transition from the empty match looked up once) and an event
    that only reached a dormant auxiliary profile (`_drop_dormant`, `_tidy`). Anything else
    goes to `on_event`. Always True: the event is handled."""
    if not rt.fast or i in rt.neg_set or rt.pat.leaves[i].clock is not None:
        return None
    parts, trans, one, fkey = rt.parts, rt._trans, [i], rt.free_keys[i]
    t0 = rt.pat.transitions(0).get(i)  # from the empty match: opens a PM (None: starts nothing)
    opens = t0[0] if t0 is not None and t0[1] is None else 0
    first = rt.kind == "first"
    per = rt.per

    def handle(ev: Event, seq: int) -> bool:
        if per:
            key = rt.partition_key(ev.attrs)
            if key is None:
                return True
        else:
            key = ()
        part = parts.get(key)
        if part is None:
            if opens:
                rt._fast_open_one(None, key, ev, seq, i, opens)
            else:
                rt.on_event(ev, seq, one)
            return True
        pms = part.pms
        if part.dormant and part.regs.get(fkey) == 0:
            if pms or (t0 is not None and not opens):
                rt.on_event(ev, seq, one)
                return True
            rt.engine.aux.drop_dormant(rt, part, fkey)  # nobody waits on it: our owner leaves
            if opens:  # (`_drop_dormant`), then what `_fast_open` does
                rt._fast_open_one(part, key, ev, seq, i, opens)
            else:
                rt._tidy(part, ev.ts)
            return True
        if not pms:
            if opens:
                rt._fast_open_one(part, key, ev, seq, i, opens)
            else:
                rt.on_event(ev, seq, one)
            return True
        if len(pms) == 1:
            pm = pms[0]
            tr = trans.get(pm.mask)
            if tr is not None and i not in tr:
                if first:
                    return True  # a duplicate: ignored
            elif rt._fast_step(part, pm, ev, seq, one):
                return True
        rt.on_event(ev, seq, one)
        return True

    return handle
