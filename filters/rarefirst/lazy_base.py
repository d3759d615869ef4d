"""Rare-first runtime's state and drivers: buffers per partition, what a driver event completes.

`LazyBase` holds a `seq` profile's buffers (`LazyPartition`: the events of the components
before the driver, in arrival order, pruned by the window) and does the work when a driver
event arrives (`_drive_first`, `_drive_each`, `_step_past`). The event entry point and the
precompiled handlers for deferred components are `filters.rarefirst.lazy.LazySeqRuntime`; the module
docstring there says what is reconstructed from the buffers, per selection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from filters.pattern import Conj, Pattern
from filters.runtime import Binding, DerivedRuntime, EngineHost, PartKey, shared
from profiles.ast import Profile
from profiles.events import Event

Binds = dict[str, dict[str, Any]]  # component name -> bound event's attributes


def drop_expired(buf: list[Binding], window: float, now: float) -> None:
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


class LazyBase(DerivedRuntime):
    """A `seq` profile evaluated rare-first: fields, tables, buffers and drivers."""

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

    @property
    def sweep_at(self) -> float:
        """Event time of the next sweep of quiet partitions (stored in a partitioned engine's
        header, `filters.partstate`)."""
        return self._sweep_at

    @sweep_at.setter
    def sweep_at(self, t: float) -> None:
        self._sweep_at = t

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

    def load_partition(self, key: PartKey, part: LazyPartition) -> None:
        """A stored partition back (`filters.partstate`): buffers only, no timers."""
        self.parts[key] = part

    def unload_partition(self, key: PartKey, timers: bool = True) -> None:
        self.parts.pop(key, None)

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
                drop_expired(buf, w, now)
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
        self._cap_notifications(found)
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

    def _cap_notifications(self, found: list[list[Binding]]) -> None:
        """`filters.caps`: of one event's completions, the first ones in report order are kept."""
        cap = self.engine.cap_notifications
        if len(found) > cap and not self.unique:
            self.engine.count_capped_notifications(self.pid, len(found) - cap)
            if self.engine.tracer is not None:
                self._trace("capped", f"{len(found) - cap} notification(s) beyond {cap}")
            del found[cap:]

    def _room(self, buf: list[Binding]) -> None:
        """`filters.caps`: a buffer holds what the eager engine's PMs of one partition would
        (`seq(a, b)`: one per `a`), so the partition cap bounds it: its oldest event leaves."""
        eng = self.engine
        if len(buf) >= eng.cap_partition:
            del buf[: len(buf) - eng.cap_partition + 1]
            eng.count_dropped_pm(self.pid)

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
            self._cap_notifications(done)
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
        room = eng.cap_notifications  # `filters.caps`: the first ones are kept
        for x in buf:  # pruned: inside the window, in arrival order (= §4's reporting order)
            if cs and not self._check(cs, {n0: x.ev.attrs, n1: ev.attrs}):
                continue
            if not room:
                eng.count_capped_notifications(pid, 1)
                continue
            room -= 1
            eng.emit(pid, ev.ts, {n0: x.ev, n1: ev}, values, sub)
            if self.once:
                eng.deactivate(self)
                return self.unique
            if self.unique:
                buf.remove(x)
                return True
        return False
