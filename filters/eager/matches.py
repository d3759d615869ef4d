"""The state of an eagerly evaluated composite: partial matches and their partitions.

A `Partition` holds the partial matches (PMs) of one `per` value combination, the auxiliary
registrations they wait on (counted: `regs`), leading-negation history and `nth` counters;
a `PartialMatch` holds the events bound so far per positive leaf. Small slotted objects: a
site keeps many of them in flight, and a snapshot stores them (stable names `partial-match`,
`partition`, registered in `filters.engine`).
"""

from __future__ import annotations

from typing import Any

from filters.pool.primitive import Entry
from filters.runtime import INF, Binding, Handle, PartKey, RegKey


class PartialMatch:
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

    def __init__(self, n: int, part: Partition) -> None:
        self.mask = 0
        self.binds: list[Binding | None] = [None] * n
        self.counts: dict[int, int] | None = None
        # negation candidates awaiting later bindings
        self.negc: list[tuple[int, Binding]] | None = None
        self.handle: Handle | None = None  # temporal-pool entry
        self.regs: tuple[RegKey, ...] = ()  # auxiliary registrations held
        self.alive = True
        self.part = part
        self.deadline: float | None = None
        # `select last` with between-negations: the negation events this PM saw (in scope or
        # not), for checking a replacement against them (`MatchBinder.rebind_base`)
        self.nlog: list[tuple[int, Binding]] | None = None

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        """Pickle's form for slotted objects. A finished PM is kept only by its terminator,
        which reads `alive` and `part` (`on_timer`): its events are not stored (most PMs of a
        busy engine's snapshot are such, docs/state.md), its fields are."""
        if self.alive:
            binds: list[Binding | None] = self.binds
            counts, negc, nlog = self.counts, self.negc, self.nlog
        else:
            binds, counts, negc, nlog = [], None, None, None
        return None, {
            "mask": self.mask,
            "binds": binds,
            "regs": self.regs,
            "alive": self.alive,
            "part": self.part,
            "counts": counts,
            "negc": negc,
            "handle": self.handle,
            "deadline": self.deadline,
            "nlog": nlog,
        }

    def __setstate__(self, state: tuple[Any, dict[str, Any]]) -> None:
        d = state[1]
        self.mask = d["mask"]
        self.binds = d["binds"]
        self.regs = d["regs"]
        self.alive = d["alive"]
        self.part = d["part"]
        self.counts = d["counts"]
        self.negc = d["negc"]
        self.handle = d["handle"]
        self.deadline = d["deadline"]
        self.nlog = d.get("nlog")  # not in snapshots written before it existed

    def copy(self) -> PartialMatch:
        pm = PartialMatch.__new__(PartialMatch)
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

    def order_key(self) -> tuple[float, ...]:
        return tuple(b.seq if b is not None else INF for b in self.binds)

    def seqs(self) -> set[int]:
        return {b.seq for b in self.binds if b is not None}

    def first_ts(self) -> float:
        """The earliest bound event's time (a loop, not `min` over a generator: every PM's
        deadline is computed from it)."""
        first: float | None = None
        for b in self.binds:
            if b is not None:
                ts = b.ev.ts
                if first is None or ts < first:
                    first = ts
        assert first is not None  # a PM binds an event
        return first


class Partition:
    """One `per` value combination of a composite: its PMs and what they hold in the pools."""

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

    def __init__(self, key: PartKey, values: dict[str, Any] | None) -> None:
        self.key = key
        self.values = values
        # an idle partition kept for its auxiliary profiles holds `()` here, not a list of its
        # own (a site keeps one per profile without `per`: fewer objects for the collector)
        self.pms: list[PartialMatch] | tuple[()] = []
        # (leaf, eqs) -> number of PMs waiting on it; 0: dormant (references: nobody waits, our
        # owner is still in the pool; the next PM takes it back for free)
        self.regs: dict[RegKey, int] = {}
        # marking/references: auxiliary profiles kept in the pool (None until the first: most
        # partitions hold none, a pinned profile's never do; a set is the dearest field to make)
        self.held: set[RegKey] | None = None
        # (leaf, eqs) -> its pool entry (dynamic/references), made on first use: a registration
        # without `per` and bound values uses its runtime's entry (`filters.eager.auxiliary.entry_of`)
        self.entries: dict[RegKey, Entry] | None = None
        self.dormant = 0  # how many keys of `regs` are dormant
        self.until = 0.0  # the latest deadline of a PM that left: its terminator lets `held` go
        self.starts = 0  # nth: starting events counted while no PM exists
        self.starts_ts = 0.0
        # leading negations seen; `()` until the first (most patterns have none)
        self.history: list[tuple[int, float, int, Binding]] | tuple[()] = ()
        self.handle: Handle | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Without the pool handles: the pool is rebuilt on restore (see Engine.__setstate__)."""
        state = {k: getattr(self, k) for k in self.__slots__ if k != "entries"}
        for k in ("pms", "history"):  # stored as lists, whether or not one was made
            if not state[k]:
                state[k] = []
        if state["held"] is None:  # stored as a set, whether or not one was made
            state["held"] = set()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.until = 0.0  # not in snapshots written before it existed
        for k, v in state.items():
            setattr(self, k, v)
        self.entries = None
        if not self.held:
            self.held = None

    def empty(self) -> bool:
        return not (self.pms or self.history or self.starts)

    def idle(self) -> bool:
        return not (self.pms or self.history or self.starts or self.held)
