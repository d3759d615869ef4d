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
with `advance()`. Semantics: LANGUAGE.md and docs/semantics.md.
"""

from __future__ import annotations

import datetime as dt
import io
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from zoneinfo import ZoneInfo

from filters import state as state_format
from filters.compile import evaluate
from filters.notification import Notification
from filters.pattern import Pattern
from filters.plans import MODES, Plan, Rates, choose, lazy_shape
from filters.pool import Entry, PrimitivePool, owners_by_profile
from filters.temporal import TIMER, TemporalPool, TimeDriven
from profiles.ast import Absent, Clock, Profile
from profiles.events import Event

Tracer = Callable[[str, str, str], None]  # (profile id, action, detail)

_INF = float("inf")


class _B:
    """A bound event: its arrival number fixes the total order."""

    __slots__ = ("seq", "ev")

    def __init__(self, seq: int, ev: Event) -> None:
        self.seq = seq
        self.ev = ev


class _PM:
    """A partial match: bound events per positive leaf, the mask of bound leaves."""

    # what a completion reads first: fewer cache lines touched per event
    __slots__ = (
        "mask",
        "binds",
        "regs",
        "alive",
        "part",
        "counts",
        "negc",
        "handle",
        "deadline",
        "nlog",
    )

    def __init__(self, n: int, part: _Partition) -> None:
        self.mask = 0
        self.binds: list[_B | None] = [None] * n
        self.counts: dict[int, int] | None = None
        self.negc: list[tuple[int, _B]] | None = None  # negation candidates awaiting later bindings
        self.handle: tuple | None = None  # temporal-pool entry
        self.regs: tuple = ()  # auxiliary registrations held
        self.alive = True
        self.part = part
        self.deadline: float | None = None
        # `select last` with between-negations: the negation events this PM saw (in scope or
        # not), for checking a replacement against them (`_CompositeRuntime._rebind_base`)
        self.nlog: list[tuple[int, _B]] | None = None

    def __setstate__(self, state: tuple) -> None:
        self.nlog = None  # not in snapshots written before it existed
        for k, v in state[1].items():
            setattr(self, k, v)

    def copy(self) -> _PM:
        pm = _PM.__new__(_PM)
        pm.mask = self.mask
        pm.binds = list(self.binds)
        pm.counts = dict(self.counts) if self.counts else None
        pm.negc = list(self.negc) if self.negc else None
        pm.handle = None
        pm.regs = ()
        pm.alive = True
        pm.part = self.part
        pm.deadline = None
        pm.nlog = list(self.nlog) if self.nlog else None
        return pm

    def order_key(self) -> tuple:
        return tuple(b.seq if b is not None else _INF for b in self.binds)

    def seqs(self) -> set[int]:
        return {b.seq for b in self.binds if b is not None}

    def first_ts(self) -> float:
        return min(b.ev.ts for b in self.binds if b is not None)


class _Partition:
    __slots__ = (  # what a completion reads first: fewer cache lines touched per event
        "pms",
        "regs",
        "dormant",
        "values",
        "key",
        "held",
        "entries",
        "until",
        "starts",
        "starts_ts",
        "history",
        "handle",
    )

    def __init__(self, key: tuple, values: dict[str, Any] | None) -> None:
        self.key = key
        self.values = values
        self.pms: list[_PM] = []
        # (leaf, eqs) -> number of PMs waiting on it; 0: dormant (references: nobody waits, our
        # owner is still in the pool; the next PM takes it back for free)
        self.regs: dict[tuple, int] = {}
        self.held: set[tuple] = set()  # marking/references: auxiliary profiles kept in the pool
        self.entries: dict[tuple, Entry] = {}  # (leaf, eqs) -> its pool entry (dynamic/references)
        self.dormant = 0  # how many keys of `regs` are dormant
        self.until = 0.0  # the latest deadline of a PM that left: its terminator lets `held` go
        self.starts = 0  # nth: starting events counted while no PM exists
        self.starts_ts = 0.0
        self.history: list[tuple[int, float, int, _B]] = []  # leading negations seen
        self.handle: tuple | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the pool handles: the pool is rebuilt on restore (see Engine.__setstate__)."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "entries"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.until = 0.0  # not in snapshots written before it existed
        for k, v in state.items():
            setattr(self, k, v)
        self.entries = {}

    def empty(self) -> bool:
        return not (self.pms or self.history or self.starts)

    def idle(self) -> bool:
        return not (self.pms or self.history or self.starts or self.held)


# ---------------------------------------------------------------- runtimes


class _Runtime:
    """One profile's state inside the engine."""

    def __init__(self, engine: Engine, profile: Profile, idx: int) -> None:
        self.engine = engine
        self.profile = profile
        self.idx = idx
        self.active = True
        self.per = profile.per
        self.pid, self.subscriber, self.once = profile.id, profile.subscriber, profile.once

    def start_registrations(self) -> Iterable[tuple[Any, int]]:
        return ()

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        raise NotImplementedError

    def on_timer(self, when: float, payload: Any) -> None:
        pass

    def activate(self, now: float | None) -> None:
        pass

    def sink(self, leaf: int) -> Callable[[Event, int], bool] | None:
        """A fast handler for events matching only `leaf` (see `LazySeqRuntime.sink`); most
        runtimes have none."""
        return None

    def live(self) -> tuple[int, int]:
        """(partial matches, partitions) held; a rare-first runtime counts its buffered events."""
        return (0, 0)

    def clear(self) -> None:
        """Forget all state (the profile is being removed)."""

    def fresh(self) -> bool:
        """Holds nothing but its profile: a snapshot stores the profile only (see Engine)."""
        return False

    def report(self, ts: float, events: dict[str, Event], partition: dict[str, Any] | None) -> None:
        eng = self.engine
        eng._nseq += 1
        eng._out.append(Notification(self.pid, ts, events, partition, eng._nseq, self.subscriber))
        if eng.tracer is not None:
            eng._trace(self.pid, "reported", _fmt(events) + f" at {_num(ts)}")
        if self.once:
            eng._deactivate(self)

    def partition_key(self, attrs: dict[str, Any]) -> tuple | None:
        """The event's partition (`per` values, normalised); None if it lacks a `per` attribute."""
        per = self.per
        if not per:
            return ()
        if len(per) == 1:  # the usual case
            v = attrs.get(per[0])
            if v is None:
                return None
            return ((bool, v),) if v.__class__ is bool else (v,)
        vals = []
        for a in per:
            v = attrs.get(a)
            if v is None:
                return None
            vals.append((bool, v) if v.__class__ is bool else v)  # `norm`, inline: every event
        return tuple(vals)

    def partition_values(self, attrs: dict[str, Any]) -> dict[str, Any] | None:
        """The `per` values as reported; built only when a partition is created (every event
        of a profile with `per` computes its key, few create a partition)."""
        return {a: attrs[a] for a in self.per} if self.per else None


_SHARED: dict[tuple, tuple] = {}
# (shape's mask tables, which leaves are filters) -> mask -> auxiliary registrations wanted
_WANTS: dict[tuple, dict[int, tuple]] = {}


def _shared(t: tuple) -> tuple:
    """One object for equal small tuples (component names, registration keys) across profiles.

    Thousands of profiles of one shape then read the same few objects on every completion,
    which stay in the CPU cache, instead of one copy each (measured: bench composite).
    """
    return _SHARED.setdefault(t, t)


def _drifted(old: Mapping[str, float], new: Mapping[str, float], factor: float) -> bool:
    """Did any component's rate move by `factor` or more (a rate from or to 0 always has)?"""
    for k, r in new.items():
        o = old.get(k, 0.0)
        lo, hi = min(o, r), max(o, r)
        if hi and (not lo or hi / lo >= factor):
            return True
    return False


def _num(ts: float) -> str:
    return f"{ts:.3f}".rstrip("0").rstrip(".")


def _fmt(events: dict[str, Event]) -> str:
    return "{" + ", ".join(f"{k}: {v.id}" for k, v in events.items()) + "}"


class _FilterRuntime(_Runtime):
    def start_registrations(self) -> Iterable[tuple[Any, int]]:
        return [(self.profile.expr, 0)]

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        self.report(ev.ts, {"e": ev}, None)

    def fresh(self) -> bool:
        return True


class _AbsentRuntime(_Runtime):
    """absent(F) within T: one notification per silence, re-armed by the next F event."""

    def __init__(self, engine: Engine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        assert isinstance(profile.expr, Absent)
        self.window = float(profile.within or 0.0)
        self.parts: dict[tuple, list[Any]] = {}  # key -> [last event | None, handle, values]

    def start_registrations(self) -> Iterable[tuple[Any, int]]:
        return [(self.profile.expr.filter, 0)]  # type: ignore[union-attr]

    def activate(self, now: float | None) -> None:
        if not self.per and now is not None and () not in self.parts:
            self._arm((), None, None, now)

    def _arm(
        self, key: tuple, values: dict[str, Any] | None, last: Event | None, at: float
    ) -> None:
        st = self.parts.get(key)
        if st is not None:
            self.engine.timers.discard(st[1])
        handle = self.engine.timers.add(at + self.window, TIMER, (self, key))
        self.parts[key] = [last, handle, values]

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        key = self.partition_key(ev.attrs)
        if key is None:
            return
        values = self.partition_values(ev.attrs)
        if self.engine.tracer is not None:
            self.engine._trace(
                self.profile.id,
                "restarted",
                f"silence timer by {ev.id} until ts={_num(ev.ts + self.window)}",
            )
        self._arm(key, values, ev, ev.ts)

    def on_timer(self, when: float, key: Any) -> None:
        st = self.parts.pop(key, None)
        if st is None:
            return
        last, _, values = st
        self.report(when, {"last": last} if last is not None else {}, values)

    def live(self) -> tuple[int, int]:
        return (len(self.parts), len(self.parts))

    def fresh(self) -> bool:
        return not self.parts  # quiet: no timer armed (activation is not replayed on restore)


class _DerivedRuntime(_Runtime):
    """A runtime with compiled tables (`_DERIVED`, built by `_derive` from the profile).

    Snapshots keep the state, not the tables: they are rebuilt on restore.
    """

    _DERIVED: tuple[str, ...] = ()

    def _derive(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._DERIVED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive()


class _CompositeRuntime(_DerivedRuntime):
    def __init__(self, engine: Engine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        self.kind = profile.select.kind
        self.nth = profile.select.n
        self.unique = profile.consume == "unique"
        self.window = profile.within
        self.parts: dict[tuple, _Partition] = {}
        self.pm_count = 0
        self._derive()

    _DERIVED = (
        "_aux",
        "pat",
        "n",
        "flat",
        "start",
        "start_set",
        "leading",
        "clock_leaves",
        "neg_conjs",
        "names",
        "neg_set",
        "simple",
        "fast",
        "fast_each",
        "_wants",
        "_trans",
        "between",
    )

    def _derive(self) -> None:
        """The tables, computed once per pattern: read-only (the memos `_trans` and `_wants` are
        pure functions of a mask), so runtimes of one shared pattern (`Pattern.build` may return
        one per profile, as `ens spark stream` does) share them, and a restore is cheap."""
        pat = Pattern.build(self.profile)
        cached = pat.__dict__.get("_runtime_tables")
        if cached is None or cached[0] != self.kind:
            cached = pat._runtime_tables = (self.kind, self._tables(pat))  # type: ignore[attr-defined]
        self.__dict__.update(cached[1])
        self._aux: dict[
            int, Entry
        ] = {}  # leaf -> its auxiliary profile, planned (see `prepare_aux`)

    def _tables(self, pat: Pattern) -> dict[str, Any]:
        simple = not pat.conjs and not pat.leading  # no where, no history: binding needs no checks
        neg_set = frozenset(i for i, lf in enumerate(pat.leaves) if lf.negated)
        # first/last over positives only, no any/trailing: the fast path's exact domain
        plain = simple and not neg_set and not pat.has_any
        start = pat.info(0).enabled
        between = frozenset(neg_set - set(pat.leading) - set(pat.trailing))
        return {
            "pat": pat,
            "n": len(pat.leaves),
            "_trans": pat._trans,  # mask -> transitions, shared by every pattern of this shape
            "start": start,
            "start_set": frozenset(start),
            "leading": frozenset(pat.leading),
            "clock_leaves": [lf for lf in pat.leaves if lf.clock is not None],
            "neg_conjs": {
                i: [c for c in pat.conjs if i in c.neg]
                for i, lf in enumerate(pat.leaves)
                if lf.negated
            },
            "names": _shared(tuple(lf.name for lf in pat.leaves)),
            "neg_set": neg_set,
            "simple": simple,
            "fast": plain and self.kind in ("first", "last"),
            "fast_each": plain and self.kind == "each",
            # without where-equalities or `last`, the auxiliary profiles wanted depend on the mask
            # only: one memo per shape (and clock leaves), shared by the profiles of that shape
            "_wants": _WANTS.setdefault(
                (id(pat._masks), tuple(lf.clock is None for lf in pat.leaves)), {}
            )
            if not pat.eq_bindings and self.kind != "last"
            else None,
            # no nested window: a PM's deadline is its first event's time plus the window
            "flat": all(node.within is None for node in pat.nodes[1:]),
            # `select last`: the between-negations a replacement is checked against (§4.1 item 1)
            "between": between if self.kind == "last" else frozenset(),
        }

    # --------------------------------------------------------- registrations
    def start_registrations(self) -> Iterable[tuple[Any, int]]:
        out = []
        for i in self.start:
            lf = self.pat.leaves[i]
            if lf.clock is None:
                out.append((lf.filter, i))
        for i in self.pat.leading:
            out.append((self.pat.leaves[i].filter, i))
        return out

    def prepare_aux(self) -> None:
        """Plan, once, the auxiliary profiles that do not depend on bound values (no `per`, no
        where-equality): a partial match then inserts its own by an index update only."""
        if self.per or self.engine.variant == "marking":
            return
        pool = self.engine.pool
        eqb = self.pat.eq_bindings
        for lf in self.pat.leaves:
            if lf.clock is None and not eqb.get(lf.idx) and lf.idx not in self._aux:
                self._aux[lf.idx] = pool.prepare(lf.filter)

    def _wanted(self, pm: _PM) -> tuple:
        """Auxiliary registrations (leaf, eqs) this PM needs in its partition."""
        wants = self._wants
        if wants is not None:
            w = wants.get(pm.mask)
            if w is None:
                w = wants[pm.mask] = _shared(self._wanted_now(pm))
            return w
        return self._wanted_now(pm)

    def _wanted_now(self, pm: _PM) -> tuple:
        pat = self.pat
        mi = pat.info(pm.mask)
        leaves = list(mi.enabled)
        if self.kind == "last" and pm.mask:
            newest = self._newest(pm)
            if newest is not None and newest not in leaves:
                leaves.append(newest)
            for j in mi.all_bound:
                if j not in leaves:
                    leaves.append(j)
        leaves.extend(mi.negations)
        between = self.between
        if between and pm.mask:
            # every between-negation, active or not, unrestricted by where-values bound so far:
            # a replacement may bring its events into scope or change the values (`_rebind_base`)
            leaves.extend(i for i in sorted(between) if i not in mi.negations_set)
        out = []
        eqb = pat.eq_bindings
        for i in leaves:
            if pat.leaves[i].clock is not None:
                continue
            eqs: tuple = ()
            rules = eqb.get(i)
            if rules and i not in between:
                vals = []
                ok = True
                for attr, other, oattr in rules:
                    b = pm.binds[other]
                    if b is None:
                        continue
                    v = b.ev.attrs.get(oattr)
                    if v is None:
                        ok = False
                        break
                    vals.append((attr, v))
                if not ok:
                    continue
                eqs = tuple(vals)
            out.append(_shared((i, eqs)) if not eqs else (i, eqs))
        return tuple(out)

    def _sync(self, pm: _PM) -> None:
        """Make the pool hold exactly the auxiliary profiles this PM waits on."""
        new = self._wanted(pm) if pm.alive else ()
        old = pm.regs
        if new == old:
            return
        part = pm.part
        for key in old:
            if key not in new:
                self._unreg(part, key)
        for key in new:
            if key not in old:
                self._reg(part, key)
        pm.regs = new

    def _reg(self, part: _Partition, key: tuple) -> None:
        n = part.regs.get(key)
        if n is not None:
            part.regs[key] = n + 1
            if not n:  # dormant (references): our owner never left the pool
                part.dormant -= 1
            return
        part.regs[key] = 1
        eng = self.engine
        variant = eng.variant
        leaf, eqs = key
        if variant == "marking":
            if key in part.held:
                return  # already in the pool, unmarked: marking it is the count above
            part.held.add(key)
        else:
            entry = part.entries.get(key)  # references: kept in the pool without owners
            if entry is not None and eng.pool.claim(entry, (self.idx, leaf)):
                return
            if variant == "references" and not eqs:
                part.held.add(key)
            if not eqs and not part.values:  # planned when the profile was added
                aux = self._aux.get(leaf)
                if aux is None:
                    aux = self._aux[leaf] = eng.pool.prepare(self.pat.leaves[leaf].filter)
                part.entries[key] = eng.pool.revive(aux, (self.idx, leaf))
                return
        entry = eng.pool.add(self.pat.leaves[leaf].filter, (self.idx, leaf), self._eqs(part, eqs))
        if variant != "marking":
            part.entries[key] = entry

    def _unreg(self, part: _Partition, key: tuple) -> None:
        """No PM of the partition waits on `key` any more.

        `marking` and `references` keep the auxiliary profile in the pool for the next PM
        (until the partition is released), except one carrying `where` values bound from
        events: those vary without bound, so they leave at once as under `dynamic`.
        `references` even leaves the profile's owner on it (`dormant`): the next PM of the
        partition takes it back for free, and the first event it receives while dormant takes
        it off (`_drop_dormant`), so it is not handed events nobody waits for more than once.
        """
        n = part.regs[key] - 1
        if n:
            part.regs[key] = n
            return
        variant = self.engine.variant
        leaf, eqs = key
        if variant == "references" and not eqs:
            part.regs[key] = 0
            part.dormant += 1
            return
        del part.regs[key]
        if variant == "marking":
            if not eqs:
                return  # stays in the pool, unmarked, until the partition is released
            part.held.discard(key)
            self.engine.pool.remove(
                self.pat.leaves[leaf].filter, (self.idx, leaf), self._eqs(part, eqs)
            )
            return
        self.engine.pool.release(part.entries.pop(key), (self.idx, leaf))

    def _release(self, part: _Partition) -> None:
        """Marking/references variants: take a released partition's auxiliary profiles out of the pool."""
        pool = self.engine.pool
        regs = part.regs
        if part.dormant:
            for key, n in list(regs.items()):
                if not n:
                    pool.release(part.entries[key], (self.idx, key[0]), True)
                    del regs[key]
            part.dormant = 0
        marking = self.engine.variant == "marking"
        for key in part.held:
            if key in regs:
                continue
            leaf, eqs = key
            if marking:
                pool.remove(self.pat.leaves[leaf].filter, (self.idx, leaf), self._eqs(part, eqs))
                continue
            entry = part.entries.pop(key, None)
            if entry is not None and entry.indexed:  # the pool's entry for the key: no look-up
                pool.purge_entry(entry)
            else:
                pool.purge(self.pat.leaves[leaf].filter, self._eqs(part, eqs))
        part.held.clear()

    def _eqs(self, part: _Partition, eqs: tuple) -> tuple:
        if part.values:
            return tuple(part.values.items()) + eqs
        return eqs

    # -------------------------------------------------------------- helpers
    def _newest(self, pm: _PM) -> int | None:
        best, bseq = None, -1
        for i, b in enumerate(pm.binds):
            if b is not None and b.seq > bseq:
                best, bseq = i, b.seq
        return best

    def _bindings(self, pm: _PM, extra: dict[int, _B] | None = None) -> dict[str, dict[str, Any]]:
        names = self.names
        out = {names[i]: b.ev.attrs for i, b in enumerate(pm.binds) if b is not None}
        if extra:
            for i, b in extra.items():
                out[names[i]] = b.ev.attrs
        return out

    def _events(self, pm: _PM) -> dict[str, Event]:
        names = self.names
        return {names[i]: b.ev for i, b in enumerate(pm.binds) if b is not None}

    def _trace(self, action: str, detail: str) -> None:
        self.engine._trace(self.profile.id, action, detail)

    def _desc(self, pm: _PM) -> str:
        return _fmt(self._events(pm)) + (f" in {pm.part.values}" if pm.part.values else "")

    def _neg_blocks(
        self, cands: list[tuple[int, _B]], binds: dict[str, dict[str, Any]], final: bool
    ) -> tuple[bool, list]:
        """Re-check pending negation candidates after a binding: (blocked?, still pending)."""
        pending = []
        for x, b in cands:
            verdict = self._neg_verdict(x, b, binds, final)
            if verdict is True:
                return True, []
            if verdict is None:
                pending.append((x, b))
        return False, pending

    def _neg_verdict(
        self, x: int, b: _B, binds: dict[str, dict[str, Any]], final: bool
    ) -> bool | None:
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
    def _try_bind(self, pm: _PM, leaf: int, b: _B, replace: bool = False) -> _PM | None:
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
        if conjs or pm.negc or (complete and (self.leading or pat.conjs)):
            binds = self._bindings(pm, {leaf: b})
            for c in conjs:
                if not c.fn(binds):
                    return None
            negc = pm.negc
            if negc:
                blocked, pending = self._neg_blocks(
                    negc, binds, final=complete and not pat.trailing
                )
                if blocked:
                    return None
            else:
                pending = None
            if complete:
                # conjuncts not fully bound in the final match (across any-alternatives, or
                # mentioning a binding the winning alternative dropped) see absent values;
                # with a trailing negation too: its positives are final once all are bound
                final = binds
                if cleared != new_mask:
                    names = self.names
                    final = {n: a for n, a in binds.items() if cleared >> names.index(n) & 1}
                for c in pat.conjs:
                    if not c.neg and c.mask & cleared != c.mask and not c.fn(final):
                        return None
            if complete and self.leading and self._leading_blocks(pm, leaf, b, binds, cleared):
                # the last positive is bound: the leading window [last.ts - T, first) is known
                return None
        else:
            pending = pm.negc
        new = pm.copy()
        new.binds[leaf] = b
        new.mask = pat.clear_losing_alternatives(new_mask)
        if new.mask != new_mask:
            for i in range(self.n):
                if not new.mask >> i & 1:
                    new.binds[i] = None
        new.negc = pending or None
        if new.counts and leaf in new.counts:
            del new.counts[leaf]
        return new

    def _leading_blocks(
        self, pm: _PM, leaf: int, b: _B, binds: dict[str, dict[str, Any]], final: int = -1
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

    # ---------------------------------------------------------------- event
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
                    if self._fast_step(part, pms[0], ev, seq, leaves):
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

    def _part(self, key: tuple, ev: Event) -> _Partition:
        """The event's partition, created if it has none yet."""
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = _Partition(key, self.partition_values(ev.attrs))
        return part

    def _general(
        self, part: _Partition | None, key: tuple, ev: Event, seq: int, leaves: list[int]
    ) -> None:
        """Every shape and selection: extend or complete the waiting PMs, apply the event's
        negations, open new PMs, keep leading-negation history (LANGUAGE.md §4)."""
        b = _B(seq, ev)
        if self.neg_set:
            pos = [i for i in leaves if i not in self.neg_set]
            neg = [i for i in leaves if i in self.neg_set]
        else:
            pos, neg = leaves, ()
        tracing = self.engine.tracer is not None
        completions: list[tuple[_PM, _PM | None]] = []  # (completed state, PM it came from)
        touched: set[int] = set()
        consumed = False

        if part is not None and part.pms and pos:
            for pm in list(part.pms):
                if pm.alive:
                    self._extend(part, pm, pos, b, completions, touched, tracing)

        if completions:
            consumed = self._complete(part, completions, ev.ts)  # type: ignore[arg-type]
            if not self.active:
                return
        self._settle(part, key, b, pos, neg, touched, consumed)

    def _settle(
        self,
        part: _Partition | None,
        key: tuple,
        b: _B,
        pos: list[int],
        neg: Any,
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
                for i in lead:
                    part.history.append((seq, ev.ts, i, b))
        if part is not None:
            self._tidy(part, ev.ts)

    def _extend(
        self,
        part: _Partition,
        pm: _PM,
        pos: list[int],
        b: _B,
        completions: list,
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
        part: _Partition,
        pm: _PM,
        mi: Any,
        cands: list[int],
        b: _B,
        completions: list,
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
                self._add_pm(part, new)
                if tracing:
                    self._trace("extended", f"{self._desc(pm)} -> {self._desc(new)} (branch)")

    def _bind_next(
        self, pm: _PM, cands: list[int], b: _B, completions: list, touched: set[int], tracing: bool
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
        pm: _PM,
        mi: Any,
        pos: list[int],
        b: _B,
        completions: list,
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

    def _drop_dormant(self, part: _Partition, leaves: list[int]) -> None:
        """References: the event reached dormant auxiliary profiles (nobody waits): take our owner off."""
        regs = part.regs
        for i in leaves:
            key = _shared((i, ()))
            if regs.get(key) == 0:
                del regs[key]
                part.dormant -= 1
                self.engine.pool.release(part.entries[key], (self.idx, i), True)

    def _fast_step(self, part: _Partition, pm: _PM, ev: Event, seq: int, leaves: list[int]) -> bool:
        """The common case in one place: a single PM (first/last) extended or completed by the event.

        Same semantics as the general path; returns False to hand anything
        else (replacements, duplicates under last) to it. This is the step
        that makes the last event of a composite cost about a primitive one,
        so the completion is written out here rather than called piecewise
        (`_match_events`, `_unreg`, `report`, `_tidy`): each call is a
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
            pm.binds[i] = _B(seq, ev)
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
        if self.unique:
            pm.alive = False  # its terminator stays and fires as a no-op (see `_drop`)
            d = pm.deadline
            if d is not None and d > part.until:
                part.until = d
            regs = pm.regs
            if regs:
                pm.regs = ()
                counts = part.regs
                keep = eng.variant == "references"
                for key in regs:
                    n = counts[key]
                    if n > 1:
                        counts[key] = n - 1
                    elif keep and not key[1]:  # `_unreg`'s commonest case, inline
                        counts[key] = 0
                        part.dormant += 1
                        kept = True
                    else:
                        self._unreg(part, key)
            part.pms.clear()
            self.pm_count -= 1
        eng._nseq += 1
        eng._out.append(
            Notification(self.pid, ev.ts, events, part.values, eng._nseq, self.subscriber)
        )
        if self.once:
            eng._deactivate(self)
        elif self.unique and (not (kept or part.held) or (part.key and self.window is None)):
            self._tidy(part, ev.ts)  # fast shapes keep no history or counts
        return True

    def _fast_open(
        self, part: _Partition | None, key: tuple, ev: Event, seq: int, leaves: list[int]
    ) -> bool:
        """A starting event where no PM waits (the fast paths' shapes): open its PM(s) directly.

        What `_open` does for these shapes, without its general checks. Returns False to hand
        the general path anything else (an event that completes at once, or starts nothing).
        """
        tr = self.pat.transitions(0)
        opened = []
        for i in leaves:
            t = tr.get(i)
            if t is None:
                continue
            if t[1] is not None:
                return False
            opened.append((i, t[0]))
            if not self.fast_each:
                break
        if not opened:  # it starts nothing (it reached a dormant auxiliary profile): what is
            if part is not None:  # left of the general path for it
                self._tidy(part, ev.ts)
            return True
        if part is None:
            part = self.parts[key] = _Partition(key, self.partition_values(ev.attrs))
        b = _B(seq, ev)
        pms = part.pms
        flat = self.flat
        window = self.window
        for i, mask in opened:
            pm = _PM(self.n, part)
            pm.binds[i] = b
            pm.mask = mask
            if not flat:
                self._add_pm(part, pm)
                continue
            pms.append(pm)  # `_add_pm` and `_changed`, inline: the deadline is known
            self.pm_count += 1
            if window is not None:
                pm.deadline = d = ev.ts + window
                pm.handle = self.engine.timers.add(d, TIMER, (self, pm))
            self._sync(pm)
        return True

    def _match_events(self, pm: _PM, i: int, ev: Event, order: tuple[int, ...]) -> dict[str, Event]:
        """The events of the match `ev` completes by binding leaf `i` (`order`: its leaves)."""
        binds = pm.binds
        names = self.names
        events = {}
        for j in order:  # a loop, not a comprehension: no closure cells on 3.11
            events[names[j]] = ev if j == i else binds[j].ev  # type: ignore[union-attr]
        return events

    def _fast_each(self, part: _Partition, ev: Event, seq: int, leaves: list[int]) -> None:
        """`select each` without where/negations/any: the general path's steps, minus its bookkeeping."""
        trans = self._trans
        b = _B(seq, ev)
        done: list[
            tuple[_PM, int, tuple[int, ...]]
        ] = []  # (PM, leaf, match leaves) completed by this event
        for pm in list(part.pms):
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
                    self._add_pm(part, new)
        consumed = False
        if done:
            if len(done) > 1:  # report in the order of the matches' events (their order keys)
                done.sort(
                    key=lambda d: tuple(
                        seq if j == d[1] else (x.seq if x is not None else _INF)
                        for j, x in enumerate(d[0].binds)
                    )
                )
            eng = self.engine
            names = self.names
            values = part.values
            for pm, i, order in done[:1] if self.unique else done:
                binds = pm.binds
                events = {}
                for j in order:
                    events[names[j]] = ev if j == i else binds[j].ev  # type: ignore[union-attr]
                if self.unique:
                    used = {x.seq for x in binds if x is not None}
                    used.add(seq)
                    self._consume(part, used)
                    consumed = True
                eng._nseq += 1
                eng._out.append(
                    Notification(self.pid, ev.ts, events, values, eng._nseq, self.subscriber)
                )
                if self.once:
                    eng._deactivate(self)
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

    def _advance(
        self, pm: _PM, new: _PM, completions: list, tracing: bool, ev: Event, replaced: bool = False
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

    def _complete(
        self, part: _Partition, completions: list[tuple[_PM, _PM | None]], ts: float
    ) -> bool:
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
        for new, _src in completions:
            self.report(ts, self._events(new), part.values)
            if not self.active:
                break
        return False

    def _consume(self, part: _Partition, seqs: set[int]) -> None:
        if not part.pms:
            return
        for pm in list(part.pms):
            if pm.alive and any(b is not None and b.seq in seqs for b in pm.binds):
                self._drop(pm, "consumed")

    def _log_negations(self, pm: _PM, neg: list[int], b: _B) -> None:
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
            if not self.neg_conjs[x]:
                newest = max(y.seq for y in pm.binds if y is not None)
                dup = False
                for lx, le in reversed(log):
                    if le.seq <= newest:
                        break
                    if lx == x:
                        dup = True
                        break
                if dup:
                    continue
            log.append((x, b))

    def _prune_nlog(self, pm: _PM) -> None:
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
        lo = min((binds[i].seq for i in repl if binds[i] is not None), default=-1)  # type: ignore[union-attr]
        q = max(
            (x.seq for i, x in enumerate(binds) if x is not None and i not in repl and x.seq < lo),
            default=-1,
        )
        if q >= 0 and log[0][1].seq <= q:
            pm.nlog = [(x, e) for x, e in log if e.seq > q] or None

    def _rebind_base(self, pm: _PM, leaf: int, b: _B) -> _PM:
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
        cands: list[tuple[int, _B]] = []
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

    def _negate(self, pm: _PM, neg: list[int], b: _B) -> None:
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

    def _open(self, part: _Partition, starts: list[int], b: _B) -> None:
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
        empty = _PM(self.n, part)
        completions: list[tuple[_PM, _PM | None]] = []
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
                self._add_pm(part, new)
                if tracing:
                    self._trace("opened", self._desc(new))
            if kind != "each":
                break
        if completions:
            self._complete(part, completions, b.ev.ts)

    def _could_start(self, starts: list[int], b: _B) -> bool:
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

    # ------------------------------------------------------------ lifecycle
    def _add_pm(self, part: _Partition, pm: _PM) -> None:
        part.pms.append(pm)
        self.pm_count += 1
        self._changed(pm)

    def _changed(self, pm: _PM) -> None:
        """Recompute the PM's terminator and auxiliary profiles after its state changed."""
        pat = self.pat
        d = None
        if self.window is not None:
            d = pm.first_ts() + self.window
        if not self.flat:
            for nid in pat.info(pm.mask).started_nodes:
                node = pat.nodes[nid]
                lo = min(
                    b.ev.ts
                    for i, b in enumerate(pm.binds)
                    if b is not None and node.leaves >> i & 1
                )
                nd = lo + node.within  # type: ignore[operator]
                if d is None or nd < d:
                    d = nd
        if d != pm.deadline or (pm.handle is None and d is not None):
            timers = self.engine.timers
            timers.discard(pm.handle)
            pm.deadline = d
            pm.handle = timers.add(d, TIMER, (self, pm)) if d is not None else None
        self._sync(pm)

    def _drop(self, pm: _PM, why: str, ended: float | None = None) -> None:
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
                note += f" (window ended at ts={_num(ended)})"
            self._trace(action, self._desc(pm) + note)
        pm.alive = False
        # The terminator is not taken out of the temporal pool: it fires as a no-op at its
        # deadline (or lets the partition's auxiliary profiles go, see `_tidy`). A sorted-list
        # delete per completed match costs more than the no-op, and dead entries are bounded
        # by the window like live ones.
        pm.handle = None
        self._sync(pm)
        part = pm.part
        if pm.deadline is not None and pm.deadline > part.until:
            part.until = pm.deadline
        part.pms.remove(pm)
        self.pm_count -= 1

    def _reset(self, pm: _PM, nid: int, why: str) -> None:
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

    def on_timer(self, when: float, payload: Any) -> None:
        if isinstance(payload, _Partition):
            part = payload
            part.handle = None
            self._tidy(part, when, fired=True)
            return
        pm: _PM = payload
        if not pm.alive:
            # a finished PM's terminator: its partition, if idle since, lets its auxiliary
            # profiles go now (see `_tidy`)
            part = pm.part
            if not part.pms and (part.held or part.dormant) and when >= part.until:
                self._tidy(part, when, fired=True)
            return
        pm.handle = None
        pat = self.pat
        part = pm.part
        if self.window is not None and (end := pm.first_ts() + self.window) <= when:
            if pat.trailing and pat.info(pm.mask).complete:
                if pm.negc:
                    blocked, _ = self._neg_blocks(pm.negc, self._bindings(pm), final=True)
                    if blocked:
                        self._drop(pm, "killed by a negation")
                        self._tidy(part, when, fired=True)
                        return
                events = self._events(pm)
                self._drop(pm, "completed")
                if self.unique:
                    self._consume(part, pm.seqs())
                self.report(when, events, part.values)
            else:
                self._drop(pm, "expired", end)
            if self.active:
                self._tidy(part, when, fired=True)
            return
        # a nested window ended
        mi = pat.info(pm.mask)
        for nid in mi.started_nodes:  # outermost first
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
        if pm.alive:
            self._changed(pm)
        self._tidy(part, when, fired=True)

    def _tidy(self, part: _Partition, now: float, fired: bool = False) -> None:
        """Forget partition state the windows no longer need; drop empty partitions.

        `fired`: a timer is due at `now` (the partition's own, or a PM's terminator), so state
        that ends at `now` is stale too. An emptied partition keeps its auxiliary profiles
        (marking, references) for its next partial match until the window of its last one ends:
        a PM that left before its window ended (completed, consumed, killed) left its terminator
        in the temporal pool, and that terminator lets them go (`on_timer`), so a completion
        schedules no clean-up timer of its own.
        """
        w = self.window
        if part.history and w is not None:
            lo = now - w
            h = part.history
            k = 0
            while k < len(h) and (h[k][1] < lo or (fired and h[k][1] <= lo)):
                k += 1
            if k:
                del h[:k]
        if (
            part.starts
            and w is not None
            and (part.starts_ts + w < now or (fired and part.starts_ts + w <= now))
        ):
            part.starts = 0
        if not (
            part.pms or part.history or part.starts
        ):  # `part.empty()`, inline: after every match
            if part.held or part.dormant:
                if not part.key:
                    return  # no per: one partition, its few auxiliary profiles simply stay marked off
                if not fired:
                    if w is not None:
                        return  # the terminator of the PM that left releases them (`on_timer`)
                    if part.handle is None:  # no window, no terminators: at the next event
                        part.handle = self.engine.timers.add(now, TIMER, (self, part))
                    return
                self._release(part)
            if self.parts.get(part.key) is part:
                del self.parts[part.key]
            if part.handle is not None:
                self.engine.timers.discard(part.handle)
                part.handle = None
            return
        if not part.pms and w is not None and part.handle is None:
            # only history / counters left: come back when they are stale
            t = min([h[1] for h in part.history] + ([part.starts_ts] if part.starts else [])) + w
            part.handle = self.engine.timers.add(t, TIMER, (self, part))

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

    def live(self) -> tuple[int, int]:
        return (self.pm_count, len(self.parts))

    def fresh(self) -> bool:
        return not self.parts and not self.pm_count and not self.clock_leaves

    def clear(self) -> None:
        for part in list(self.parts.values()):
            for pm in list(part.pms):
                pm.alive = False
                self.engine.timers.discard(pm.handle)
                self._sync(pm)
            self._release(part)
            self.engine.timers.discard(part.handle)
        self.pm_count = 0
        self.parts.clear()


# ------------------------------------------------------------------ engine


class _ProfileRefPickler(pickle.Pickler):
    """Stores profiles as references to their id."""

    def persistent_id(self, obj: Any) -> str | None:
        return obj.id if obj.__class__ is Profile else None


class _ProfileRefUnpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, profiles: Mapping[str, Profile]) -> None:
        super().__init__(f)
        self.profiles = profiles

    def persistent_load(self, pid: Any) -> Profile:
        try:
            return self.profiles[pid]
        except KeyError:
            raise KeyError(
                f"the snapshot refers to profile {pid!r}, which was not supplied"
            ) from None


def _load_pickle(data: bytes, profiles: Mapping[str, Profile]) -> Engine:
    """Version 1 of the state format: the pickled engine (ENS 0.1)."""
    eng = _ProfileRefUnpickler(io.BytesIO(data), profiles).load()
    if not isinstance(eng, Engine):
        raise TypeError("not an engine snapshot")
    return eng


class Engine(TimeDriven):
    """Deterministic event filtering: add/remove profiles, process events, advance time, take notifications.

    >>> eng = Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")])
    >>> eng.process(Event("a1", 0.0, {"k": "A"})); eng.process(Event("b1", 5.0, {"k": "B"}))
    >>> [n.to_json() for n in eng.take_notifications()]
    [{'profile': 'p', 'ts': 5.0, 'events': {'a': 'a1', 'b': 'b1'}}]
    """

    VARIANTS = ("dynamic", "marking", "references")
    DEFAULT_VARIANT = "references"  # the fastest: docs/benchmarks.md, docs/paper.md
    plan = "eager"  # class defaults: snapshots written before plans existed restore eager
    rates: Rates | None = None
    replan_every = 0
    drift = 4.0
    sample = 8
    _count_pool: PrimitivePool | None = None

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
    ) -> None:
        """`plan`: eager, rare-first or auto (chosen from `rates`), per profile: docs/plans.md.

        Online rates (plan auto): with `replan_every` > 0 the engine counts, for one event in
        `sample`, which components of the profiles that could go rare-first it matches; every
        `replan_every` events, a profile whose rates moved by `drift` (a factor) since its plan
        was chosen is planned again from them (`replan`: its state moves with it). Counting
        is by arrival number, so a replay decides the same way.

        `timers`: the temporal pool to schedule in (an empty one; Spark's slices give their own).
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
        self._counts: dict[tuple[int, int], int] = {}  # (runtime, leaf) -> sampled matches
        self._count_since: float | None = None
        self._counted: dict[int, tuple[str, ...]] = {}  # runtime -> its counted components' names
        self._count_pool = PrimitivePool() if replan_every else None
        self.pool = PrimitivePool()
        # runtime index -> the pool entries of its starting components and their owners (what
        # leaves the pool with the profile, without looking the filters up again)
        self._starts: dict[int, list[tuple[Entry, tuple[int, int]]]] = {}
        self.timers = timers if timers is not None else TemporalPool()
        self.tz = ZoneInfo(tz)
        self.now: float | None = None
        self.tracer: Tracer | None = None
        self.trace_only: str | None = None
        self._rts: dict[int, _Runtime] = {}
        self._by_id: dict[str, _Runtime] = {}
        self._next_idx = 0
        self._seq = 0
        self._nseq = 0
        self._out: list[Notification] = []
        self._clocks: dict[Clock, tuple | None] = {}  # clock -> its scheduled temporal entry
        self._clock_users: dict[Clock, dict[int, _CompositeRuntime]] = {}
        for p in profiles:
            self.add_profile(p)

    # ------------------------------------------------------------ profiles
    def add_profile(self, profile: Profile) -> None:
        if profile.id in self._by_id:
            raise ValueError(f"profile {profile.id!r} is already active")
        idx = self._next_idx
        self._next_idx += 1
        rt = self._runtime(profile, idx)
        self._rts[idx] = rt
        self._by_id[profile.id] = rt
        self._register_starts(rt)
        self._count_leaves(rt, add=True)
        if isinstance(rt, _CompositeRuntime):
            rt.prepare_aux()
            for lf in rt.clock_leaves:
                self._clock_users.setdefault(lf.clock, {})[idx] = rt  # type: ignore[index]
                if lf.clock not in self._clocks:
                    self._clocks[lf.clock] = None  # type: ignore[index]
                    if self.now is not None:
                        self._schedule_clock(lf.clock, self.now)  # type: ignore[arg-type]
        rt.activate(self.now)

    def _register_starts(self, rt: _Runtime) -> None:
        pool, idx = self.pool, rt.idx
        self._starts[idx] = [
            (pool.add(f, (idx, leaf)), (idx, leaf)) for f, leaf in rt.start_registrations()
        ]

    def _unregister_starts(self, rt: _Runtime) -> None:
        release = self.pool.release
        for entry, owner in self._starts.pop(rt.idx):
            release(entry, owner)

    def _runtime(self, profile: Profile, idx: int) -> _Runtime:
        if profile.is_filter:
            return _FilterRuntime(self, profile, idx)
        if isinstance(profile.expr, Absent):
            return _AbsentRuntime(self, profile, idx)
        plan = self.plan_of(profile) if self.plan != "eager" else None
        if plan is not None and plan.lazy:
            from filters.lazy import LazySeqRuntime

            return LazySeqRuntime(self, profile, idx, plan.driver)
        return _CompositeRuntime(self, profile, idx)

    def replan(self, plan: str | None = None, rates: Rates | None = None) -> list[str]:
        """Change the plan mode and/or the rates; convert the runtimes whose plan changes.

        The state moves with them (`filters.lazy.eager_to_lazy` / `lazy_to_eager`): no match
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
            if isinstance(rt, (_FilterRuntime, _AbsentRuntime)):
                continue
            if self._follow_plan(idx, rt):
                changed.append(rt.profile.id)
        return changed

    def _follow_plan(self, idx: int, rt: _Runtime) -> bool:
        """Convert `rt` if its plan (eager, or rare-first and its driver) changed."""
        plan = self.plan_of(rt.profile) if self.plan != "eager" else None
        lazy = plan is not None and plan.lazy
        was_lazy = not isinstance(rt, _CompositeRuntime)
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

    def _swap(self, idx: int, rt: _Runtime, lazy: bool, driver: int | None = None) -> None:
        from filters.lazy import LazySeqRuntime, eager_to_lazy, lazy_to_eager

        self._unregister_starts(rt)
        new: _Runtime
        if lazy:
            new = LazySeqRuntime(self, rt.profile, idx, driver)
            eager_to_lazy(rt, new)
            rt.clear()  # terminators and auxiliary profiles out of the pools
        else:
            new = _CompositeRuntime(self, rt.profile, idx)
            lazy_to_eager(rt, new, self.now)  # type: ignore[arg-type]
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
    def _count_leaves(self, rt: _Runtime, add: bool) -> None:
        """Keep the counting pool in step: the leaves of profiles that could go rare-first."""
        cp = self._count_pool
        if cp is None or isinstance(rt, (_FilterRuntime, _AbsentRuntime)) or lazy_shape(rt.profile):
            return
        leaves = Pattern.build(rt.profile).leaves
        for i, lf in enumerate(leaves):
            if add:
                cp.add(lf.filter, (rt.idx, i))
            else:
                cp.remove(lf.filter, (rt.idx, i))
                self._counts.pop((rt.idx, i), None)
        if add:
            self._counted[rt.idx] = _shared(tuple(lf.name for lf in leaves))
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
                self._trace(pid, "replanned", self.plan_of(self._by_id[pid].profile).reason)

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
        self._unregister_starts(rt)
        self._count_leaves(rt, add=False)
        self._online.pop(rt.profile.id, None)
        if isinstance(rt, _CompositeRuntime):
            rt.clear()
            for lf in rt.clock_leaves:
                users = self._clock_users.get(lf.clock)  # type: ignore[arg-type]
                if users is not None:
                    users.pop(rt.idx, None)
                    if not users:
                        del self._clock_users[lf.clock]  # type: ignore[arg-type]
                        self.timers.discard(self._clocks.pop(lf.clock, None))  # type: ignore[arg-type]
        elif isinstance(rt, _AbsentRuntime):
            for st in rt.parts.values():
                self.timers.discard(st[1])
            rt.parts.clear()
        else:
            rt.clear()

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
            if rt is not None and isinstance(rt, _CompositeRuntime):
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
        if self._count_pool is not None:
            if not seq % self.sample:
                self._count(event)
            if not seq % self.replan_every:
                self._online_replan(ts)  # between events: the state moves with a re-plan
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
                ((idx, leaf),) = owners
                rt = self._rts.get(idx)
                if rt is not None:
                    if solo is None:
                        entry.solo = rt.sink(leaf) or False
                    rt.on_event(event, seq, [leaf])
                return
            if not owners:  # an auxiliary profile kept in the pool while nobody waits on it
                return
        if tracer is None and self._report_plain(entries, event):
            return
        for idx, leaves in owners_by_profile(entries):
            rt = self._rts.get(idx)
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
            if not owners:
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
        for idx, _leaf in entry.owners:
            rt = self._rts.get(idx)
            if rt is None or rt.__class__ is not _FilterRuntime or rt.once or not rt.active:
                return False
            out.append((idx, rt.pid, rt.subscriber))
        return tuple(out)

    def bound_duplicate(self, profile_id: str, event: Event) -> str | None:
        """Which bound component of which partial match `event` duplicates (see `ens explain`)."""
        rt = self._by_id.get(profile_id)
        return (
            rt.bound_duplicate(event) if isinstance(rt, _CompositeRuntime) and rt.active else None
        )

    def take_notifications(self) -> list[Notification]:
        out, self._out = self._out, []
        return out

    def pending(self) -> int:
        """Notifications produced and not taken yet."""
        return len(self._out)

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
        the primitive pool is rebuilt from the state. `profiles` (id -> profile) resolves the
        references of a `profiles_apart` snapshot. Unreadable state raises `StateError`."""
        eng = state_format.load(data, profiles, legacy=_load_pickle)
        if not isinstance(eng, Engine):
            raise state_format.StateError("not an engine snapshot")
        return eng

    def __getstate__(self) -> dict[str, Any]:
        """The state without what can be rebuilt: the pool, and runtimes that hold only a profile
        (most of them, with many profiles: a snapshot then costs what is in flight)."""
        state = self.__dict__.copy()
        del state["pool"]
        del state["_by_id"]
        del state["_starts"]
        state.pop("_count_pool", None)
        state["tracer"] = None
        state["tz"] = self.tz.key
        kept: dict[int, _Runtime] = {}
        fresh: list[tuple[int, Profile]] = []
        for idx, rt in self._rts.items():
            if rt.fresh():
                fresh.append((idx, rt.profile))
            else:
                kept[idx] = rt
        state["_rts"], state["_fresh"] = kept, fresh
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        fresh = state.pop("_fresh", ())
        self.__dict__.update(state)
        for k, v in (
            ("_online", {}),
            ("_counts", {}),
            ("_count_since", None),
            ("_counted", {}),
        ):  # older
            self.__dict__.setdefault(k, v)
        self.tz = ZoneInfo(state["tz"])
        for idx, profile in fresh:
            self._rts[idx] = self._runtime(profile, idx)
        self._rts = dict(sorted(self._rts.items()))
        self._by_id = {rt.profile.id: rt for rt in self._rts.values()}
        self.pool = PrimitivePool()
        self._starts = {}
        self._count_pool = PrimitivePool() if self.replan_every else None
        self._counted = {}
        for rt in self._rts.values():
            self._count_leaves(rt, add=True)
            self._register_starts(rt)
            if isinstance(rt, _CompositeRuntime):
                for part in rt.parts.values():
                    part.held = set()
                    part.regs = {
                        k: n for k, n in part.regs.items() if n
                    }  # dormant owners were not stored
                    part.dormant = 0
                    for key, _n in part.regs.items():
                        leaf, eqs = key
                        entry = self.pool.add(
                            rt.pat.leaves[leaf].filter, (rt.idx, leaf), rt._eqs(part, eqs)
                        )
                        if self.variant != "marking":
                            part.entries[key] = entry
                        if self.variant != "dynamic" and not eqs:
                            part.held.add(key)

    def _trace(self, profile_id: str, action: str, detail: str) -> None:
        if self.tracer is not None and (self.trace_only is None or self.trace_only == profile_id):
            self.tracer(profile_id, action, detail)


for _name, _cls in (
    ("engine", Engine),
    ("binding", _B),
    ("partial-match", _PM),
    ("partition", _Partition),
    ("filter-runtime", _FilterRuntime),
    ("absent-runtime", _AbsentRuntime),
    ("composite-runtime", _CompositeRuntime),
):
    state_format.register(_name, _cls)
