"""The primitive pool returns exactly what evaluating every filter directly returns."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.compile import compile_filter, evaluate
from filters.pool.index import Range
from filters.pool.primitive import PrimitivePool
from profiles.ast import And, Cmp, In, Or
from profiles.parser import parse_filter
from tests.strategies import STRS, attr, events, filters, numbers, scalars

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


@settings(max_examples=400, deadline=None)
@given(filters, events)
def test_compiled_filter_agrees_with_direct_evaluation(f, attrs) -> None:
    assert compile_filter(f)(attrs) == evaluate(f, attrs)


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove"]),
        filters,
        st.integers(0, 5),
        st.lists(st.tuples(st.sampled_from(["a", "room"]), scalars), max_size=2),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=250, deadline=None)
@given(ops, st.lists(events, min_size=1, max_size=8))
def test_pool_matches_direct_evaluation_under_inserts_and_deletes(ops, evs) -> None:
    pool = PrimitivePool()
    live: dict[tuple, int] = {}  # (filter, owner, eqs) -> refs
    for op, f, owner, eqs in ops:
        eqs = tuple(eqs)
        key = (f, owner, eqs)
        if op == "add":
            pool.add(f, owner, eqs)
            live[key] = live.get(key, 0) + 1
        elif live:
            victim = sorted(live, key=repr)[owner % len(live)]
            pool.remove(victim[0], victim[1], victim[2])
            live[victim] -= 1
            if not live[victim]:
                del live[victim]
    for attrs in evs:
        expected = set()
        for f, owner, eqs in live:
            full = And((f, *[Cmp(a, "=", v) for a, v in eqs])) if eqs else f
            if evaluate(full, attrs):
                expected.add(owner)
        assert set(pool.owners(attrs)) == expected
    for f, owner, eqs in list(live):
        for _ in range(live[(f, owner, eqs)]):
            pool.remove(f, owner, eqs)
    assert len(pool) == 0 and pool.owner_count == 0
    assert pool._idx == {} and pool._schemas == {} and not pool._scan


def test_identical_filters_are_stored_once_with_every_owner() -> None:
    pool = PrimitivePool()
    f1 = parse_filter('kind = "temperature" and value > 30')
    f2 = parse_filter('kind = "temperature" and value > 30')
    pool.add(f1, "alice")
    pool.add(f2, "bob")
    assert len(pool) == 1
    assert sorted(pool.owners({"kind": "temperature", "value": 31})) == ["alice", "bob"]
    pool.remove(f1, "alice")
    assert pool.owners({"kind": "temperature", "value": 31}) == ["bob"]


def test_shared_access_predicate_points_to_every_filter() -> None:
    pool = PrimitivePool()
    pool.add(parse_filter('room = "101" and value > 3'), 1)
    pool.add(parse_filter('room = "101" and value < 3'), 2)
    bucket = pool._schemas[("room",)]["101"]  # one bucket for room = "101", sorted by threshold
    assert sum(len(sl) for sl in bucket.ranges.values()) == 2
    assert pool.owners({"room": "101", "value": 5}) == [1]
    assert pool.owners({"room": "101", "value": 1}) == [2]
    assert pool.owners({"room": 101, "value": 1}) == []  # "101" and 101 differ


def test_range_predicates_use_binary_search_boundaries() -> None:
    pool = PrimitivePool()
    for i in range(100):
        pool.add(parse_filter(f"value > {i}"), f"gt{i}")
        pool.add(parse_filter(f"value <= {i}"), f"le{i}")
    got = set(pool.owners({"value": 50}))
    assert got == {f"gt{i}" for i in range(50)} | {f"le{i}" for i in range(50, 100)}
    assert pool.owners({"value": "50"}) == []  # strings never compare with numbers


def test_remove_unknown_owner_is_an_error() -> None:
    pool = PrimitivePool()
    pool.add(parse_filter("a = 1"), "x")
    try:
        pool.remove(parse_filter("a = 1"), "y")
    except KeyError:
        pass
    else:
        raise AssertionError("expected KeyError")


def test_false_and_zero_are_different_filters() -> None:
    """`a = 0` and `a = false` must not be shared (Python says 0 == False)."""
    pool = PrimitivePool()
    pool.add(parse_filter("a = 0"), "zero")
    pool.add(parse_filter("a = false"), "false")
    assert len(pool) == 2
    assert pool.owners({"a": 0}) == ["zero"]
    assert pool.owners({"a": False}) == ["false"]
    assert parse_filter("a = 0") != parse_filter("a = false")
    assert parse_filter("a = 1") == parse_filter("a = 1.0")  # numbers compare numerically


# the memo's domain: plain equalities (and `in`), with the values that collide as dict keys
eq_filters = st.one_of(
    st.builds(lambda a, v: Cmp(a, "=", v), attr, scalars),
    st.builds(
        lambda a, v, b, w: And((Cmp(a, "=", v), Cmp(b, "=", w))), attr, scalars, attr, scalars
    ),
    st.builds(
        lambda a, vs: In(a, tuple(vs), False), attr, st.lists(scalars, min_size=1, max_size=3)
    ),
)
eq_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove"]),
        st.one_of(eq_filters, eq_filters, filters),
        st.integers(0, 5),
        st.lists(st.tuples(st.sampled_from(["a", "room"]), scalars), max_size=2),
    ),
    min_size=1,
    max_size=30,
)


def check_ops_against_direct_evaluation(
    ops: list[tuple[str, Any, int, list[tuple[str, Any]]]],
    evs: list[dict[str, Any]],
    flips: tuple[Any, ...],
    matched: Callable[[PrimitivePool, dict[str, Any]], Iterable[Any]],
    compare: Callable[[Iterable[Any]], Any],
) -> None:
    """Apply ``ops`` (add, or remove one of the live entries) to a new pool; after each, every
    event of ``evs``, and each with one attribute replaced by each of ``flips``, is matched
    (``matched``: the owners the pool reports) as direct evaluation of the live entries says,
    both sides seen through ``compare`` (a set, or a sorted list to count duplicates)."""
    pool = PrimitivePool()
    live: dict[tuple, int] = {}
    for op, f, owner, eqs in ops:
        key = (f, owner, tuple(eqs))
        if op == "add":
            pool.add(*key)
            live[key] = live.get(key, 0) + 1
        elif live:
            victim = sorted(live, key=repr)[owner % len(live)]
            pool.remove(*victim)
            live[victim] -= 1
            if not live[victim]:
                del live[victim]
        for attrs in evs + [{**a, k: flip} for a in evs for k in a for flip in flips]:
            expected = [
                o
                for f2, o, eq2 in live
                if evaluate(And((f2, *[Cmp(a, "=", v) for a, v in eq2])) if eq2 else f2, attrs)
            ]
            assert compare(matched(pool, attrs)) == compare(expected), attrs


@settings(max_examples=250, deadline=None)
@given(eq_ops, st.lists(events, min_size=1, max_size=6))
def test_memoized_matches_agree_with_direct_evaluation(ops, evs) -> None:
    """With memoization from the first match (`CALM` 0): results are right after every insert
    and delete, also for booleans against 0 and 1 (equal as dict keys, not as values)."""
    import filters.pool.memo as memo_module

    calm = memo_module.CALM
    memo_module.CALM = 0
    try:
        check_ops_against_direct_evaluation(
            ops, evs, (True, 1, 1.0, False, 0), lambda pool, attrs: pool.owners(attrs), set
        )
    finally:
        memo_module.CALM = calm


def test_memo_is_used_once_the_pool_is_calm() -> None:
    """A pool without ranges or residual checks memoizes by its equality attributes' values;
    a change drops the memo, a range predicate keeps it off."""
    import filters.pool.memo as memo_module

    pool = PrimitivePool()
    pool.add(parse_filter('kind = "window" and state = "broken"'), "w")
    pool.add(parse_filter('kind = "temperature"'), "t")
    for _ in range(memo_module.CALM):
        assert pool.owners({"kind": "temperature", "room": "r1"}) == ["t"]
    assert pool._memo is not None and pool._memo_attrs == ("kind", "state")
    assert pool.owners({"kind": "window", "state": "broken"}) == ["w"]
    assert pool.owners({"kind": "window", "state": True}) == []
    assert ("window", "broken") in pool._memo and ("window", (bool, True)) in pool._memo
    pool.add(parse_filter("value > 30"), "hot")
    assert pool._memo is None
    for _ in range(2 * memo_module.CALM):
        assert pool.owners({"kind": "temperature", "value": 31}) in (["t", "hot"], ["hot", "t"])
    assert pool._memo is None  # a range: the values of the equality attributes do not decide


def test_plain_inserts_over_the_memo_attributes_forget_one_key_only() -> None:
    """Auxiliary profiles come and go on every partial match: an equality insert or delete over
    exactly the memoized attributes keeps the memo and forgets the one combination it changes."""
    import filters.pool.memo as memo_module

    pool = PrimitivePool()
    pool.add(parse_filter('kind = "A" and g = 1'), "a1")
    for _ in range(memo_module.CALM):
        assert pool.owners({"kind": "A", "g": 1}) == ["a1"]
    memo = pool._memo
    assert memo is not None and pool._memo_attrs == ("g", "kind")
    assert pool.owners({"kind": "B", "g": 2}) == []  # memoized: nobody
    pool.add(parse_filter('kind = "B" and g = 2'), "b2")
    assert pool._memo is memo
    assert pool.owners({"kind": "B", "g": 2}) == ["b2"]
    assert pool.owners({"kind": "A", "g": 1}) == ["a1"]
    pool.remove(parse_filter('kind = "B" and g = 2'), "b2")
    assert pool._memo is memo
    assert pool.owners({"kind": "B", "g": 2}) == []
    pool.add(parse_filter('kind = "B"'), "b")  # fewer attributes than the memo's: it goes
    assert pool._memo is None
    assert pool.owners({"kind": "B", "g": 2}) == ["b"]


def test_a_prepared_entry_is_indexed_by_revive_and_joins_an_equal_one() -> None:
    pool = PrimitivePool()
    f = parse_filter('kind = "B" and g = 2')
    entry = pool.prepare(f)
    assert len(pool) == 0 and pool.owners({"kind": "B", "g": 2}) == []
    assert pool.revive(entry, "o") is entry
    assert pool.owners({"kind": "B", "g": 2}) == ["o"]
    pool.release(entry, "o")
    assert len(pool) == 0 and pool.owners({"kind": "B", "g": 2}) == []
    assert pool.revive(entry, "p") is entry  # planned once: back in without planning again
    assert pool.owners({"kind": "B", "g": 2}) == ["p"]
    pool.release(entry, "p")
    other = pool.add(parse_filter('kind = "B" and g = 2'), "q")
    assert other is not entry
    assert pool.revive(entry, "r") is other  # an equal filter was added since: its entry
    assert pool.owners({"kind": "B", "g": 2}) == ["q", "r"]


# the memo's ranged domain: equalities plus one range each (a plain threshold filter's shape),
# `or` of them (an entry with two clauses that may both match: the memo must not report it twice)
ranges = st.builds(
    Cmp,
    attr,
    st.sampled_from(["<", "<=", ">", ">="]),
    st.one_of(numbers, st.sampled_from(STRS)),
)
kinds = st.sampled_from(["x", "y", 1])
keyed = st.one_of(  # one schema (`kind`): the memo keeps a range per kind and forgets one kind
    st.builds(lambda k, r: And((Cmp("kind", "=", k), r)), kinds, ranges),
    st.builds(lambda k: Cmp("kind", "=", k), kinds),
)
ranged_filters = st.one_of(
    keyed,
    keyed,
    st.builds(lambda a, v, r: And((Cmp(a, "=", v), r)), attr, scalars, ranges),
    st.builds(
        lambda a, v, b, w, r: And((Cmp(a, "=", v), Cmp(b, "=", w), r)),
        attr,
        scalars,
        attr,
        scalars,
        ranges,
    ),
    st.builds(
        lambda a, v, r, s: Or((And((Cmp(a, "=", v), r)), And((Cmp(a, "=", v), s)))),
        attr,
        scalars,
        ranges,
        ranges,
    ),
)
ranged_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove"]),
        st.one_of(ranged_filters, ranged_filters, eq_filters),
        st.integers(0, 5),
        st.lists(st.tuples(st.sampled_from(["a", "room"]), scalars), max_size=1),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=250, deadline=None)
@given(ranged_ops, st.lists(events, min_size=1, max_size=6), st.sampled_from([1, 3, 1024]))
def test_memoized_ranges_agree_with_direct_evaluation(ops, evs, big) -> None:
    """Equalities with a range are memoized too (the range's thresholds decide, by bisect):
    results are right after every insert and delete, for small and big (SortedKeyList) ranges,
    also for values of the other kind and for booleans (which are not numbers here)."""
    import filters.pool.index as index_module
    import filters.pool.memo as memo_module

    calm, big_was = memo_module.CALM, index_module._BIG
    memo_module.CALM, index_module._BIG = 0, big
    try:
        check_ops_against_direct_evaluation(
            ops,
            evs,
            (True, 1, 2.5, "x", 0),
            lambda pool, attrs: [o for e in pool.match(attrs) for o in e.owners],
            lambda owners: sorted(owners, key=repr),  # a list: an owner reported twice fails
        )
    finally:
        memo_module.CALM, index_module._BIG = calm, big_was


def test_a_threshold_pool_is_memoized_by_its_equality_values() -> None:
    """`kind = "T" and v > t` filters: the memo keeps the range per kind, a match is one bisect;
    a new threshold forgets that kind only."""
    import filters.pool.memo as memo_module

    pool = PrimitivePool()
    for t in range(10):
        pool.add(parse_filter(f'kind = "T" and v > {t}'), f"gt{t}")
    pool.add(parse_filter('kind = "U" and v < 5'), "u")
    for _ in range(memo_module.CALM):
        assert pool.owners({"kind": "T", "v": 2.5}) == ["gt0", "gt1", "gt2"]
    memo = pool._memo
    assert memo is not None and pool._memo_attrs == ("kind",)
    assert isinstance(memo["T"], Range)
    assert pool.owners({"kind": "T", "v": 0}) == []
    assert pool.owners({"kind": "T", "v": True}) == []  # a boolean is not a number
    assert pool.owners({"kind": "U", "v": 1}) == ["u"]
    pool.add(parse_filter('kind = "T" and v > -1'), "gt-1")
    assert pool._memo is memo and "T" not in memo and "U" in memo
    assert pool.owners({"kind": "T", "v": 0}) == ["gt-1"]


def test_booleans_and_numbers_are_memoized_apart() -> None:
    """`flag = true` and `flag = 1` (or `x = 1` and `x = true`) share a dict key (True == 1),
    not a result: the memo keys booleans as the buckets do, and memoizes both."""
    import filters.pool.memo as memo_module

    pool = PrimitivePool()
    filters_ = {
        "flag-true": "flag = true",
        "flag-1": "flag = 1",
        "x-1": "x = 1",
        "x-true": "x = true",
        "x-false": "x = false",
        "x-0": "x = 0",
    }
    for owner, text in filters_.items():
        pool.add(parse_filter(text), owner)
    evs = [
        {"flag": True},
        {"flag": 1},
        {"flag": 1.0},
        {"x": 1},
        {"x": True},
        {"x": False},
        {"x": 0},
        {"x": 0.0},
        {"flag": True, "x": 1},
        {"flag": 1, "x": True},
    ]
    for _ in range(memo_module.CALM):
        pool.owners({"other": 1})
    for _ in range(3):  # the second and third rounds are answered from the memo
        for attrs in evs:
            expected = {o for o, t in filters_.items() if evaluate(parse_filter(t), attrs)}
            assert set(pool.owners(attrs)) == expected, attrs
    memo = pool._memo
    assert memo is not None and pool._memo_attrs == ("flag", "x")
    assert ((bool, True), None) in memo and (1, None) in memo
    assert (None, (bool, True)) in memo and (None, 1) in memo
    assert (None, (bool, False)) in memo and (None, 0) in memo
    assert memo[((bool, True), None)] != memo[(1, None)]


def test_the_memo_pauses_while_nearly_every_look_up_misses() -> None:
    """Unique keys (every event a new `x`): the memo only costs, so it pauses, resumes after
    the pause as it was (kept up to date meanwhile) and stays on for a stream it serves; every
    result equals direct evaluation."""
    import filters.pool.memo as memo_module

    pool = PrimitivePool()
    live: dict[str, str] = {}
    for i in range(50):
        live[f"a{i}"] = f'k = "A" and x = {i}'
    live["z"] = 'k = "Z"'
    for owner, text in live.items():
        pool.add(parse_filter(text), owner)

    parsed = functools.cache(parse_filter)  # ~2,000 events x 51 filters: parsed once each

    def check(attrs: dict[str, Any]) -> None:
        expected = {o for o, t in live.items() if evaluate(parsed(t), attrs)}
        assert set(pool.owners(attrs)) == expected, attrs

    n = 0
    for _ in range(memo_module.CALM + memo_module.TRIAL):  # a new x every event
        check({"k": "A", "x": n})
        n += 1
    assert pool._memo is None and pool._paused is not None  # paused, kept
    kept = pool._paused
    pool.remove(parse_filter('k = "A" and x = 3'), "a3")  # kept up to date while paused
    del live["a3"]
    assert pool._paused is kept
    for _ in range(memo_module.PAUSE - memo_module.CALM):
        check({"k": "A", "x": n})
        n += 1
    assert pool._memo is None
    for _ in range(2 * memo_module.CALM):
        check({"k": "A", "x": n})
        n += 1
    assert pool._memo is kept  # resumed where it was
    for _ in range(2 * memo_module.TRIAL):  # a few keys, over and over: the memo serves them
        for x in (1, 2, 3, 4):
            check({"k": "A", "x": x})
    check({"k": "A", "x": n})  # a miss: the review (at a miss) keeps the memo, pauses reset
    assert pool._memo is kept and pool._pause == memo_module.PAUSE
    pool.add(parse_filter('k = "A" and x = 3'), "a3")
    live["a3"] = 'k = "A" and x = 3'
    check({"k": "A", "x": 3})
    pool.add(parse_filter("x in (1, 2)"), "in")  # not an equality over the memo's attributes
    live["in"] = "x in (1, 2)"
    assert pool._memo is None and pool._paused is None
    for x in range(6):
        check({"k": "A", "x": x})


@settings(max_examples=150, deadline=None)
@given(eq_ops, st.lists(events, min_size=1, max_size=6))
def test_a_paused_memo_agrees_with_direct_evaluation(ops, evs) -> None:
    """The memo pausing after every few look-ups and resuming (kept up to date meanwhile): the
    results stay those of direct evaluation after every insert and delete."""
    import filters.pool.memo as memo_module

    saved = (
        memo_module.CALM,
        memo_module.TRIAL,
        memo_module.MISSES,
        memo_module.PAUSE,
        memo_module.PAUSE_MAX,
    )
    (
        memo_module.CALM,
        memo_module.TRIAL,
        memo_module.MISSES,
        memo_module.PAUSE,
        memo_module.PAUSE_MAX,
    ) = (0, 3, 1, 2, 4)
    try:
        check_ops_against_direct_evaluation(
            ops, evs, (True, 1, 1.0, False, 0), lambda pool, attrs: pool.owners(attrs), set
        )
    finally:
        (
            memo_module.CALM,
            memo_module.TRIAL,
            memo_module.MISSES,
            memo_module.PAUSE,
            memo_module.PAUSE_MAX,
        ) = saved
