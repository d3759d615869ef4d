"""The primitive pool's match memo: results kept by the values of the equality attributes.

While every clause in the pool is equalities with at most one range, the values of the
equality attributes decide an event's match (or which ranges do): a facility feed has tens of
value combinations (kind x state), so most events are one dict look-up. `PrimitivePool.match`
reads the memo inline (the hot path); here are its state and upkeep: when it starts, pauses
and resumes, what a changed clause forgets, and what a miss stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

from filters.pool.index import Clause, ClauseIndex, Entry, Range

CALM = 64  # matches without a pool change before results are memoized
MEMO_MAX = 4096  # memoized value combinations (a facility feed has tens: kind x state)
# the memo reviews its hit rate every TRIAL look-ups; if at least MISSES of them missed
# (unique keys, or a key forgotten by an auxiliary insert before it is looked up again) it
# only costs, so matching goes without it for PAUSE matches (doubled after every failed
# review since the last good one, up to PAUSE_MAX), then it takes up again where it was (kept
# up to date meanwhile: a memo still filling with many value combinations resumes warm)
TRIAL = 256
MISSES = TRIAL * 7 // 8
PAUSE = 1024
PAUSE_MAX = 65_536

# a memoized match: the entries, or (when ranges decide) the one range or a function of the
# event that gives them
Memo: TypeAlias = list[Entry] | Range | Callable[[dict[str, Any]], list[Entry]]


class _Parts:
    """A memoized match over several buckets' parts (entries, ranges), in the index's order."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[list[Entry] | Range, ...]) -> None:
        self.parts = parts

    def hits(self, attrs: dict[str, Any]) -> list[Entry]:
        out: list[Entry] = []
        for part in self.parts:
            out += part if isinstance(part, list) else part.hits(attrs)
        return out


class MatchMemo:
    """The memo's state and upkeep; `PrimitivePool` (a subclass) owns the index it reads."""

    _index: ClauseIndex
    _schemas: dict[tuple[str, ...], dict[Any, Any]]
    _match: Callable[[dict[str, Any]], list[Entry]]

    def __init__(self) -> None:
        # match results memoized by the values of the equality attributes, while the pool
        # holds only equalities with at most one range (then those values decide the result, or
        # which ranges do) and has not changed for CALM matches (a pool that changes on every
        # event gains nothing)
        self._impure = 0  # clauses whose match depends on more than that
        self._ranged = 0  # equality clauses with a range (without any, a memo miss is a match)
        self._memo: dict[Any, Memo] | None = None
        self._memo_attrs: tuple[str, ...] = ()
        self._memo_n = 0  # len(_memo_attrs): `match` reads it on every event
        self._calm = 0  # negative while the memo is paused
        self._paused: dict[Any, Memo] | None = None  # the memo while paused
        self._looks = 0  # memo look-ups since its last review
        self._misses = 0  # of which missed
        self._pause = PAUSE  # the next pause's length

    def _forget(self, clause: Clause) -> None:
        """The memo after `clause` enters or leaves the index.

        A clause of equalities (and at most one range) over exactly the memoized attributes
        changes the result for one combination of values only, so only that one is forgotten:
        auxiliary profiles come and go on every partial match, and the rest of the memo stays
        valid. Before the memo starts, such clauses do not delay it (its attributes are read
        from them when it does). Any other change drops the memo.
        """
        access = clause.access
        plain = clause.check is None and access is not None and access[0] == "eqs"
        memo = self._memo
        if memo is None:
            memo = self._paused
            if memo is None:
                if not plain and self._calm > 0:  # (a paused memo stays paused)
                    self._calm = 0
                return
        if plain and access is not None and access[1] == self._memo_attrs:
            memo.pop(access[2], None)  # the bucket's values are the memo's key (`match`)
            return
        self._drop_memo()

    def _drop_memo(self) -> None:
        """Forget the memo (running or paused): it starts afresh after CALM quiet matches (a
        paused one when its pause ends)."""
        self._memo = self._paused = None
        if self._calm > 0:  # (a paused one's pause goes on)
            self._calm = 0

    def _review(self) -> None:
        """Every TRIAL look-ups (at a miss): keep the memo, or pause it if nearly all missed."""
        if self._misses < MISSES:
            self._pause = PAUSE
        else:
            self._paused, self._memo = self._memo, None
            self._calm = CALM - self._pause  # `match` counts it up to CALM, then resumes
            self._pause = min(2 * self._pause, PAUSE_MAX)
        self._looks = self._misses = 0

    def _start_memo(self) -> dict[Any, Memo]:
        self._looks = self._misses = 0
        memo = self._paused
        if memo is not None:  # resumed: its attributes and keys were kept up to date
            self._paused = None
            self._memo = memo
            return memo
        names: dict[str, None] = {}
        for schema in self._schemas:
            names.update(dict.fromkeys(schema))
        self._memo_attrs = attrs = tuple(sorted(names)) or ("",)
        self._memo_n, memo = len(attrs), {}
        self._memo = memo
        return memo

    def _memo_value(self, attrs: dict[str, Any]) -> Memo:
        """What the memo keeps for the equality values of `attrs`: the matching entries, or, when
        those values reach ranges, how to match the rest (the ranges' thresholds decide)."""
        index = self._index
        if not self._ranged:
            return index.match(attrs)
        buckets = index.buckets(attrs)
        for b in buckets:
            if b.ranges:
                break
        else:
            return index.match(attrs, buckets)
        parts: list[list[Entry] | Range] = []
        for b in buckets:
            if b.plain:
                parts.append([c.entry for c in b.plain])
            parts.extend(b.ranges.values())
        for part in parts:
            entries = part if isinstance(part, list) else part.entries()
            if any(len(e.clauses) > 1 for e in entries):  # an entry may match twice: dedup
                return self._match
        if len(parts) == 1 and isinstance(parts[0], Range):
            return parts[0]  # `match` runs its `hits`
        return _Parts(tuple(parts)).hits
