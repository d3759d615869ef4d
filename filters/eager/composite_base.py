"""The eager composite runtime's foundation: its compiled tables, partitions, registrations.

`CompositeTables` is what a profile's pattern compiles to for the runtime (computed once per
pattern and selection, shared by every runtime of that pattern). `CompositeBase` declares the
runtime's fields (the tables as typed attributes, read directly on the hot paths), creates
partitions, describes matches for traces, and keeps the auxiliary profiles a partial match
waits on in the pool (`_sync`), counting them per partition and leaving what a count change
means to the engine's variant (`filters.eager.auxiliary`).

The runtime is built up in layers, each a class in its own module: this base, then binding
(`filters.eager.binding`), the life of a match (`filters.eager.lifecycle`), the general event step
(`filters.eager.stepping`) and the fast paths (`filters.eager.composite`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from filters.eager.auxiliary import AuxiliaryRegistrations, full_eqs
from filters.eager.matches import PartialMatch, Partition
from filters.pattern import Conj, Leaf
from filters.pattern import Pattern as Pattern  # re-exported: adapters.spark.live shares it
from filters.pool.primitive import Entry, Eqs
from filters.runtime import (
    Binding,
    DerivedRuntime,
    EngineHost,
    PartKey,
    RegKey,
    Runtime,
    fmt_events,
    shared,
)
from profiles.ast import Clock, Profile
from profiles.events import Event

Transitions = dict[int, tuple[int, tuple[int, ...] | None]]  # leaf -> (new mask, completion)
Wants = dict[int, tuple[RegKey, ...]]  # mask -> auxiliary registrations wanted


class CompositeHost(EngineHost, Protocol):
    """The engine, as the composite runtime sees it: with its variant's registrations."""

    aux: AuxiliaryRegistrations

    def release_starts(self, rt: Runtime) -> None: ...


# (shape's mask tables, which leaves are filters) -> mask -> auxiliary registrations wanted
_WANTS: dict[tuple[int, tuple[bool, ...]], Wants] = {}


@dataclass(frozen=True, slots=True)
class CompositeTables:
    """What the runtime reads of a pattern, computed once per pattern and selection kind.

    Read-only (the memos `trans` and `wants` are pure functions of a mask), so the runtimes of
    one profile share them (`Pattern.build` compiles a profile once per process), and a restore
    is cheap.
    """

    kind: str
    pat: Pattern
    n: int
    trans: dict[int, Transitions]  # mask -> transitions, shared by every pattern of this shape
    start: list[int]
    start_set: frozenset[int]
    leading: frozenset[int]
    clock_leaves: list[Leaf]
    neg_conjs: dict[int, list[Conj]]
    names: tuple[str, ...]
    neg_set: frozenset[int]
    simple: bool  # no where, no history: binding needs no checks
    # first/last over positives only, no any/trailing, or first with root between-negations
    # and nothing else: `_fast_step`'s exact domain
    fast: bool
    fast_each: bool
    # `fast_each`: the leaves that can extend a partial match (from a non-empty mask); an event
    # of none of them (a seq's first component) only opens: `_fast_each` skips the PMs
    extenders: frozenset[int]
    # without where-equalities or `last`, the auxiliary profiles wanted depend on the mask
    # only: one memo per shape (and clock leaves), shared by the profiles of that shape
    wants: Wants | None
    flat: bool  # no nested window: a PM's deadline is its first event's time plus the window
    between: frozenset[int]  # `select last`: the between-negations a replacement is checked against

    @staticmethod
    def of(pat: Pattern, kind: str) -> CompositeTables:
        simple = not pat.conjs and not pat.leading
        neg_set = frozenset(i for i, lf in enumerate(pat.leaves) if lf.negated)
        plain = simple and not neg_set and not pat.has_any
        each = plain and kind == "each"
        flat = all(node.within is None for node in pat.nodes[1:])
        kills = simple and kind == "first" and _negations_only_kill(pat, neg_set, flat)
        start = pat.info(0).enabled
        between = frozenset(neg_set - set(pat.leading) - set(pat.trailing))
        wants = None
        if not pat.eq_bindings and kind != "last":
            shape = (pat.shape_id, tuple(lf.clock is None for lf in pat.leaves))
            wants = _WANTS.setdefault(shape, {})
        return CompositeTables(
            kind=kind,
            pat=pat,
            n=len(pat.leaves),
            trans=pat.transition_memo,
            start=start,
            start_set=frozenset(start),
            leading=frozenset(pat.leading),
            clock_leaves=[lf for lf in pat.leaves if lf.clock is not None],
            neg_conjs={
                i: [c for c in pat.conjs if i in c.neg]
                for i, lf in enumerate(pat.leaves)
                if lf.negated
            },
            names=shared(tuple(lf.name for lf in pat.leaves)),
            neg_set=neg_set,
            simple=simple,
            fast=(plain and kind in ("first", "last")) or kills,
            fast_each=each,
            extenders=_extenders(pat, each),
            wants=wants,
            flat=flat,
            between=between if kind == "last" else frozenset(),
        )


def _extenders(pat: Pattern, fast_each: bool) -> frozenset[int]:
    """`fast_each`: the leaves a transition from a reachable non-empty mask binds (forward
    steps, and the masks a nested window's reset leaves); too many masks to walk: every leaf."""
    if not fast_each:
        return frozenset()
    seen, todo, out = {0}, [0], set()
    timed = [node.leaves for node in pat.nodes[1:] if node.within is not None]
    while todo:
        mask = todo.pop()
        for i, (nm, done) in pat.transitions(mask).items():
            if mask:
                out.add(i)
            if done is not None:
                continue
            for m in (nm, *[nm & ~leaves for leaves in timed]):
                if m and m not in seen:
                    seen.add(m)
                    todo.append(m)
        if len(seen) > 4096:
            return frozenset(range(len(pat.leaves)))
    return frozenset(out)


def _negations_only_kill(pat: Pattern, neg_set: frozenset[int], flat: bool) -> bool:
    """Between-negations of the root only (no any, trailing or nested window): under `select
    first` without where an active negation's event just drops the PM (`_fast_negate`)."""
    return (
        not pat.has_any
        and not pat.trailing
        and flat
        and all(pat.leaves[i].node == 0 for i in neg_set)
    )


def tables_for(profile: Profile, kind: str) -> CompositeTables:
    """The tables of `profile`'s pattern, kept on the pattern object (one per `Profile` object:
    every engine, partition and restore over it shares them)."""
    pat = Pattern.build(profile)
    memo = pat.__dict__
    cached = memo.get("_runtime_tables")
    if cached is None or cached.kind != kind:
        cached = memo["_runtime_tables"] = CompositeTables.of(pat, kind)
    assert isinstance(cached, CompositeTables)
    return cached


class CompositeBase(DerivedRuntime):
    """Fields, tables, partitions and auxiliary registrations of the eager composite runtime."""

    _DERIVED: ClassVar[tuple[str, ...]] = (
        "aux_entries",
        "aux_pins",
        "owners",
        "free_keys",
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
        "extenders",
        "_wants",
        "_trans",
        "between",
        "opens_once",
    )

    __slots__ = (  # the fields a snapshot stores (in the order they are set), then `_DERIVED`
        "kind",
        "nth",
        "unique",
        "window",
        "parts",
        "pm_count",
        *_DERIVED,
    )

    # the tables (`CompositeTables`), rebuilt by `_derive`, not stored in snapshots
    pat: Pattern
    n: int
    _trans: dict[int, Transitions]
    start: list[int]
    start_set: frozenset[int]
    leading: frozenset[int]
    clock_leaves: list[Leaf]
    neg_conjs: dict[int, list[Conj]]
    names: tuple[str, ...]
    neg_set: frozenset[int]
    simple: bool
    fast: bool
    fast_each: bool
    extenders: frozenset[int]
    _wants: Wants | None
    flat: bool
    between: frozenset[int]
    aux_entries: dict[int, Entry]  # leaf -> its auxiliary profile, planned (`prepare_aux`)
    aux_pins: tuple[Entry, ...]  # those kept indexed while the profile lives (references)
    owners: tuple[tuple[int, int], ...]  # leaf -> (idx, leaf), its owner in the pool: one object
    free_keys: tuple[RegKey, ...]  # leaf -> (leaf, ()): its registration without bound values
    # `once`, `select first`, no `per`, no window, negation, where or `any` (a fast, flat shape):
    # its first PM can only end by completing, which retires the profile, so no later starting
    # event can open another; its starting entries leave the pool when that PM opens
    # (`CompositeHost.release_starts`), while they are hot from the match that opened it
    opens_once: bool
    engine: CompositeHost

    def __init__(self, engine: CompositeHost, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        self.kind = profile.select.kind
        self.nth = profile.select.n
        self.unique = profile.consume == "unique"
        self.window = profile.within
        self.parts: dict[PartKey, Partition] = {}
        self.pm_count = 0
        self._derive()

    def _derive(self) -> None:
        t = tables_for(self.profile, self.kind)
        self.pat, self.n, self._trans = t.pat, t.n, t.trans
        self.start, self.start_set, self.leading = t.start, t.start_set, t.leading
        self.clock_leaves, self.neg_conjs, self.names = t.clock_leaves, t.neg_conjs, t.names
        self.neg_set, self.simple, self.fast, self.fast_each = (
            t.neg_set,
            t.simple,
            t.fast,
            t.fast_each,
        )
        self.extenders = t.extenders
        self._wants, self.flat, self.between = t.wants, t.flat, t.between
        self.aux_entries = {}
        self.aux_pins = ()
        self.owners = tuple([(self.idx, i) for i in range(t.n)])
        self.free_keys = tuple([shared((i, ())) for i in range(t.n)])
        self.opens_once = (
            self.once
            and t.fast
            and t.kind == "first"
            and not t.neg_set
            and t.flat
            and self.window is None
            and not self.per
        )

    # --------------------------------------------------------- registrations
    def start_registrations(self) -> list[tuple[Any, int]]:
        out = []
        for i in self.start:
            lf = self.pat.leaves[i]
            if lf.clock is None:
                out.append((lf.filter, i))
        for i in self.pat.leading:
            out.append((self.pat.leaves[i].filter, i))
        return out

    def prepare_aux(self, aux: AuxiliaryRegistrations) -> None:
        """Plan, once, the auxiliary profiles that do not depend on bound values (no `per`, no
        where-equality): a partial match then inserts its own by an index update only."""
        if not self.per:
            aux.prepare(self)

    def _wanted(self, pm: PartialMatch) -> tuple[RegKey, ...]:
        """Auxiliary registrations (leaf, eqs) this PM needs in its partition."""
        wants = self._wants
        if wants is not None:
            w = wants.get(pm.mask)
            if w is None:
                w = wants[pm.mask] = shared(self._wanted_now(pm))
            return w
        return self._wanted_now(pm)

    def _wanted_leaves(self, pm: PartialMatch) -> list[int]:
        """The leaves whose events this PM waits for (or, under `last`, may replace)."""
        mi = self.pat.info(pm.mask)
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
        return leaves

    def _wanted_now(self, pm: PartialMatch) -> tuple[RegKey, ...]:
        pat = self.pat
        out: list[RegKey] = []
        eqb = pat.eq_bindings
        between = self.between
        for i in self._wanted_leaves(pm):
            if pat.leaves[i].clock is not None:
                continue
            eqs: Eqs = ()
            rules = eqb.get(i)
            if rules and i not in between:
                bound = self._bound_values(pm, rules)
                if bound is None:
                    continue
                eqs = bound
            out.append(shared((i, eqs)) if not eqs else (i, eqs))
        return tuple(out)

    @staticmethod
    def _bound_values(pm: PartialMatch, rules: list[tuple[str, int, str]]) -> Eqs | None:
        """The where-equalities `rules` bound so far in `pm`; None: a bound value is missing."""
        vals = []
        for attr, other, oattr in rules:
            b = pm.binds[other]
            if b is None:
                continue
            v = b.ev.attrs.get(oattr)
            if v is None:
                return None
            vals.append((attr, v))
        return tuple(vals)

    def _sync(self, pm: PartialMatch) -> None:
        """Make the pool hold exactly the auxiliary profiles this PM waits on.

        A step of a PM (every middle event of a `seq`) lands here: `_wanted`, `_unreg` and
        `_reg` are written out for their commonest cases (a count that stays above zero, a
        value-free registration going dormant or coming back), as `_unreg_done` does.
        """
        if pm.alive:
            wants = self._wants
            new = wants.get(pm.mask) if wants is not None else None
            if new is None:
                new = self._wanted(pm)
        else:
            new = ()
        old = pm.regs
        if new == old:
            return
        part = pm.part
        counts = part.regs
        aux = self.engine.aux
        for key in old:
            if key not in new:
                n = counts[key]
                if n > 1:
                    counts[key] = n - 1
                elif aux.keeps_dormant and not key[1] and part.values:  # `References.remove`
                    counts[key] = 0
                    part.dormant += 1
                elif not (key[1] or part.values) and self._leave_pinned(key[0]):
                    del counts[key]
                else:
                    aux.remove(self, part, key)
        for key in new:
            if key not in old:
                m = counts.get(key)
                if m:
                    counts[key] = m + 1
                elif m is None:
                    counts[key] = 1
                    aux.insert(self, part, key)
                else:  # dormant (references): our owner never left the pool
                    counts[key] = 1
                    part.dormant -= 1
        pm.regs = new

    def _reg(self, part: Partition, key: RegKey) -> None:
        n = part.regs.get(key)
        if n is not None:
            part.regs[key] = n + 1
            if not n:  # dormant (references): our owner never left the pool
                part.dormant -= 1
            return
        part.regs[key] = 1
        self.engine.aux.insert(self, part, key)

    def _unreg_done(self, part: Partition, regs: tuple[RegKey, ...]) -> bool:
        """`_unreg` of a finished PM's registrations (completed or expired), its commonest cases inline; True if an
        auxiliary profile stays (dormant, references)."""
        counts = part.regs
        keep = self.engine.aux.keeps_dormant
        kept = False
        for key in regs:
            n = counts[key]
            if n > 1:
                counts[key] = n - 1
            elif keep and not key[1] and part.values:
                counts[key] = 0
                part.dormant += 1
                kept = True
            elif not (key[1] or part.values) and self._leave_pinned(key[0]):
                del counts[key]
            else:
                self._unreg(part, key)
        return kept

    def _leave_pinned(self, leaf: int) -> bool:
        """Our owner off `leaf`'s entry if it is pinned (references, no `per`): the entry stays
        indexed, so the pool's `release` is all `remove` would do (`References.remove` ->
        `Dynamic.remove` -> `PrimitivePool.release`, three calls fewer: every completed match
        of a profile without `per` ends here). False: not pinned, the variant decides."""
        entry = self.aux_entries.get(leaf)
        if entry is None or not entry.pins:
            return False
        self.engine.pool.release(entry, self.owners[leaf])
        return True

    def _unreg(self, part: Partition, key: RegKey) -> None:
        """No PM of the partition waits on `key` any more: the variant decides what stays."""
        n = part.regs[key] - 1
        if n:
            part.regs[key] = n
            return
        self.engine.aux.remove(self, part, key)

    def _drop_dormant(self, part: Partition, leaves: list[int]) -> None:
        """References: the event reached dormant auxiliary profiles (nobody waits): take our
        owner off (`AuxiliaryRegistrations.drop_dormant`, inline for a value-free key)."""
        regs = part.regs
        keys = self.free_keys
        for i in leaves:
            key = keys[i]
            if regs.get(key) == 0:
                if part.values:
                    self.engine.aux.drop_dormant(self, part, key)
                    continue
                del regs[key]
                part.dormant -= 1
                entry = self.aux_entries[i]  # `PrimitivePool.release(..., keep=True)`, inline
                owners = entry.owners
                owner = self.owners[i]
                n = owners[owner] - 1
                if n:
                    owners[owner] = n
                    continue
                del owners[owner]
                self.engine.pool.owner_count -= 1
                entry.solo = entry.fanout = None

    def restore_registrations(self, aux: AuxiliaryRegistrations) -> None:
        """After a restore: put the registrations of the stored partitions into the new pool
        (dormant owners were not stored)."""
        for part in self.parts.values():
            part.held = None
            part.regs = {k: n for k, n in part.regs.items() if n}
            part.dormant = 0
            for key in part.regs:
                aux.restore(self, part, key)

    def load_partition(self, key: PartKey, part: Partition) -> None:
        """One stored partition back (`filters.partstate`): into `parts`, its registrations
        into the pool as `restore_registrations` puts a whole engine's (its timers: the
        engine). The profile's PM count is the engine header's, not changed here."""
        self.parts[key] = part
        part.held = None
        part.regs = {k: n for k, n in part.regs.items() if n}
        part.dormant = 0
        aux = self.engine.aux
        for key in part.regs:
            aux.restore(self, part, key)

    def _eqs(self, part: Partition, eqs: Eqs) -> Eqs:
        return full_eqs(part, eqs)

    # -------------------------------------------------------------- helpers
    @property
    def clocks(self) -> list[Clock]:
        """The clocks (`at hh:mm`) this profile's components wait for."""
        return [lf.clock for lf in self.clock_leaves if lf.clock is not None]

    def _part(self, key: PartKey, ev: Event) -> Partition:
        """The event's partition, created if it has none yet."""
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = Partition(key, self.partition_values(ev.attrs))
        return part

    @staticmethod
    def _newest(pm: PartialMatch) -> int | None:
        best, bseq = None, -1
        for i, b in enumerate(pm.binds):
            if b is not None and b.seq > bseq:
                best, bseq = i, b.seq
        return best

    def _bindings(
        self, pm: PartialMatch, extra: dict[int, Binding] | None = None
    ) -> dict[str, dict[str, Any]]:
        names = self.names
        out = {names[i]: b.ev.attrs for i, b in enumerate(pm.binds) if b is not None}
        if extra:
            for i, b in extra.items():
                out[names[i]] = b.ev.attrs
        return out

    def _events(self, pm: PartialMatch) -> dict[str, Event]:
        names = self.names
        return {names[i]: b.ev for i, b in enumerate(pm.binds) if b is not None}

    def _desc(self, pm: PartialMatch) -> str:
        return fmt_events(self._events(pm)) + (f" in {pm.part.values}" if pm.part.values else "")
