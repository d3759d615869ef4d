"""The primitive profile pool, indexed Gough-style.

Each stored filter is split into conjunctive *clauses* (a top-level `or`
becomes one clause per branch). Every clause is indexed under one *access
predicate* that must hold for the clause to hold: equality and `in` in a
hash table per attribute, ranges and `between` in sorted lists searched by
binary search, `starts with` by prefix length, `exists` per attribute. The
rest of the clause (its residual) is a compiled predicate checked only for
the candidates the index returns. Clauses with no indexable predicate
(e.g. `not (...)` alone) are scanned.

Identical filters (same AST, same bound equalities) are stored once and
carry every owner; identical access predicates are stored once and point to
every clause that uses them. Insert and delete touch one hash entry or one
sorted list (O(log n)), which matters because the composite engine inserts
and deletes auxiliary profiles all the time.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import Any

from sortedcontainers import SortedList

from filters.compile import Check, compile_filter, norm
from profiles.ast import And, Between, Cmp, Exists, Filter, In, Or, StartsWith

Eqs = tuple[tuple[str, Any], ...]  # extra `attr = value` predicates bound by the engine

_MAX_SPLIT = 32  # a top-level `or` with more branches is kept as one scanned clause
_INF = float("inf")


class Entry:
    """One distinct filter in the pool, with every owner that subscribed it."""

    __slots__ = ("key", "filter", "eqs", "owners", "clauses")

    def __init__(self, key: tuple[Filter, Eqs], f: Filter, eqs: Eqs) -> None:
        self.key = key
        self.filter = f
        self.eqs = eqs
        self.owners: dict[Hashable, int] = {}
        self.clauses: list[Clause] = []


class Clause:
    __slots__ = ("entry", "check", "access")

    def __init__(self, entry: Entry, check: Check | None, access: tuple | None) -> None:
        self.entry = entry
        self.check = check
        self.access = access


class _Node:
    """An access predicate stored once, pointing at every clause that uses it."""

    __slots__ = ("clauses", "high")

    def __init__(self, high: Any = None) -> None:
        self.clauses: dict[Clause, None] = {}
        self.high = high


class _AttrIndex:
    """All access predicates over one attribute."""

    __slots__ = ("eq", "exists", "prefix", "prefix_lens", "ranges", "between", "nodes")

    def __init__(self) -> None:
        self.eq: dict[Any, _Node] = {}
        self.exists: _Node | None = None
        self.prefix: dict[str, _Node] = {}
        self.prefix_lens: dict[int, int] = {}
        # (op, kind) -> SortedList[(threshold, node id)]; kind separates numbers and strings
        self.ranges: dict[tuple[str, str], SortedList] = {}
        self.between: dict[str, SortedList] = {}
        self.nodes: dict[int, _Node] = {}

    def empty(self) -> bool:
        return not (self.eq or self.exists or self.prefix or self.nodes)

    def collect(self, v: Any, out: list[Clause]) -> None:
        node = self.eq.get(norm(v))
        if node is not None:
            out.extend(node.clauses)
        if self.exists is not None:
            out.extend(self.exists.clauses)
        cls = v.__class__
        if cls is str:
            if self.prefix_lens:
                for n in self.prefix_lens:
                    node = self.prefix.get(v[:n])
                    if node is not None:
                        out.extend(node.clauses)
            kind = "s"
        elif cls is int or cls is float:
            kind = "n"
        else:
            return
        if self.nodes:
            nodes = self.nodes
            ranges = self.ranges
            sl = ranges.get((">", kind))  # threshold < v
            if sl:
                for _, nid in sl.islice(0, sl.bisect_left((v,))):
                    out.extend(nodes[nid].clauses)
            sl = ranges.get((">=", kind))  # threshold <= v
            if sl:
                for _, nid in sl.islice(0, sl.bisect_left((v, _INF))):
                    out.extend(nodes[nid].clauses)
            sl = ranges.get(("<", kind))  # threshold > v
            if sl:
                for _, nid in sl.islice(sl.bisect_left((v, _INF))):
                    out.extend(nodes[nid].clauses)
            sl = ranges.get(("<=", kind))  # threshold >= v
            if sl:
                for _, nid in sl.islice(sl.bisect_left((v,))):
                    out.extend(nodes[nid].clauses)
            sl = self.between.get(kind)  # low <= v, then check high
            if sl:
                for _, nid in sl.islice(0, sl.bisect_left((v, _INF))):
                    node = nodes[nid]
                    if v <= node.high:
                        out.extend(node.clauses)


def _kind(v: Any) -> str:
    return "s" if isinstance(v, str) else "n"


def _rank(p: Any, idx: dict[str, _AttrIndex]) -> float | None:
    """Lower is better as an access predicate; None when not indexable."""
    if isinstance(p, Cmp):
        if p.op == "=":
            ix = idx.get(p.attr)
            node = ix.eq.get(norm(p.value)) if ix is not None else None
            return 0.0 + (len(node.clauses) / 1e6 if node is not None else 0.0)
        if p.op in ("<", "<=", ">", ">=") and not isinstance(p.value, bool):
            return 4.0
        return None
    if isinstance(p, In):
        return None if p.negated or not p.values else 1.0 + len(p.values) / 100
    if isinstance(p, StartsWith):
        return 2.0
    if isinstance(p, Between):
        return 3.0
    if isinstance(p, Exists):
        return 5.0
    return None


def _conjuncts(f: Filter) -> list[Filter]:
    if isinstance(f, And):
        out: list[Filter] = []
        for item in f.items:
            out.extend(_conjuncts(item))
        return out
    return [f]


def _eq_check(eqs: Eqs, base: Check | None) -> Check:
    if len(eqs) == 1 and base is None:
        ((attr, key),) = eqs

        def check1(a: dict[str, Any]) -> bool:
            v = a.get(attr)
            return v is not None and norm(v) == key

        return check1

    def check(a: dict[str, Any]) -> bool:
        for attr, key in eqs:
            v = a.get(attr)
            if v is None or norm(v) != key:
                return False
        return base is None or base(a)

    return check


class PrimitivePool:
    """Filters -> owners, with sublinear insert, delete and match."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Filter, Eqs], Entry] = {}
        self._idx: dict[str, _AttrIndex] = {}
        self._scan: dict[Clause, None] = {}
        self._ids = itertools.count()
        self._range_ids: dict[str, dict[tuple, int]] = {}  # attr -> range predicate -> node id
        self.owner_count = 0

    def __len__(self) -> int:
        """Number of distinct filters stored."""
        return len(self._entries)

    # ----------------------------------------------------------- insert/delete
    def add(self, f: Filter, owner: Hashable, eqs: Eqs = ()) -> Entry:
        """Subscribe `owner` to `f` (and the bound equalities `eqs`). Re-adding counts a reference."""
        eqs = tuple((a, norm(v)) for a, v in eqs)
        key = (f, eqs)
        entry = self._entries.get(key)
        if entry is None:
            entry = Entry(key, f, eqs)
            self._entries[key] = entry
            for parts in self._split(f):
                self._insert_clause(entry, parts, eqs)
        prev = entry.owners.get(owner, 0)
        entry.owners[owner] = prev + 1
        if prev == 0:
            self.owner_count += 1
        return entry

    def remove(self, f: Filter, owner: Hashable, eqs: Eqs = ()) -> None:
        """Drop one reference of `owner` to `f`; the filter goes when its last owner does."""
        eqs = tuple((a, norm(v)) for a, v in eqs)
        entry = self._entries.get((f, eqs))
        if entry is None or owner not in entry.owners:
            raise KeyError(f"{owner!r} is not subscribed to this filter")
        n = entry.owners[owner] - 1
        if n:
            entry.owners[owner] = n
            return
        del entry.owners[owner]
        self.owner_count -= 1
        if not entry.owners:
            del self._entries[entry.key]
            for clause in entry.clauses:
                self._remove_clause(clause)

    def _split(self, f: Filter) -> list[list[Filter]]:
        if isinstance(f, Or) and len(f.items) <= _MAX_SPLIT:
            out: list[list[Filter]] = []
            for item in f.items:
                if isinstance(item, Or):
                    return [_conjuncts(f)]
                out.append(_conjuncts(item))
            return out
        return [_conjuncts(f)]

    def _insert_clause(self, entry: Entry, parts: list[Filter], eqs: Eqs) -> None:
        best, best_rank = None, None
        for i, p in enumerate(parts):
            r = _rank(p, self._idx)
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        access: tuple | None = None
        eq_rest = eqs
        if eqs:
            # a bound equality is usually the most selective predicate (e.g. room = "101")
            ranks = []
            for j, (attr, key) in enumerate(eqs):
                ix = self._idx.get(attr)
                node = ix.eq.get(key) if ix is not None else None
                ranks.append((len(node.clauses) if node is not None else 0, j))
            size, j = min(ranks)
            if best_rank is None or best_rank >= 1.0 or size == 0:
                attr, key = eqs[j]
                access = ("eq", attr, key)
                eq_rest = eqs[:j] + eqs[j + 1 :]
                best = None
        if access is None and best is not None:
            access = self._access_of(parts[best])
        rest = [p for i, p in enumerate(parts) if i != best]
        base = None
        if rest:
            base = compile_filter(rest[0] if len(rest) == 1 else And(tuple(rest)))
            if base.__name__ == "_always":
                base = None
        check = _eq_check(eq_rest, base) if eq_rest else base
        clause = Clause(entry, check, access)
        entry.clauses.append(clause)
        if access is None:
            self._scan[clause] = None
            return
        for key in self._keys_of(access):
            self._node_for(key, create=True).clauses[clause] = None

    @staticmethod
    def _access_of(p: Filter) -> tuple:
        if isinstance(p, Cmp):
            if p.op == "=":
                return ("eq", p.attr, norm(p.value))
            return ("range", p.attr, p.op, p.value)
        if isinstance(p, In):
            return ("in", p.attr, tuple(norm(v) for v in p.values))
        if isinstance(p, StartsWith):
            return ("prefix", p.attr, p.prefix)
        if isinstance(p, Between):
            return ("between", p.attr, p.low, p.high)
        if isinstance(p, Exists):
            return ("exists", p.attr)
        raise TypeError(p)

    @staticmethod
    def _keys_of(access: tuple) -> Iterable[tuple]:
        if access[0] == "in":
            for k in dict.fromkeys(access[2]):
                yield ("eq", access[1], k)
        else:
            yield access

    def _node_for(self, key: tuple, create: bool) -> _Node | None:
        kind, attr = key[0], key[1]
        ix = self._idx.get(attr)
        if ix is None:
            if not create:
                return None
            ix = self._idx[attr] = _AttrIndex()
        if kind == "eq":
            node = ix.eq.get(key[2])
            if node is None and create:
                node = ix.eq[key[2]] = _Node()
            return node
        if kind == "exists":
            if ix.exists is None and create:
                ix.exists = _Node()
            return ix.exists
        if kind == "prefix":
            node = ix.prefix.get(key[2])
            if node is None and create:
                node = ix.prefix[key[2]] = _Node()
                n = len(key[2])
                ix.prefix_lens[n] = ix.prefix_lens.get(n, 0) + 1
            return node
        # range / between: look the node up through a per-index dict keyed by the predicate
        nodes_by_key = self._range_ids.setdefault(attr, {})
        nid = nodes_by_key.get(key)
        if nid is not None:
            return ix.nodes[nid]
        if not create:
            return None
        nid = next(self._ids)
        nodes_by_key[key] = nid
        if kind == "range":
            op, value = key[2], key[3]
            node = _Node()
            ix.ranges.setdefault((op, _kind(value)), SortedList()).add((value, nid))
        else:
            low, high = key[2], key[3]
            node = _Node(high)
            ix.between.setdefault(_kind(low), SortedList()).add((low, nid))
        ix.nodes[nid] = node
        return node

    def _remove_clause(self, clause: Clause) -> None:
        if clause.access is None:
            del self._scan[clause]
            return
        for key in self._keys_of(clause.access):
            node = self._node_for(key, create=False)
            assert node is not None
            del node.clauses[clause]
            if not node.clauses:
                self._drop_node(key)

    def _drop_node(self, key: tuple) -> None:
        kind, attr = key[0], key[1]
        ix = self._idx[attr]
        if kind == "eq":
            del ix.eq[key[2]]
        elif kind == "exists":
            ix.exists = None
        elif kind == "prefix":
            del ix.prefix[key[2]]
            n = len(key[2])
            ix.prefix_lens[n] -= 1
            if not ix.prefix_lens[n]:
                del ix.prefix_lens[n]
        else:
            nid = self._range_ids[attr].pop(key)
            del ix.nodes[nid]
            if kind == "range":
                sl = ix.ranges[(key[2], _kind(key[3]))]
                sl.remove((key[3], nid))
                if not sl:
                    del ix.ranges[(key[2], _kind(key[3]))]
            else:
                sl = ix.between[_kind(key[2])]
                sl.remove((key[2], nid))
                if not sl:
                    del ix.between[_kind(key[2])]
        if ix.empty():
            del self._idx[attr]

    # ------------------------------------------------------------------ match
    def match(self, attrs: dict[str, Any]) -> list[Entry]:
        """Every stored filter that `attrs` satisfies (each once)."""
        cands: list[Clause] = []
        idx = self._idx
        if len(idx) < len(attrs):
            for attr, ix in idx.items():
                v = attrs.get(attr)
                if v is not None:
                    ix.collect(v, cands)
        else:
            for attr, v in attrs.items():
                ix = idx.get(attr)
                if ix is not None:
                    ix.collect(v, cands)
        if self._scan:
            cands.extend(self._scan)
        out: list[Entry] = []
        seen: set[int] | None = None
        for clause in cands:
            check = clause.check
            if check is None or check(attrs):
                entry = clause.entry
                if len(entry.clauses) > 1:
                    if seen is None:
                        seen = set()
                    if id(entry) in seen:
                        continue
                    seen.add(id(entry))
                out.append(entry)
        return out

    def owners(self, attrs: dict[str, Any]) -> list[Hashable]:
        """Owners of every matching filter (an owner of several matching filters appears once)."""
        out: dict[Hashable, None] = {}
        for entry in self.match(attrs):
            out.update(dict.fromkeys(entry.owners))
        return list(out)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()
