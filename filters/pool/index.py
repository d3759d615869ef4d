"""The primitive pool's index: clauses under their access predicates (see filters/pool/primitive.py).

Equality clauses go into buckets, one per combination of equality values (`_Bucket`), with
their range, if any, sorted by threshold inside the bucket (`Range`); `in` lists put the clause
into one bucket per value. Clauses without equality are indexed per attribute (`_AttrIndex`):
ranges and `between` in sorted lists, `starts with` by prefix length, `exists`. Clauses with no
indexable predicate are scanned. `ClauseIndex` places and removes clauses and collects the
candidates of an event; the pool above it keeps entries, owners and the memo.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable
from typing import Any

from sortedcontainers import SortedKeyList, SortedList

from filters.compile import Check
from filters.pool.plan import Access, Eqs, kind_of
from profiles.ast import Filter

_INF = float("inf")


class Entry:
    """One distinct filter in the pool, with every owner that subscribed it."""

    __slots__ = (
        "key",
        "filter",
        "eqs",
        "owners",
        "clauses",
        "indexed",
        "solo",
        "fanout",
        "hits",
        "pins",
    )

    def __init__(self, key: tuple[Filter, Eqs], f: Filter, eqs: Eqs) -> None:
        self.key = key
        self.filter = f
        self.eqs = eqs
        self.owners: dict[Hashable, int] = {}
        self.clauses: list[Clause] = []
        self.indexed = True  # False once dropped: a handle kept by a caller is then stale
        # the user's precompiled handler for an event matching only this entry, valid while
        # the owners do not change (None: not made yet; False: there is none)
        self.solo: Any = None
        # the user's precomputed view of the owners for events matching several entries, valid
        # while the owners do not change (None: not made yet)
        self.fanout: Any = None
        self.hits = 0  # events seen with one owner and no handler (`Engine.process`)
        self.pins = 0  # users that keep it indexed without owning it (`PrimitivePool.pin`)


class Clause:
    """A conjunction: indexed under its access predicates, `check` tests the rest."""

    __slots__ = ("entry", "check", "access", "thr")

    def __init__(
        self, entry: Entry, check: Check | None, access: Access | None, thr: Any = None
    ) -> None:
        self.entry = entry
        self.check = check
        self.access = access
        self.thr = thr


def _thr(c: Clause) -> Any:
    return c.thr


_BIG = 1024  # above this many thresholds a range switches from a plain sorted list to SortedKeyList


class Range:
    """Clauses of one bucket with a range on one attribute, sorted by threshold.

    Small ranges are parallel plain lists searched with `bisect` (fastest in
    CPython); big ones become a SortedKeyList so insert and delete stay
    O(log n). `v op threshold` holds for a prefix (`>`, `>=`) or a suffix
    (`<`, `<=`) of the sorted thresholds: one cut by binary search.
    """

    __slots__ = (
        "attr",
        "op",
        "kind",
        "classes",
        "keys",
        "items",
        "ents",
        "big",
        "prefix",
        "left",
        "cut",
    )

    def __init__(self, attr: str, op: str, kind: str) -> None:
        self.attr, self.op, self.kind = attr, op, kind
        # the value classes this range compares with (a bool is not a number here)
        self.classes: tuple[type, ...] = (str,) if kind == "s" else (int, float)
        self.keys: list[Any] = []
        self.items: list[Clause] = []
        self.ents: list[Entry] = []  # items' entries: a memoized match is a slice of them
        self.big: Any = None  # SortedKeyList of the clauses, above _BIG of them
        self.prefix = op in (">", ">=")
        self.left = op in (">", "<=")  # cut left of thresholds equal to v (else right)
        self.cut: Callable[[list[Any], Any], int] = bisect_left if self.left else bisect_right

    def __len__(self) -> int:
        return len(self.big) if self.big is not None else len(self.items)

    def add(self, clause: Clause) -> None:
        if self.big is not None:
            self.big.add(clause)
            return
        i = bisect_right(self.keys, clause.thr)
        self.keys.insert(i, clause.thr)
        self.items.insert(i, clause)
        self.ents.insert(i, clause.entry)
        if len(self.items) > _BIG:
            self.big = SortedKeyList(self.items, key=_thr)
            self.keys, self.items, self.ents = [], [], []

    def remove(self, clause: Clause) -> None:
        if self.big is not None:
            self.big.remove(clause)
            return
        i = bisect_left(self.keys, clause.thr)
        while self.items[i] is not clause:
            i += 1
        del self.keys[i]
        del self.items[i]
        del self.ents[i]

    def entries(self) -> list[Entry]:
        """The entries of every clause, in threshold order."""
        return self.ents if self.big is None else [c.entry for c in self.big]

    def collect(self, v: Any, out: list[Clause]) -> None:
        """Append the clauses whose range `v` satisfies (`v` of this range's kind)."""
        big = self.big
        if big is None:
            k = self.cut(self.keys, v)
            out.extend(self.items[:k] if self.prefix else self.items[k:])
        else:
            k = big.bisect_key_left(v) if self.left else big.bisect_key_right(v)
            out.extend(big.islice(0, k) if self.prefix else big.islice(k))

    def hits(self, attrs: dict[str, Any]) -> list[Entry]:
        """The entries this range alone matches: a memoized match when it is all that an event's
        equality values reach (one bisect and one slice, as a hand-written loop does)."""
        v = attrs.get(self.attr)
        if v is None or v.__class__ not in self.classes:
            return []
        if self.big is None:
            k = self.cut(self.keys, v)
            return self.ents[:k] if self.prefix else self.ents[k:]
        out: list[Clause] = []
        self.collect(v, out)
        return [c.entry for c in out]


class _Bucket:
    """Clauses sharing one combination of equality values, plus at most one range each.

    The range thresholds are kept sorted, so an event's value selects the
    satisfied ones by binary search instead of testing them one by one.
    """

    __slots__ = ("plain", "ranges")

    def __init__(self) -> None:
        self.plain: dict[Clause, None] = {}
        self.ranges: dict[tuple[str, str, str], Range] = {}

    def collect(self, attrs: dict[str, Any], out: list[Clause]) -> None:
        if self.plain:
            out.extend(self.plain)
        for r in self.ranges.values():
            v = attrs.get(r.attr)
            if v is None:
                continue
            cls = v.__class__
            if r.kind == "s":
                if cls is not str:
                    continue
            elif cls is not int and cls is not float:
                continue
            r.collect(v, out)

    def empty(self) -> bool:
        return not (self.plain or self.ranges)


class _Node:
    """A non-equality access predicate stored once, pointing at every clause that uses it."""

    __slots__ = ("clauses", "high")

    def __init__(self, high: Any = None) -> None:
        self.clauses: dict[Clause, None] = {}
        self.high = high


class _AttrIndex:
    """Access predicates over one attribute for clauses without any equality."""

    __slots__ = ("exists", "prefix", "prefix_lens", "ranges", "between", "nodes")

    def __init__(self) -> None:
        self.exists: _Node | None = None
        self.prefix: dict[str, _Node] = {}
        self.prefix_lens: dict[int, int] = {}
        # (op, kind) -> SortedList[(threshold, node id)]; kind separates numbers and strings
        self.ranges: dict[tuple[str, str], SortedList] = {}
        self.between: dict[str, SortedList] = {}
        self.nodes: dict[int, _Node] = {}

    def empty(self) -> bool:
        return not (self.exists or self.prefix or self.nodes)

    def collect(self, v: Any, out: list[Clause]) -> None:
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


class ClauseIndex:
    """Clauses under their access predicates; `candidates` are the clauses an event may match."""

    def __init__(self) -> None:
        # equality schema (attribute names) -> equality values -> bucket
        self.schemas: dict[tuple[str, ...], dict[Any, _Bucket]] = {}
        self.attrs: dict[str, _AttrIndex] = {}
        self.scan: dict[Clause, None] = {}
        self._ids = itertools.count()
        self._range_ids: dict[str, dict[Access, int]] = {}  # attr -> range predicate -> node id

    def place(self, clause: Clause) -> None:
        """Put a clause into the index (under its access predicate)."""
        access = clause.access
        if access is None:
            self.scan[clause] = None
        elif access[0] == "eqs":
            table = self.schemas.get(access[1])
            if table is None:
                table = self.schemas[access[1]] = {}
            bucket = table.get(access[2])
            if bucket is None:
                bucket = table[access[2]] = _Bucket()
            if access[3] is None:
                bucket.plain[clause] = None
            else:
                rng = bucket.ranges.get(access[3])
                if rng is None:
                    rng = bucket.ranges[access[3]] = Range(*access[3])
                rng.add(clause)
        elif access[0] == "in":
            for k in dict.fromkeys(access[2]):
                bucket = self.schemas.setdefault((access[1],), {}).get(k)
                if bucket is None:
                    bucket = self.schemas[(access[1],)][k] = _Bucket()
                bucket.plain[clause] = None
        else:
            node = self._node_for(access, create=True)
            assert node is not None
            node.clauses[clause] = None

    def _node_for(self, key: Access, create: bool) -> _Node | None:
        kind, attr = key[0], key[1]
        ix = self.attrs.get(attr)
        if ix is None:
            if not create:
                return None
            ix = self.attrs[attr] = _AttrIndex()
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
            ix.ranges.setdefault((op, kind_of(value)), SortedList()).add((value, nid))
        else:
            low, high = key[2], key[3]
            node = _Node(high)
            ix.between.setdefault(kind_of(low), SortedList()).add((low, nid))
        ix.nodes[nid] = node
        return node

    def remove(self, clause: Clause) -> None:
        access = clause.access
        if access is None:
            del self.scan[clause]
            return
        kind = access[0]
        if kind == "eqs":  # one bucket (the auxiliary profiles' shape): no list of targets
            self._unbucket(clause, access[1], access[2], access[3])
            return
        if kind == "in":
            for k in dict.fromkeys(access[2]):
                self._unbucket(clause, (access[1],), k, None)
            return
        node = self._node_for(access, create=False)
        assert node is not None
        del node.clauses[clause]
        if not node.clauses:
            self._drop_node(access)

    def _unbucket(
        self, clause: Clause, schema: tuple[str, ...], values: Any, rng: tuple[str, str, str] | None
    ) -> None:
        """Take `clause` out of one equality bucket (its range `rng`, or its plain set)."""
        table = self.schemas[schema]
        bucket = table[values]
        if rng is None:
            del bucket.plain[clause]
        else:
            sl = bucket.ranges[rng]
            sl.remove(clause)
            if not sl:
                del bucket.ranges[rng]
        if bucket.empty():
            del table[values]
            if not table:
                del self.schemas[schema]

    def _drop_node(self, key: Access) -> None:
        kind, attr = key[0], key[1]
        ix = self.attrs[attr]
        if kind == "exists":
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
                sl = ix.ranges[(key[2], kind_of(key[3]))]
                sl.remove((key[3], nid))
                if not sl:
                    del ix.ranges[(key[2], kind_of(key[3]))]
            else:
                sl = ix.between[kind_of(key[2])]
                sl.remove((key[2], nid))
                if not sl:
                    del ix.between[kind_of(key[2])]
        if ix.empty():
            del self.attrs[attr]
            self._range_ids.pop(attr, None)

    def buckets(self, attrs: dict[str, Any]) -> list[_Bucket]:
        """The equality buckets that `attrs` reaches, one per schema at most (in schema order)."""
        out: list[_Bucket] = []
        for schema, table in self.schemas.items():
            if len(schema) == 1:
                v = attrs.get(schema[0])
                if v is None:
                    continue
                bucket = table.get(v if v.__class__ is not bool else (bool, v))
            else:
                vals = []
                for a in schema:
                    v = attrs.get(a)
                    if v is None:
                        break
                    vals.append(v if v.__class__ is not bool else (bool, v))
                else:
                    bucket = table.get(tuple(vals))
                    if bucket is not None:
                        out.append(bucket)
                continue
            if bucket is not None:
                out.append(bucket)
        return out

    def match(self, attrs: dict[str, Any], buckets: list[_Bucket] | None = None) -> list[Entry]:
        """Every indexed entry with a clause that `attrs` satisfies (each once); `buckets`: the
        equality buckets `attrs` reaches if found already (else found here, inline: hot path)."""
        cands: list[Clause] = []
        if buckets is not None:
            for found in buckets:
                found.collect(attrs, cands)
        else:
            for schema, table in self.schemas.items():
                if len(schema) == 1:
                    v = attrs.get(schema[0])
                    if v is None:
                        continue
                    bucket = table.get(v if v.__class__ is not bool else (bool, v))
                else:
                    vals = []
                    for a in schema:
                        v = attrs.get(a)
                        if v is None:
                            break
                        vals.append(v if v.__class__ is not bool else (bool, v))
                    else:
                        bucket = table.get(tuple(vals))
                        if bucket is not None:
                            bucket.collect(attrs, cands)
                    continue
                if bucket is not None:
                    bucket.collect(attrs, cands)
        idx = self.attrs
        if idx:
            for attr, ix in idx.items():
                v = attrs.get(attr)
                if v is not None:
                    ix.collect(v, cands)
        if self.scan:
            cands.extend(self.scan)
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
