"""Rare-first evaluation of `seq(c1, ..., cn) within T`: a rare component drives (issue 16).

The eager runtime opens a partial match (PM) on every c1 event: a PM object, a
terminator in the temporal pool, auxiliary profiles in the primitive pool, and
its expiry later. Here the events of the components before the driver ck (the
last, or under `each` any but the first) are only appended to per-partition,
time-ordered buffers (pruned by the window), and the work is done when a ck
event arrives: it looks up exactly the PMs the eager engine would hold at that
moment and extends them in the same step (completes them, when ck is the last;
otherwise they wait in `pend` for the later components, bound as eagerly).

What the eager engine holds is reconstructed from the buffers, per selection:

- `each`: every combination of buffered events in component order whose first
  event is inside the window and whose `where` conjuncts hold (checked at the
  binding that makes them checkable, as the eager engine does). `consume unique`
  reports the earliest combination (component by component) and takes its
  events out of the buffers; `shared` reports them all, in that order.
- `first`: at most one PM per partition; which c1 event opened it depends on
  the chain of earlier PMs (a c1 event arriving while one exists is ignored
  for good), so the opener is tracked online, in O(1) per c1 event: the first
  c1 event (passing its own conjuncts) after the last PM expired or was
  consumed. Its later components bind greedily: the first buffered event of
  each component after the previous binding that passes the conjuncts.

An event matching several components is handled as the eager engine does:
first as the driver (extend/complete), then, unless consumed, as an earlier
component (bound later) and as an opener. Pure like the engine: time is the
events' `ts`; a PM alive at ts `t` is one with `first.ts + T >= t` (timers fire
when time passes their deadline).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from filters.composite import CompositeRuntime
from filters.matches import PartialMatch, Partition
from filters.notification import Notification
from filters.pattern import Conj, Pattern
from filters.runtime import Binding, DerivedRuntime, EngineHost, PartKey, shared
from profiles.ast import Profile
from profiles.events import Event

Binds = dict[str, dict[str, Any]]  # component name -> bound event's attributes


def _drop_expired(buf: list[Binding], window: float, now: float) -> None:
    """Drop the leading events of a ts-ordered buffer whose window ended before `now` (the
    caller saw the first one's did)."""
    k = 1
    while k < len(buf) and buf[k].ev.ts + window < now:
        k += 1
    del buf[:k]


class LazyPartition:
    """One partition: a buffer per deferred component, the opener under `first`."""

    __slots__ = ("values", "bufs", "opener", "pend")

    def __init__(self, values: dict[str, Any] | None, n: int) -> None:
        self.values = values
        self.bufs: list[list[Binding]] = [[] for _ in range(n - 1)]
        self.opener: Binding | None = None
        # a driver before the last component: the partial matches past it, each its bound
        # events in component order (few: they hold the rare component)
        self.pend: list[list[Binding]] = []

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.values, self.bufs, self.opener, self.pend)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.values, self.bufs, self.opener = state[:3]
        self.pend = state[3] if len(state) > 3 else []

    def size(self) -> int:
        return sum(len(b) for b in self.bufs) + (self.opener is not None) + len(self.pend)


class LazySeqRuntime(DerivedRuntime):
    """A `seq` profile evaluated rare-first (see the module docstring; shapes: `plans.lazy_shape`)."""

    _sweep_at = float("-inf")  # snapshots from before it existed restore too

    def __init__(
        self, engine: EngineHost, profile: Profile, idx: int, driver: int | None = None
    ) -> None:
        super().__init__(engine, profile, idx)
        # the component whose events drive (-1: the last, set by `_derive`)
        self.k: int = -1 if driver is None else driver
        self.each = profile.select.kind == "each"
        self.unique = profile.consume == "unique"
        self.window = float(profile.within)  # type: ignore[arg-type]
        self.parts: dict[PartKey, LazyPartition] = {}
        self._sweep_at = float("-inf")  # event time of the next sweep of quiet partitions
        self._derive()

    _DERIVED: ClassVar[tuple[str, ...]] = (
        "pat",
        "n",
        "names",
        "conjs",
        "open_conjs",
        "per1",
        "slack",
        "_sinks",
    )
    # the tables, rebuilt by `_derive`, not stored in snapshots
    pat: Pattern
    n: int
    names: tuple[str, ...]
    conjs: list[list[Conj]]  # the conjuncts the eager engine checks when leaf j binds after 0..j-1
    open_conjs: list[Conj]
    per1: str | None  # the one `per` attribute, if there is exactly one
    slack: float
    _sinks: dict[int, Callable[[Event, int], bool] | None]  # leaf -> its handler (`sink`)

    def _derive(self) -> None:
        self.per1 = self.per[0] if len(self.per) == 1 else None
        # appends drop expired events once the oldest is this far behind, a few at a time
        # (a driver prunes exactly first): the buffer holds at most 1/8 more than the window
        self.slack = self.window * 1.125
        self._sinks = {}
        self.pat = Pattern.build(self.profile)
        self.n = len(self.pat.leaves)
        self.names = shared(tuple(lf.name for lf in self.pat.leaves))
        pat = self.pat
        self.conjs = [pat.bind_conjs((1 << j) - 1, j) if pat.conjs else [] for j in range(self.n)]
        self.open_conjs = self.conjs[0]
        k = self.__dict__.get("k")  # None: snapshots from before drivers other than the last
        self.k = self.n - 1 if k is None or k < 0 or not self.each else k

    def start_registrations(self) -> list[tuple[Any, int]]:
        return [(lf.filter, lf.idx) for lf in self.pat.leaves]

    def live(self) -> tuple[int, int]:
        """(buffered events under `each`, tracked partial matches under `first`; partitions)."""
        if self.each:
            return (sum(p.size() for p in self.parts.values()), len(self.parts))
        return (sum(1 for p in self.parts.values() if p.opener is not None), len(self.parts))

    def fresh(self) -> bool:
        return not self.parts

    def clear(self) -> None:
        self.parts.clear()

    # ---------------------------------------------------------------- event
    def sink(self, leaf: int) -> Callable[[Event, int], bool] | None:
        """A precompiled handler for events that match only `leaf` among this profile's
        components, when that is a deferred one (the frequent events rare-first exists for);
        made once per leaf. It does the common case with every constant in a local and
        returns False (then `on_event` runs) whenever there is more to do: a new partition, a
        sweep due, a binding. None when `leaf` is not deferred. Valid while no tracer is set.
        Each handler finds the partition inline (the same seven lines in the three of them):
        a shared helper would cost a call per event on the path these exist to shorten.
        """
        try:
            return self._sinks[leaf]
        except KeyError:
            made = self._sinks[leaf] = self._make_sink(leaf)
            return made

    def _make_sink(self, leaf: int) -> Callable[[Event, int], bool] | None:
        if leaf == self.k or (self.per and self.per1 is None):
            return None
        if not self.each:
            return self._first_sink(leaf)
        if leaf > self.k:
            return self._late_sink()
        if leaf == 0 and self.open_conjs:
            return None
        parts, per1, w, slack, rt = self.parts, self.per1, self.window, self.slack, self

        def append(ev: Event, seq: int) -> bool:
            if per1 is not None:
                v = ev.attrs.get(per1)
                if v is None:
                    return True  # in no partition: nothing to do (as `on_event`)
                part = parts.get(((bool, v),) if v.__class__ is bool else (v,))
            else:
                part = parts.get(())
            now = ev.ts
            if part is None or now >= rt._sweep_at:
                return False
            buf = part.bufs[leaf]
            if buf and buf[0].ev.ts + slack < now:
                if len(buf) > 1 and buf[1].ev.ts + w >= now:
                    del buf[0]  # the usual case, inline: one reading left the window
                else:
                    _drop_expired(buf, w, now)
            buf.append(Binding(seq, ev))
            return True

        return append

    def _late_sink(self) -> Callable[[Event, int], bool]:
        """`each`, a component after a middle driver: nothing to do unless the partition
        holds partial matches past the driver (`pend`), which is rare: they hold the driver."""
        parts, per1, rt = self.parts, self.per1, self

        def idle(ev: Event, seq: int) -> bool:
            if per1 is not None:
                v = ev.attrs.get(per1)
                if v is None:
                    return True
                part = parts.get(((bool, v),) if v.__class__ is bool else (v,))
            else:
                part = parts.get(())
            return part is None or (not part.pend and ev.ts < rt._sweep_at)

        return idle

    def _first_sink(self, leaf: int) -> Callable[[Event, int], bool]:
        """`select first`: an event of a deferred component while the partition's PM lives
        and does not await it is ignored for good (eagerly: a duplicate of a waiting match),
        the common case at one reading a minute; anything else goes to `on_event`."""
        parts, per1, w, rt = self.parts, self.per1, self.window, self
        awaited = leaf - 1  # bindings in the chain when the PM waits for this component

        def ignore(ev: Event, seq: int) -> bool:
            if per1 is not None:
                v = ev.attrs.get(per1)
                if v is None:
                    return True
                part = parts.get(((bool, v),) if v.__class__ is bool else (v,))
            else:
                part = parts.get(())
            if part is None:
                return False
            op = part.opener
            now = ev.ts
            if op is None or op.ev.ts + w < now or now >= rt._sweep_at:
                return False
            return leaf == 0 or len(part.bufs[0]) != awaited

        return ignore

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        key = self.partition_key(ev.attrs)
        if key is None:
            return
        part = self.parts.get(key)
        now = ev.ts
        if now >= self._sweep_at:  # once per window of event time: partitions gone quiet
            self._sweep_at = now + self.window
            self._sweep(now)
            part = self.parts.get(key)
        elif part is not None and len(leaves) == 1 and self.engine.tracer is None:
            fast = self.sink(leaves[0])  # the engine calls it directly when it can
            if fast is not None and fast(ev, seq):
                return
        last, k = self.n - 1, self.k
        b: Binding | None = None
        if k < last:  # a middle driver (`each`): extend what lies past it, or drive
            if part is not None and (part.pend or k in leaves):
                self._prune(part, now)
                b = Binding(seq, ev)
                if self._step_past(part, b, leaves):
                    self._tidy(key, part)
                    return  # consumed
                if not self.active:
                    return
        elif part is not None and last in leaves:
            self._prune(part, now)
            b = Binding(seq, ev)
            if self._drive_each(part, b) if self.each else self._drive_first(part, b):
                self._tidy(key, part)
                return  # consumed
            if not self.active:
                return
        if not self.each:
            self._step_first(part, key, ev, seq, leaves, b)
            return
        tracing = self.engine.tracer is not None
        w = self.window
        for i in leaves:
            if i >= k:
                continue
            if (
                i == 0
                and self.open_conjs
                and not self._check(self.open_conjs, {self.names[0]: ev.attrs})
            ):
                if tracing:
                    self._trace("ignored", f"{ev.id} cannot start: where not satisfied")
                continue
            if part is None:
                part = self.parts[key] = LazyPartition(self.partition_values(ev.attrs), self.n)
            buf = part.bufs[i]
            if buf and buf[0].ev.ts + w < now:
                _drop_expired(buf, w, now)
            if b is None:
                b = Binding(seq, ev)
            buf.append(b)
            if tracing:
                self._trace("buffered", f"{ev.id} as {self.names[i]}")

    def _step_first(
        self,
        part: LazyPartition | None,
        key: PartKey,
        ev: Event,
        seq: int,
        leaves: list[int],
        b: Binding | None,
    ) -> None:
        """`select first`, an event the driver did not consume: bind the awaited component, or open.

        The partition's one PM is tracked as it would be eagerly (opener, then the components
        bound so far in `bufs[0]`), minus its terminator and auxiliary profiles: a component
        event binds only when it is the awaited one (the first that passes its conjuncts), an
        event binds at most one component, and a starting event opens only where no PM lives.
        """
        tracing = self.engine.tracer is not None
        op = part.opener if part is not None else None
        if op is not None and op.ev.ts + self.window < ev.ts:
            self._expire(part)  # type: ignore[arg-type]
            op = None
        if op is not None:
            chain = part.bufs[0]  # type: ignore[union-attr]
            j = len(chain) + 1
            if j < self.n - 1 and j in leaves:
                names = self.names
                cs = self.conjs[j]
                if cs:
                    attrs = {names[0]: op.ev.attrs}
                    for k, x in enumerate(chain, 1):
                        attrs[names[k]] = x.ev.attrs
                    attrs[names[j]] = ev.attrs
                    if not self._check(cs, attrs):
                        if tracing:
                            self._trace("ignored", f"{ev.id} for {names[j]}: where not satisfied")
                        return
                chain.append(b or Binding(seq, ev))
                if tracing:
                    self._trace("extended", f"opened by {op.ev.id}: {ev.id} bound as {names[j]}")
            elif tracing and 0 in leaves:
                self._trace(
                    "ignored", f"{ev.id}: a partial match already exists (opened by {op.ev.id})"
                )
            return
        if 0 not in leaves:
            if part is not None:
                self._tidy(key, part)
            return
        if self.open_conjs and not self._check(self.open_conjs, {self.names[0]: ev.attrs}):
            if tracing:
                self._trace("ignored", f"{ev.id} cannot start: where not satisfied")
            return
        if part is None:
            part = self.parts[key] = LazyPartition(self.partition_values(ev.attrs), self.n)
        part.opener = b or Binding(seq, ev)
        if tracing:
            self._trace(
                "opened",
                f"{{{self.names[0]}: {ev.id}}} (rare-first: no timer, no auxiliary profiles)",
            )

    def _expire(self, part: LazyPartition) -> None:
        """`first`: the opener's window ended, its PM expired: nothing buffered can bind now."""
        part.opener = None
        for buf in part.bufs:
            buf.clear()

    def _sweep(self, now: float) -> None:
        for key, part in list(self.parts.items()):
            self._prune(part, now)
            self._tidy(key, part)

    def _tidy(self, key: PartKey, part: LazyPartition) -> None:
        if not part.size() and self.parts.get(key) is part:
            del self.parts[key]

    def _prune(self, part: LazyPartition, now: float) -> None:
        """Forget what no PM alive at `now` can hold: a PM lives while first.ts + T >= now."""
        w = self.window
        op = part.opener
        if op is not None and op.ev.ts + w < now:
            self._expire(part)
            return
        if not self.each:
            return  # `first` holds its PM's bindings, not a buffer
        for buf in part.bufs:
            if buf and buf[0].ev.ts + w < now:
                _drop_expired(buf, w, now)
        if part.pend:
            part.pend = [pm for pm in part.pend if min(x.ev.ts for x in pm) + w >= now]

    def _check(self, conjs: list[Conj], binds: Binds) -> bool:
        for c in conjs:
            if not c.fn(binds):
                return False
        return True

    # --------------------------------------------------------------- drivers
    def _drive_first(self, part: LazyPartition, b: Binding) -> bool:
        """`select first`: complete the partition's one PM if it waits for the driver."""
        op = part.opener
        if op is None:
            return False
        chain = part.bufs[0]
        last = self.n - 1
        if len(chain) != last - 1:
            return False  # the PM does not wait for the driver yet
        names = self.names
        binds = [op, *chain, b]
        cs = self.conjs[last]
        if cs and not self._check(cs, {names[j]: x.ev.attrs for j, x in enumerate(binds)}):
            if self.engine.tracer is not None:
                self._trace("ignored", f"{b.ev.id}: where not satisfied")
            return False
        events = {names[j]: x.ev for j, x in enumerate(binds)}
        if self.unique:
            self._expire(part)  # consumed: the partition is empty again
        self.report(b.ev.ts, events, part.values)
        return self.unique

    def _drive_each(self, part: LazyPartition, b: Binding) -> bool:
        """`select each`: every buffered combination the driver completes, earliest first."""
        if not all(part.bufs):
            return False
        names, last = self.names, self.n - 1
        if last == 1 and self.engine.tracer is None:
            return self._drive_pairs(part, b)
        found = self._combos(part.bufs, last, b, self.unique)
        if not found:
            return False
        ts = b.ev.ts
        for combo in found:
            events = {names[j]: x.ev for j, x in enumerate(combo)}
            if self.unique:
                self._consume(part, {x.seq for x in combo})
            self.report(ts, events, part.values)
            if not self.active:
                break
        return self.unique

    def _combos(
        self, bufs: list[list[Binding]], depth: int, b: Binding, first_only: bool
    ) -> list[list[Binding]]:
        """The partial matches on components 0..depth-1 the eager engine holds (buffered
        events in component order, the first inside the window: the caller pruned) that
        `b` extends as component `depth`, each with `b`, earliest first; the conjuncts
        checked at the binding that makes them checkable, as `_try_bind` does."""
        names, conjs = self.names, self.conjs
        found: list[list[Binding]] = []
        stack: list[Binding] = []
        attrs: dict[str, dict[str, Any]] = {}

        def dfs(j: int, prev: int) -> bool:  # True: stop (first_only found one)
            if j == depth:
                cs = conjs[depth]
                if cs:
                    attrs[names[depth]] = b.ev.attrs
                    if not self._check(cs, attrs):
                        return False
                found.append([*stack, b])
                return first_only
            cs = conjs[j]
            name = names[j]
            for x in bufs[j]:
                if x.seq <= prev:
                    continue
                attrs[name] = x.ev.attrs
                if cs and not self._check(cs, attrs):
                    continue
                stack.append(x)
                stop = dfs(j + 1, x.seq)
                stack.pop()
                if stop:
                    return True
            return False

        dfs(0, -1)
        return found

    def _consume(self, part: LazyPartition, used: set[int]) -> None:
        """`consume unique`: the eager engine drops every PM holding a consumed event."""
        for buf in part.bufs:
            if buf:
                buf[:] = [x for x in buf if x.seq not in used]
        if part.pend:
            part.pend = [pm for pm in part.pend if not any(x.seq in used for x in pm)]

    def _step_past(self, part: LazyPartition, b: Binding, leaves: list[int]) -> bool:
        """`select each` driven by a middle component k: `b` extends the partial matches past
        k (`pend`) and, as component k, every buffered combination before it; completions
        are reported earliest first (one, consumed, under `unique`). True: consumed."""
        names, conjs, last, k = self.names, self.conjs, self.n - 1, self.k
        ev = b.ev
        done: list[list[Binding]] = []
        made: list[list[Binding]] = []
        for pm in part.pend:
            j = len(pm)
            if j not in leaves:
                continue
            cs = conjs[j]
            if cs:
                attrs = {names[i]: x.ev.attrs for i, x in enumerate(pm)}
                attrs[names[j]] = ev.attrs
                if not self._check(cs, attrs):
                    continue
            (done if j == last else made).append([*pm, b])
        if k in leaves and all(part.bufs[:k]):
            made.extend(self._combos(part.bufs, k, b, False))
        if self.engine.tracer is not None:
            for pm in made:
                self._trace(
                    "extended",
                    "{" + ", ".join(f"{names[i]}: {x.ev.id}" for i, x in enumerate(pm)) + "}",
                )
        if done:
            done.sort(key=lambda pm: [x.seq for x in pm])
            ts = ev.ts
            if self.unique:
                self._consume(part, {x.seq for x in done[0]})
                self.report(ts, {names[j]: x.ev for j, x in enumerate(done[0])}, part.values)
                return True  # what this event made holds it: consumed too
            for pm in done:
                self.report(ts, {names[j]: x.ev for j, x in enumerate(pm)}, part.values)
                if not self.active:
                    return False
        part.pend.extend(made)
        return False

    def _drive_pairs(self, part: LazyPartition, b: Binding) -> bool:
        """`_drive_each` for `seq(a, b)`: one loop, notifications built inline (as `_fast_each`)."""
        buf = part.bufs[0]
        n0, n1 = self.names
        cs = self.conjs[1]
        ev = b.ev
        eng = self.engine
        pid, values, sub = self.pid, part.values, self.subscriber
        for x in buf:  # pruned: inside the window, in arrival order (= §4's reporting order)
            if cs and not self._check(cs, {n0: x.ev.attrs, n1: ev.attrs}):
                continue
            eng._nseq += 1
            eng._out.append(Notification(pid, ev.ts, {n0: x.ev, n1: ev}, values, eng._nseq, sub))
            if self.once:
                eng._deactivate(self)
                return self.unique
            if self.unique:
                buf.remove(x)
                return True
        return False

    def _trace(self, action: str, detail: str) -> None:
        self.engine._trace(self.profile.id, action, detail)


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
    each binding). `new._add_pm` gives each its terminator and auxiliary profiles.
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
            new._add_pm(part, pm)


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
            if conjs[j] and not rt._check(conjs[j], attrs):
                continue
            stack.append(x)
            made.append(list(stack))
            dfs(j + 1, x.seq)
            stack.pop()
        attrs.pop(names[j], None)

    dfs(0, -1)
    return made
