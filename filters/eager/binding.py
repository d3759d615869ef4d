"""Binding an event to a partial match: `where` conjuncts and negations (docs/language.md §4, §4.1).

`MatchBinder.try_bind` is the one place that decides whether a partial match may take an
event as a component: the conjuncts the binding makes checkable, the negation candidates
still pending, leading negations once the match is complete, and under `select last` the
negation events a replacement puts back in scope (`_rebind_base`, from the log the PM keeps).
"""

from __future__ import annotations

from typing import Any

from filters.eager.composite_base import CompositeBase
from filters.eager.matches import PartialMatch
from filters.pattern import Conj
from filters.runtime import Binding

Binds = dict[str, dict[str, Any]]  # component name -> bound event's attributes
NegCands = list[tuple[int, Binding]]  # (negated leaf, its event) awaiting later bindings


class MatchBinder(CompositeBase):
    """The binding checks of the eager composite runtime."""

    __slots__ = ()

    def _neg_blocks(self, cands: NegCands, binds: Binds, final: bool) -> tuple[bool, NegCands]:
        """Re-check pending negation candidates after a binding: (blocked?, still pending)."""
        pending = []
        for x, b in cands:
            verdict = self._neg_verdict(x, b, binds, final)
            if verdict is True:
                return True, []
            if verdict is None:
                pending.append((x, b))
        return False, pending

    def _neg_verdict(self, x: int, b: Binding, binds: Binds, final: bool) -> bool | None:
        """Does negation event b (leaf x) kill, given bindings? None: not decidable yet."""
        conjs = self.neg_conjs[x]
        if not conjs:
            return True
        binds = dict(binds)
        binds[self.names[x]] = b.ev.attrs
        undecided = False
        for c in conjs:
            if not final and not all(r in binds for r in c.refs):
                undecided = True
                continue
            if not c.fn(binds):
                return False
        return None if undecided else True

    # ----------------------------------------------------------------- bind
    def _try_bind(
        self, pm: PartialMatch, leaf: int, b: Binding, replace: bool = False
    ) -> PartialMatch | None:
        """The PM with `leaf` bound to b, or None when where/negations forbid it."""
        pat = self.pat
        if replace and self.between:
            pm, replace = self._rebind_base(pm, leaf, b), False
        base_mask = pm.mask & ~(1 << leaf) if replace else pm.mask
        new_mask = base_mask | 1 << leaf
        if self.simple and not pm.negc and not pat.has_any:
            new = pm.copy()
            new.binds[leaf] = b
            new.mask = new_mask
            if new.counts and leaf in new.counts:
                del new.counts[leaf]
            return new
        conjs = pat.bind_conjs(base_mask, leaf) if pat.conjs else ()
        cleared = pat.clear_losing_alternatives(new_mask)
        complete = pat.info(cleared).complete
        pending: NegCands | None
        if conjs or pm.negc or (complete and (self.leading or pat.conjs)):
            ok, pending = self._checked(pm, leaf, b, conjs, cleared, new_mask, complete)
            if not ok:
                return None
        else:
            pending = pm.negc
        new = pm.copy()
        new.binds[leaf] = b
        new.mask = cleared
        if cleared != new_mask:
            for i in range(self.n):
                if not cleared >> i & 1:
                    new.binds[i] = None
        new.negc = pending or None
        if new.counts and leaf in new.counts:
            del new.counts[leaf]
        return new

    def _checked(
        self,
        pm: PartialMatch,
        leaf: int,
        b: Binding,
        conjs: list[Conj] | tuple[()],
        cleared: int,
        new_mask: int,
        complete: bool,
    ) -> tuple[bool, NegCands | None]:
        """The checks of binding `leaf` to b: (allowed?, negation candidates still pending)."""
        pat = self.pat
        binds = self._bindings(pm, {leaf: b})
        for c in conjs:
            if not c.fn(binds):
                return False, None
        negc = pm.negc
        pending: NegCands | None = None
        if negc:
            blocked, pending = self._neg_blocks(negc, binds, final=complete and not pat.trailing)
            if blocked:
                return False, None
        if not complete:
            return True, pending
        # conjuncts not fully bound in the final match (across any-alternatives, or
        # mentioning a binding the winning alternative dropped) see absent values;
        # with a trailing negation too: its positives are final once all are bound
        final = binds
        if cleared != new_mask:
            names = self.names
            final = {n: a for n, a in binds.items() if cleared >> names.index(n) & 1}
        for c in pat.conjs:
            if not c.neg and c.mask & cleared != c.mask and not c.fn(final):
                return False, None
        if self.leading and self._leading_blocks(pm, leaf, b, binds, cleared):
            # the last positive is bound: the leading window [last.ts - T, first) is known
            return False, None
        return True, pending

    def _leading_blocks(
        self, pm: PartialMatch, leaf: int, b: Binding, binds: Binds, final: int = -1
    ) -> bool:
        """Is there a leading-negation event before the match's first event, inside the window?

        `final` is the mask of the match's leaves (bindings of a losing any-alternative are
        not part of it); `leaf` is being bound (or re-bound under `last`), so its old event
        does not count.
        """
        hist = pm.part.history
        if not hist:
            return False
        first_seq = min(
            [
                x.seq
                for j, x in enumerate(pm.binds)
                if x is not None and j != leaf and final >> j & 1
            ]
            + [b.seq]
        )
        lo = b.ev.ts - (self.window or 0.0)
        for hseq, hts, x, hb in hist:
            if hts >= lo and hseq < first_seq and self._neg_verdict(x, hb, binds, final=True):
                return True
        return False

    def _could_start(self, starts: list[int], b: Binding) -> bool:
        """Could b open a partial match: does a starting leaf it matches pass every `where`
        conjunct that mentions that leaf alone? (What `nth` counts, spec §4.1 item 2.)"""
        pat = self.pat
        if not pat.conjs:
            return True
        names = self.names
        for i in starts:
            conjs = pat.bind_conjs(0, i)
            if not conjs:
                return True
            binds = {names[i]: b.ev.attrs}
            if all(c.fn(binds) for c in conjs):
                return True
        return False

    # ------------------------------------------------ `select last` replacements
    def _log_negations(self, pm: PartialMatch, neg: list[int], b: Binding) -> None:
        """`select last`: remember the between-negation events the PM sees (`_rebind_base`).

        An event of a negation without `where` is not logged if one of the same negation is
        logged since the PM's newest binding: both lie between the same two bindings whatever
        is replaced later, so it adds nothing (and a PM without a window stays bounded).
        """
        between = self.between
        for x in neg:
            if x not in between:
                continue
            log = pm.nlog
            if log is None:
                pm.nlog = [(x, b)]
                continue
            if not self.neg_conjs[x] and self._logged_since_newest(pm, log, x):
                continue
            log.append((x, b))

    @staticmethod
    def _logged_since_newest(pm: PartialMatch, log: NegCands, x: int) -> bool:
        newest = max(y.seq for y in pm.binds if y is not None)
        for lx, le in reversed(log):
            if le.seq <= newest:
                return False
            if lx == x:
                return True
        return False

    def _prune_nlog(self, pm: PartialMatch) -> None:
        """Forget logged negation events no future replacement can bring into scope: those
        before the last binding that can no longer be replaced (`last` replaces the newest
        binding, or a bound child of an incomplete `all`)."""
        log = pm.nlog
        if not log:
            return
        newest = self._newest(pm)
        repl = set(self.pat.info(pm.mask).all_bound)
        if newest is not None:
            repl.add(newest)
        binds = pm.binds
        lo = min((x.seq for i in repl if (x := binds[i]) is not None), default=-1)
        q = max(
            (x.seq for i, x in enumerate(binds) if x is not None and i not in repl and x.seq < lo),
            default=-1,
        )
        if q >= 0 and log[0][1].seq <= q:
            pm.nlog = [(x, e) for x, e in log if e.seq > q] or None

    def _rebind_base(self, pm: PartialMatch, leaf: int, b: Binding) -> PartialMatch:
        """`select last` is to replace `leaf`'s binding by b: the PM without it, whose pending
        negations are the logged between-negation events that the new binding puts in scope
        (spec §4.1 item 1: no such event between the new binding and its neighbours).

        The PM's bindings are replayed in arrival order with the logged events between them:
        an event is in scope if its negation is active in the state reached before it (the
        new binding comes last, after every logged event). `_try_bind` then binds `leaf` to b,
        checking those candidates against the new bindings like any pending negation.
        """
        base = pm.copy()
        base.binds[leaf] = None
        base.mask = pm.mask & ~(1 << leaf)
        cands: NegCands = []
        log = pm.nlog
        if log:
            info = self.pat.info
            marks = sorted((x.seq, j) for j, x in enumerate(base.binds) if x is not None)
            bound = {s for s, _ in marks}
            mask = k = 0
            for x, e in log:  # in arrival order
                if e.seq in bound:
                    continue  # bound into the PM: never a negation of it
                while k < len(marks) and marks[k][0] < e.seq:
                    mask |= 1 << marks[k][1]
                    k += 1
                if x in info(mask).negations_set:
                    cands.append((x, e))
        base.negc = cands or None
        return base
