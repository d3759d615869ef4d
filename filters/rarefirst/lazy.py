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

from filters.rarefirst.lazy_base import LazyBase, LazyPartition, drop_expired
from filters.runtime import Binding, PartKey
from profiles.events import Event


class LazySeqRuntime(LazyBase):
    """A `seq` profile evaluated rare-first (see the module docstring; shapes: `plans.lazy_shape`)."""

    has_sink = True

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
        eng = self.engine

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
                    drop_expired(buf, w, now)
            if len(buf) >= eng.cap_partition:
                rt._room(buf)
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
        self._buffer(part, key, ev, seq, leaves, b)

    def _buffer(
        self,
        part: LazyPartition | None,
        key: PartKey,
        ev: Event,
        seq: int,
        leaves: list[int],
        b: Binding | None,
    ) -> None:
        """`select each`, an event the driver did not consume: buffer it as each component
        before the driver it matches (a first component only if its conjuncts hold)."""
        tracing = self.engine.tracer is not None
        w, k, now = self.window, self.k, ev.ts
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
                drop_expired(buf, w, now)
            if b is None:
                b = Binding(seq, ev)
            self._room(buf)
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
