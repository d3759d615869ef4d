"""The general event step of the eager composite runtime: every shape and selection.

An event that reaches a composite (through its starting components in the pool, or an
auxiliary profile a partial match waits on) extends or completes the waiting partial
matches as the selection says (`first`, `last`, `nth`, `each`), applies its negations to
the others, opens new ones and keeps leading-negation history (docs/language.md §4). The common
shapes take the fast paths of `filters.eager.composite` instead, with the same results.
"""

from __future__ import annotations

from filters.eager.lifecycle import MatchLifecycle
from filters.eager.matches import PartialMatch, Partition
from filters.pattern import MaskInfo
from filters.runtime import Binding, PartKey
from profiles.events import Event

Completions = list[tuple[PartialMatch, PartialMatch | None]]  # (completed state, PM it came from)


class GeneralSteps(MatchLifecycle):
    """Extend, complete, negate and open partial matches for one event."""

    __slots__ = ()

    def _general(
        self, part: Partition | None, key: PartKey, ev: Event, seq: int, leaves: list[int]
    ) -> None:
        """Every shape and selection: extend or complete the waiting PMs, apply the event's
        negations, open new PMs, keep leading-negation history (docs/language.md §4)."""
        b = Binding(seq, ev)
        if self.neg_set:
            pos = [i for i in leaves if i not in self.neg_set]
            neg = [i for i in leaves if i in self.neg_set]
        else:
            pos, neg = leaves, []
        tracing = self.engine.tracer is not None
        completions: Completions = []  # (completed state, PM it came from)
        touched: set[int] = set()
        consumed = False

        if part is not None and part.pms and pos:
            for pm in list(part.pms):
                if pm.alive:
                    self._extend(part, pm, pos, b, completions, touched, tracing)

        if completions and part is not None:  # only a partition's PMs complete
            consumed = self._complete(part, completions, ev.ts)
            if not self.active:
                return
        self._settle(part, key, b, pos, neg, touched, consumed)

    def _settle(
        self,
        part: Partition | None,
        key: PartKey,
        b: Binding,
        pos: list[int],
        neg: list[int],
        touched: set[int],
        consumed: bool,
    ) -> None:
        """After the extensions: the event's negations on the PMs it did not extend, then (if not
        consumed) the PMs it opens, the leading-negation history, and the partition's clean-up."""
        ev, seq = b.ev, b.seq
        if neg and part is not None and part.pms:
            for pm in list(part.pms):
                if pm.alive:
                    if id(pm) not in touched:
                        self._negate(pm, neg, b)
                    elif self.between:
                        self._log_negations(pm, neg, b)  # bound now, but a replacement frees it

        if not consumed and self.active:
            starts = [i for i in pos if i in self.start_set]
            if starts:
                if part is None:
                    part = self._part(key, ev)
                self._open(part, starts, b)
                if not self.active:
                    return

        if neg and self.leading:
            lead = [i for i in neg if i in self.leading]
            if lead:
                if part is None:
                    part = self._part(key, ev)
                hist = part.history
                if not hist:
                    hist = part.history = []
                for i in lead:
                    hist.append((seq, ev.ts, i, b))
        if part is not None:
            self._tidy(part, ev.ts)

    def _extend(
        self,
        part: Partition,
        pm: PartialMatch,
        pos: list[int],
        b: Binding,
        completions: Completions,
        touched: set[int],
        tracing: bool,
    ) -> None:
        """Bind the event's positive leaves `pos` to one waiting PM, as its selection says."""
        mi = self.pat.info(pm.mask)
        cands = [i for i in pos if i in mi.enabled_set]
        if self.kind == "each":
            self._branch(part, pm, mi, cands, b, completions, touched, tracing)
        elif self._bind_next(pm, cands, b, completions, touched, tracing):
            pass
        elif self.kind == "last" and pm.mask:
            self._replace(pm, mi, pos, b, completions, touched, tracing)
        elif tracing:
            dup = next(
                (i for i in pos if pm.binds[i] is not None and i not in self.start_set), None
            )
            if dup is not None:
                self._trace(
                    "ignored", f"{b.ev.id} as a duplicate of {self.names[dup]} for {self._desc(pm)}"
                )

    def _branch(
        self,
        part: Partition,
        pm: PartialMatch,
        mi: MaskInfo,
        cands: list[int],
        b: Binding,
        completions: Completions,
        touched: set[int],
        tracing: bool,
    ) -> None:
        """`select each`: every candidate leaf extends a copy of the PM (one per any-alternative set)."""
        pat = self.pat
        groups: set[int] = set()
        for i in cands:
            g = mi.any_groups.get(i, -1)
            if g != -1 and g in groups:
                continue
            new = self._try_bind(pm, i, b)
            if new is None:
                continue
            if g != -1:
                groups.add(g)
            if pat.info(new.mask).complete and not pat.trailing:
                # completed: the waiting original is not exempt from the event's
                # negations (it lies between this PM's events and any later one)
                completions.append((new, pm))
            else:
                touched.add(id(new))  # the copy holds the event; the original does not
                self.add_pm(part, new)
                if tracing and new.alive:
                    self._trace("extended", f"{self._desc(pm)} -> {self._desc(new)} (branch)")

    def _bind_next(
        self,
        pm: PartialMatch,
        cands: list[int],
        b: Binding,
        completions: Completions,
        touched: set[int],
        tracing: bool,
    ) -> bool:
        """first/last/nth: the first candidate leaf that may bind does (nth: is counted until the
        N-th). False if none could."""
        ev = b.ev
        for i in cands:
            if self.kind == "nth":
                cnt = (pm.counts or {}).get(i, 0) + 1
                if cnt < self.nth:
                    if self._try_bind(pm, i, b) is None:
                        continue
                    if pm.counts is None:
                        pm.counts = {}
                    pm.counts[i] = cnt  # counted, not bound: negations still apply
                    if tracing:
                        self._trace(
                            "counted",
                            f"{ev.id} as {self.names[i]} #{cnt} of {self.nth} for {self._desc(pm)}",
                        )
                    return True
            new = self._try_bind(pm, i, b)
            if new is None:
                if tracing:
                    self._trace(
                        "ignored", f"{ev.id} for {self._desc(pm)}: where/negation not satisfied"
                    )
                continue
            if not self._advance(pm, new, completions, tracing, ev):
                touched.add(id(pm))
            return True
        return False

    def _replace(
        self,
        pm: PartialMatch,
        mi: MaskInfo,
        pos: list[int],
        b: Binding,
        completions: Completions,
        touched: set[int],
        tracing: bool,
    ) -> None:
        """`select last`: the event replaces the newest binding (or a bound leaf of an open all)."""
        ev = b.ev
        repl = [self._newest(pm)] + list(mi.all_bound)
        for i in pos:
            if i in repl:
                new = self._try_bind(pm, i, b, replace=True)
                if new is None:
                    if tracing:
                        self._trace(
                            "ignored",
                            f"{ev.id} as {self.names[i]} for {self._desc(pm)}: "
                            "the match would break (where/negation)",
                        )
                    continue
                if tracing:
                    self._trace(
                        "replaced",
                        f"{self.names[i]} by {ev.id}: {self._desc(pm)} -> {self._desc(new)}",
                    )
                if not self._advance(pm, new, completions, tracing, ev, replaced=True):
                    touched.add(id(pm))
                break

    def _advance(
        self,
        pm: PartialMatch,
        new: PartialMatch,
        completions: Completions,
        tracing: bool,
        ev: Event,
        replaced: bool = False,
    ) -> bool:
        """Apply an in-place change (first/last/nth) or record a completion (returns True).

        An extended PM is exempt from the event's negations (the event closed their
        scope); a completed one stays as it was, and under `shared` keeps waiting with
        the event between its events and any later duplicate, so they apply to it.
        """
        pat = self.pat
        if pat.info(new.mask).complete and not pat.trailing:
            completions.append((new, pm))
            return True
        if tracing and not replaced:
            self._trace("extended", f"{self._desc(pm)} -> {self._desc(new)}")
        pm.mask, pm.binds, pm.counts, pm.negc = new.mask, new.binds, new.counts, new.negc
        if pm.nlog:
            self._prune_nlog(pm)
        self._changed(pm)
        return False

    def _complete(self, part: Partition, completions: Completions, ts: float) -> bool:
        """Report completed matches; under unique the earliest wins and its events are consumed."""
        if len(completions) > 1:
            completions.sort(key=lambda c: c[0].order_key())
        if self.unique:
            new, src = completions[0]
            if src is not None and self.kind != "each":
                self._drop(src, "completed")
            self._consume(part, new.seqs())
            self.report(ts, self._events(new), part.values)
            return True
        cap = self.engine.cap_notifications
        if len(completions) > cap:  # `filters.caps`: the first ones in report order are kept
            self.engine.count_capped_notifications(self.pid, len(completions) - cap)
            if self.engine.tracer is not None:
                self._trace("capped", f"{len(completions) - cap} notification(s) beyond {cap}")
            del completions[cap:]
        for new, _src in completions:
            self.report(ts, self._events(new), part.values)
            if not self.active:
                break
        return False

    def _negate(self, pm: PartialMatch, neg: list[int], b: Binding) -> None:
        if self.between:
            self._log_negations(pm, neg, b)
        mi = self.pat.info(pm.mask)
        for x in neg:
            if x not in mi.negations_set:
                continue
            binds = self._bindings(pm)
            verdict = self._neg_verdict(x, b, binds, final=False)
            if verdict is False:
                continue
            if verdict is None:
                if pm.negc is None:
                    pm.negc = []
                pm.negc.append((x, b))
                continue
            node = self.pat.leaves[x].node
            if node == 0 or self.kind == "each":
                self._drop(pm, f"killed by {self.names[x]} = {b.ev.id}")
                return
            self._reset(pm, node, f"killed by {self.names[x]} = {b.ev.id}")
            if not pm.alive:
                return
            # the reset PM may still be inside another negation's scope (e.g. the root's)
            mi = self.pat.info(pm.mask)

    def _open(self, part: Partition, starts: list[int], b: Binding) -> None:
        kind = self.kind
        tracing = self.engine.tracer is not None
        if kind != "each" and part.pms:
            if tracing:
                self._trace(
                    "ignored",
                    f"{b.ev.id}: a partial match already exists ({self._desc(part.pms[0])})",
                )
            return
        if kind == "nth":
            if not self._could_start(starts, b):
                if tracing:
                    self._trace(
                        "ignored", f"{b.ev.id} cannot start: where not satisfied (not counted)"
                    )
                return
            if not part.starts:
                part.starts_ts = b.ev.ts
            part.starts += 1
            if part.starts < self.nth:
                if tracing:
                    self._trace(
                        "counted", f"{b.ev.id} as starting event #{part.starts} of {self.nth}"
                    )
                return
            part.starts = 0
        empty = PartialMatch(self.n, part)
        completions: Completions = []
        groups: set[int] = set()
        mi = self.pat.info(0)
        for i in starts:
            g = mi.any_groups.get(i, -1)
            if g != -1 and g in groups:
                continue
            new = self._try_bind(empty, i, b)
            if new is None:
                if tracing:
                    self._trace("ignored", f"{b.ev.id} cannot start: where/negation not satisfied")
                continue
            if g != -1:
                groups.add(g)
            if self.pat.info(new.mask).complete and not self.pat.trailing:
                completions.append((new, None))
            else:
                self.add_pm(part, new)
                if tracing and new.alive:  # (not refused by a cap)
                    self._trace("opened", self._desc(new))
            if kind != "each":
                break
        if completions:
            self._complete(part, completions, b.ev.ts)
