"""The classic two-step engine: the baseline CompAS is measured against.

Step 1 filters every event against *all* component filters of every profile
(every leaf, positive and negated), which stay in the primitive pool for the
profile's whole life. Step 2 hands the matches to a separate composite pool:
per profile and partition it keeps *binding lists* (the events matched per
component inside the window; profiles without a window keep none, nothing
could prune them and events bind on arrival) and the partial matches (PMs),
and evaluates the composites. Nothing flows back into the primitive pool, so
an event that matches a component is evaluated for every profile that has
that component, whether or not a partial match waits for it: the cost the
single-step engine avoids.

Written from LANGUAGE.md and docs/semantics.md only (not from filters/engine.py)
so that the differential tests compare two independent readings.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable
from typing import Any
from zoneinfo import ZoneInfo

from filters.compile import compare, norm
from filters.notification import Notification
from filters.pool import PrimitivePool, owners_by_profile
from filters.temporal import TemporalPool, TimeDriven
from profiles.ast import (
    Absent,
    All,
    AnyOf,
    Arith,
    Clock,
    Cond,
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
    is_filter,
    refs_of,
)
from profiles.events import Event

_INF = float("inf")
B = tuple[int, Event]  # a bound event: (arrival number, event)


# ------------------------------------------------------------------ where
def _term(t: Term, env: dict[str, dict[str, Any]]) -> Any:
    """Value of a where term; None when a reference is absent or the arithmetic is undefined."""
    if isinstance(t, Ref):
        attrs = env.get(t.name)
        return None if attrs is None else attrs.get(t.attr)
    if isinstance(t, Lit):
        return t.value
    assert isinstance(t, Arith)
    x, y = _term(t.left, env), _term(t.right, env)
    if x.__class__ not in (int, float) or y.__class__ not in (int, float):
        return None
    if t.op == "+":
        return x + y
    if t.op == "-":
        return x - y
    if t.op == "*":
        return x * y
    return None if y == 0 else x / y


def _holds(c: Cond, env: dict[str, dict[str, Any]]) -> bool:
    if isinstance(c, WCmp):
        return compare(_term(c.left, env), c.op, _term(c.right, env))
    if isinstance(c, WAnd):
        return all(_holds(i, env) for i in c.items)
    if isinstance(c, WOr):
        return any(_holds(i, env) for i in c.items)
    assert isinstance(c, WNot)
    return not _holds(c.item, env)


# ------------------------------------------------------------- the pattern
class _Leaf:
    """A primitive component (filter or clock), positive or negated."""

    __slots__ = ("idx", "name", "filter", "clock", "negated", "parent", "anys", "path")

    def __init__(self, idx: int, name: str, expr: Any, negated: bool, parent: _Node) -> None:
        self.idx = idx
        self.name = name
        self.clock: Clock | None = expr if isinstance(expr, Clock) else None
        self.filter = None if self.clock is not None else expr
        self.negated = negated
        self.parent = parent
        self.anys: list[_Node] = []  # any-ancestors, innermost first
        self.path: list[Any] = []  # ancestors from the root down, then the leaf itself


class _Node:
    """A composite (seq/all/any); `pos` holds its positive children in written order."""

    __slots__ = ("nid", "kind", "children", "pos", "within", "parent", "leaves", "negs")

    def __init__(self, nid: int, kind: str, within: float | None, parent: _Node | None) -> None:
        self.nid = nid
        self.kind = kind
        self.within = within
        self.parent = parent
        self.children: list[_Node | _Leaf] = []
        self.pos: list[_Node | _Leaf] = []
        self.leaves: list[int] = []  # positive leaves under this node
        self.negs: list[tuple[_Leaf, Any, Any]] = []  # (negated leaf, previous, next positive)


def _done(n: _Node | _Leaf, binds: list) -> bool:
    """Is `n` complete under `binds`?"""
    if n.__class__ is _Leaf:
        return binds[n.idx] is not None  # type: ignore[union-attr]
    if n.kind == "any":  # type: ignore[union-attr]
        return any(_done(c, binds) for c in n.pos)  # type: ignore[union-attr]
    return all(_done(c, binds) for c in n.pos)  # type: ignore[union-attr]


def _started(n: _Node | _Leaf, binds: list) -> bool:
    if n.__class__ is _Leaf:
        return binds[n.idx] is not None  # type: ignore[union-attr]
    return any(binds[i] is not None for i in n.leaves)  # type: ignore[union-attr]


def _enabled(n: _Node | _Leaf, binds: list, out: list[int]) -> None:
    """Leaves the PM waits for: first incomplete child of a seq, every incomplete child of an all,
    every alternative of an incomplete any."""
    if n.__class__ is _Leaf:
        if binds[n.idx] is None:  # type: ignore[union-attr]
            out.append(n.idx)  # type: ignore[union-attr]
        return
    kind = n.kind  # type: ignore[union-attr]
    if kind == "seq":
        for c in n.pos:  # type: ignore[union-attr]
            if not _done(c, binds):
                _enabled(c, binds, out)
                return
    elif kind == "all":
        for c in n.pos:  # type: ignore[union-attr]
            if not _done(c, binds):
                _enabled(c, binds, out)
    elif not _done(n, binds):
        for c in n.pos:  # type: ignore[union-attr]
            _enabled(c, binds, out)


class _Pattern:
    """A composite profile compiled to a tree of nodes and leaves, plus its where conjuncts."""

    def __init__(self, profile: Profile) -> None:
        self.leaves: list[_Leaf] = []
        self.nodes: list[_Node] = []
        self.root = self._build(profile.expr, None, profile.within)
        leaves = self.leaves
        self.pos = [lf.idx for lf in leaves if not lf.negated]
        self.neg = {lf.idx for lf in leaves if lf.negated}
        self.by_name = {lf.name: lf.idx for lf in leaves}
        starts: list[int] = []
        _enabled(self.root, [None] * len(leaves), starts)
        self.starts = frozenset(starts)
        root = self.root
        self.leading: list[int] = []
        self.trailing: list[int] = []
        if root.kind == "seq":
            kids = root.children
            for c in kids:
                if c.__class__ is _Leaf and c.negated:  # type: ignore[union-attr]
                    self.leading.append(c.idx)  # type: ignore[union-attr]
                else:
                    break
            for c in reversed(kids):
                if c.__class__ is _Leaf and c.negated:  # type: ignore[union-attr]
                    self.trailing.append(c.idx)  # type: ignore[union-attr]
                else:
                    break
        self.flat = root.kind != "any" and len(self.nodes) == 1 and not self.neg
        self.timed = [n for n in self.nodes if n.within is not None and n is not root]
        # where: conjuncts over positives are checked when their last leaf binds; those with a
        # negated leaf decide whether that negation kills; those that can never be fully bound
        # (two alternatives of one any) are evaluated at completion
        self.pos_conj: dict[int, list[tuple[Cond, tuple[int, ...]]]] = {}
        self.neg_conj: dict[int, list[tuple[Cond, tuple[int, ...]]]] = {}
        # at completion every conjunct is evaluated on the final match, unbound references absent
        self.late_conj: list[tuple[Cond, tuple[int, ...], bool]] = []
        self.const_conj: list[Cond] = []
        for c in conjuncts(profile.where):
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

    def _build(self, expr: Any, parent: _Node | None, within: float | None) -> _Node:
        kind = "seq" if isinstance(expr, Seq) else "all" if isinstance(expr, All) else "any"
        assert isinstance(expr, (Seq, All, AnyOf))
        node = _Node(len(self.nodes), kind, within, parent)
        self.nodes.append(node)
        for comp in expr.components:
            e = comp.expr
            if isinstance(e, (Seq, All, AnyOf)):
                child: _Node | _Leaf = self._build(e, node, e.within)
            else:
                child = _Leaf(len(self.leaves), comp.name, e, comp.negated, node)
                self.leaves.append(child)
                a: _Node | None = node
                while a is not None:
                    if a.kind == "any":
                        child.anys.append(a)
                    if not comp.negated:
                        a.leaves.append(child.idx)
                    a = a.parent
                chain: list[Any] = [child]
                a = node
                while a is not None:
                    chain.append(a)
                    a = a.parent
                child.path = chain[::-1]
            node.children.append(child)
            if not (child.__class__ is _Leaf and comp.negated):
                node.pos.append(child)
        for i, c in enumerate(node.children):
            if c.__class__ is _Leaf and c.negated:  # type: ignore[union-attr]
                prev = next((p for p in reversed(node.children[:i]) if p in node.pos), None)
                nxt = next((p for p in node.children[i + 1 :] if p in node.pos), None)
                node.negs.append((c, prev, nxt))  # type: ignore[arg-type]
        return node

    def done(self, binds: list) -> bool:
        """Is the root complete? (A flat pattern of positive leaves needs no tree walk.)"""
        if self.flat:
            return None not in binds
        return _done(self.root, binds)

    def enabled(self, binds: list) -> list[int]:
        if self.flat:
            if self.root.kind == "seq":
                return [binds.index(None)] if None in binds else []
            return [i for i, b in enumerate(binds) if b is None]
        out: list[int] = []
        _enabled(self.root, binds, out)
        return out

    def exclusive(self, i: int, j: int) -> bool:
        """Are leaves i and j in different alternatives of one any (never both bound)?"""
        pi, pj = self.leaves[i].path, self.leaves[j].path
        k = 0
        while k < len(pi) and k < len(pj) and pi[k] is pj[k]:
            k += 1
        lca = pi[k - 1]
        return lca.__class__ is _Node and lca.kind == "any"

    def alt_of(self, leaf: int) -> int | None:
        """The any node a leaf is a direct alternative of (None otherwise)."""
        parent = self.leaves[leaf].parent
        return parent.nid if parent.kind == "any" else None

    def active_negs(self, binds: list) -> list[int]:
        """Negated leaves (between in a seq, or in an all) active for a PM, in written order."""
        out: list[int] = []
        self._act(self.root, binds, out)
        out.sort()
        return out

    def _act(self, node: _Node, binds: list, out: list[int]) -> None:
        if node.negs:
            if node.kind == "all":
                if _started(node, binds) and not _done(node, binds):
                    out.extend(x.idx for x, _, _ in node.negs)
            else:
                for x, prev, nxt in node.negs:
                    if prev is None:
                        continue  # leading: checked when a match completes
                    if nxt is None:
                        if _done(node, binds):  # trailing: the PM waits for its deadline
                            out.append(x.idx)
                    elif _done(prev, binds) and not _started(nxt, binds):
                        out.append(x.idx)
        for c in node.pos:
            if c.__class__ is _Node:
                self._act(c, binds, out)  # type: ignore[arg-type]


# ------------------------------------------------------------ runtime state
class _PM:
    """A partial match: the positive leaves bound so far, plus negation candidates."""

    __slots__ = ("binds", "cands", "counts", "waiting", "alive", "timers", "part", "seen")

    def __init__(self, binds: list, part: _Part) -> None:
        self.binds = binds
        self.cands: list[tuple[int, B]] = []  # negation events waiting for their where verdict
        self.counts: dict[int, int] = {}  # nth: matching events seen per enabled leaf
        self.waiting = False  # all positives bound, waiting for a trailing negation's deadline
        self.alive = True
        self.timers: dict[int, tuple] = {}  # node id -> temporal handle (deadline first)
        self.part = part
        # select last: between-negation events seen while alive (bound or not), which a
        # replacement may put between its events (`_CompositeRuntime._replace`)
        self.seen: list[tuple[int, B]] = []

    def copy(self, binds: list) -> _PM:
        pm = _PM(binds, self.part)
        pm.cands = list(self.cands)
        pm.counts = dict(self.counts)
        pm.seen = list(self.seen)
        return pm

    def seqs(self) -> set[int]:
        return {b[0] for b in self.binds if b is not None}

    def empty(self) -> bool:
        return all(b is None for b in self.binds)


class _Part:
    """One partition of one profile: binding lists, partial matches, the nth start counter."""

    __slots__ = ("key", "values", "pms", "lists", "nth", "nth_timer")

    def __init__(self, key: tuple, values: dict[str, Any] | None) -> None:
        self.key = key
        self.values = values
        self.pms: list[_PM] = []
        self.lists: dict[int, deque[B]] = {}
        self.nth = 0
        self.nth_timer: tuple | None = None


class _Runtime:
    """One profile inside the two-step engine."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        self.engine = engine
        self.profile = profile
        self.idx = idx
        self.active = True

    def filters(self) -> Iterable[tuple[Any, int]]:
        """(filter, leaf) pairs that sit in the primitive pool for the profile's whole life."""
        return ()

    def clocks(self) -> Iterable[Clock]:
        return ()

    def activate(self, now: float | None) -> None:
        pass

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        raise NotImplementedError

    def on_timer(self, when: float, arg: Any) -> None:
        pass

    def clear(self) -> None:
        pass

    def live(self) -> tuple[int, int, int]:
        return (0, 0, 0)

    def partition(self, attrs: dict[str, Any]) -> tuple[tuple, dict[str, Any] | None] | None:
        per = self.profile.per
        if not per:
            return (), None
        key = []
        for a in per:
            v = attrs.get(a)
            if v is None:
                return None
            key.append(norm(v))
        return tuple(key), {a: attrs[a] for a in per}

    def report(self, ts: float, events: dict[str, Event], partition: dict[str, Any] | None) -> None:
        eng = self.engine
        eng._nseq += 1
        eng._out.append(
            Notification(self.profile.id, ts, events, partition, eng._nseq, self.profile.subscriber)
        )
        if self.profile.once:
            eng._deactivate(self)


class _FilterRuntime(_Runtime):
    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((self.profile.expr, 0),)

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        self.report(ev.ts, {"e": ev}, None)


class _AbsentRuntime(_Runtime):
    """absent(F) within T: one timer per partition, restarted by every F event."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        assert isinstance(profile.expr, Absent) and profile.within is not None
        self.window = profile.within
        self.armed: dict[tuple, tuple[Event | None, dict[str, Any] | None, tuple]] = {}
        self.started = False

    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((self.profile.expr.filter, 0),)  # type: ignore[union-attr]

    def activate(self, now: float | None) -> None:
        if now is not None and not self.started:
            self.started = True
            if not self.profile.per:
                self._arm((), None, None, now + self.window)

    def _arm(
        self, key: tuple, values: dict[str, Any] | None, last: Event | None, at: float
    ) -> None:
        old = self.armed.get(key)
        if old is not None:
            self.engine.timers.discard(old[2])
        self.armed[key] = (last, values, self.engine._timer(at, (self, key)))

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        part = self.partition(ev.attrs)
        if part is None:
            return
        key, values = part
        old = self.armed.get(key)
        if old is not None and old[1] is not None:
            values = old[1]
        self._arm(key, values, ev, ev.ts + self.window)

    def on_timer(self, when: float, key: Any) -> None:
        st = self.armed.pop(key, None)
        if st is None:
            return
        last, values, _ = st
        self.report(when, {"last": last} if last is not None else {}, values)

    def clear(self) -> None:
        for st in self.armed.values():
            self.engine.timers.discard(st[2])
        self.armed.clear()

    def live(self) -> tuple[int, int, int]:
        return (0, len(self.armed), 0)


class _CompositeRuntime(_Runtime):
    """Step 2 for one composite profile: binding lists and partial matches per partition."""

    def __init__(self, engine: TwoStepEngine, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        self.pat = _Pattern(profile)
        self.kind = profile.select.kind
        self.nth = profile.select.n
        self.unique = profile.consume == "unique"
        self.window = profile.within
        self.parts: dict[tuple, _Part] = {}
        self.has_trailing = bool(self.pat.trailing)
        self.openers = self.pat.starts | frozenset(self.pat.leading)
        # select last: negations between positives, which a replacement must respect (§4.1)
        self.between = (
            frozenset(self.pat.neg - set(self.pat.leading) - set(self.pat.trailing))
            if self.kind == "last"
            else frozenset()
        )
        self.fast = (
            self.pat.flat
            and self.pat.root.kind == "seq"
            and self.kind == "first"
            and profile.where is None
        )

    def filters(self) -> Iterable[tuple[Any, int]]:
        return ((lf.filter, lf.idx) for lf in self.pat.leaves if lf.clock is None)

    def clocks(self) -> Iterable[Clock]:
        return {lf.clock for lf in self.pat.leaves if lf.clock is not None}  # type: ignore[misc]

    def clock_leaves(self, clock: Clock) -> list[int]:
        return [lf.idx for lf in self.pat.leaves if lf.clock == clock]

    # ------------------------------------------------------------ helpers
    def _env(self, binds: list, extra: tuple[int, B] | None = None) -> dict[str, dict[str, Any]]:
        leaves = self.pat.leaves
        env = {leaves[i].name: b[1].attrs for i, b in enumerate(binds) if b is not None}
        if extra is not None:
            env[leaves[extra[0]].name] = extra[1][1].attrs
        return env

    def _neg_verdict(self, x: int, xb: B, binds: list) -> bool | None:
        """Does negation event xb on leaf x satisfy its where conjuncts under `binds`?
        True: all hold; False: one fails; None: one still needs an unbound positive."""
        conj = self.pat.neg_conj.get(x)
        if not conj:
            return True
        env = None
        undecided = False
        for c, poss in conj:
            if all(binds[i] is not None for i in poss):
                if env is None:
                    env = self._env(binds, (x, xb))
                if not _holds(c, env):
                    return False
            else:
                undecided = True
        return None if undecided else True

    def _key(self, binds: list) -> tuple:
        return tuple(binds[i][0] if binds[i] is not None else _INF for i in self.pat.pos)

    def _complete(self, binds: list) -> bool:
        """A match to report now (a trailing negation makes the PM wait instead)."""
        return not self.has_trailing and self.pat.done(binds)

    def _try(self, part: _Part, pm: _PM | None, leaf: int, b: B) -> list | None:
        """`pm`'s bindings with `leaf` bound to `b` (replacing a binding under `last`),
        or None when a where conjunct fails, a negation candidate blocks, or a leading
        negation blocks the completion."""
        pat = self.pat
        binds = list(pm.binds) if pm is not None else [None] * len(pat.leaves)
        binds[leaf] = b
        for a in pat.leaves[leaf].anys:
            if _done(a, binds):
                for alt in a.pos:
                    if alt.__class__ is _Leaf:
                        if alt.idx != leaf:  # type: ignore[union-attr]
                            binds[alt.idx] = None  # type: ignore[union-attr]
                    elif leaf not in alt.leaves:  # type: ignore[union-attr]
                        for i in alt.leaves:  # type: ignore[union-attr]
                            binds[i] = None
        env = None
        for c, poss in pat.pos_conj.get(leaf, ()):
            if all(binds[i] is not None for i in poss):
                if env is None:
                    env = self._env(binds)
                if not _holds(c, env):
                    return None
        if pm is None:
            for c in pat.const_conj:
                if not _holds(c, {}):
                    return None
        else:
            for x, xb in pm.cands:
                if self._neg_verdict(x, xb, binds) is True:
                    return None
        if pat.done(binds):
            if pat.late_conj:  # where holds on the final match (dropped bindings are absent)
                env = self._env(binds)
                for c, _, _ in pat.late_conj:
                    if not _holds(c, env):
                        return None
            if pat.leading and self._leading_blocks(part, binds):
                return None
        return binds

    def _leading_blocks(self, part: _Part, binds: list) -> bool:
        """An x of a leading `not x` before the first positive event, within T of the last."""
        bound = [v for v in binds if v is not None]
        first = min(v[0] for v in bound)
        last_ts = max(v[1].ts for v in bound)
        lo = last_ts - self.window  # type: ignore[operator]
        for x in self.pat.leading:
            for xb in part.lists.get(x, ()):
                if xb[0] < first and xb[1].ts >= lo and self._neg_verdict(x, xb, binds) is True:
                    return True
        return False

    def _sync(self, pm: _PM) -> None:
        """Timers follow the bindings: the window from the first bound event, nested windows
        from their own first event (while they are incomplete)."""
        binds = pm.binds
        want: dict[int, float] = {}
        if self.window is not None:
            want[0] = min(b[1].ts for b in binds if b is not None) + self.window
        for n in self.pat.timed:
            if _started(n, binds) and not _done(n, binds):
                want[n.nid] = (
                    min(binds[i][1].ts for i in n.leaves if binds[i] is not None) + n.within
                )  # type: ignore[operator]
        timers = self.engine.timers
        for nid, h in list(pm.timers.items()):
            if want.get(nid) != h[0]:
                timers.discard(h)
                del pm.timers[nid]
        for nid, when in want.items():
            if nid not in pm.timers:
                pm.timers[nid] = self.engine._timer(when, (self, ("pm", pm, nid)))

    def _set(self, pm: _PM, binds: list) -> None:
        pm.binds = binds
        pm.waiting = self.has_trailing and self.pat.done(binds)
        self._sync(pm)

    def _drop(self, pm: _PM) -> None:
        pm.alive = False
        for h in pm.timers.values():
            self.engine.timers.discard(h)
        pm.timers.clear()

    def _reset(self, pm: _PM, node: _Node) -> None:
        """Forget the bindings of a nested composite (its negation fired or its window ended)."""
        if self.kind == "each":
            self._drop(pm)
            return
        binds = list(pm.binds)
        for i in node.leaves:
            binds[i] = None
        under = {lf.idx for lf in self.pat.leaves if node in lf.path}
        pm.cands = [c for c in pm.cands if c[0] not in under]
        pm.counts = {k: v for k, v in pm.counts.items() if k not in under}
        if all(v is None for v in binds):
            self._drop(pm)
        else:
            self._set(pm, binds)

    def _events(self, binds: list) -> dict[str, Event]:
        leaves = self.pat.leaves
        return {leaves[i].name: binds[i][1] for i in self.pat.pos if binds[i] is not None}

    # ------------------------------------------------------------- events
    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        if self.profile.per:
            got = self.partition(ev.attrs)
            if got is None:
                return
            key, values = got
        else:
            key, values = (), None
        part = self.parts.get(key)
        if part is None:
            if self.openers.isdisjoint(leaves):
                return  # nothing waits for it and nothing can start: the evaluator drops it
            part = self.parts[key] = _Part(key, values)
        b: B = (seq, ev)
        if self.window is not None:
            # binding lists: the events matched per component inside the window (read by
            # leading negations; nothing else needs past events, events bind on arrival)
            lists = part.lists
            lo = ev.ts - self.window
            for i in leaves:
                lst = lists.get(i)
                if lst is None:
                    lst = lists[i] = deque()
                lst.append(b)
                while lst[0][1].ts < lo:
                    lst.popleft()
        if self.fast:
            self._step_fast(part, b, leaves)
        else:
            self._step(part, b, leaves)
        if self.active and not part.pms:
            self._tidy(part)

    def _step_fast(self, part: _Part, b: B, leaves: list[int]) -> None:
        """`_step` for the common shape: a flat seq of positive filters, select first, no where
        (at most one PM, no negations, no candidates). Checked against `_step` by the tests."""
        pms = part.pms
        if pms:
            pm = pms[0]
            binds = pm.binds
            i = binds.index(None)
            if i not in leaves:
                return
            nb = binds.copy()
            nb[i] = b
            if None in nb:
                self._set(pm, nb)
                return
            if self.unique:
                self._drop(pm)
                part.pms = []
            self.report(b[1].ts, self._events(nb), part.values)
            return
        if 0 in leaves:
            nb = [None] * len(self.pat.leaves)
            nb[0] = b
            self._open(part, nb, b)

    def _step(self, part: _Part, b: B, leaves: list[int]) -> None:
        pat = self.pat
        kind = self.kind
        if pat.neg:
            pos = [i for i in leaves if i not in pat.neg]
            neg = [i for i in leaves if i in pat.neg]
        else:
            pos, neg = leaves, []
        touched: set[int] = set()
        completions: list[tuple[tuple, list]] = []
        fresh: list[_PM] = []
        # 1. extend
        if pos:
            for pm in part.pms:
                if not pm.alive:
                    continue
                en = pat.enabled(pm.binds)
                hit = [i for i in en if i in pos]  # enabled leaves come in written order
                if kind == "each":
                    alts: set[int] = set()  # of one any's alternative leaves, the first that binds
                    for i in hit:
                        alt = pat.alt_of(i)
                        if alt in alts:
                            continue
                        nb = self._try(part, pm, i, b)
                        if nb is None:
                            continue
                        if alt is not None:
                            alts.add(alt)
                        if self._complete(nb):  # the original waits on: not exempt from the event
                            completions.append((self._key(nb), nb))
                        else:
                            cp = pm.copy(nb)
                            cp.counts = {}
                            self._set(cp, nb)
                            fresh.append(cp)
                    continue
                nb = None
                if kind == "nth":
                    # the event counts for the leaf it would bind under `first`; the N-th binds
                    for i in hit:
                        cand = self._try(part, pm, i, b)
                        if cand is None:
                            continue
                        n = pm.counts.get(i, 0) + 1
                        if n >= self.nth:
                            nb = cand
                            if not self._complete(nb):  # a completed PM stays as it was
                                del pm.counts[i]
                        else:
                            pm.counts[i] = n
                        break
                else:
                    for i in hit:
                        nb = self._try(part, pm, i, b)
                        if nb is not None:
                            break
                    if nb is None and kind == "last":
                        nb, cands = self._replace(part, pm, b, pos)
                        if nb is not None and not self._complete(nb):
                            pm.cands = cands
                if nb is None:
                    continue
                if self._complete(nb):
                    completions.append((self._key(nb), nb))
                    if self.unique:
                        self._drop(pm)  # the PM became the match (even if an any dropped events)
                else:
                    touched.add(id(pm))  # extended: the event closed its negations' scope
                    self._set(pm, nb)
                    if pm.seen:
                        self._forget_seen(pm)
        # 2. complete
        consumed = False
        if completions:
            if len(completions) > 1:
                completions.sort(key=lambda c: c[0])
            if self.unique:
                _, nb = completions[0]
                used = {v[0] for v in nb if v is not None}
                self.report(b[1].ts, self._events(nb), part.values)
                if not self.active:
                    return
                for pm in part.pms + fresh:
                    if pm.alive and not used.isdisjoint(pm.seqs()):
                        self._drop(pm)
                consumed = True
            else:
                for _, nb in completions:
                    self.report(b[1].ts, self._events(nb), part.values)
                    if not self.active:
                        return
        # 3. negate
        if neg:
            seen = [x for x in neg if x in self.between]
            for pm in part.pms:
                if pm.alive:
                    for x in seen:
                        self._see(pm, x, b)  # bound or not: a replacement may free it
                    if id(pm) not in touched:
                        self._negate(pm, neg, b)
        if fresh or not all(pm.alive for pm in part.pms):
            part.pms = [pm for pm in part.pms if pm.alive] + [pm for pm in fresh if pm.alive]
        # 4. open
        if consumed or not pos:
            return
        starts = [i for i in pos if i in pat.starts]
        if not starts:
            return
        if kind == "each":
            alts: set[int] = set()
            for i in starts:
                alt = pat.alt_of(i)
                if alt in alts:
                    continue
                nb = self._try(part, None, i, b)
                if nb is not None:
                    if alt is not None:
                        alts.add(alt)
                    done = self._open(part, nb, b)
                    if not self.active or (done and self.unique):
                        return  # a match reported at once consumed the event
            return
        if part.pms:
            return
        if kind == "nth":
            # a starting event counts if it could open a PM (its where conjuncts over the
            # starting leaf alone hold, §4.1); the N-th opens the PM if it can bind (a leading
            # negation may still block it), and the count starts over either way
            if not any(self._may_open(i, b) for i in starts):
                return
            part.nth += 1
            if part.nth == 1 and self.window is not None:
                part.nth_timer = self.engine._timer(b[1].ts + self.window, (self, ("nth", part)))
            if part.nth < self.nth:
                return
            self._forget_nth(part)
        for i in starts:
            nb = self._try(part, None, i, b)
            if nb is not None:
                self._open(part, nb, b)
                return

    def _forget_nth(self, part: _Part) -> None:
        part.nth = 0
        if part.nth_timer is not None:
            self.engine.timers.discard(part.nth_timer)
            part.nth_timer = None

    def _open(self, part: _Part, nb: list, b: B) -> bool:
        """Open a PM; one that is complete at once is reported and nothing of it remains."""
        if self._complete(nb):
            self.report(b[1].ts, self._events(nb), part.values)
            if self.unique and self.active:
                for pm in part.pms:
                    if pm.alive and b[0] in pm.seqs():
                        self._drop(pm)
                part.pms = [pm for pm in part.pms if pm.alive]
            return True
        pm = _PM([None] * len(nb), part)
        self._set(pm, nb)
        part.pms.append(pm)
        return False

    def _may_open(self, i: int, b: B) -> bool:
        """nth: do the where conjuncts that name starting leaf i alone hold for b?"""
        env = None
        for c, poss in self.pat.pos_conj.get(i, ()):
            if poss == (i,):
                if env is None:
                    env = {self.pat.leaves[i].name: b[1].attrs}
                if not _holds(c, env):
                    return False
        return True

    def _replaceable(self, binds: list) -> set[int]:
        """select last: the newest bound leaf, and the bound leaf children of incomplete alls."""
        out: set[int] = set()
        bound = [i for i in self.pat.pos if binds[i] is not None]
        if bound:
            out.add(max(bound, key=lambda i: binds[i][0]))
        for n in self.pat.nodes:
            if n.kind == "all" and not _done(n, binds):
                for c in n.pos:
                    if c.__class__ is _Leaf and binds[c.idx] is not None:  # type: ignore[union-attr]
                        out.add(c.idx)  # type: ignore[union-attr]
        return out

    def _replace(self, part: _Part, pm: _PM, b: B, pos: list[int]) -> tuple[list | None, list]:
        """select last: the event replaces the newest binding, or a bound leaf child of an
        incomplete all; of several such leaves the first in written order. (The new bindings,
        and the negation candidates that stay pending for them.)

        A replacement must leave a valid match (§4.1 item 1): besides `where`, every
        between-negation event seen by the PM that now lies inside its scope (`_inside`)
        becomes a candidate that `_try` checks against the new bindings."""
        binds = pm.binds
        for i in sorted(self._replaceable(binds)):
            if i not in pos:
                continue
            if not self.between:
                nb = self._try(part, pm, i, b)
                if nb is not None:
                    return nb, pm.cands
                continue
            new = list(binds)
            new[i] = b
            used = {v[0] for v in new if v is not None}
            rest = list(binds)
            rest[i] = None
            base = pm.copy(rest)
            base.cands = [
                (x, e) for x, e in pm.seen if e[0] not in used and self._inside(x, e[0], new)
            ]
            nb = self._try(part, base, i, b)
            if nb is not None:
                return nb, base.cands
        return None, pm.cands

    def _inside(self, x: int, at: int, binds: list) -> bool:
        """Does arrival number `at` lie in the scope of between-negation x for these bindings?
        In a seq: after the last event of the positive before x and before the first of the one
        after it (if bound); in an all: after the node's first event (and before its last, once
        the node is complete)."""
        leaf = self.pat.leaves[x]
        node = leaf.parent

        def stamps(n: _Node | _Leaf) -> list[int]:
            idxs = n.leaves if n.__class__ is _Node else [n.idx]  # type: ignore[union-attr]
            return [binds[i][0] for i in idxs if binds[i] is not None]

        if node.kind == "all":
            got = stamps(node)
            if not got or at < min(got):
                return False
            return not _done(node, binds) or at < max(got)
        prev, nxt = next((p, q) for y, p, q in node.negs if y is leaf)
        if prev is None or nxt is None or not _done(prev, binds) or at < max(stamps(prev)):
            return False
        after = stamps(nxt)
        return not after or at < min(after)

    def _see(self, pm: _PM, x: int, b: B) -> None:
        """Keep between-negation event b for later replacements, unless x has no where and an
        x event is kept already after the PM's latest binding (same scope, whatever happens)."""
        if x not in self.pat.neg_conj:
            latest = max(v[0] for v in pm.binds if v is not None)
            if any(y == x and e[0] > latest for y, e in pm.seen):
                return
        pm.seen.append((x, b))

    def _forget_seen(self, pm: _PM) -> None:
        """Drop seen negation events that no replacement can put in scope any more: those
        before the latest binding that can no longer be replaced."""
        binds = pm.binds
        repl = self._replaceable(binds)
        lo = min((binds[i][0] for i in repl), default=-1)
        fixed = [
            binds[i][0]
            for i in self.pat.pos
            if binds[i] is not None and i not in repl and binds[i][0] < lo
        ]
        if fixed:
            p = max(fixed)
            pm.seen = [s for s in pm.seen if s[1][0] > p]

    def _negate(self, pm: _PM, neg: list[int], b: B) -> None:
        pat = self.pat
        for x in neg:
            if not pm.alive:
                return
            if x in pat.leading or x not in pat.active_negs(pm.binds):
                continue
            verdict = self._neg_verdict(x, b, pm.binds)
            if verdict is False:
                continue
            if verdict is None:
                pm.cands.append((x, b))
                continue
            node = pat.leaves[x].parent
            if node is pat.root:
                self._drop(pm)
            else:
                self._reset(pm, node)

    def _tidy(self, part: _Part) -> None:
        if part.pms:
            return
        if part.nth:
            return
        for x in list(part.lists):
            if x not in self.pat.leading or not part.lists[x]:
                del part.lists[x]
        if not part.lists:
            del self.parts[part.key]

    # -------------------------------------------------------------- clocks
    def on_clock(self, ev: Event, seq: int, clock: Clock) -> None:
        leaves = self.clock_leaves(clock)
        if leaves:
            self.on_event(ev, seq, leaves)

    # -------------------------------------------------------------- timers
    def on_timer(self, when: float, arg: Any) -> None:
        if arg[0] == "nth":
            part = arg[1]
            part.nth_timer = None
            part.nth = 0
            if self.parts.get(part.key) is part:
                self._tidy(part)
            return
        _, pm, nid = arg
        h = pm.timers.get(nid)
        if not pm.alive or h is None or h[0] != when:
            return
        del pm.timers[nid]
        part = pm.part
        if nid == 0:
            self._drop(pm)
            if pm.waiting:
                self.report(when, self._events(pm.binds), part.values)
                if not self.active:
                    return
                if self.unique:
                    used = pm.seqs()
                    for other in part.pms:
                        if other.alive and not used.isdisjoint(other.seqs()):
                            self._drop(other)
        else:
            self._reset(pm, self.pat.nodes[nid])
        part.pms = [p for p in part.pms if p.alive]
        if self.parts.get(part.key) is part:
            self._tidy(part)

    def clear(self) -> None:
        for part in self.parts.values():
            for pm in part.pms:
                self._drop(pm)
            self._forget_nth(part)
        self.parts.clear()

    def live(self) -> tuple[int, int, int]:
        pms = sum(len(p.pms) for p in self.parts.values())
        evs = sum(len(lst) for p in self.parts.values() for lst in p.lists.values())
        return (pms, len(self.parts), evs)


# ------------------------------------------------------------------ engine
class TwoStepEngine(TimeDriven):
    """Same interface as `filters.engine.Engine`; primitive filtering, then composite evaluation.

    >>> from profiles.parser import parse_profile
    >>> eng = TwoStepEngine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")])
    >>> eng.process(Event("a1", 0.0, {"k": "A"})); eng.process(Event("b1", 5.0, {"k": "B"}))
    >>> [n.to_json() for n in eng.take_notifications()]
    [{'profile': 'p', 'ts': 5.0, 'events': {'a': 'a1', 'b': 'b1'}}]
    """

    def __init__(
        self,
        profiles: Iterable[Profile] = (),
        *,
        tz: str = "UTC",
        timers: TemporalPool | None = None,
    ) -> None:
        self.pool = PrimitivePool()
        self.timers = timers if timers is not None else TemporalPool()
        self.tz = ZoneInfo(tz)
        self.now: float | None = None
        self._rts: dict[int, _Runtime] = {}
        self._by_id: dict[str, _Runtime] = {}
        self._next = 0
        self._seq = 0
        self._nseq = 0
        self._out: list[Notification] = []
        self._clocks: dict[Clock, tuple | None] = {}
        self._clock_users: dict[Clock, set[int]] = {}
        for p in profiles:
            self.add_profile(p)

    # ------------------------------------------------------------ profiles
    def add_profile(self, profile: Profile) -> None:
        if profile.id in self._by_id:
            raise ValueError(f"profile {profile.id!r} is already active")
        idx = self._next
        self._next += 1
        rt: _Runtime
        if is_filter(profile.expr):
            rt = _FilterRuntime(self, profile, idx)
        elif isinstance(profile.expr, Absent):
            rt = _AbsentRuntime(self, profile, idx)
        else:
            rt = _CompositeRuntime(self, profile, idx)
        self._rts[idx] = rt
        self._by_id[profile.id] = rt
        for f, leaf in rt.filters():
            self.pool.add(f, (idx, leaf))
        for clock in rt.clocks():
            self._clock_users.setdefault(clock, set()).add(idx)
            if clock not in self._clocks:
                self._clocks[clock] = None
                if self.now is not None:
                    self._schedule_clock(clock, self.now)
        rt.activate(self.now)

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
        for f, leaf in rt.filters():
            self.pool.remove(f, (rt.idx, leaf))
        rt.clear()
        for clock in rt.clocks():
            users = self._clock_users.get(clock)
            if users is not None:
                users.discard(rt.idx)
                if not users:
                    del self._clock_users[clock]
                    self.timers.discard(self._clocks.pop(clock, None))

    @property
    def profiles(self) -> list[Profile]:
        return [rt.profile for rt in self._rts.values()]

    # ---------------------------------------------------------------- time
    def _timer(self, when: float, payload: tuple) -> tuple:
        return self.timers.add(when, 1, payload)

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
        for idx in sorted(self._clock_users.get(clock, ())):
            rt = self._rts.get(idx)
            if isinstance(rt, _CompositeRuntime) and rt.active:
                rt.on_clock(ev, self._seq, clock)
        if clock in self._clock_users:
            self._schedule_clock(clock, when + 60.0)

    # --------------------------------------------------------------- events
    def process(self, event: Event) -> None:
        """Step 1: match the event against every component filter; step 2: evaluate."""
        if self.now is None or event.ts > self.now or self.timers:
            self.advance(event.ts)
        self._seq += 1
        seq = self._seq
        entries = self.pool.match(event.attrs)
        rts = self._rts
        if len(entries) == 1:
            # owners are registered once, when the profile is added, so they are in profile
            # order already (a profile's leaves on one filter are adjacent); copied because a
            # `once` profile leaves the pool while we walk them
            owners = list(entries[0].owners)
            i, n = 0, len(owners)
            while i < n:
                idx, leaf = owners[i]
                i += 1
                leaves = [leaf]
                while i < n and owners[i][0] == idx:
                    leaves.append(owners[i][1])
                    i += 1
                rt = rts.get(idx)
                if rt is not None and rt.active:
                    rt.on_event(event, seq, leaves)
            return
        for idx, leaves in owners_by_profile(entries):
            rt = rts.get(idx)
            if rt is not None and rt.active:
                rt.on_event(event, seq, leaves)

    def take_notifications(self) -> list[Notification]:
        out, self._out = self._out, []
        return out

    def pending(self) -> int:
        """Notifications produced and not taken yet."""
        return len(self._out)

    def stats(self) -> dict[str, int]:
        pms = parts = evs = 0
        for rt in self._rts.values():
            a, b, c = rt.live()
            pms += a
            parts += b
            evs += c
        return {
            "profiles": len(self._rts),
            "partial_matches": pms,
            "partitions": parts,
            "binding_events": evs,
            "pool_filters": len(self.pool),
            "pool_owners": self.pool.owner_count,
            "timers": len(self.timers),
        }
