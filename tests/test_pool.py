"""The primitive pool returns exactly what evaluating every filter directly returns."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from filters.compile import compile_filter, evaluate
from filters.pool import PrimitivePool
from profiles.ast import And, Cmp
from profiles.parser import parse_filter
from tests.strategies import events, filters, scalars


@settings(max_examples=400, deadline=None)
@given(filters, events)
def test_compiled_filter_agrees_with_direct_evaluation(f, attrs) -> None:
    assert compile_filter(f)(attrs) == evaluate(f, attrs)


ops = st.lists(
    st.tuples(st.sampled_from(["add", "add", "add", "remove"]), filters, st.integers(0, 5),
              st.lists(st.tuples(st.sampled_from(["a", "room"]), scalars), max_size=2)),
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
