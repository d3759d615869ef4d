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
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeAlias

from sortedcontainers import SortedKeyList, SortedList

from filters.compile import Check, compile_filter, norm
from profiles.ast import And, Between, Cmp, Exists, Filter, In, Or, StartsWith

Eqs = tuple[tuple[str, Any], ...]  # extra `attr = value` predicates bound by the engine

_MAX_PLANS = 100_000
_MAX_SPLIT = 32  # a top-level `or` with more branches is kept as one scanned clause
_INF = float("inf")
_CALM = 64  # matches without a pool change before results are memoized
_MEMO_MAX = 4096  # memoized value combinations (a facility feed has tens: kind x state)


class Entry:
    """One distinct filter in the pool, with every owner that subscribed it."""

    __slots__ = ("key", "filter", "eqs", "owners", "clauses", "indexed", "solo", "fanout")

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


class Clause:
    """A conjunction: indexed under its access predicates, `check` tests the rest."""

    __slots__ = ("entry", "check", "access", "thr")

    def __init__(
        self, entry: Entry, check: Check | None, access: tuple | None, thr: Any = None
    ) -> None:
        self.entry = entry
        self.check = check
        self.access = access
        self.thr = thr


def _thr(c: Clause) -> Any:
    return c.thr


_BIG = 1024  # above this many thresholds a range switches from a plain sorted list to SortedKeyList


class _Range:
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
        self.ranges: dict[tuple[str, str, str], _Range] = {}

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


def _kind(v: Any) -> str:
    return "s" if isinstance(v, str) else "n"


def _is_range(p: Any) -> bool:
    return isinstance(p, Cmp) and p.op in ("<", "<=", ">", ">=") and not isinstance(p.value, bool)


def _rank(p: Any) -> float | None:
    """For clauses without equality: lower is a better access predicate; None = not indexable."""
    if isinstance(p, In):
        return None if p.negated or not p.values else 1.0
    if isinstance(p, StartsWith):
        return 2.0
    if isinstance(p, Between):
        return 3.0
    if _is_range(p):
        return 4.0
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


# a memoized match: the entries, or (when ranges decide) the one range or a function of the
# event that gives them
Memo: TypeAlias = list[Entry] | _Range | Callable[[dict[str, Any]], list[Entry]]


class _Parts:
    """A memoized match over several buckets' parts (entries, ranges), in `_match`'s order."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[list[Entry] | _Range, ...]) -> None:
        self.parts = parts

    def hits(self, attrs: dict[str, Any]) -> list[Entry]:
        out: list[Entry] = []
        for part in self.parts:
            out += part if part.__class__ is list else part.hits(attrs)  # type: ignore[union-attr,operator]
        return out


class PrimitivePool:
    """Filters -> owners, with sublinear insert, delete and match."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Filter, Eqs], Entry] = {}
        # equality schema (attribute names) -> equality values -> bucket
        self._schemas: dict[tuple[str, ...], dict[Any, _Bucket]] = {}
        self._idx: dict[str, _AttrIndex] = {}
        self._scan: dict[Clause, None] = {}
        self._ids = itertools.count()
        self._range_ids: dict[str, dict[tuple, int]] = {}  # attr -> range predicate -> node id
        # (filter, bound attribute names) -> how its clauses are indexed: auxiliary profiles
        # differ only in bound values, so they are inserted without planning again
        self._plans: dict[tuple, list[tuple]] = {}
        self.owner_count = 0
        # match results memoized by the values of the equality attributes, while the pool
        # holds only plain equalities (then those values alone decide the result) and has
        # not changed for _CALM matches (a pool that changes on every event gains nothing)
        self._impure = 0  # clauses whose match depends on more than their equality values
        self._memo: dict[Any, Memo] | None = None
        self._memo_attrs: tuple[str, ...] = ()
        self._calm = 0

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
        return entry if entry is not None else self._plan(key, f, eqs, False)

    def revive(self, entry: Entry, owner: Hashable) -> Entry:
        """`add` through a handle from `prepare` (or a kept one): the entry that now holds `owner`
        (another one, if an equal filter was added since the handle was made)."""
        if not entry.indexed:
            held = self._entries.get(entry.key)
            if held is not None:
                entry = held
            else:
                self._entries[entry.key] = entry
                entry.indexed = True
                for clause in entry.clauses:
                    self._place(clause)
        owners = entry.owners
        prev = owners.get(owner, 0)
        owners[owner] = prev + 1
        if not prev:
            self.owner_count += 1
            entry.solo = entry.fanout = None
        return entry

    def _plan(self, key: tuple[Filter, Eqs], f: Filter, eqs: Eqs, index: bool) -> Entry:
        """A new entry and its clauses (indexed if `index`), planned or from a stored plan."""
        entry = Entry(key, f, eqs)
        entry.indexed = index
        pkey = (f, tuple(a for a, _ in eqs))
        plans = self._plans.get(pkey)
        if plans is not None:
            for plan in plans:
                self._from_plan(entry, plan, eqs, index)
        else:
            made = [self._insert_clause(entry, parts, eqs, index) for parts in self._split(f)]
            if all(m is not None for m in made) and len(self._plans) < _MAX_PLANS:
                self._plans[pkey] = made  # type: ignore[assignment]
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
        if not entry.owners and not keep:
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
        if not owners and not keep:
            self._drop_entry(entry)

    def purge(self, f: Filter, eqs: Eqs = ()) -> None:
        """Remove a kept filter that has no owners left."""
        if eqs:
            eqs = tuple([(a, (bool, v) if v.__class__ is bool else v) for a, v in eqs])
        entry = self._entries.get((f, eqs))
        if entry is not None and not entry.owners:
            self._drop_entry(entry)

    def purge_entry(self, entry: Entry) -> None:
        """`purge` through a kept handle of an indexed entry."""
        if not entry.owners:
            self._drop_entry(entry)

    def _drop_entry(self, entry: Entry) -> None:
        entry.indexed = False
        del self._entries[entry.key]
        for clause in entry.clauses:
            self._forget(clause)
            if _impure(clause):
                self._impure -= 1
            access = clause.access
            if access is not None and access[0] == "eqs" and access[3] is None:
                # an auxiliary profile's usual shape, inline: this runs on every completed match
                table = self._schemas[access[1]]
                bucket = table[access[2]]
                plain = bucket.plain
                del plain[clause]
                if not plain and not bucket.ranges:
                    del table[access[2]]
                    if not table:
                        del self._schemas[access[1]]
            else:
                self._remove_clause(clause)

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
            if not plain:
                self._calm = 0
            return
        if plain and access[1] == self._memo_attrs:  # type: ignore[index]
            key = access[2]  # type: ignore[index]
            # a (bool, v) value is never memoized (True == 1, see `_memoizable`)
            if len(access[1]) == 1:  # type: ignore[index]
                if key.__class__ is not tuple:
                    memo.pop(key, None)
                    return
            else:
                for v in key:
                    if v.__class__ is tuple:
                        break
                else:
                    memo.pop(key, None)
                    return
        self._memo = None
        self._calm = 0

    @staticmethod
    def _split(f: Filter) -> list[list[Filter]]:
        if isinstance(f, Or) and len(f.items) <= _MAX_SPLIT:
            out: list[list[Filter]] = []
            for item in f.items:
                if isinstance(item, Or):
                    return [_conjuncts(f)]
                out.append(_conjuncts(item))
            return out
        return [_conjuncts(f)]

    def _insert_clause(
        self, entry: Entry, parts: list[Filter], eqs: Eqs, index: bool = True
    ) -> tuple | None:
        """Choose the clause's access predicates and index it; return a reusable plan (or None)."""
        # all equalities (the filter's own and those bound by the engine) form the access key
        eq: dict[str, Any] = {}
        used: set[int] = set()
        conflict = False
        for a, k in eqs:
            if a in eq and eq[a] != k:
                conflict = True
            eq[a] = k
        for i, p in enumerate(parts):
            if isinstance(p, Cmp) and p.op == "=":
                k = norm(p.value)
                if p.attr in eq and eq[p.attr] != k:
                    conflict = True
                eq[p.attr] = k
                used.add(i)
        if conflict:  # a = 1 and a = 2: can never match; keep it scanned so it stays correct
            eq, used = {}, set()
        access: tuple | None = None
        thr = None
        if eq:
            schema = tuple(sorted(eq))
            values = eq[schema[0]] if len(schema) == 1 else tuple(eq[a] for a in schema)
            rng = next((i for i, p in enumerate(parts) if i not in used and _is_range(p)), None)
            if rng is not None:
                p = parts[rng]
                used.add(rng)
                access = ("eqs", schema, values, (p.attr, p.op, _kind(p.value)))
                thr = p.value
            else:
                access = ("eqs", schema, values, None)
        else:
            best, best_rank = None, None
            for i, p in enumerate(parts):
                r = _rank(p)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is not None:
                access = self._access_of(parts[best])
                used.add(best)
        rest = [p for i, p in enumerate(parts) if i not in used]
        if conflict:
            rest = list(parts) + [Cmp(a, "=", k[1] if isinstance(k, tuple) else k) for a, k in eqs]
        check = None
        if rest:
            check = compile_filter(rest[0] if len(rest) == 1 else And(tuple(rest)))
            if check.__name__ == "_always":
                check = None
        clause = Clause(entry, check, access, thr)
        entry.clauses.append(clause)
        if index:
            self._place(clause)
        if conflict or (
            eqs and any(isinstance(p, Cmp) and p.op == "=" and p.attr in dict(eqs) for p in parts)
        ):
            return None
        if access is not None and access[0] == "eqs":
            positions = {a: j for j, (a, _) in enumerate(eqs)}
            sources = tuple(
                (True, positions[a]) if a in positions else (False, eq[a]) for a in access[1]
            )
            return ("eqs", access[1], sources, access[3], thr, check)
        if eqs:
            return None
        return ("static", access, thr, check)

    def _from_plan(self, entry: Entry, plan: tuple, eqs: Eqs, index: bool = True) -> None:
        """Insert a clause whose indexing was planned before for the same filter and bound attributes."""
        if plan[0] == "static":
            _, access, thr, check = plan
        else:
            _, schema, sources, rng, thr, check = plan
            vals = tuple(eqs[v][1] if bound else v for bound, v in sources)
            access = ("eqs", schema, vals[0] if len(vals) == 1 else vals, rng)
        clause = Clause(entry, check, access, thr)
        entry.clauses.append(clause)
        if index:
            self._place(clause)

    def _place(self, clause: Clause) -> None:
        """Put an entry's clause into the index (under its access predicate)."""
        access = clause.access
        self._forget(clause)
        if _impure(clause):
            self._impure += 1
        if access is None:
            self._scan[clause] = None
        elif access[0] == "eqs":
            table = self._schemas.get(access[1])
            if table is None:
                table = self._schemas[access[1]] = {}
            bucket = table.get(access[2])
            if bucket is None:
                bucket = table[access[2]] = _Bucket()
            if access[3] is None:
                bucket.plain[clause] = None
            else:
                rng = bucket.ranges.get(access[3])
                if rng is None:
                    rng = bucket.ranges[access[3]] = _Range(*access[3])
                rng.add(clause)
        elif access[0] == "in":
            for k in dict.fromkeys(access[2]):
                bucket = self._schemas.setdefault((access[1],), {}).get(k)
                if bucket is None:
                    bucket = self._schemas[(access[1],)][k] = _Bucket()
                bucket.plain[clause] = None
        else:
            node = self._node_for(access, create=True)
            assert node is not None
            node.clauses[clause] = None

    @staticmethod
    def _access_of(p: Filter) -> tuple:
        if isinstance(p, In):
            return ("in", p.attr, tuple(norm(v) for v in p.values))
        if isinstance(p, StartsWith):
            return ("prefix", p.attr, p.prefix)
        if isinstance(p, Between):
            return ("between", p.attr, p.low, p.high)
        if isinstance(p, Exists):
            return ("exists", p.attr)
        assert isinstance(p, Cmp)
        return ("range", p.attr, p.op, p.value)

    def _node_for(self, key: tuple, create: bool) -> _Node | None:
        kind, attr = key[0], key[1]
        ix = self._idx.get(attr)
        if ix is None:
            if not create:
                return None
            ix = self._idx[attr] = _AttrIndex()
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
            ix.ranges.setdefault((op, _kind(value)), SortedList()).add((value, nid))
        else:
            low, high = key[2], key[3]
            node = _Node(high)
            ix.between.setdefault(_kind(low), SortedList()).add((low, nid))
        ix.nodes[nid] = node
        return node

    def _remove_clause(self, clause: Clause) -> None:
        access = clause.access
        if access is None:
            del self._scan[clause]
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
        self, clause: Clause, schema: tuple[str, ...], values: Any, rng: tuple | None
    ) -> None:
        """Take `clause` out of one equality bucket (its range `rng`, or its plain set)."""
        table = self._schemas[schema]
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
                del self._schemas[schema]

    def _drop_node(self, key: tuple) -> None:
        kind, attr = key[0], key[1]
        ix = self._idx[attr]
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
            self._range_ids.pop(attr, None)

    # ------------------------------------------------------------------ match
    def match(self, attrs: dict[str, Any]) -> list[Entry]:
        """Every stored filter that `attrs` satisfies (each once). The list is shared: do not change it."""
        memo = self._memo
        if memo is None:
            self._calm += 1
            if self._calm < _CALM or self._impure:
                return self._match(attrs)
            memo = self._start_memo()
        names = self._memo_attrs
        n = len(names)  # spelled out for the usual sizes: 3x faster than tuple(map(...))
        if n == 1:
            key = attrs.get(names[0])
        elif n == 2:
            key = (attrs.get(names[0]), attrs.get(names[1]))
        elif n == 3:
            key = (attrs.get(names[0]), attrs.get(names[1]), attrs.get(names[2]))
        else:
            key = tuple([attrs.get(a) for a in names])
        out = memo.get(key)
        if out is None:
            out = self._memo_value(attrs)
            if len(memo) < _MEMO_MAX and _memoizable(key, n == 1):
                memo[key] = out
        cls = out.__class__
        if cls is list:
            return out  # type: ignore[return-value]
        if cls is _Range:  # `_Range.hits`, inline: the plain threshold filter's whole match
            v = attrs.get(out.attr)  # type: ignore[union-attr]
            if v is None or v.__class__ not in out.classes or out.big is not None:  # type: ignore[union-attr]
                return out.hits(attrs)  # type: ignore[union-attr]
            k = out.cut(out.keys, v)  # type: ignore[union-attr]
            return out.ents[:k] if out.prefix else out.ents[k:]  # type: ignore[union-attr]
        return out(attrs)  # type: ignore[operator]

    def _start_memo(self) -> dict[Any, Memo]:
        names: dict[str, None] = {}
        for schema in self._schemas:
            names.update(dict.fromkeys(schema))
        self._memo_attrs = tuple(sorted(names)) or ("",)
        self._memo = {}
        return self._memo

    def _memo_value(self, attrs: dict[str, Any]) -> Memo:
        """What the memo keeps for the equality values of `attrs`: the matching entries, or, when
        those values reach ranges, how to match the rest (the ranges' thresholds decide)."""
        buckets = self._buckets(attrs)
        if not any(b.ranges for b in buckets):
            return self._match(attrs)
        parts: list[list[Entry] | _Range] = []
        for b in buckets:
            if b.plain:
                parts.append([c.entry for c in b.plain])
            parts.extend(b.ranges.values())
        for part in parts:
            clauses = part if isinstance(part, list) else part.ents
            if part.__class__ is not list and part.big is not None:  # type: ignore[union-attr]
                clauses = [c.entry for c in part.big]  # type: ignore[union-attr]
            if any(len(e.clauses) > 1 for e in clauses):  # an entry may match twice: dedup
                return self._match
        if len(parts) == 1 and isinstance(parts[0], _Range):
            return parts[0]  # `match` runs its `hits`
        return _Parts(tuple(parts)).hits

    def _buckets(self, attrs: dict[str, Any]) -> list[_Bucket]:
        """The equality buckets that `attrs` reaches, one per schema at most (in schema order)."""
        out: list[_Bucket] = []
        for schema, table in self._schemas.items():
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

    def _match(self, attrs: dict[str, Any]) -> list[Entry]:
        cands: list[Clause] = []
        for bucket in self._buckets(attrs):
            bucket.collect(attrs, cands)
        idx = self._idx
        if idx:
            for attr, ix in idx.items():
                v = attrs.get(attr)
                if v is not None:
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


def _impure(clause: Clause) -> bool:
    """Whether the clause's match depends on more than the values of its equality attributes."""
    access = clause.access
    return clause.check is not None or access is None or access[0] not in ("eqs", "in")


def _memoizable(key: Any, single: bool) -> bool:
    """A key that no other key of different match result equals: `True == 1 == 1.0` as dict keys,
    but the pool tells booleans from numbers, and NaN equals nothing."""
    for v in (key,) if single else key:
        if v.__class__ is not str and v is not None and (v == 0 or v == 1 or v != v):
            return False
    return True


def owners_by_profile(entries: list[Entry]) -> list[tuple[int, list[int]]]:
    """Owners `(profile index, leaf)` of matched entries as (index, sorted leaves), in index order.

    Both engines hand an event to each profile once, with every leaf it matched, in profile
    order (the order notifications of one event come out in).
    """
    if len(entries) == 1:  # one filter (a closing event waited for by many): sort its owners
        owners = sorted(entries[0].owners)
        out = []
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
        for idx, leaf in entry.owners:
            lst = hits.get(idx)
            if lst is None:
                hits[idx] = [leaf]
            elif leaf not in lst:
                lst.append(leaf)
    out = []
    for idx in sorted(hits):
        leaves = hits[idx]
        if len(leaves) > 1:
            leaves.sort()
        out.append((idx, leaves))
    return out
