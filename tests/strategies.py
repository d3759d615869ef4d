"""Hypothesis strategies for filters and events (shared by the pool and compiler tests)."""

from __future__ import annotations

from hypothesis import strategies as st

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
    st.builds(Cmp, attr, st.sampled_from(["<", "<=", ">", ">="]), st.one_of(numbers, st.sampled_from(STRS))),
    st.builds(In, attr, st.lists(scalars, min_size=1, max_size=3).map(tuple), st.booleans()),
    st.one_of(
        st.builds(lambda a, x, y: Between(a, min(x, y), max(x, y)), attr, numbers, numbers),
        st.builds(lambda a, x, y: Between(a, min(x, y), max(x, y)), attr, st.sampled_from(STRS), st.sampled_from(STRS)),
    ),
    st.builds(Exists, attr),
    st.builds(StartsWith, attr, st.sampled_from(["lab-", "l", "x", ""])),
)

filters = st.recursive(
    st.one_of(predicates, st.just(Const(True))),
    lambda inner: st.one_of(
        st.builds(lambda xs: And(tuple(xs)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda xs: Or(tuple(xs)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(Not, inner),
    ),
    max_leaves=6,
)

events = st.dictionaries(attr, scalars, max_size=4)
