"""The two-step engine's reading of a composite pattern: a tree of nodes and leaves.

A partial match of the two-step engine is a list of bindings, one slot per leaf
(`Binds`); everything here answers questions about such a list from the tree
alone: is a node complete, which leaves may bind next, which negations are
active, does a `where` conjunct hold. No runtime state, no timers.

Written from docs/language.md and docs/semantics.md only (not from filters/pattern.py,
the single-step engine's mask tables), so that the differential tests compare two
independent readings.
"""

from __future__ import annotations

from typing import Any, Literal, final

from filters.compile import compare
from profiles.ast import (
    All,
    AnyOf,
    Arith,
    Clock,
    Cond,
    Expr,
    Lit,
    Profile,
    Ref,
    Seq,
    Term,
    WAnd,
    WCmp,
    WNot,
    WOr,
    conjuncts,
    refs_of,
)
from profiles.events import Event

B = tuple[int, Event]  # a bound event: (arrival number, event)
Binds = list[B | None]  # one slot per leaf of the pattern, None while unbound
Env = dict[str, dict[str, Any]]  # component name -> the bound event's attributes
ConjAt = tuple[Cond, tuple[int, ...]]  # a where conjunct and the positive leaves it names
_INF = float("inf")


# ------------------------------------------------------------------ where
def term_value(t: Term, env: Env) -> Any:
    """Value of a where term; None when a reference is absent or the arithmetic is undefined."""
    if isinstance(t, Ref):
        attrs = env.get(t.name)
        return None if attrs is None else attrs.get(t.attr)
    if isinstance(t, Lit):
        return t.value
    assert isinstance(t, Arith)
    x, y = term_value(t.left, env), term_value(t.right, env)
    if x.__class__ not in (int, float) or y.__class__ not in (int, float):
        return None
    if t.op == "+":
        return x + y
    if t.op == "-":
        return x - y
    if t.op == "*":
        return x * y
    return None if y == 0 else x / y


def holds(c: Cond, env: Env) -> bool:
    """Does where condition `c` hold for the bound attributes `env`?"""
    if isinstance(c, WCmp):
        return compare(term_value(c.left, env), c.op, term_value(c.right, env))
    if isinstance(c, WAnd):
        return all(holds(i, env) for i in c.items)
    if isinstance(c, WOr):
        return any(holds(i, env) for i in c.items)
    assert isinstance(c, WNot)
    return not holds(c.item, env)


# ------------------------------------------------------------- the tree
@final
class Leaf:
    """A primitive component (filter or clock), positive or negated."""

    __slots__ = ("idx", "name", "filter", "clock", "negated", "parent", "anys", "path")
    is_leaf: Literal[True] = True  # tells a Leaf from a Node as cheaply as a class test

    def __init__(self, idx: int, name: str, expr: Any, negated: bool, parent: Node) -> None:
        self.idx = idx
        self.name = name
        self.clock: Clock | None = expr if isinstance(expr, Clock) else None
        self.filter: Any = None if self.clock is not None else expr  # a Filter
        self.negated = negated
        self.parent = parent
        self.anys: list[Node] = []  # any-ancestors, innermost first
        self.path: list[Node | Leaf] = []  # ancestors from the root down, then the leaf itself


@final
class Node:
    """A composite (seq/all/any); `pos` holds its positive children in written order."""

    __slots__ = ("nid", "kind", "children", "pos", "within", "parent", "leaves", "negs")
    is_leaf: Literal[False] = False

    def __init__(self, nid: int, kind: str, within: float | None, parent: Node | None) -> None:
        self.nid = nid
        self.kind = kind
        self.within = within
        self.parent = parent
        self.children: list[Node | Leaf] = []
        self.pos: list[Node | Leaf] = []
        self.leaves: list[int] = []  # positive leaves under this node
        # (negated leaf, previous positive, next positive)
        self.negs: list[tuple[Leaf, Node | Leaf | None, Node | Leaf | None]] = []


def node_done(n: Node | Leaf, binds: Binds) -> bool:
    """Is `n` complete under `binds`?"""
    if n.is_leaf:
        return binds[n.idx] is not None
    if n.kind == "any":
        return any(node_done(c, binds) for c in n.pos)
    return all(node_done(c, binds) for c in n.pos)


def node_started(n: Node | Leaf, binds: Binds) -> bool:
    if n.is_leaf:
        return binds[n.idx] is not None
    return any(binds[i] is not None for i in n.leaves)


def collect_enabled(n: Node | Leaf, binds: Binds, out: list[int]) -> None:
    """Leaves the PM waits for: first incomplete child of a seq, every incomplete child of an all,
    every alternative of an incomplete any."""
    if n.is_leaf:
        if binds[n.idx] is None:
            out.append(n.idx)
        return
    kind = n.kind
    if kind == "seq":
        for c in n.pos:
            if not node_done(c, binds):
                collect_enabled(c, binds, out)
                return
    elif kind == "all":
        for c in n.pos:
            if not node_done(c, binds):
                collect_enabled(c, binds, out)
    elif not node_done(n, binds):
        for c in n.pos:
            collect_enabled(c, binds, out)


def _kind_of(expr: Expr) -> str:
    if isinstance(expr, Seq):
        return "seq"
    if isinstance(expr, All):
        return "all"
    assert isinstance(expr, AnyOf)
    return "any"


class TreePattern:
    """A composite profile compiled to a tree of nodes and leaves, plus its where conjuncts."""

    def __init__(self, profile: Profile) -> None:
        self.leaves: list[Leaf] = []
        self.nodes: list[Node] = []
        self.root = self._build(profile.expr, None, profile.within)
        leaves = self.leaves
        self.pos = [lf.idx for lf in leaves if not lf.negated]
        self.neg = {lf.idx for lf in leaves if lf.negated}
        self.by_name = {lf.name: lf.idx for lf in leaves}
        starts: list[int] = []
        collect_enabled(self.root, [None] * len(leaves), starts)
        self.starts = frozenset(starts)
        root = self.root
        self.leading: list[int] = []
        self.trailing: list[int] = []
        if root.kind == "seq":
            self.leading = self._negated_run(root.children)
            self.trailing = self._negated_run(root.children[::-1])
        self.flat = root.kind != "any" and len(self.nodes) == 1 and not self.neg
        # nested nodes with a window of their own, and that window
        self.timed = [(n, n.within) for n in self.nodes if n.within is not None and n is not root]
        # where: conjuncts over positives are checked when their last leaf binds; those with a
        # negated leaf decide whether that negation kills; those that can never be fully bound
        # (two alternatives of one any) are evaluated at completion
        self.pos_conj: dict[int, list[ConjAt]] = {}
        self.neg_conj: dict[int, list[ConjAt]] = {}
        # at completion every conjunct is evaluated on the final match, unbound references absent
        self.late_conj: list[tuple[Cond, tuple[int, ...], bool]] = []
        self.const_conj: list[Cond] = []
        for c in conjuncts(profile.where):
            self._add_conjunct(c)

    @staticmethod
    def _negated_run(children: list[Node | Leaf]) -> list[int]:
        """The negated leaves at the start of `children`, up to the first positive."""
        out: list[int] = []
        for c in children:
            if not (c.is_leaf and c.negated):
                break
            out.append(c.idx)
        return out

    def _add_conjunct(self, c: Cond) -> None:
        idxs = sorted(self.by_name[n] for n in refs_of(c))
        negs = [i for i in idxs if i in self.neg]
        poss = tuple(i for i in idxs if i not in self.neg)
        if negs:
            for x in negs:
                self.neg_conj.setdefault(x, []).append((c, poss))
        elif not poss:
            self.const_conj.append(c)
        else:
            excl = any(self.exclusive(i, j) for i in poss for j in poss if i < j)
            self.late_conj.append((c, poss, excl))
            if not excl:
                for i in poss:
                    self.pos_conj.setdefault(i, []).append((c, poss))

    def _build(self, expr: Expr, parent: Node | None, within: float | None) -> Node:
        assert isinstance(expr, (Seq, All, AnyOf))
        node = Node(len(self.nodes), _kind_of(expr), within, parent)
        self.nodes.append(node)
        for comp in expr.components:
            e = comp.expr
            if isinstance(e, (Seq, All, AnyOf)):
                child: Node | Leaf = self._build(e, node, e.within)
            else:
                child = self._leaf(comp.name, e, comp.negated, node)
            node.children.append(child)
            if not (child.is_leaf and comp.negated):
                node.pos.append(child)
        for i, c in enumerate(node.children):
            if c.is_leaf and c.negated:
                prev = next((p for p in reversed(node.children[:i]) if p in node.pos), None)
                nxt = next((p for p in node.children[i + 1 :] if p in node.pos), None)
                node.negs.append((c, prev, nxt))
        return node

    def _leaf(self, name: str, expr: Any, negated: bool, node: Node) -> Leaf:
        leaf = Leaf(len(self.leaves), name, expr, negated, node)
        self.leaves.append(leaf)
        a: Node | None = node
        while a is not None:
            if a.kind == "any":
                leaf.anys.append(a)
            if not negated:
                a.leaves.append(leaf.idx)
            a = a.parent
        chain: list[Node | Leaf] = [leaf]
        a = node
        while a is not None:
            chain.append(a)
            a = a.parent
        leaf.path = chain[::-1]
        return leaf

    # ------------------------------------------------------------- queries
    def done(self, binds: Binds) -> bool:
        """Is the root complete? (A flat pattern of positive leaves needs no tree walk.)"""
        if self.flat:
            return None not in binds
        return node_done(self.root, binds)

    def enabled(self, binds: Binds) -> list[int]:
        if self.flat:
            if self.root.kind == "seq":
                return [binds.index(None)] if None in binds else []
            return [i for i, b in enumerate(binds) if b is None]
        out: list[int] = []
        collect_enabled(self.root, binds, out)
        return out

    def exclusive(self, i: int, j: int) -> bool:
        """Are leaves i and j in different alternatives of one any (never both bound)?"""
        pi, pj = self.leaves[i].path, self.leaves[j].path
        k = 0
        while k < len(pi) and k < len(pj) and pi[k] is pj[k]:
            k += 1
        lca = pi[k - 1]
        return not lca.is_leaf and lca.kind == "any"

    def alt_of(self, leaf: int) -> int | None:
        """The any node a leaf is a direct alternative of (None otherwise)."""
        parent = self.leaves[leaf].parent
        return parent.nid if parent.kind == "any" else None

    def drop_losers(self, binds: Binds, leaf: int) -> None:
        """`leaf` just bound: of every any it completed, unbind the other alternatives."""
        for a in self.leaves[leaf].anys:
            if node_done(a, binds):
                for alt in a.pos:
                    if alt.is_leaf:
                        if alt.idx != leaf:
                            binds[alt.idx] = None
                    elif leaf not in alt.leaves:
                        for i in alt.leaves:
                            binds[i] = None

    def active_negs(self, binds: Binds) -> list[int]:
        """Negated leaves (between in a seq, or in an all) active for a PM, in written order."""
        out: list[int] = []
        self._act(self.root, binds, out)
        out.sort()
        return out

    def _act(self, node: Node, binds: Binds, out: list[int]) -> None:
        if node.negs:
            if node.kind == "all":
                if node_started(node, binds) and not node_done(node, binds):
                    out.extend(x.idx for x, _, _ in node.negs)
            else:
                for x, prev, nxt in node.negs:
                    if prev is None:
                        continue  # leading: checked when a match completes
                    if nxt is None:
                        if node_done(node, binds):  # trailing: the PM waits for its deadline
                            out.append(x.idx)
                    elif node_done(prev, binds) and not node_started(nxt, binds):
                        out.append(x.idx)
        for c in node.pos:
            if not c.is_leaf:
                self._act(c, binds, out)

    # ------------------------------------------------- bindings and where
    def env(self, binds: Binds, extra: tuple[int, B] | None = None) -> Env:
        """The attributes of the bound events by component name (plus `extra` (leaf, event))."""
        leaves = self.leaves
        env = {leaves[i].name: b[1].attrs for i, b in enumerate(binds) if b is not None}
        if extra is not None:
            env[leaves[extra[0]].name] = extra[1][1].attrs
        return env

    def neg_verdict(self, x: int, xb: B, binds: Binds) -> bool | None:
        """Does negation event xb on leaf x satisfy its where conjuncts under `binds`?
        True: all hold; False: one fails; None: one still needs an unbound positive."""
        conj = self.neg_conj.get(x)
        if not conj:
            return True
        env = None
        undecided = False
        for c, poss in conj:
            if all(binds[i] is not None for i in poss):
                if env is None:
                    env = self.env(binds, (x, xb))
                if not holds(c, env):
                    return False
            else:
                undecided = True
        return None if undecided else True

    def may_open(self, i: int, b: B) -> bool:
        """nth: do the where conjuncts that name starting leaf i alone hold for b?"""
        env = None
        for c, poss in self.pos_conj.get(i, ()):
            if poss == (i,):
                if env is None:
                    env = {self.leaves[i].name: b[1].attrs}
                if not holds(c, env):
                    return False
        return True

    def order_key(self, binds: Binds) -> tuple[float, ...]:
        """Completions are reported in the order of their positive events' arrival numbers."""
        return tuple(b[0] if (b := binds[i]) is not None else _INF for i in self.pos)

    def events(self, binds: Binds) -> dict[str, Event]:
        """The bound positive events by component name (a notification's `events`)."""
        leaves = self.leaves
        return {leaves[i].name: b[1] for i in self.pos if (b := binds[i]) is not None}

    def replaceable(self, binds: Binds) -> set[int]:
        """select last: the newest bound leaf, and the bound leaf children of incomplete alls."""
        out: set[int] = set()
        bound = {i: b[0] for i in self.pos if (b := binds[i]) is not None}
        if bound:
            out.add(max(bound, key=bound.__getitem__))
        for n in self.nodes:
            if n.kind == "all" and not node_done(n, binds):
                for c in n.pos:
                    if c.is_leaf and binds[c.idx] is not None:
                        out.add(c.idx)
        return out

    def inside(self, x: int, at: int, binds: Binds) -> bool:
        """Does arrival number `at` lie in the scope of between-negation x for these bindings?
        In a seq: after the last event of the positive before x and before the first of the one
        after it (if bound); in an all: after the node's first event (and before its last, once
        the node is complete)."""
        leaf = self.leaves[x]
        node = leaf.parent

        def stamps(n: Node | Leaf) -> list[int]:
            idxs = [n.idx] if n.is_leaf else n.leaves
            return [b[0] for i in idxs if (b := binds[i]) is not None]

        if node.kind == "all":
            got = stamps(node)
            if not got or at < min(got):
                return False
            return not node_done(node, binds) or at < max(got)
        prev, nxt = next((p, q) for y, p, q in node.negs if y is leaf)
        if prev is None or nxt is None or not node_done(prev, binds) or at < max(stamps(prev)):
            return False
        after = stamps(nxt)
        return not after or at < min(after)
