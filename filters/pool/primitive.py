"""The primitive profile pool, indexed Gough-style.

Each stored filter is split into conjunctive *clauses* (a top-level `or`
becomes one clause per branch). Every clause is indexed under one *access
predicate* that must hold for the clause to hold: equality and `in` in a
hash table per attribute, ranges and `between` in sorted lists searched by
binary search, `starts with` by prefix length, `exists` per attribute. The
rest of the clause (its residual) is a compiled predicate checked only for
the candidates the index returns. Clauses with no indexable predicate
(e.g. `not (...)` alone) are scanned. (Planning: filters/pool/plan.py; the
index: filters/pool/index.py.)

Identical filters (same AST, same bound equalities) are stored once and
carry every owner; identical access predicates are stored once and point to
every clause that uses them. Insert and delete touch one hash entry or one
sorted list (O(log n)), which matters because the composite engine inserts
and deletes auxiliary profiles all the time.

Match results are memoized by the values of the equality attributes while every clause is
equalities with at most one range (a facility feed has tens of value combinations: kind x
state); a combination whose buckets hold ranges memoizes the ranges, so its match is a bisect.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import filters.pool.memo as poolmemo
from filters.pool.index import Clause, ClauseIndex, Entry, Range
from filters.pool.memo import MatchMemo
from filters.pool.plan import Eqs, Plan, from_plan, plan_clause, split
from profiles.ast import Filter

__all__ = ["Entry", "Eqs", "PrimitivePool", "owners_by_profile"]

_MAX_PLANS = 100_000
_MAX_PREPARED = 100_000  # prepared entries kept for equal filters (`prepare`)


class PrimitivePool(MatchMemo):
    """Filters -> owners, with sublinear insert, delete and match."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Filter, Eqs], Entry] = {}
        self._index = index = ClauseIndex()
        self._schemas = index.schemas  # the index's tables, read and changed in place here
        self._idx = index.attrs
        self._scan = index.scan
        self._match = index.match
        # (filter, bound attribute names) -> how its clauses are indexed: auxiliary profiles
        # differ only in bound values, so they are inserted without planning again
        self._plans: dict[tuple[Filter, tuple[str, ...]], list[Plan]] = {}
        self.owner_count = 0
        super().__init__()  # the memo (filters/pool/memo.py)
        # (filter, eqs) -> the entry `prepare` made for it (equal auxiliary filters of many
        # profiles share one handle: one entry and one set of clauses, revived by a count)
        self._prepared: dict[tuple[Filter, Eqs], Entry] = {}

    def __len__(self) -> int:
        """Number of distinct filters stored."""
        return len(self._entries)

    # ----------------------------------------------------------- insert/delete
    def add(self, f: Filter, owner: Hashable, eqs: Eqs = ()) -> Entry:
        """Subscribe `owner` to `f` (and the bound equalities `eqs`). Re-adding counts a reference."""
        if eqs:
            eqs = tuple([(a, (bool, v) if v.__class__ is bool else v) for a, v in eqs])
        key = (f, eqs)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._plan(key, f, eqs, True)
            self._entries[key] = entry
        prev = entry.owners.get(owner, 0)
        entry.owners[owner] = prev + 1
        if prev == 0:
            self.owner_count += 1
            entry.solo = entry.fanout = None
        return entry

    def prepare(self, f: Filter, eqs: Eqs = ()) -> Entry:
        """An entry for `f` with its clauses planned but not indexed: `revive` puts it in.

        The engine prepares the auxiliary profiles a composite will insert while it is being
        compiled, so a partial match's insert is an index update, not a planning step.
        """
        if eqs:
            eqs = tuple([(a, (bool, v) if v.__class__ is bool else v) for a, v in eqs])
        key = (f, eqs)
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        entry = self._prepared.get(key)
        if entry is None:
            entry = self._plan(key, f, eqs, False)
            if len(self._prepared) < _MAX_PREPARED:
                self._prepared[key] = entry
        return entry

    def revive(self, entry: Entry, owner: Hashable) -> Entry:
        """`add` through a handle from `prepare` (or a kept one): the entry that now holds `owner`
        (another one, if an equal filter was added since the handle was made)."""
        if not entry.indexed:
            entry = self.index(entry)
        owners = entry.owners
        prev = owners.get(owner, 0)
        owners[owner] = prev + 1
        if not prev:
            self.owner_count += 1
            entry.solo = entry.fanout = None
        return entry

    def index(self, entry: Entry) -> Entry:
        """Put an entry from `prepare` into the index, without an owner (it matches and reports
        nobody): the entry now indexed for its filter (another one, if an equal filter was added)."""
        if entry.indexed:
            return entry
        held = self._entries.setdefault(entry.key, entry)  # (one hash of the filter)
        if held is entry:
            entry.indexed = True
            for clause in entry.clauses:
                self._place(clause)
        return held

    def pin(self, entry: Entry) -> Entry:
        """`index`, and keep the entry indexed without owners until `unpin` (a profile's
        auxiliary profile while the profile lives: equal ones of many profiles are one entry)."""
        entry = self.index(entry)
        entry.pins += 1
        return entry

    def forget(self, entry: Entry) -> None:
        """Out of `prepare`'s cache (its profile went; one still holding it can `revive` it)."""
        if self._prepared.get(entry.key) is entry:
            del self._prepared[entry.key]

    def unpin(self, entry: Entry) -> None:
        """One user fewer; the last one's `unpin` drops an ownerless entry, and forgets it as
        prepared (`prepare`'s cache would otherwise keep every removed profile's filters)."""
        entry.pins -= 1
        if not entry.pins and not entry.owners:
            if entry.indexed:
                self._drop_entry(entry)
            self.forget(entry)

    def _plan(self, key: tuple[Filter, Eqs], f: Filter, eqs: Eqs, index: bool) -> Entry:
        """A new entry and its clauses (indexed if `index`), planned or from a stored plan."""
        entry = Entry(key, f, eqs)
        entry.indexed = index
        pkey = (f, tuple(a for a, _ in eqs))
        plans = self._plans.get(pkey)
        if plans is not None:
            for plan in plans:
                access, thr, check = from_plan(plan, eqs)
                self._add_clause(Clause(entry, check, access, thr), index)
        else:
            made = [self._insert_clause(entry, parts, eqs, index) for parts in split(f)]
            kept = [m for m in made if m is not None]
            if len(kept) == len(made) and len(self._plans) < _MAX_PLANS:
                self._plans[pkey] = kept
        return entry

    def remove(self, f: Filter, owner: Hashable, eqs: Eqs = (), *, keep: bool = False) -> None:
        """Drop one reference of `owner` to `f`; the filter goes when its last owner does.

        With `keep`, a filter left without owners stays indexed (it matches, and
        reports nobody) so that re-adding it is a reference update only; `purge`
        removes it for good.
        """
        if eqs:
            eqs = tuple([(a, (bool, v) if v.__class__ is bool else v) for a, v in eqs])
        entry = self._entries.get((f, eqs))
        if entry is None or owner not in entry.owners:
            raise KeyError(f"{owner!r} is not subscribed to this filter")
        n = entry.owners[owner] - 1
        if n:
            entry.owners[owner] = n
            return
        del entry.owners[owner]
        self.owner_count -= 1
        entry.solo = entry.fanout = None
        if not entry.owners and not keep and not entry.pins:
            self._drop_entry(entry)

    def claim(self, entry: Entry, owner: Hashable) -> bool:
        """`add` through a kept handle: False if the entry has left the pool (then call `add`)."""
        if not entry.indexed:
            return False
        owners = entry.owners
        prev = owners.get(owner, 0)
        owners[owner] = prev + 1
        if not prev:
            self.owner_count += 1
            entry.solo = entry.fanout = None
        return True

    def release(self, entry: Entry, owner: Hashable, keep: bool = False) -> None:
        """`remove` for a caller that kept the entry `add` returned: no key to normalise and hash.

        The composite engine retires an auxiliary profile on every completed match; this is
        that step's cost.
        """
        owners = entry.owners
        n = owners[owner] - 1
        if n:
            owners[owner] = n
            return
        del owners[owner]
        self.owner_count -= 1
        entry.solo = entry.fanout = None
        if not owners and not keep and not entry.pins:
            self._drop_entry(entry)

    def release_all(self, held: Iterable[tuple[Entry, Hashable]]) -> None:
        """`release` of several (entry, owner) pairs: a profile's starting entries when it goes
        (every completed `once` profile: one call, not one per entry)."""
        for entry, owner in held:
            owners = entry.owners
            n = owners[owner] - 1
            if n:
                owners[owner] = n
                continue
            del owners[owner]
            self.owner_count -= 1
            entry.solo = entry.fanout = None
            if not owners and not entry.pins:
                self._drop_entry(entry)

    def purge(self, f: Filter, eqs: Eqs = ()) -> None:
        """Remove a kept filter that has no owners left."""
        if eqs:
            eqs = tuple([(a, (bool, v) if v.__class__ is bool else v) for a, v in eqs])
        entry = self._entries.get((f, eqs))
        if entry is not None and not entry.owners and not entry.pins:
            self._drop_entry(entry)

    def purge_entry(self, entry: Entry) -> None:
        """`purge` through a kept handle of an indexed entry."""
        if not entry.owners and not entry.pins:
            self._drop_entry(entry)

    def _drop_entry(self, entry: Entry) -> None:
        entry.indexed = False
        del self._entries[entry.key]
        for clause in entry.clauses:
            access = clause.access
            if access is not None and access[0] == "eqs" and access[3] is None:
                # an equality clause (an auxiliary profile's or a starting component's usual
                # shape), inline: this runs on every completed match and every `once` profile
                # that reports
                if clause.check is None:
                    memo = self._memo
                    if memo is None:
                        memo = self._paused
                    if memo is not None:  # `_forget`: one key, or the whole memo
                        if access[1] == self._memo_attrs:
                            memo.pop(access[2], None)
                        else:
                            self._drop_memo()
                else:
                    self._forget(clause)
                    self._impure -= 1
                schema = access[1]
                table = self._schemas[schema]
                bucket = table[access[2]]
                plain = bucket.plain
                del plain[clause]
                if not plain and not bucket.ranges:
                    del table[access[2]]
                    if not table:
                        del self._schemas[schema]
                continue
            self._forget(clause)
            if _impure(clause):
                self._impure -= 1
            elif _ranged(clause):
                self._ranged -= 1
            self._index.remove(clause)

    def _insert_clause(
        self, entry: Entry, parts: list[Filter], eqs: Eqs, index: bool
    ) -> Plan | None:
        """Plan the clause's indexing and add it to the entry (and the index if `index`);
        return the plan for other bound values (or None)."""
        access, thr, check, plan = plan_clause(parts, eqs)
        self._add_clause(Clause(entry, check, access, thr), index)
        return plan

    def _add_clause(self, clause: Clause, index: bool) -> None:
        clause.entry.clauses.append(clause)
        if index:
            self._place(clause)

    def _place(self, clause: Clause) -> None:
        """Put an entry's clause into the index (under its access predicate)."""
        access = clause.access
        if clause.check is None and access is not None and access[0] == "eqs":
            # equalities (and a range): an auxiliary profile's shape, inline (`_forget`, the
            # counts): a group's first partial match puts its closing component back
            memo = self._memo
            if memo is None:
                memo = self._paused
            if memo is not None:
                if access[1] == self._memo_attrs:
                    memo.pop(access[2], None)
                else:
                    self._drop_memo()
            if access[3] is not None:
                self._ranged += 1
            self._index.place(clause)
            return
        self._forget(clause)
        if _impure(clause):
            self._impure += 1
        elif _ranged(clause):
            self._ranged += 1
        self._index.place(clause)

    # ------------------------------------------------------------------ match
    def match(self, attrs: dict[str, Any]) -> list[Entry]:
        """Every stored filter that `attrs` satisfies (each once). The list is shared: do not change it."""
        memo = self._memo
        if memo is None:
            self._calm += 1
            if self._calm < poolmemo.CALM or self._impure:
                return self._match(attrs)
            memo = self._start_memo()
        names = self._memo_attrs
        # the key: the equality attributes' values as the buckets hold them (a boolean is
        # (bool, v), as True == 1 for a dict); spelled out for the usual sizes (3x faster)
        key: Any
        if (n := self._memo_n) == 2:
            a = attrs.get(names[0])
            b = attrs.get(names[1])
            if a is True or a is False:
                a = (bool, a)
            if b is True or b is False:
                b = (bool, b)
            key = (a, b)
        elif n == 1:
            key = attrs.get(names[0])
            if key is True or key is False:  # (cheaper than a class test)
                key = (bool, key)
        else:
            key = tuple([(bool, v) if v.__class__ is bool else v for v in map(attrs.get, names)])
        self._looks += 1
        out = memo.get(key)
        if out is None:
            out = self._memo_value(attrs)
            if len(memo) < poolmemo.MEMO_MAX:
                memo[key] = out
            self._misses += 1
            if self._looks >= poolmemo.TRIAL:
                self._review()
        if out.__class__ is list:  # (cheaper than `isinstance`: every event)
            return out  # type: ignore[return-value]
        if isinstance(out, Range):  # `Range.hits`, inline: the plain threshold filter's match
            v = attrs.get(out.attr)
            if v is None or v.__class__ not in out.classes or out.big is not None:
                return out.hits(attrs)
            k = out.cut(out.keys, v)
            return out.ents[:k] if out.prefix else out.ents[k:]
        return out(attrs)  # type: ignore[operator]  # (not a list: the `__class__` test)

    def owners(self, attrs: dict[str, Any]) -> list[Hashable]:
        """Owners of every matching filter (an owner of several matching filters appears once)."""
        out: dict[Hashable, None] = {}
        for entry in self.match(attrs):
            out.update(dict.fromkeys(entry.owners))
        return list(out)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()


def _ranged(clause: Clause) -> bool:
    """Whether the clause is indexed in an equality bucket's range."""
    access = clause.access
    return access is not None and access[0] == "eqs" and access[3] is not None


def _impure(clause: Clause) -> bool:
    """Whether the clause's match depends on more than the values of its equality attributes."""
    access = clause.access
    return clause.check is not None or access is None or access[0] not in ("eqs", "in")


def owners_by_profile(entries: list[Entry]) -> list[tuple[int, list[int]]]:
    """Owners `(profile index, leaf)` of matched entries as (index, sorted leaves), in index order.

    Both engines hand an event to each profile once, with every leaf it matched, in profile
    order (the order notifications of one event come out in).
    """
    out: list[tuple[int, list[int]]] = []
    if len(entries) == 1:  # one filter (a closing event waited for by many): sort its owners
        pairs: dict[tuple[int, int], int] = entries[0].owners  # type: ignore[assignment]
        owners = sorted(pairs)
        i, n = 0, len(owners)
        while i < n:
            idx, leaf = owners[i]
            i += 1
            leaves = [leaf]
            while i < n and owners[i][0] == idx:
                leaves.append(owners[i][1])
                i += 1
            out.append((idx, leaves))
        return out
    hits: dict[int, list[int]] = {}
    for entry in entries:
        pairs = entry.owners  # type: ignore[assignment]  # the engines' owners: (index, leaf)
        for idx, leaf in pairs:
            lst = hits.get(idx)
            if lst is None:
                hits[idx] = [leaf]
            elif leaf not in lst:
                lst.append(leaf)
    for idx in sorted(hits):
        leaves = hits[idx]
        if len(leaves) > 1:
            leaves.sort()
        out.append((idx, leaves))
    return out
