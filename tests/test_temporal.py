"""The temporal pool's lanes fire exactly what one sorted list would, in the same order."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.temporal import CLOCK, TIMER, TemporalPool

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

# one operation: ("add", kind, dt) | ("lane", lane, dt) | ("discard", pick, ordered)
# | ("pop", dt, inclusive) | ("pickle",); dt is relative to the current time, so lanes get
# deadlines mostly in order, sometimes not (a late event)
_ops = st.one_of(
    st.tuples(st.just("add"), st.sampled_from([CLOCK, TIMER]), st.integers(-2, 12)),
    st.tuples(st.just("lane"), st.sampled_from([5, 10]), st.integers(-1, 12)),
    st.tuples(st.just("discard"), st.integers(0, 10_000), st.booleans()),
    st.tuples(st.just("pop"), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("pickle")),
)


class _Reference:
    """The pool as it was before lanes: one sorted list of (deadline, kind, tie, payload)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, int, int, Any]] = []

    def add(self, item: tuple[float, int, int, Any]) -> None:
        self.items.append(item)
        self.items.sort(key=lambda h: h[:3])

    def discard(self, item: tuple[float, int, int, Any]) -> None:
        self.items = [h for h in self.items if h[2] != item[2]]

    def pop_due(self, now: float, inclusive: bool) -> tuple[float, int, int, Any] | None:
        if not self.items:
            return None
        when, kind = self.items[0][:2]
        if when < now or (when == now and (inclusive or kind == CLOCK)):
            return self.items.pop(0)
        return None


@settings(max_examples=300, deadline=None)
@given(st.lists(_ops, max_size=80))
def test_lanes_fire_as_one_sorted_list(ops: list[tuple[Any, ...]]) -> None:
    pool, ref = TemporalPool(), _Reference()
    handles: list[tuple[Any, ...]] = []
    now = 0.0
    for op in ops:
        if op[0] == "add":
            h = pool.add(now + op[2], op[1], f"p{len(handles)}")
            handles.append((h, None))
            ref.add(h)
        elif op[0] == "lane":
            h = pool.add_ordered(op[1], now + op[2], f"p{len(handles)}")
            assert h[1] == TIMER
            handles.append((h, op[1]))
            ref.add(h)
        elif op[0] == "discard" and handles:
            h, lane = handles[op[1] % len(handles)]  # may have fired or been discarded already
            if op[2] and lane is not None:
                pool.discard_ordered(lane, h)
            else:
                pool.discard(h)
            ref.discard(h)
        elif op[0] == "pop":
            now += op[1]
            while True:
                got, want = pool.pop_due(now, op[2]), ref.pop_due(now, op[2])
                assert got == want
                if got is None:
                    break
        elif op[0] == "pickle":
            # as a snapshot does: the handles (held by partial matches) with the pool; the
            # lanes' entries come back in the sorted list, `discard_ordered` finds them there
            pool, handles = pickle.loads(pickle.dumps((pool, handles)))
        assert len(pool) == len(ref.items)
        assert pool.head == (ref.items[0][0] if ref.items else float("inf"))
    rest = []
    while (h := pool.pop_due(1e18, True)) is not None:
        rest.append(h)
    assert rest == ref.items


def test_a_snapshot_stores_the_lanes_in_the_sorted_list() -> None:
    pool = TemporalPool()
    pool.add_ordered(10, 10.0, "a")
    pool.add_ordered(10, 12.0, "b")
    pool.add(11.0, TIMER, "c")
    _, slots = pool.__getstate__()
    assert [h[3] for h in slots["_items"]] == ["a", "c", "b"]  # the stored format is unchanged
    back = pickle.loads(pickle.dumps(pool))
    assert [back.pop_due(20.0, False)[3] for _ in range(3)] == ["a", "c", "b"]
