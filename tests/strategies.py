"""Hypothesis strategies for filters and events (shared by the pool and compiler tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from profiles import timeofday as tod
from profiles.ast import And, Between, Cmp, Const, Exists, In, Not, Or, StartsWith

ATTRS = ["a", "b", "c", "kind"]
STRS = ["x", "y", "lab-1", "lab-2", "l", ""]
scalars = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([-1.5, 0.0, 0.5, 2.0, 2.5]),
    st.sampled_from(STRS),
    st.booleans(),
)
numbers = st.one_of(st.integers(-3, 3), st.sampled_from([-1.5, 0.5, 2.0]))
attr = st.sampled_from(ATTRS)


predicates = st.one_of(
    st.builds(Cmp, attr, st.sampled_from(["=", "!="]), scalars),
    st.builds(
        Cmp,
        attr,
        st.sampled_from(["<", "<=", ">", ">="]),
        st.one_of(numbers, st.sampled_from(STRS)),
    ),
    st.builds(In, attr, st.lists(scalars, min_size=1, max_size=3).map(tuple), st.booleans()),
    st.one_of(
        st.builds(lambda a, x, y: Between(a, min(x, y), max(x, y)), attr, numbers, numbers),
        st.builds(
            lambda a, x, y: Between(a, min(x, y), max(x, y)),
            attr,
            st.sampled_from(STRS),
            st.sampled_from(STRS),
        ),
    ),
    st.builds(Exists, attr),
    st.builds(StartsWith, attr, st.sampled_from(["lab-", "l", "x", ""])),
)

# docs/language.md §2.1 as the parser writes it: the reserved keys, seconds of the local day (a
# `between` that wraps midnight is an `or` of two comparisons) and day names
_SECS = st.sampled_from([0, 1, 3599, 21600, 43200, 79200, 86399])
local_predicates = st.one_of(
    st.builds(
        Cmp, st.just(tod.KEY_LOCALTIME), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), _SECS
    ),
    st.builds(
        lambda x, y: (
            Between(tod.KEY_LOCALTIME, x, y)
            if x <= y
            else Or((Cmp(tod.KEY_LOCALTIME, ">=", x), Cmp(tod.KEY_LOCALTIME, "<=", y)))
        ),
        _SECS,
        _SECS,
    ),
    st.builds(
        Cmp, st.just(tod.KEY_WEEKDAY), st.sampled_from(["=", "!="]), st.sampled_from(tod.DAYS)
    ),
    st.builds(
        In,
        st.just(tod.KEY_WEEKDAY),
        st.lists(st.sampled_from(tod.DAYS), min_size=1, max_size=3).map(tuple),
        st.booleans(),
    ),
)
predicates = st.one_of(predicates, local_predicates)

filters = st.recursive(
    st.one_of(predicates, st.just(Const(True))),
    lambda inner: st.one_of(
        st.builds(lambda xs: And(tuple(xs)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda xs: Or(tuple(xs)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(Not, inner),
    ),
    max_leaves=6,
)

events = st.builds(
    lambda attrs, local: {**attrs, **local},
    st.dictionaries(attr, scalars, max_size=4),
    st.fixed_dictionaries(
        {},
        optional={
            tod.KEY_LOCALTIME: st.one_of(_SECS, st.integers(0, 86399)),
            tod.KEY_WEEKDAY: st.sampled_from(tod.DAYS),
        },
    ),
)


# ------------------------------------------- flat seq profiles for the reference interpreter
# Each entry: the filter text and the same filter as a predicate over one event (spec §2:
# an absent attribute, or one of another type, makes a comparison false). The kinds repeat
# and overlap (`k in ("A", "B")`, `true`), so one event often matches several components.


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


SEQ_FILTERS: list[tuple[str, Callable[[dict], bool]]] = [
    ('k = "A"', lambda e: e.get("k") == "A"),
    ('k = "B"', lambda e: e.get("k") == "B"),
    ('k = "C"', lambda e: e.get("k") == "C"),
    ('k = "X"', lambda e: e.get("k") == "X"),
    ('k in ("A", "B")', lambda e: e.get("k") in ("A", "B")),
    ('k = "A" and v > 0', lambda e: e.get("k") == "A" and _num(e.get("v")) and e["v"] > 0),
    ('k = "B" and v <= 1', lambda e: e.get("k") == "B" and _num(e.get("v")) and e["v"] <= 1),
    ('k != "X"', lambda e: isinstance(e.get("k"), str) and e["k"] != "X"),
    ("v >= 2", lambda e: _num(e.get("v")) and e["v"] >= 2),
    ("true", lambda e: True),
    # docs/language.md §2.1 in UTC (tests.reference adds localtime and weekday): the streams start
    # at the epoch, a Thursday, so these split them a few seconds in; the first wraps midnight
    ('localtime between "00:00:09" and "00:00:03"', lambda e: not 3 < e["localtime"] < 9),
    ('k = "A" and localtime <= "00:00:05"', lambda e: e.get("k") == "A" and e["localtime"] <= 5),
    (
        'weekday = "thu" and localtime > "00:00:02"',
        lambda e: e["weekday"] == "thu" and e["localtime"] > 2,
    ),
]


def _where_form(
    form: int, a: str, c: str, lit: int
) -> tuple[str, frozenset[str], Callable[[dict], bool]]:
    """One where conjunct as text, its component names, and its truth (all names bound)."""
    if form == 4:  # §2.1: the bound events' local times (UTC in tests.reference)
        return (
            f"{a}.localtime < {c}.localtime",
            frozenset({a, c}),
            lambda b: b[a]["localtime"] < b[c]["localtime"],
        )

    def vals(b: dict) -> tuple[object, object]:
        return b[a].get("v"), b[c].get("v")

    if form == 0:
        return (
            f"{a}.v = {c}.v",
            frozenset({a, c}),
            lambda b: _num(vals(b)[0]) and _num(vals(b)[1]) and vals(b)[0] == vals(b)[1],
        )
    if form == 1:
        return (
            f"{a}.v > {c}.v",
            frozenset({a, c}),
            lambda b: _num(vals(b)[0]) and _num(vals(b)[1]) and vals(b)[0] > vals(b)[1],
        )
    if form == 2:
        return (
            f"{a}.v != {c}.v",
            frozenset({a, c}),
            lambda b: _num(vals(b)[0]) and _num(vals(b)[1]) and vals(b)[0] != vals(b)[1],
        )
    # a single component against a literal: `where a.v >= 2` (what nth counts, §4.1 item 2)
    return f"{a}.v >= {lit}", frozenset({a}), lambda b: _num(b[a].get("v")) and b[a]["v"] >= lit


RARE_FILTERS = [f for f in SEQ_FILTERS if f[0] in ('k = "X"', 'k = "C"', "v >= 2")]
FLAT_SELECTS = ["last", "last", "nth 2", "nth 2", "nth 3", "first"]


@st.composite
def flat_seq_profiles(
    draw: st.DrawFn,
    pid: str = "p",
    sizes: tuple[int, int] = (1, 4),
    selects: list[str] = FLAT_SELECTS,
    between: bool = False,
) -> tuple[str, Any]:
    """(profile text, tests.reference.SeqSpec): seq of 1-4 components (`sizes`), some negated
    (leading, between, trailing), mostly under select last / nth, often with a where on one
    component. `between` puts a negation right before a positive that has a positive after it
    (the shape where a `select last` replacement can jump over a negated event), gives negated
    components the filters that match few events, and no `per` (so more events meet)."""
    from tests.reference import Comp, Conj, SeqSpec

    n = draw(st.integers(*sizes))
    negs = [draw(st.integers(0, 2)) == 0 for _ in range(n)]
    if all(negs):
        negs[draw(st.integers(0, n - 1))] = False
    if between and n >= 4:
        at = draw(st.integers(1, n - 3))  # positive before, negation at `at`, two positives after
        negs[at - 1], negs[at], negs[at + 1], negs[at + 2] = False, True, False, False
    comps, parts = [], []
    for i, neg in enumerate(negs):
        text, fn = draw(st.sampled_from(RARE_FILTERS if neg and between else SEQ_FILTERS))
        name = f"{'x' if neg else 'c'}{i + 1}"
        comps.append(Comp(name, neg, fn))
        parts.append(f"{'not ' if neg else ''}{name}: {text}")
    pos = [c.name for c in comps if not c.negated]
    neg_names = [c.name for c in comps if c.negated]
    within = draw(st.sampled_from([None, 3.0, 5.0, 10.0]))
    if within is None and (negs[0] or negs[-1]):
        within = 5.0  # leading and trailing negations need a window
    clauses = [] if within is None else [f"within {within:g}s"]
    per = draw(st.booleans()) and not between
    if per:
        clauses.append("per r")
    conjs, texts = [], []
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        form = draw(st.sampled_from([0, 1, 2, 3, 3, 4]))
        a = draw(st.sampled_from(pos + neg_names))
        c = draw(st.sampled_from(pos))
        if form != 3 and a == c:
            form = 3
        text, refs, fn = _where_form(form, a, c, draw(st.integers(1, 2)))
        texts.append(text)
        conjs.append(Conj(refs, fn))
    if texts:
        clauses.append("where " + " and ".join(texts))
    select = draw(st.sampled_from(selects))
    clauses.append(f"select {select}")
    shared = draw(st.booleans())
    clauses.append("consume shared" if shared else "consume unique")
    text = f"seq({', '.join(parts)}) " + " ".join(draw(st.permutations(clauses)))
    kind, _, cnt = select.partition(" ")
    spec = SeqSpec(pid, comps, within, "r" if per else None, conjs, kind, int(cnt or 1), shared)
    return text, spec


@st.composite
def tie_streams(draw: st.DrawFn, longest: int = 12) -> list[dict]:
    """Short streams with ties in ts and repeated kinds (duplicates of every component)."""
    out, ts = [], 0
    for j in range(draw(st.integers(2, longest))):
        ts += draw(st.sampled_from([0, 0, 1, 1, 2, 3, 6]))
        ev: dict = {
            "id": f"e{j + 1}",
            "ts": ts,
            "k": draw(st.sampled_from(["A", "A", "B", "B", "C", "X"])),
        }
        if draw(st.integers(0, 4)):
            ev["v"] = draw(st.integers(0, 3))
        if draw(st.integers(0, 9)):
            ev["r"] = draw(st.sampled_from([1, 1, 2]))
        out.append(ev)
    return out
