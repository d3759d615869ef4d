"""Engine properties beyond the conformance cases: bounded state, API, snapshots, explain."""

from __future__ import annotations

import random

import pytest

from filters.engine import Engine
from filters.interface import DetectionEngine
from filters.notification import Notification
from filters.twostep.engine import TwoStepEngine
from profiles.events import Event
from profiles.parser import parse_profile

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


@pytest.mark.slow  # a scale test: a million events (~10 s alone)
def test_a_million_events_keep_state_bounded_by_the_window() -> None:
    """1,000,000 events through a windowed `each` profile: live state follows the window, not the stream."""
    profile = parse_profile(
        'seq(a: k = "A", not x: k = "X", b: k = "B") within 10s per sensor '
        "where b.v > a.v select each consume shared",
        "p",
    )
    eng = Engine([profile])
    rng = random.Random(3)
    kinds = ["A", "B", "X", "Y"]
    rate = 20.0  # events per second of event time, over 8 sensors
    max_pms = max_timers = max_pool = 0
    notes = 0
    for i in range(1_000_000):
        eng.process(
            Event(
                f"e{i}",
                i / rate,
                {"k": rng.choice(kinds), "sensor": i % 8, "v": rng.randrange(100)},
            )
        )
        if i % 5000 == 0:
            st = eng.stats()
            max_pms = max(max_pms, st["partial_matches"])
            max_timers = max(max_timers, st["timers"])
            max_pool = max(max_pool, st["pool_filters"])
            notes += len(eng.take_notifications())
    notes += len(eng.take_notifications())
    # at most one PM per A event inside one window (10 s x 20/s x 1/4 A's = 50), plus slack
    assert max_pms <= 80, max_pms
    # one terminator per A event of the last window (those of completed or killed PMs stay
    # until their deadline and fire as no-ops) plus one clean-up per sensor partition
    assert max_timers <= 80 + 8, max_timers
    assert max_pool <= 1 + 8 * 2  # the start filter + per sensor: B and X auxiliaries
    assert notes > 10_000  # it did match all along
    # past the last window: the default variant (references) keeps an emptied partition's
    # auxiliary profiles, for its next partial match, until its last partial match's window ends
    eng.finish(eng.now + 10)
    st = eng.stats()
    assert st["partial_matches"] == 0 and st["timers"] == 0 and st["partitions"] == 0
    assert st["pool_filters"] == 1  # only the permanent start filter remains


def _events(spec: str) -> list[Event]:
    out = []
    for i, item in enumerate(spec.split()):
        k, ts = item.split("@")
        out.append(Event(f"{k.lower()}{i}", float(ts), {"k": k}))
    return out


def test_auxiliary_profiles_come_and_go_with_partial_matches() -> None:
    """`dynamic`: an auxiliary profile is in the pool exactly while a partial match waits for it."""
    eng = Engine(
        [parse_profile('seq(a: k = "A", b: k = "B", c: k = "C") within 10s per r', "p")],
        variant="dynamic",
    )
    assert eng.stats()["pool_filters"] == 1  # only the starting component
    eng.process(Event("a1", 0, {"k": "A", "r": 1}))
    st = eng.stats()
    assert st["pool_filters"] == 2 and st["timers"] == 1  # auxiliary b for r=1, and its terminator
    aux = [e for e in eng.pool.entries() if e.eqs]
    assert aux and aux[0].eqs == (("r", 1),)  # the partition value is an indexed predicate
    eng.process(Event("b1", 1, {"k": "B", "r": 1}))
    assert {e.filter.value for e in eng.pool.entries() if e.eqs} == {"C"}
    eng.process(Event("c1", 2, {"k": "C", "r": 1}))
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [
        {"a": "a1", "b": "b1", "c": "c1"}
    ]
    st = eng.stats()
    assert st["pool_filters"] == 1 and st["partial_matches"] == 0
    assert st["timers"] == 1  # the completed PM's terminator: left to fire as a no-op at ts 10
    eng.advance(10.5)
    assert eng.stats()["timers"] == 0 and eng.take_notifications() == []


def test_references_keep_auxiliary_profiles_and_drop_dormant_owners() -> None:
    """The default variant: a completed match leaves its auxiliary profile indexed and owned
    (the next partial match takes it back without indexing it again); the first event that
    reaches it while nobody waits takes the owner off; when the window of the partition's last
    partial match ends, the entry goes (that match's terminator, left in the temporal pool,
    lets it go: no clean-up timer per completion)."""
    eng = Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s per r', "p")])
    assert eng.variant == Engine.DEFAULT_VARIANT == "references"
    eng.process(Event("a1", 0, {"k": "A", "r": 1}))
    eng.process(Event("b1", 1, {"k": "B", "r": 1}))
    [aux] = [e for e in eng.pool.entries() if e.eqs]
    assert aux.owners  # dormant: nobody waits, the owner stays
    eng.process(Event("a2", 2, {"k": "A", "r": 1}))
    assert [e for e in eng.pool.entries() if e.eqs] == [
        aux
    ] and aux.owners  # taken back, same entry
    eng.process(Event("b2", 3, {"k": "B", "r": 1}))
    eng.process(Event("b3", 4, {"k": "B", "r": 1}))  # nobody waits: reaches the profile once
    assert not aux.owners and aux.indexed
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [
        {"a": "a1", "b": "b1"},
        {"a": "a2", "b": "b2"},
    ]
    st = eng.stats()
    assert (
        st["partitions"] == 1 and st["timers"] == 2
    )  # the terminators of a1's (ts 10) and a2's (ts 12) matches
    eng.advance(11)  # a1's terminator: the partition is idle, but a2's window is still open
    assert eng.stats()["partitions"] == 1
    assert eng.stats()["timers"] == 1
    eng.advance(12.5)
    st = eng.stats()
    assert (
        st["pool_filters"] == 1
        and st["pool_owners"] == 1
        and st["partitions"] == 0
        and st["timers"] == 0
    )


@pytest.mark.parametrize("variant", ["dynamic", "marking", "references"])
def test_events_not_awaited_never_reach_the_profile(variant: str) -> None:
    """Single step: a B with no waiting A is filtered out by the pool itself. `dynamic` and
    `marking` insert the auxiliary profile with the first A; `references` has it indexed,
    ownerless, from the start (a partial match adds its owner): it reaches nobody."""
    eng = Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")], variant=variant)
    if variant == "references":
        [aux] = eng.pool.match({"k": "B"})
        assert not aux.owners
    else:
        assert eng.pool.match({"k": "B"}) == []
    assert eng.pool.owners({"k": "B"}) == []
    eng.process(Event("b0", 0, {"k": "B"}))
    eng.process(Event("a1", 1, {"k": "A"}))
    assert eng.pool.owners({"k": "B"}) == [(0, 1)]
    eng.process(Event("b1", 2, {"k": "B"}))
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [{"a": "a1", "b": "b1"}]
    eng.remove_profile("p")
    assert len(eng.pool) == 0  # the profile's auxiliary profiles go with it


@pytest.mark.parametrize("variant", Engine.VARIANTS)
def test_a_once_profile_waiting_for_its_last_component_leaves_its_start_out_of_the_pool(
    variant: str,
) -> None:
    """`once`, `select first`, no window, `per` or negation: its first partial match can only
    end by completing, which retires the profile, so a later A could do nothing for it. Its
    starting entry leaves the pool when the match opens (a repeated A reaches no profile); the
    notifications are those of the two-step engine, which keeps every start registered."""
    from filters.twostep.engine import TwoStepEngine

    text = 'seq(a: k = "A" and x = 1, b: k = "B") once'
    eng = Engine([parse_profile(text, "p")], variant=variant)
    assert eng.pool.owners({"k": "A", "x": 1}) == [(0, 0)]
    stream = [
        Event("a1", 1, {"k": "A", "x": 1}),
        Event("a2", 2, {"k": "A", "x": 1}),
        Event("b1", 3, {"k": "B"}),
        Event("a3", 4, {"k": "A", "x": 1}),
        Event("b2", 5, {"k": "B"}),
    ]
    eng.process(stream[0])
    assert eng.pool.owners({"k": "A", "x": 1}) == []  # the start is not awaited any more
    assert eng.pool.owners({"k": "B"}) == [(0, 1)]
    two = TwoStepEngine([parse_profile(text, "p")])
    for ev in stream[1:]:
        eng.process(ev)
    for ev in stream:
        two.process(ev)
    got = [n.to_json() for n in eng.take_notifications()]
    assert got == [n.to_json() for n in two.take_notifications()]
    assert got == [{"profile": "p", "ts": 3.0, "events": {"a": "a1", "b": "b1"}}]
    assert len(eng.pool) == 0 and eng.stats()["profiles"] == 0


@pytest.mark.parametrize(
    "tail",
    [
        " within 2s once",  # its match can expire: a later A opens the next one
        " once per r",  # another partition's A opens its own
        " select last once",  # a later A replaces the bound one
        " within 10s select each once",  # every A opens a match
        " select nth 2 once",  # the A counts
        "",  # not `once`: the next match after a completion
    ],
)
def test_a_profile_whose_later_starts_still_count_keeps_them_in_the_pool(tail: str) -> None:
    text = 'seq(a: k = "A", b: k = "B")' + tail
    eng = Engine([parse_profile(text, "p")])
    eng.process(Event("a1", 1, {"k": "A", "r": 1}))
    assert eng.pool.owners({"k": "A", "r": 1}) == [(0, 0)]


def test_a_negation_keeps_the_start_of_a_once_profile_in_the_pool() -> None:
    """A negation can kill the waiting match: the next A must open a new one."""
    eng = Engine([parse_profile('seq(a: k = "A", not x: k = "X", b: k = "B") once', "p")])
    for i, k in enumerate("AXAB"):
        eng.process(Event(f"{k.lower()}{i}", float(i), {"k": k}))
        assert eng.pool.owners({"k": "A"}) == ([(0, 0)] if i < 3 else [])
    got = [n.to_json()["events"] for n in eng.take_notifications()]
    assert got == [{"a": "a2", "b": "b3"}]


def test_where_equality_becomes_an_indexed_predicate() -> None:
    eng = Engine(
        [parse_profile('seq(a: k = "A", b: k = "B") within 10s where b.room = a.room', "p")]
    )
    eng.process(Event("a1", 0, {"k": "A", "room": "101"}))
    aux = [e for e in eng.pool.entries() if e.eqs]
    assert aux[0].eqs == (("room", "101"),)
    eng.process(Event("b0", 1, {"k": "B", "room": "102"}))
    eng.process(Event("b1", 2, {"k": "B", "room": "101"}))
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [{"a": "a1", "b": "b1"}]


def test_add_and_remove_profiles_while_running() -> None:
    eng = Engine()
    eng.process(Event("x", 0, {"k": "A"}))
    eng.add_profile(parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p"))
    eng.process(Event("a1", 1, {"k": "A"}))
    eng.remove_profile("p")
    eng.process(Event("b1", 2, {"k": "B"}))
    assert eng.take_notifications() == []
    st = eng.stats()
    assert st["pool_filters"] == 0 and st["timers"] == 0 and st["partial_matches"] == 0


def test_snapshot_restores_partial_matches_timers_and_pool() -> None:
    profiles = [
        parse_profile('seq(a: k = "A", not x: k = "X") within 10s per r', "trail"),
        parse_profile('seq(a: k = "A", b: k = "B") within 10s select each per r', "each"),
        parse_profile("absent(true) within 5s per r", "silent"),
        parse_profile('seq(n: clock("00:01"), a: k = "A") within 1h', "clock"),
    ]
    stream = [Event(f"e{i}", float(i), {"k": k, "r": i % 2}) for i, k in enumerate("AABXABBAXB")]
    ref = Engine(profiles)
    for ev in stream:
        ref.process(ev)
    ref.finish(200.0)
    expected = [n.to_json() for n in ref.take_notifications()]
    eng = Engine(profiles)
    for ev in stream[:5]:
        eng.process(ev)
    got = [n.to_json() for n in eng.take_notifications()]
    eng = Engine.restore(eng.snapshot())
    for ev in stream[5:]:
        eng.process(ev)
    eng.finish(200.0)
    got += [n.to_json() for n in eng.take_notifications()]
    assert got == expected and len(expected) > 3


def test_late_event_is_processed_not_dropped() -> None:
    eng = Engine([parse_profile('k = "A"', "f")])
    eng.process(Event("a2", 10, {"k": "A"}))
    eng.process(Event("a1", 5, {"k": "A"}))
    assert [n.to_json()["events"]["e"] for n in eng.take_notifications()] == ["a2", "a1"]


def test_temporal_pool_head_survives_pickling_and_old_snapshots() -> None:
    """`head` (the earliest deadline every event checks) is derived, so it is rebuilt on load,
    also from snapshots written before it existed (no `head` in their state)."""
    import itertools
    import pickle

    from sortedcontainers import SortedList

    from filters.temporal import TIMER, TemporalPool

    pool = TemporalPool()
    assert pool.head == float("inf") and not pool.due(1e18)
    h5 = pool.add(5.0, TIMER, "five")
    pool.add(9.0, TIMER, "nine")
    pool.add(7.0, TIMER, "seven")
    assert pool.head == 5.0
    pool.discard(h5)
    assert pool.head == 7.0
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.head == 7.0 and copy.pop_due(8.0, False)[3] == "seven" and copy.head == 9.0
    old = TemporalPool.__new__(TemporalPool)
    old.__setstate__(
        (None, {"_items": SortedList([(3.0, TIMER, 0, "x")]), "_tie": itertools.count(1)})
    )
    assert old.head == 3.0 and old.due(3.0) and not old.due(2.9)
    assert old.pop_due(3.0, True)[3] == "x" and old.head == float("inf")


@pytest.mark.parametrize("variant", ["references", "marking"])
@pytest.mark.parametrize(
    ("expr", "events"),
    [
        # completed, then idle
        ('seq(a: k = "A", b: k = "B") within 10s per r', "A@0 B@1"),
        # expired
        ('seq(a: k = "A", b: k = "B") within 10s per r', "A@0"),
        # killed by a negation
        ('seq(a: k = "A", not x: k = "X", b: k = "B") within 10s per r', "A@0 X@1"),
        # a nested window moved the terminator earlier than the outer one, then completed
        ('seq(a: k = "A", seq(b: k = "B", c: k = "C") within 2s) within 1h per r', "A@0 B@5 C@6"),
        # consumed by another match's completion (each/unique), two PMs
        ('seq(a: k = "A", b: k = "B") within 10s per r select each', "A@0 A@1 B@2"),
        # no window at all
        ('seq(a: k = "A", b: k = "B") per r', "A@0 B@1"),
    ],
)
def test_an_idle_partition_lets_its_auxiliary_profiles_go(
    variant: str, expr: str, events: str
) -> None:
    """Whatever ended a partition's last partial match, its auxiliary profiles (kept for the
    next one under marking/references) leave the pool once that match's window is over."""
    eng = Engine([parse_profile(expr, "p")], variant=variant)
    base = eng.stats()["pool_filters"]
    for ev in _events(events):
        ev.attrs["r"] = 1
        eng.process(ev)
    assert eng.stats()["partitions"] == 1  # still there: for its next partial match
    eng.process(Event("other", 3601, {"k": "Y", "r": 2}))  # time passes: every window is over
    eng.process(Event("other2", 3602, {"k": "Y", "r": 2}))
    st = eng.stats()
    assert st["partitions"] == 0 and st["partial_matches"] == 0 and st["timers"] == 0, st
    assert st["pool_filters"] == base


def test_plain_filters_matched_together_report_in_profile_order() -> None:
    """The reporting fast path (every matched filter a plain one) keeps the general path's output:
    profile order, `once` profiles and removed profiles included, the same as the two-step engine."""
    from filters.twostep.engine import TwoStepEngine

    texts = ["v > 5", "v > 1", 'v > 3 and kind = "t"', "v > 2 once", "v > 4"]
    profiles = [parse_profile(t, f"f{i}") for i, t in enumerate(texts)]
    events = [
        Event(f"e{i}", float(i), {"kind": "t", "v": v}) for i, v in enumerate([6, 0, 4, 6, 2.5])
    ]
    outs = []
    for eng in (Engine(profiles), TwoStepEngine(profiles)):
        got = []
        for ev in events:
            if ev.id == "e3":
                eng.remove_profile("f4")
            eng.process(ev)
            got.append([(n.profile, n.seq) for n in eng.take_notifications()])
        outs.append(got)
    assert outs[0] == outs[1]
    assert [p for p, _ in outs[0][0]] == ["f0", "f1", "f2", "f3", "f4"]
    assert [p for p, _ in outs[0][3]] == ["f0", "f1", "f2"]  # f3 fired once, f4 removed


def test_both_engines_take_their_temporal_pool_and_say_what_is_pending() -> None:
    from filters.temporal import TemporalPool
    from filters.twostep.engine import TwoStepEngine

    profile = parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")
    for make in (Engine, TwoStepEngine):
        timers = TemporalPool()
        eng = make([profile], timers=timers)
        eng.process(Event("a1", 0.0, {"k": "A"}))
        assert eng.timers is timers and len(timers) == 1  # the terminator went into the given pool
        assert eng.pending() == 0
        eng.process(Event("b1", 5.0, {"k": "B"}))
        assert eng.pending() == 1
        assert [n.profile for n in eng.take_notifications()] == ["p"]
        assert eng.pending() == 0


def test_both_engines_append_to_a_given_output_list_until_notifications_are_taken() -> None:
    from filters.twostep.engine import TwoStepEngine

    profile = parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")
    for make in (Engine, TwoStepEngine):
        eng = make([profile])
        out: list = []
        eng.collect_into(out)
        eng.process(Event("a1", 0.0, {"k": "A"}))
        eng.process(Event("b1", 5.0, {"k": "B"}))
        assert [n.events["b"].id for n in out] == ["b1"] and eng.pending() == 1
        assert eng.take_notifications() is out
        eng.process(Event("a2", 6.0, {"k": "A"}))
        eng.process(Event("b2", 7.0, {"k": "B"}))
        assert len(out) == 1  # a new list after the take
        assert [n.events["b"].id for n in eng.take_notifications()] == ["b2"]


@pytest.mark.parametrize("variant", Engine.VARIANTS)
def test_select_last_negation_log_stays_bounded_without_a_window(variant: str) -> None:
    """`select last` keeps the between-negation events a PM saw, to check replacements (§4.1
    item 1); without a window the PM lives on, yet repeated events of one negation without
    `where` in one gap are kept once, and the replacement stays refused."""
    from filters.twostep.engine import TwoStepEngine

    p = parse_profile('seq(a: k = "A", not x: k = "X", b: k = "B", c: k = "C") select last', "p")
    engines = [Engine([p], variant=variant), TwoStepEngine([p])]
    evs = [Event("a1", 0.0, {"k": "A"}), Event("b1", 1.0, {"k": "B"})]
    evs += [Event(f"x{i}", 2.0 + i, {"k": "X"}) for i in range(1000)]
    evs += [Event("b2", 2000.0, {"k": "B"}), Event("c1", 2001.0, {"k": "C"})]
    for eng in engines:
        for ev in evs:
            eng.process(ev)
        assert [n.to_json()["events"] for n in eng.take_notifications()] == [
            {"a": "a1", "b": "b1", "c": "c1"}
        ]
    eng = Engine([p], variant=variant)
    for ev in evs[:-2]:
        eng.process(ev)
    (pm,) = eng._by_id["p"].parts[()].pms
    assert len(pm.nlog) == 1  # x0 only: x1 .. x999 lie in the same gap
    two = TwoStepEngine([p])
    for ev in evs[:-2]:
        two.process(ev)
    (tpm,) = two._by_id["p"].parts[()].pms
    assert len(tpm.seen) == 1


@pytest.mark.parametrize("variant", ["dynamic", "marking", "references"])
def test_between_negation_fast_path_matches_the_general_path(variant: str) -> None:
    """`select first` with a between-negation runs on the fast path (`_fast_negate`); a tracer
    sends every event through the general path instead. Both must report the same matches,
    also for events that are a component and a negation at once (`v` makes `not x` overlap
    `a` and `b`) and with `per`."""
    exprs = [
        'seq(a: k = "A", not x: v > 5, b: k = "B") within 10s',
        'seq(a: k = "A", not x: v > 5, b: k = "B") within 10s select first consume shared',
        'seq(a: k = "A", not x: k = "X", b: k = "B", c: k = "C") within 20s per g',
        'seq(a: k = "A", not x: k = "X", b: k = "B") within 10s per g once',
    ]
    rng = random.Random(5)
    events = [
        Event(
            f"e{i}",
            float(i),
            {"k": rng.choice("ABCX"), "v": rng.randint(0, 9), "g": rng.randint(0, 2)},
        )
        for i in range(600)
    ]

    def run(trace: bool) -> list[tuple[str, float, tuple[tuple[str, str], ...]]]:
        eng = Engine([parse_profile(e, f"p{n}") for n, e in enumerate(exprs)], variant=variant)
        if trace:
            eng.tracer = lambda *_: None
        out = []
        for ev in events:
            eng.process(ev)
            out += eng.take_notifications()
        eng.finish()
        out += eng.take_notifications()
        return [
            (n.profile, n.ts, tuple(sorted((k, e.id) for k, e in n.events.items()))) for n in out
        ]

    fast = run(trace=False)
    assert len(fast) > 20
    assert fast == run(trace=True)


@pytest.mark.parametrize("variant", ["dynamic", "marking", "references"])
def test_matches_leave_no_reference_cycles_for_the_collector(variant: str) -> None:
    """A completed PM's terminator stays in the temporal pool as a no-op until its deadline;
    if the PM still pointed at it, every completion would leave a cycle (PM, terminator,
    payload) that only the cyclic collector frees, which costs a busy site collections."""
    import gc

    from filters.eager.matches import PartialMatch, Partition

    exprs = [
        'seq(a: k = "A" and x = 1, b: k = "B" and x = 1) within 10s',
        'seq(a: k = "A", b: k = "B") within 10s per x',
        'seq(a: k = "A", not n: k = "N", b: k = "B") within 10s per x once',
    ]
    rng = random.Random(3)
    events = [
        Event(f"e{i}", float(i), {"k": rng.choice("ABN"), "x": rng.randint(1, 3)})
        for i in range(300)
    ]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        eng = Engine([parse_profile(e, f"p{n}") for n, e in enumerate(exprs)], variant=variant)
        notes = 0
        for ev in events:
            eng.process(ev)
            notes += len(eng.take_notifications())
        eng.finish()
        assert notes > 20
        gc.collect()  # the engine is alive: what is collected had left it
        cyclic = [o for o in gc.garbage if isinstance(o, (PartialMatch, Partition))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []


def test_a_profile_is_compiled_once_and_equal_leaf_filters_are_one_object() -> None:
    """Engines and restores over the same `Profile` share its pattern (restores are ~5x
    faster, docs/state.md); the compiled pattern is not part of the profile's value."""
    import pickle

    from filters.pattern import Pattern

    p = parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")
    q = parse_profile('seq(x: k = "A", y: k = "C") within 5s', "q")
    assert p.compiled is None
    Engine([p, q])
    assert p.compiled is Pattern.build(p) and Pattern.build(p) is Pattern.build(p)
    assert Pattern.build(p).leaves[0].filter is Pattern.build(q).leaves[0].filter
    again = pickle.loads(pickle.dumps(p))
    assert again == p and hash(again) == hash(p) and again.compiled is None
    assert "compiled" not in repr(p)
    # two engines over one profile: the shared pattern changes nothing in either's output
    evs = [Event(f"e{i}", float(i), {"k": k}) for i, k in enumerate("ABCAB")]
    outs = []
    for variant in Engine.VARIANTS:
        eng = Engine([p, q], variant=variant)
        for ev in evs:
            eng.process(ev)
        eng.finish()
        outs.append([n.to_json() for n in eng.take_notifications()])
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 3


@pytest.mark.parametrize(
    "tail",
    ["", " select last", " per g", " select last per g", " once", " consume shared"],
)
def test_busy_composite_handlers_keep_the_notifications(tail: str) -> None:
    """An entry with one owner that keeps receiving events gets the composite's `sink` (the
    engine's per-leaf handler): the notifications stay those of the general dispatch (a tracer
    turns the handlers off) and of the two-step engine, across opens, duplicates, completions,
    dormant auxiliary profiles and expiries; a snapshot taken midway restores and goes on."""
    from filters.twostep.engine import TwoStepEngine

    texts = [
        f'seq(a: k = "A" and x = {i}, b: k = "B" and x = {i}, c: k = "C" and x = {i}) within 20s'
        for i in range(3)
    ] + [
        'seq(a: k = "A" and x = 9, b: k = "B" and x = 9) within 5s',
        'all(a: k = "A" and x = 8, b: k = "B" and x = 8) within 5s',
    ]
    profiles = [parse_profile(t + tail, f"p{i}") for i, t in enumerate(texts)]
    rng = random.Random(7)
    events = [
        Event(
            f"e{t}",
            float(t),
            {"k": rng.choice("ABC"), "x": rng.choice([0, 1, 2, 8, 9]), "g": t % 2},
        )
        for t in range(600)
    ]

    def run(eng: object, trace: bool = False, snap_at: int = -1) -> list[tuple[str, float, tuple]]:
        if trace:
            eng.tracer = lambda *a: None  # type: ignore[attr-defined]
        out = []
        for t, ev in enumerate(events):
            if t == snap_at:
                eng = Engine.restore(eng.snapshot())  # type: ignore[attr-defined]
            eng.process(ev)  # type: ignore[attr-defined]
            out += [
                (n.profile, n.ts, tuple(e.id for e in n.events.values()))
                for n in eng.take_notifications()  # type: ignore[attr-defined]
            ]
        return out

    eng = Engine(profiles)
    fast = run(eng)
    made = any(callable(e.solo) for e in eng.pool.entries())
    assert made or tail == " once", "no handler was made"  # (`once` profiles left early)
    assert fast == run(Engine(profiles), trace=True)
    assert fast == run(TwoStepEngine(profiles))
    assert fast == run(Engine(profiles), snap_at=300)
    assert fast


@pytest.mark.parametrize("make", [Engine, TwoStepEngine], ids=["single-step", "two-step"])
def test_both_engines_implement_the_public_interface(make: type) -> None:
    """`filters.interface.DetectionEngine`: what `ens replay --engine` and the benches swap."""
    eng = make([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")])
    assert isinstance(eng, DetectionEngine)
    out: list[Notification] = []
    eng.collect_into(out)  # (instrumentation: notifications go to the caller's list)
    eng.process(Event("a1", 0, {"k": "A"}))
    eng.process(Event("b1", 1, {"k": "B"}))
    assert eng.pending() == 1 and [n.profile for n in out] == ["p"]
    assert eng.take_notifications() is out and eng.pending() == 0
    eng.add_profile(parse_profile('k = "C"', "q"))
    assert [p.id for p in eng.profiles] == ["p", "q"]
    eng.remove_profile("p")
    eng.process(Event("c1", 2, {"k": "C"}))
    eng.finish(30)
    assert [(n.profile, n.seq) for n in eng.take_notifications()] == [("q", 2)]
    assert eng.now == 30 and eng.stats()["profiles"] == 1


@pytest.mark.parametrize("variant", ["dynamic", "marking", "references"])
@pytest.mark.parametrize("tail", ["once", "per r once", "within 10s where b.r = a.r once"])
def test_a_reported_once_profile_leaves_nothing_in_the_pools(variant: str, tail: str) -> None:
    """A `once` profile's completion releases its registrations for good (`_retire`), then the
    profile goes: nothing of it stays in the primitive pool, whichever the variant."""
    profiles = [
        parse_profile(f'seq(a: k = "A" and x = {i}, b: k = "B") {tail}', f"p{i}") for i in range(3)
    ]
    eng = Engine(profiles, variant=variant)
    for t, (k, x) in enumerate([("A", 0), ("A", 1), ("B", 9), ("A", 2), ("B", 9), ("B", 9)]):
        eng.process(Event(f"{k.lower()}{t}", float(t), {"k": k, "x": x, "r": 1}))
    got = [(n.profile, n.to_json()["events"]) for n in eng.take_notifications()]
    assert got == [
        ("p0", {"a": "a0", "b": "b2"}),
        ("p1", {"a": "a1", "b": "b2"}),
        ("p2", {"a": "a3", "b": "b4"}),
    ]
    st = eng.stats()
    assert st["profiles"] == st["partial_matches"] == st["partitions"] == 0
    assert len(eng.pool) == 0 and eng.pool.owner_count == 0


def test_a_shared_auxiliary_profile_stays_indexed_while_a_profile_pins_it() -> None:
    """references, no `per`: equal auxiliary filters of many profiles are one entry, pinned by
    each of them (`PrimitivePool.pin`); it stays indexed while one lives, also across a
    restore and a change of plan, and goes with the last (no entry left behind)."""
    ps = [
        parse_profile(f'seq(a: k = "A" and x = {i}, b: k = "B") within 10s', f"p{i}")
        for i in range(3)
    ]
    eng = Engine(ps)
    [shared] = [e for e in eng.pool.entries() if e.filter == ps[0].expr.components[1].expr]
    assert shared.pins == 3 and not shared.owners
    eng.process(Event("a0", 0, {"k": "A", "x": 0}))
    eng.process(Event("b1", 1, {"k": "B"}))  # p0 completes: its owner leaves, the entry stays
    assert shared.indexed and not shared.owners
    assert [n.profile for n in eng.take_notifications()] == ["p0"]
    eng.remove_profile("p0")
    assert shared.indexed and shared.pins == 2
    eng = Engine.restore(eng.snapshot())  # a restored engine pins again
    assert eng.replan("rare-first") == ["p1", "p2"]  # and back: the eager runtimes pin again
    assert eng.replan("eager") == ["p1", "p2"]
    eng.process(Event("a2", 2, {"k": "A", "x": 1}))
    eng.process(Event("b3", 3, {"k": "B"}))
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [{"a": "a2", "b": "b3"}]
    [shared] = [e for e in eng.pool.entries() if e.filter == ps[0].expr.components[1].expr]
    assert shared.pins == 2
    eng.remove_profile("p1")
    eng.remove_profile("p2")
    assert len(eng.pool) == 0 and eng.pool.owner_count == 0


def test_plain_filters_report_alongside_an_ownerless_pinned_entry() -> None:
    """An event matching plain filter profiles and a pinned auxiliary profile nobody waits on:
    the plain ones report (in profile order), the ownerless entry adds nothing."""
    ps = [
        parse_profile('k = "B" and v > 1', "f1"),
        parse_profile('seq(a: k = "A", b: k = "B" and z = 0) within 10s', "s"),
        parse_profile('k = "B"', "f2"),
    ]
    eng = Engine(ps)
    [pinned] = [e for e in eng.pool.match({"k": "B", "v": 2, "z": 0}) if not e.owners]
    assert pinned.pins == 1  # with f1's and f2's entries: three
    eng.process(Event("b1", 0, {"k": "B", "v": 2, "z": 0}))
    eng.process(Event("a2", 1, {"k": "A"}))
    eng.process(Event("b3", 2, {"k": "B", "v": 0, "z": 0}))
    got = [(n.profile, n.to_json()["events"]) for n in eng.take_notifications()]
    assert got == [
        ("f1", {"e": "b1"}),
        ("f2", {"e": "b1"}),
        ("s", {"a": "a2", "b": "b3"}),
        ("f2", {"e": "b3"}),
    ]


@pytest.mark.parametrize("variant", ["references", "dynamic", "marking"])
def test_removed_profiles_leave_no_prepared_filters_behind(variant: str) -> None:
    """Profile churn (add, run, remove): the pool's cache of prepared auxiliary filters does
    not keep the filters of removed profiles."""
    eng = Engine(variant=variant)
    for i in range(50):
        eng.add_profile(
            parse_profile(f'seq(a: k = "A", b: k = "B" and x = {i}) within 10s', f"p{i}")
        )
        eng.process(Event(f"a{i}", float(i), {"k": "A"}))
        eng.process(Event(f"b{i}", i + 0.5, {"k": "B", "x": i}))
        eng.remove_profile(f"p{i}")
    assert len(eng.take_notifications()) == 50
    assert len(eng.pool) == 0 and not eng.pool._prepared


def test_a_plan_change_with_matches_in_flight_keeps_the_pins() -> None:
    """To rare-first and back while partial matches wait: the eager runtime that takes them
    over pins its auxiliary profiles too (one pin per profile), and nothing stays behind."""
    ps = [
        parse_profile(f'seq(a: k = "A", b: k = "B", c: k = "C" and x = {i}) within 100s', f"p{i}")
        for i in range(2)
    ]
    eng = Engine(ps)
    eng.process(Event("a0", 0, {"k": "A"}))
    eng.process(Event("b1", 1, {"k": "B"}))  # both wait for their c now
    assert eng.replan("rare-first") == ["p0", "p1"]
    assert eng.replan("eager") == ["p0", "p1"]
    pinned = [e for e in eng.pool.entries() if e.pins]
    assert sorted(e.pins for e in pinned) == [1, 1, 2]  # c0, c1; b shared by both
    eng.process(Event("c2", 2, {"k": "C", "x": 1}))
    assert [n.profile for n in eng.take_notifications()] == ["p1"]
    eng.remove_profile("p0")
    eng.remove_profile("p1")
    assert len(eng.pool) == 0 and eng.pool.owner_count == 0


@pytest.mark.parametrize("select", ["", " select each"])
def test_a_match_that_ends_takes_its_owner_off_the_pinned_entry_and_leaves_it_indexed(
    select: str,
) -> None:
    """Completion, expiry and a middle step each leave the pinned entry of the component no
    longer awaited without our owner (`_leave_pinned`), indexed while the profile lives; with
    two matches waiting on one entry the owner stays until the second one ends."""
    eng = Engine(
        [parse_profile(f'seq(a: k = "A", b: k = "B", c: k = "C") within 10s{select}', "p")]
    )
    [b_entry] = eng.pool.match({"k": "B"})
    [c_entry] = eng.pool.match({"k": "C"})
    assert b_entry.pins == c_entry.pins == 1 and not b_entry.owners and not c_entry.owners
    eng.process(Event("a1", 0, {"k": "A"}))
    assert list(b_entry.owners) == [(0, 1)] and not c_entry.owners
    eng.process(Event("b1", 1, {"k": "B"}))  # a middle step: b off, c on
    if select:  # `each`: the match on a1 waits for b again through a copy
        assert list(b_entry.owners) == [(0, 1)]
    else:
        assert not b_entry.owners
    assert list(c_entry.owners) == [(0, 2)]
    eng.process(Event("c1", 2, {"k": "C"}))  # completed
    assert [n.to_json()["events"] for n in eng.take_notifications()] == [
        {"a": "a1", "b": "b1", "c": "c1"}
    ]
    if not select:
        assert not c_entry.owners and eng.pool.owner_count == 1  # (the start's owner)
    eng.process(Event("a2", 3, {"k": "A"}))
    eng.process(Event("x", 20, {"k": "X"}))  # every window ended: expired
    assert not b_entry.owners and not c_entry.owners and eng.pool.owner_count == 1
    assert b_entry.indexed and c_entry.indexed and len(eng.pool) == 3
    eng.remove_profile("p")
    assert len(eng.pool) == 0 and eng.pool.owner_count == 0
