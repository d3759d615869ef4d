"""The life of a partial match: opened, changed, dropped; its terminator; partition clean-up.

A PM's window end is a *terminator* in the temporal pool; when it fires (`on_timer`) the PM
expires, completes (a trailing negation stayed silent) or loses a nested part. A PM that
left early leaves its terminator in place as a no-op, which later lets its partition's kept
auxiliary profiles go (`_tidy`): a completion schedules no clean-up of its own.
"""

from __future__ import annotations

from typing import Any

from filters.eager.binding import MatchBinder
from filters.eager.matches import PartialMatch, Partition
from filters.runtime import fmt_ts
from filters.temporal import TIMER


class MatchLifecycle(MatchBinder):
    """Partial matches and partitions over time: deadlines, expiry, clean-up."""

    __slots__ = ()

    def add_pm(self, part: Partition, pm: PartialMatch) -> None:
        """Keep a new PM in `part` (the caps applied), with its terminator and auxiliary profiles:
        every PM the runtime opens, and those `filters.plans.replan` converts from rare-first."""
        pms = part.pms
        eng = self.engine
        if len(pms) >= eng.cap_partition or self.pm_count >= eng.cap_profile:
            if not self._make_room(part):
                self._refuse(pm)
                return
            pms = part.pms
        if pms:
            pms.append(pm)  # type: ignore[union-attr]  # a list: it holds PMs
        else:
            part.pms = [pm]
        self.pm_count += 1
        self._changed(pm)

    def _make_room(self, part: Partition) -> bool:
        """A cap is reached (`filters.caps`): the partition's oldest PMs (the first opened, the
        closest to expiring) are dropped, and counted, until one more fits; False if the
        profile's cap still does not let one in (the partition holds none to drop)."""
        eng = self.engine
        pms = part.pms
        while pms and (len(pms) >= eng.cap_partition or self.pm_count >= eng.cap_profile):
            assert isinstance(pms, list)  # it holds PMs
            if len(pms) > 1:
                self._evict(pms)
            else:  # the last: its terminator stays, to let the partition's profiles go (`_drop`)
                self._drop(pms[0], "capped by the partial-match cap")
            eng.count_dropped_pm(self.pid)
        return self.pm_count < eng.cap_profile

    def _evict(self, pms: list[PartialMatch]) -> None:
        """`_drop` of the oldest PM for a cap, its terminator taken out too: nothing then keeps
        it or its events (a dropped PM's terminator would hold them for the whole window, and
        a flood drops one per event); the partition's other PMs have terminators of their own."""
        pm = pms[0]
        if self.engine.tracer is not None:
            self._trace("capped", self._desc(pm) + " (capped by the partial-match cap)")
        timers = self.engine.timers
        if self.flat:
            timers.discard_ordered(self.window, pm.handle)
        else:
            timers.discard(pm.handle)
        pm.handle = None
        pm.alive = False
        self._sync(pm)
        del pms[0]
        self.pm_count -= 1

    def _refuse(self, pm: PartialMatch) -> None:
        """The profile's cap is reached and the PM's partition holds none to drop: the new PM
        is not kept (a partition never evicts another's matches), and counted."""
        pm.alive = False
        self.engine.count_dropped_pm(self.pid)
        if self.engine.tracer is not None:
            self._trace("refused", self._desc(pm) + " (partial-match cap of the profile)")

    def _deadline(self, pm: PartialMatch) -> float | None:
        """When the PM's window (or its earliest started nested window) ends."""
        d = None
        if self.window is not None:
            d = pm.first_ts() + self.window
        if not self.flat:
            pat = self.pat
            for nid in pat.info(pm.mask).started_nodes:
                node = pat.nodes[nid]
                lo = min(
                    b.ev.ts
                    for i, b in enumerate(pm.binds)
                    if b is not None and node.leaves >> i & 1
                )
                nd = lo + node.within  # type: ignore[operator]  # a started nested node has one
                if d is None or nd < d:
                    d = nd
        return d

    def _changed(self, pm: PartialMatch) -> None:
        """Recompute the PM's terminator and auxiliary profiles after its state changed."""
        d = self._deadline(pm)
        if d != pm.deadline or (pm.handle is None and d is not None):
            timers = self.engine.timers
            if d is None:
                timers.discard(pm.handle)
                pm.handle = None
            elif self.flat:  # d is the first event's time plus the window: in the window's lane
                timers.discard_ordered(self.window, pm.handle)
                pm.handle = timers.add_ordered(self.window, d, (self, pm))
            else:
                timers.discard(pm.handle)
                pm.handle = timers.add(d, TIMER, (self, pm))
            pm.deadline = d
        self._sync(pm)

    def _drop(self, pm: PartialMatch, why: str, ended: float | None = None) -> None:
        """Remove a PM; `why` is "completed", "consumed", "expired" or "killed by ...".

        `ended` is the stream time its window ended (with "expired"): the trace shows it, as
        the timer may only fire at a later event or at the end of the stream.
        """
        if not pm.alive:
            return
        if self.engine.tracer is not None and why != "completed":
            action, _, detail = why.partition(" ")
            note = f" ({why})" if detail else ""
            if ended is not None:
                note += f" (window ended at ts={fmt_ts(ended)})"
            self._trace(action, self._desc(pm) + note)
        pm.alive = False
        # The terminator is not taken out of the temporal pool: it fires as a no-op at its
        # deadline (or lets the partition's auxiliary profiles go, see `_tidy`). A sorted-list
        # delete per completed match costs more than the no-op, and dead entries are bounded
        # by the window like live ones (taking it out of its lane on completion was measured:
        # it put 1-3 µs on the completing event and no gain elsewhere).
        pm.handle = None
        self._sync(pm)
        part = pm.part
        if pm.deadline is not None and pm.deadline > part.until:
            part.until = pm.deadline
        pms = part.pms
        assert isinstance(pms, list)  # an alive PM is in its partition's list
        pms.remove(pm)
        self.pm_count -= 1

    def _reset(self, pm: PartialMatch, nid: int, why: str) -> None:
        """A nested node expired or was killed: forget its bindings, keep the rest."""
        leaves = self.pat.nodes[nid].leaves
        pm.mask &= ~leaves
        for i in range(self.n):
            if leaves >> i & 1:
                pm.binds[i] = None
                if pm.counts:
                    pm.counts.pop(i, None)
        pm.negc = None
        if not pm.mask:
            self._drop(pm, why)
            return
        if self.engine.tracer is not None:
            self._trace("reset", f"nested part of {self._desc(pm)} ({why})")
        self._changed(pm)

    def _consume(self, part: Partition, seqs: set[int]) -> None:
        if not part.pms:
            return
        for pm in list(part.pms):
            if pm.alive:
                for b in pm.binds:  # a loop, not `any` over a generator: every `each` completion
                    if b is not None and b.seq in seqs:
                        self._drop(pm, "consumed")
                        break

    # ----------------------------------------------------------------- timers
    def on_timer(self, when: float, payload: Any) -> None:
        if isinstance(payload, Partition):
            part = payload
            part.handle = None
            self._tidy(part, when, fired=True)
            return
        pm: PartialMatch = payload
        if not pm.alive:
            # a finished PM's terminator: its partition, if idle since, lets its auxiliary
            # profiles go now (see `_tidy`); one holding only pinned ones has nothing to let
            # go (it stays, its emptied list kept for the next PM)
            part = pm.part
            if not part.pms and (part.held or part.dormant) and when >= part.until:
                self._tidy(part, when, fired=True)
            return
        pm.handle = None
        part = pm.part
        end = pm.deadline  # flat: the first event's time plus the window (`_changed`)
        if end is None or not self.flat:
            end = pm.first_ts() + self.window if self.window is not None else None
        if end is not None and end <= when:
            if (self.fast or self.fast_each) and self.engine.tracer is None:
                self._expire(pm, part, when)
                return
            self._window_ended(pm, when, end)
            if self.active:
                self._tidy(part, when, fired=True)
            return
        self._nested_ended(pm, when)
        if pm.alive:
            self._changed(pm)
        self._tidy(part, when, fired=True)

    def _expire(self, pm: PartialMatch, part: Partition, when: float) -> None:
        """The window of a fast shape's PM ended (no trailing negation, history or counts):
        `_window_ended`, `_drop` and `_tidy` in one step (a spread workload's commonest end)."""
        pm.alive = False
        regs = pm.regs
        if regs:
            pm.regs = ()
            self._unreg_done(part, regs)
        d = pm.deadline
        if d is not None and d > part.until:
            part.until = d
        pms = part.pms
        assert isinstance(pms, list)  # an alive PM is in its partition's list
        pms.remove(pm)
        self.pm_count -= 1
        if not pms:
            self._drop_partition(part, when, True)

    def _window_ended(self, pm: PartialMatch, when: float, end: float) -> None:
        """The PM's window ended: it expires, or completes if only trailing negations were
        awaited and none came."""
        pat = self.pat
        part = pm.part
        if not (pat.trailing and pat.info(pm.mask).complete):
            self._drop(pm, "expired", end)
            return
        if pm.negc:
            blocked, _ = self._neg_blocks(pm.negc, self._bindings(pm), final=True)
            if blocked:
                self._drop(pm, "killed by a negation")
                return
        events = self._events(pm)
        self._drop(pm, "completed")
        if self.unique:
            self._consume(part, pm.seqs())
        self.report(when, events, part.values)

    def _nested_ended(self, pm: PartialMatch, when: float) -> None:
        """A nested window of the PM ended: reset that part (under `each`, drop the PM)."""
        pat = self.pat
        for nid in pat.info(pm.mask).started_nodes:  # outermost first
            node = pat.nodes[nid]
            stamps = [
                b.ev.ts for i, b in enumerate(pm.binds) if b is not None and node.leaves >> i & 1
            ]
            if not stamps:
                continue  # an enclosing nested node ending at the same time already reset it
            if (end := min(stamps) + node.within) <= when:  # type: ignore[operator]
                if self.kind == "each":
                    self._drop(pm, "expired", end)
                    break
                self._reset(pm, nid, "nested window ended")
                if not pm.alive:
                    break

    # --------------------------------------------------------------- clean-up
    def _tidy(self, part: Partition, now: float, fired: bool = False) -> None:
        """Forget partition state the windows no longer need; drop empty partitions.

        `fired`: a timer is due at `now` (the partition's own, or a PM's terminator), so state
        that ends at `now` is stale too. An emptied partition keeps its auxiliary profiles
        (marking, references) for its next partial match until the window of its last one ends:
        a PM that left before its window ended (completed, consumed, killed) left its terminator
        in the temporal pool, and that terminator lets them go (`on_timer`), so a completion
        schedules no clean-up timer of its own.
        """
        w = self.window
        if w is not None and (part.history or part.starts):
            self._forget_stale(part, now, w, fired)
        if not (part.pms or part.history or part.starts):  # `part.empty()`, inline
            if not part.key and (part.held or part.dormant or self.aux_pins):
                part.pms = ()  # `_drop_partition`'s commonest case, inline: kept idle
                return
            self._drop_partition(part, now, fired)
            return
        if not part.pms and w is not None and part.handle is None:
            # only history / counters left: come back when they are stale
            t = min([h[1] for h in part.history] + ([part.starts_ts] if part.starts else [])) + w
            part.handle = self.engine.timers.add(t, TIMER, (self, part))

    @staticmethod
    def _forget_stale(part: Partition, now: float, w: float, fired: bool) -> None:
        """Leading-negation history and `nth` counts older than the window."""
        if part.history:
            lo = now - w
            h = part.history
            k = 0
            while k < len(h) and (h[k][1] < lo or (fired and h[k][1] <= lo)):
                k += 1
            if k:
                del h[:k]
        if part.starts and (part.starts_ts + w < now or (fired and part.starts_ts + w <= now)):
            part.starts = 0

    def _drop_partition(self, part: Partition, now: float, fired: bool) -> None:
        """An empty partition: forget it, unless its kept auxiliary profiles must wait."""
        if part.held or part.dormant or self.aux_pins:
            if not part.key:
                part.pms = ()  # kept idle: no list of its own (see `Partition`)
                return  # no per: one partition, its few auxiliary profiles simply stay marked off
            if not fired:
                if self.window is not None:
                    return  # the terminator of the PM that left releases them (`on_timer`)
                if part.handle is None:  # no window, no terminators: at the next event
                    part.handle = self.engine.timers.add(now, TIMER, (self, part))
                return
            self.engine.aux.release(self, part)
        if self.parts.get(part.key) is part:
            del self.parts[part.key]
        if part.handle is not None:
            self.engine.timers.discard(part.handle)
            part.handle = None

    # ------------------------------------------------------------------ state
    def live(self) -> tuple[int, int]:
        return (self.pm_count, len(self.parts))

    def fresh(self) -> bool:
        return not self.parts and not self.pm_count and not self.clock_leaves

    def unload_partition(self, key: Any, timers: bool = True) -> None:
        """The partition leaves the engine, stored elsewhere (`filters.partstate`): `clear`
        for one partition, the profile's PM count kept (the header's). Its PMs are dead
        after this: store it first. `timers`: take its PMs' terminators out (not when the
        caller empties the temporal pool anyway)."""
        part = self.parts.pop(key, None)
        if part is None:
            return
        eng = self.engine
        tp, aux = eng.timers, eng.aux
        if part.pms:
            for pm in list(part.pms):
                pm.alive = False
                if timers:
                    tp.discard(pm.handle)
                pm.handle = None
                self._sync(pm)
            part.pms = ()
        if part.regs or part.held:
            aux.release(self, part)
        if part.handle is not None:
            if timers:
                tp.discard(part.handle)
            part.handle = None

    def clear(self) -> None:
        """The profile goes (removed, or `once` and reported): its PMs, timers and auxiliary
        profiles. A partition holding no registrations (most, after a completion) costs a look."""
        parts = self.parts
        if parts:
            eng = self.engine
            timers, aux = eng.timers, eng.aux
            for part in parts.values():  # (nothing below adds or drops a partition)
                if part.pms:
                    for pm in list(part.pms):
                        pm.alive = False
                        timers.discard(pm.handle)
                        pm.handle = None
                        self._sync(pm)
                    part.pms = ()  # no cycle PM <-> partition left for the collector (below)
                if part.regs or part.held:
                    aux.release(self, part)
                if part.handle is not None:
                    timers.discard(part.handle)
            # A removed profile's PMs are freed here by reference counting, not left to a
            # full collection: profiles added and removed every second (issue 41) left
            # ~100,000 PMs of removed `select each` profiles for it, and each pass of
            # the collector over them paused the engine for 0.4-1.1 s.
            parts.clear()
        if self.aux_entries:  # (its pins among them)
            self.engine.aux.drop_profile(self)
        self.pm_count = 0
