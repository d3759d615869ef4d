"""A composite expression compiled into leaves, nodes and mask-indexed tables.

A partial match (PM) is described by the bit mask of its bound positive
leaves. Everything the engine asks about a PM — which leaves it waits for,
which negations are active, whether it is complete, which where-conjuncts a
new binding makes checkable — depends only on that mask, so it is computed
once per mask and cached.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiles.ast import (
    All,
    AnyOf,
    Arith,
    Clock,
    Cond,
    Lit,
    Profile,
    Ref,
    Seq,
    WAnd,
    WCmp,
    WNot,
    WOr,
    conjuncts,
    is_filter,
    refs_of,
)

_NUM = (int, float)

# one object per distinct leaf filter in this process (see `Pattern.compile`); emptied when it
# grows past a bound, which only costs the sharing
_FILTERS: dict[Any, Any] = {}
_FILTERS_MAX = 200_000


def _one_filter(f: Any) -> Any:
    got = _FILTERS.get(f)
    if got is None:
        if len(_FILTERS) >= _FILTERS_MAX:
            _FILTERS.clear()
        got = _FILTERS[f] = f
    return got


# Mask tables depend only on a pattern's shape (node kinds, negations, windows),
# not on its filters: profiles of one shape share them.
Transitions = dict[int, tuple[int, tuple[int, ...] | None]]
_SHAPE_TABLES: dict[
    tuple[Any, ...], tuple[dict[int, MaskInfo], dict[int, int], dict[int, Transitions]]
] = {}


@dataclass(slots=True)
class Leaf:
    idx: int
    name: str
    filter: Any  # a Filter, or a Clock
    negated: bool
    node: int  # parent node id
    clock: Clock | None = None


@dataclass(slots=True)
class Node:
    idx: int
    kind: str  # "seq" | "all" | "any"
    children: list[tuple[str, int]]  # ("leaf", i) | ("node", j), written order
    within: float | None
    parent: int | None
    leaves: int = 0  # mask of positive leaves in the subtree


@dataclass(slots=True)
class Conj:
    """One top-level `and` part of the where clause."""

    refs: frozenset[str]
    fn: Callable[[dict[str, dict[str, Any]]], bool]
    mask: int  # positive leaves it mentions
    neg: frozenset[int]  # negated leaves it mentions


@dataclass
class MaskInfo:
    enabled: list[int]  # positive leaves that may bind next, written order
    enabled_set: frozenset[int]
    negations_set: frozenset[int]
    any_groups: dict[
        int, int
    ]  # enabled leaf -> id of the innermost any-node alternative set it belongs to
    negations: list[int]  # negated leaves active in this state
    complete: bool
    started_nodes: list[int]  # nested nodes with a window that are started but incomplete
    all_bound: list[int]  # bound leaf children of incomplete all-nodes (replaceable under `last`)


# ------------------------------------------------------------------ where


def _term(t: Any) -> Callable[[dict[str, dict[str, Any]]], Any]:
    if isinstance(t, Lit):
        v = t.value
        return lambda b: v
    if isinstance(t, Ref):
        name, attr = t.name, t.attr

        def ref(b: dict[str, dict[str, Any]]) -> Any:
            a = b.get(name)
            return None if a is None else a.get(attr)

        return ref
    if isinstance(t, Arith):
        left, right, op = _term(t.left), _term(t.right), t.op

        def arith(b: dict[str, dict[str, Any]]) -> Any:
            x, y = left(b), right(b)
            if x.__class__ not in _NUM or y.__class__ not in _NUM:
                return None
            if op == "+":
                r = x + y
            elif op == "-":
                r = x - y
            elif op == "*":
                r = x * y
            elif y == 0:
                return None
            else:
                r = x / y
            return r if math.isfinite(r) else None

        return arith
    raise TypeError(t)


def compile_cond(c: Cond) -> Callable[[dict[str, dict[str, Any]]], bool]:
    from filters.compile import compare

    if isinstance(c, WCmp):
        left, right, op = _term(c.left), _term(c.right), c.op
        return lambda b: compare(left(b), op, right(b))
    if isinstance(c, WAnd):
        fns = [compile_cond(i) for i in c.items]
        return lambda b: all(f(b) for f in fns)
    if isinstance(c, WOr):
        fns = [compile_cond(i) for i in c.items]
        return lambda b: any(f(b) for f in fns)
    if isinstance(c, WNot):
        fn = compile_cond(c.item)
        return lambda b: not fn(b)
    raise TypeError(c)


def where_equalities(cond: Cond | None) -> list[tuple[str, str, str, str]]:
    """`x.a = y.b` conjuncts as (x, a, y, b): they become indexed predicates of auxiliary profiles."""
    out = []
    for c in conjuncts(cond):
        if (
            isinstance(c, WCmp)
            and c.op == "="
            and isinstance(c.left, Ref)
            and isinstance(c.right, Ref)
        ):
            if c.left.name != c.right.name:
                out.append((c.left.name, c.left.attr, c.right.name, c.right.attr))
    return out


# ---------------------------------------------------------------- pattern


@dataclass
class Pattern:
    profile: Profile
    leaves: list[Leaf] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    conjs: list[Conj] = field(default_factory=list)
    leading: list[int] = field(default_factory=list)  # leading negated leaves of the root seq
    trailing: list[int] = field(default_factory=list)  # trailing negated leaves of the root seq
    by_name: dict[str, int] = field(default_factory=dict)
    eq_bindings: dict[int, list[tuple[str, int, str]]] = field(default_factory=dict)
    _masks: dict[int, MaskInfo] = field(default_factory=dict)
    _cleared: dict[int, int] = field(default_factory=dict)
    _trans: dict[int, Transitions] = field(default_factory=dict)
    has_any: bool = False
    _bind_conjs: dict[tuple[int, int], list[Conj]] = field(default_factory=dict)

    @property
    def transition_memo(self) -> dict[int, Transitions]:
        """The transitions memo by mask, shared by the patterns of one shape: the eager runtime
        reads it on its hot path (`CompositeTables.trans`)."""
        return self._trans

    @property
    def shape_id(self) -> int:
        """Equal for two patterns exactly when they share their memo tables (one shape)."""
        return id(self._masks)

    @classmethod
    def build(cls, profile: Profile) -> Pattern:
        """The profile's pattern, compiled once per `Profile` object (kept on it): engines,
        partitions and restores over the same profiles share it. A pattern is not changed after
        it is compiled except for its memo tables, which are pure functions of a mask."""
        pat = profile.compiled
        if pat.__class__ is cls:
            return pat  # type: ignore[return-value]  # checked just above
        pat = cls.compile(profile)
        object.__setattr__(profile, "compiled", pat)
        return pat

    @classmethod
    def compile(cls, profile: Profile) -> Pattern:
        """A new pattern of `profile`: equal leaf filters of all profiles as one object, so the
        pool's dict lookups compare them by identity instead of walking two trees."""
        p = cls(profile)
        expr = profile.expr
        if is_filter(expr):
            raise ValueError("a bare filter has no pattern")
        p._add_node(expr, None)
        root = p.nodes[0]
        if root.kind == "seq":
            kids = root.children
            for kind, i in kids:
                if kind == "leaf" and p.leaves[i].negated:
                    p.leading.append(i)
                else:
                    break
            for kind, i in reversed(kids):
                if kind == "leaf" and p.leaves[i].negated:
                    p.trailing.append(i)
                else:
                    break
            p.trailing.reverse()
        shape = (
            tuple(
                (
                    n.kind,
                    n.within is not None,
                    n.parent,
                    tuple((k, j, k == "leaf" and p.leaves[j].negated) for k, j in n.children),
                )
                for n in p.nodes
            ),
            tuple(p.leading),
            tuple(p.trailing),
        )
        p._masks, p._cleared, p._trans = _SHAPE_TABLES.setdefault(shape, ({}, {}, {}))
        p.has_any = any(n.kind == "any" for n in p.nodes)
        for c in conjuncts(profile.where):
            refs = frozenset(refs_of(c))
            mask = 0
            neg = set()
            for r in refs:
                li = p.by_name[r]
                if p.leaves[li].negated:
                    neg.add(li)
                else:
                    mask |= 1 << li
            p.conjs.append(Conj(refs, compile_cond(c), mask, frozenset(neg)))
        for x, xa, y, ya in where_equalities(profile.where):
            for (a, aa), (b, ba) in (((x, xa), (y, ya)), ((y, ya), (x, xa))):
                la, lb = p.by_name[a], p.by_name[b]
                if not p.leaves[lb].negated:
                    p.eq_bindings.setdefault(la, []).append((aa, lb, ba))
        return p

    def _add_node(self, expr: Any, parent: int | None) -> int:
        kind = {Seq: "seq", All: "all", AnyOf: "any"}[type(expr)]
        nid = len(self.nodes)
        node = Node(nid, kind, [], expr.within, parent)
        self.nodes.append(node)
        for comp in expr.components:
            if isinstance(comp.expr, (Seq, All, AnyOf)):
                child = self._add_node(comp.expr, nid)
                node.children.append(("node", child))
                node.leaves |= self.nodes[child].leaves
            else:
                li = len(self.leaves)
                clock = comp.expr if isinstance(comp.expr, Clock) else None
                f = comp.expr if clock is not None else _one_filter(comp.expr)
                self.leaves.append(Leaf(li, comp.name, f, comp.negated, nid, clock))
                self.by_name[comp.name] = li
                node.children.append(("leaf", li))
                if not comp.negated:
                    node.leaves |= 1 << li
        return nid

    # ----------------------------------------------------------- mask tables
    def info(self, mask: int) -> MaskInfo:
        mi = self._masks.get(mask)
        if mi is None:
            mi = self._masks[mask] = self._compute(mask)
        return mi

    def transitions(self, mask: int) -> Transitions:
        """Enabled leaf -> (next mask, the complete match's leaves in written order, or None).

        The engine's fast path (no where, negations or any) in one lookup; shared by shape.
        """
        tr = self._trans.get(mask)
        if tr is None:
            tr = {}
            for i in self.info(mask).enabled:
                nm = mask | 1 << i
                done = tuple(j for j in range(len(self.leaves)) if nm >> j & 1)
                tr[i] = (nm, done if self.info(nm).complete else None)
            self._trans[mask] = tr
        return tr

    def _complete(self, kind: str, i: int, mask: int) -> bool:
        if kind == "leaf":
            return bool(mask >> i & 1)
        node = self.nodes[i]
        pos = [(k, j) for k, j in node.children if not (k == "leaf" and self.leaves[j].negated)]
        if node.kind == "any":
            return any(self._complete(k, j, mask) for k, j in pos)
        return all(self._complete(k, j, mask) for k, j in pos)

    def _started(self, kind: str, i: int, mask: int) -> bool:
        if kind == "leaf":
            return bool(mask >> i & 1)
        return bool(mask & self.nodes[i].leaves)

    def _compute(self, mask: int) -> MaskInfo:
        mi = MaskInfo([], frozenset(), frozenset(), {}, [], self._complete("node", 0, mask), [], [])
        self._walk(0, mask, mi, any_group=-1)
        for node in self.nodes[1:]:
            if (
                node.within is not None
                and self._started("node", node.idx, mask)
                and not self._complete("node", node.idx, mask)
            ):
                mi.started_nodes.append(node.idx)
        if mi.complete and self.trailing:
            mi.negations = list(self.trailing)
        mi.enabled_set = frozenset(mi.enabled)
        mi.negations_set = frozenset(mi.negations)
        return mi

    def _walk(self, nid: int, mask: int, mi: MaskInfo, any_group: int) -> None:
        node = self.nodes[nid]
        if self._complete("node", nid, mask):
            return
        if node.kind == "seq":
            self._walk_seq(nid, mask, mi, any_group)
        elif node.kind == "all":
            self._walk_all(nid, mask, mi, any_group)
        else:  # any: every alternative progresses; the first to complete wins
            for kind, j in node.children:
                self._enable(kind, j, mask, mi, nid if kind == "leaf" else any_group)

    def _walk_seq(self, nid: int, mask: int, mi: MaskInfo, any_group: int) -> None:
        """A seq enables its first incomplete positive child; a negation between two positives
        is active once the one before it is complete and the one after it has not started."""
        children = self.nodes[nid].children
        prev_done = True
        for pos, (kind, j) in enumerate(children):
            if kind == "leaf" and self.leaves[j].negated:
                if nid == 0 and (j in self.leading or j in self.trailing):
                    continue
                nxt = next(
                    (
                        (k, jj)
                        for k, jj in children[pos + 1 :]
                        if not (k == "leaf" and self.leaves[jj].negated)
                    ),
                    None,
                )
                if prev_done and nxt is not None and not self._started(nxt[0], nxt[1], mask):
                    mi.negations.append(j)
                continue
            if self._complete(kind, j, mask):
                prev_done = True
                continue
            self._enable(kind, j, mask, mi, any_group)
            break

    def _walk_all(self, nid: int, mask: int, mi: MaskInfo, any_group: int) -> None:
        """An all enables every incomplete child; its negations are active once it started."""
        node = self.nodes[nid]
        started = bool(mask & node.leaves)
        for kind, j in node.children:
            if kind == "leaf" and self.leaves[j].negated:
                if started:
                    mi.negations.append(j)
                continue
            if self._complete(kind, j, mask):
                if kind == "leaf":
                    mi.all_bound.append(j)
                continue
            self._enable(kind, j, mask, mi, any_group)

    def _enable(self, kind: str, j: int, mask: int, mi: MaskInfo, any_group: int) -> None:
        if kind == "leaf":
            if not mask >> j & 1:
                mi.enabled.append(j)
                mi.any_groups[j] = any_group
        else:
            self._walk(j, mask, mi, any_group)

    def bind_conjs(self, mask: int, leaf: int) -> list[Conj]:
        """Positive-only where-conjuncts that become checkable when `leaf` binds in state `mask`."""
        key = (mask, leaf)
        out = self._bind_conjs.get(key)
        if out is None:
            new = mask | 1 << leaf
            out = [
                c for c in self.conjs if not c.neg and c.mask >> leaf & 1 and c.mask & new == c.mask
            ]
            self._bind_conjs[key] = out
        return out

    def clear_losing_alternatives(self, mask: int) -> int:
        """After a binding, drop bindings of alternatives of any-nodes that just completed."""
        if not self.has_any:
            return mask
        out = self._cleared.get(mask)
        if out is None:
            out = self._cleared[mask] = self._clear(mask)
        return out

    def _clear(self, mask: int) -> int:
        for node in self.nodes:
            if node.kind != "any" or not mask & node.leaves:
                continue
            winners = [(k, j) for k, j in node.children if self._complete(k, j, mask)]
            if winners:
                keep = 0
                k, j = winners[0]
                keep = (1 << j) if k == "leaf" else self.nodes[j].leaves
                mask &= ~(node.leaves & ~keep)
        return mask

    def start_leaves(self) -> list[int]:
        return self.info(0).enabled

    def node_of_leaves(self, nid: int) -> int:
        return self.nodes[nid].leaves
