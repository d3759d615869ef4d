"""The per-gateway watermark buffer (adapters.service.watermarks), without Redis or clocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.service.watermarks import Held, Watermarks

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


def released(w: Watermarks, now: float, floor: float = float("-inf")) -> list[str]:
    return [h.item for h in w.release(now, floor)]


def add(w: Watermarks, source: str, ts: float, wall: float, item: str) -> None:
    w.observe(source, ts, wall)
    w.hold(source, ts, wall, item)


@st.composite
def in_order_sources(draw: st.DrawFn) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Sources with a lateness each, whose events are at most that much out of ts order,
    interleaved in an arbitrary arrival order; every source speaks first."""
    n = draw(st.integers(1, 4))
    lateness = {f"g{i}": draw(st.sampled_from([0.0, 0.5, 2.0])) for i in range(n)}
    queues: dict[str, list[float]] = {}
    for g, late in lateness.items():
        ts = sorted(draw(st.lists(st.integers(0, 40), max_size=15)))
        # arrival order = ts plus a delay below the lateness: a later arrival is never older
        # than the newest earlier one minus the lateness
        jitter = [draw(st.floats(0, late * 0.99)) if late else 0.0 for _ in ts]
        arrive = sorted(range(len(ts)), key=lambda k: (ts[k] + jitter[k], k))
        queues[g] = [float(ts[k]) for k in arrive]
    order = draw(st.permutations([g for g, q in queues.items() for _ in q]))
    # each source speaks first with an event older than all (a source is not waited for
    # before it has spoken: until then it is idle)
    arrivals = [(g, -1.0) for g in lateness] + [(g, queues[g].pop(0)) for g in order]
    return lateness, arrivals


@settings(max_examples=300, deadline=None)
@given(in_order_sources())
def test_release_order_is_the_ts_sorted_stream(
    case: tuple[dict[str, float], list[tuple[str, float]]],
) -> None:
    lateness, arrivals = case
    w = Watermarks(default_lateness=0.0, idle_timeout=10.0, max_held=10**6)
    for g, late in lateness.items():
        w.set_lateness(g, late)
    out: list[str] = []
    for i, (g, ts) in enumerate(arrivals):
        add(w, g, ts, 0.0, f"{i}")
        out += released(w, 0.0)
    out += released(w, 100.0)  # every source idle: the rest goes
    want = [f"{i}" for i, _ in sorted(enumerate(arrivals), key=lambda x: (x[1][1], x[0]))]
    assert out == want
    assert not w.heap


def test_in_order_source_with_lateness_0_holds_nothing_alone() -> None:
    w = Watermarks(default_lateness=2.0, idle_timeout=0.5, max_held=100)
    w.set_lateness("a", 0.0)
    add(w, "a", 10.0, 0.0, "a1")
    assert released(w, 0.0) == ["a1"]
    w.set_lateness("b", None)  # the default: 2 s
    add(w, "b", 11.0, 0.1, "b1")
    add(w, "a", 12.0, 0.1, "a2")
    assert released(w, 0.1) == []  # b's watermark is 9
    add(w, "b", 14.0, 0.2, "b2")
    assert released(w, 0.2) == ["b1", "a2"]  # b's watermark is 12


def test_idle_source_stops_holding_the_others_back() -> None:
    w = Watermarks(default_lateness=0.0, idle_timeout=0.5, max_held=100)
    add(w, "quiet", 5.0, 0.0, "q1")
    add(w, "busy", 6.0, 0.0, "b1")
    assert released(w, 0.0) == ["q1"]  # b1 waits for quiet's watermark (5)
    add(w, "busy", 7.0, 0.3, "b2")
    assert released(w, 0.3) == []
    assert w.active(0.6) == ["busy"]
    assert released(w, 0.6) == ["b1", "b2"]  # quiet is idle
    add(w, "busy", 8.0, 0.7, "b3")
    assert released(w, 0.7) == ["b3"]
    add(w, "quiet", 9.0, 0.8, "q2")  # it speaks again and holds the others from now on
    add(w, "busy", 10.0, 0.8, "b4")
    assert released(w, 0.8) == ["q2"]


def test_cap_and_floor_release_early() -> None:
    w = Watermarks(default_lateness=5.0, idle_timeout=10.0, max_held=2)
    for i in range(4):
        add(w, "a", float(i), 0.0, f"e{i}")
    assert released(w, 0.0) == ["e0", "e1"]  # beyond the cap, oldest first
    assert released(w, 0.0, floor=2.0) == ["e2"]
    assert w.max_active_lateness(0.0) == 5.0
    w.set_lateness("a", 7.0)
    assert w.max_active_lateness(0.0) == 7.0 and w.max_active_lateness(20.0) == 5.0


def test_state_round_trip_keeps_progress_and_held_events() -> None:
    w = Watermarks(default_lateness=1.0, idle_timeout=10.0, max_held=100)
    add(w, "a", 10.0, 3.0, "x")
    add(w, "b", 20.0, 4.0, "y")
    w2 = Watermarks(default_lateness=1.0, idle_timeout=10.0, max_held=100)
    w2.restore(w.state(), [Held(*h) for h in w.heap])
    assert w2.watermark(5.0) == w.watermark(5.0) == 9.0
    assert w2.hold("a", 8.5, 5.0, "z").seq == 3  # numbering goes on
    assert released(w2, 5.0) == ["z"]
