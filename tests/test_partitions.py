"""The engine's state per partition (filters/partstate.py, filters/partitions.py): records
loaded, changed and stored alone give what one engine gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ens.replay import order_events
from filters import state
from filters.engine import Engine
from filters.partitions import PartitionedEngine, decode_id, due_by, encode_id
from profiles.events import Event, event_from_obj
from profiles.parser import parse_profile
from profiles.profile_file import parse_profile_document
from tests.conftest import CONFORMANCE, load_case
from tests.test_differential import _events, parsed, scenario

CASES = sorted(CONFORMANCE.glob("*.yaml")) + sorted(
    (Path(__file__).parent / "cases").glob("*.yaml")
)


def _case(path: Path) -> tuple[list, list[Event], str] | None:
    case = load_case(path)
    if "expect_error" in case:
        return None
    pset, errors = parse_profile_document(json.dumps({"profiles": case["profiles"]}, default=str))
    if errors:
        return None
    evs = [
        event_from_obj(json.loads(json.dumps(e, default=str)), f"#{n}")
        for n, e in enumerate(case["events"], 1)
    ]
    return pset.profiles, evs, str(case.get("tz", "UTC"))


def _whole(profiles: list, evs: list[Event], until: float | None = None, **opts: str) -> list[dict]:
    eng = Engine(profiles, **opts)
    for ev in evs:
        eng.process(ev)
    eng.finish(until)
    return [n.to_json() for n in eng.take_notifications()]


def run_by_partition(
    profiles: list,
    evs: list[Event],
    per_step: int = 1,
    until: float | None = None,
    held: bool = False,
    shared: bool = True,
    **opts: str,
) -> tuple[list[dict], dict[str, bytes]]:
    """Steps of `per_step` events, each on an engine holding only the header and the
    partitions the step reaches or has due, read from and written back to a key-value map;
    `held`: `wanted` is told which partitions the map holds (loads only those); `shared`:
    the engine as Spark's workers keep it (compact headers, `end` looks at what the step
    touched only)."""
    pe = PartitionedEngine(Engine(profiles, **opts), shared=shared)
    store: dict[str, bytes] = {}
    dues: dict = {}
    out: list[dict] = []

    def step(events: list[Event], until: float | None) -> None:
        pe.begin(store.get("header"))
        horizon = max([ev.ts for ev in events] + ([until] if until is not None else []))
        wanted = pe.wanted(events, dues, horizon)
        assert set(wanted) >= {p for ev in events for p in pe.reached(ev)}
        assert set(wanted) >= set(due_by(dues, horizon))
        if held:
            have = {decode_id(k) for k in store if k != "header"}
            some = pe.wanted(events, dues, horizon, have)
            assert set(some) <= set(wanted)
            assert set(some) & have == set(wanted) & have  # every stored one it may change
            wanted = some
        for part in sorted(wanted, key=encode_id):
            data = store.get(encode_id(part))
            if data is not None and not pe.load(part, data):
                del store[encode_id(part)]
        for ev in events:
            pe.process(ev)
        if until is not None:
            pe.finish(until)
        for part, rec in pe.changed().items():
            if rec is None:
                store.pop(encode_id(part), None)
                dues.pop(part, None)
            else:
                store[encode_id(part)] = rec.data
                dues[part] = rec.due
        for pid in pe.retired():
            for k in [k for k in store if k != "header" and decode_id(k)[0] == pid]:
                del store[k]
                dues.pop(decode_id(k), None)
        out.extend(n.to_json() for n in pe.take_notifications())
        store["header"] = pe.end()
        assert not pe.loaded() and pe.engine.now is None and not len(pe.engine.timers)

    for i in range(0, len(evs), per_step):
        step(evs[i : i + per_step], None)
    if evs:
        step([], until if until is not None else max(ev.ts for ev in evs))
    return out, store


def _canon(data: bytes) -> object:
    """A record as nested plain values (equal records are equal whichever objects they share)."""
    seen: set[int] = set()

    def walk(x: object) -> object:
        if isinstance(x, state.Stored):
            if id(x) in seen:  # a cycle (a PM and its partition): its name only
                return ("cycle", x.name)
            seen.add(id(x))
            out = (x.name, walk(x.args), walk(x.state))
            seen.discard(id(x))
            return out
        if isinstance(x, dict):
            return tuple(sorted((repr(walk(k)), walk(v)) for k, v in x.items()))
        if isinstance(x, (list, tuple)):
            return tuple(walk(v) for v in x)
        if isinstance(x, (set, frozenset)):
            return tuple(sorted(repr(walk(v)) for v in x))
        return x

    return walk(state.plain(data))


def check_all_loaded(
    profiles: list, evs: list[Event], every: int, until: float | None = None, **opts: str
) -> None:
    """The service's way: one engine holds every partition; after every `every` events the
    records `changed` gives are applied to a map, which then holds exactly what storing every
    partition of the engine would (nothing changed was missed, nothing gone is left)."""
    pe = PartitionedEngine(Engine(profiles, **opts))
    store: dict[str, bytes] = {}

    def apply() -> None:
        for part, rec in pe.changed().items():
            if rec is None:
                store.pop(encode_id(part), None)
            else:
                store[encode_id(part)] = rec.data
        for pid in pe.retired():
            for k in [k for k in store if decode_id(k)[0] == pid]:
                del store[k]
        eng = pe.engine
        want = {encode_id(p): got[0] for p, got in eng.store_parts(eng.part_ids()).items() if got}
        assert {k: _canon(v) for k, v in store.items()} == {k: _canon(v) for k, v in want.items()}

    for i, ev in enumerate(evs, 1):
        pe.process(ev)
        if not i % every:
            apply()
    pe.finish(until)
    apply()


@pytest.mark.parametrize("plan", ["eager", "rare-first"])
@pytest.mark.parametrize("variant", Engine.VARIANTS)
def test_every_case_with_every_partition_loaded_stores_what_changed(variant, plan) -> None:
    for path in CASES:
        got = _case(path)
        if got is None:
            continue
        profiles, evs, tz = got
        for every in (1, 3):
            check_all_loaded(profiles, evs, every, variant=variant, plan=plan, tz=tz)


def test_a_sweep_of_quiet_partitions_deletes_their_records() -> None:
    """Rare-first: a sweep (once per window of event time) empties partitions no event
    reached; their records go too."""
    p = parse_profile('seq(a: k = "A", b: k = "B") within 10s per r select each', "p")
    evs = [Event(f"a{r}", float(r), {"k": "A", "r": r}) for r in range(5)]
    evs.append(Event("x", 100.0, {"k": "A", "r": 99}))  # the sweep: r 0..4 are stale
    check_all_loaded([p], evs, 1, plan="rare-first")
    pe = PartitionedEngine(Engine([p], plan="rare-first"))
    for ev in evs[:-1]:
        pe.process(ev)
    assert len(pe.changed()) == 5
    pe.process(evs[-1])
    gone = sorted(k for k, rec in pe.changed().items() if rec is None)
    assert gone == [("p", (r,)) for r in range(5)]


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("plan", ["eager", "rare-first"])
@pytest.mark.parametrize("variant", Engine.VARIANTS)
def test_every_case_one_event_per_step_gives_what_one_engine_gives(variant, plan, shared) -> None:
    """Every conformance case, one event per step: each step loads only the partitions the
    event reaches or has due, and the notifications are those of one engine, in order
    (headers and `end` of a shared engine, `PartitionedEngine(shared=True)`, or not)."""
    ran = 0
    for path in CASES:
        got = _case(path)
        if got is None:
            continue
        profiles, evs, tz = got
        opts = {"variant": variant, "plan": plan, "tz": tz}
        want = _whole(profiles, evs, **opts)
        out, _ = run_by_partition(profiles, evs, shared=shared, **opts)
        assert out == want, path.name
        ran += 1
    assert ran > 40


@pytest.mark.parametrize("plan", ["eager", "rare-first"])
def test_loading_only_the_held_partitions_the_events_reach_gives_what_one_engine_gives(
    plan: str,
) -> None:
    """`wanted` told which partitions are stored (the Spark operator's `have`) gives exactly
    the stored ones the step may change, and every conformance case, in steps of 1 and 3
    events, gives the notifications of one engine."""
    ran = 0
    for path in CASES:
        got = _case(path)
        if got is None:
            continue
        profiles, evs, tz = got
        want = _whole(profiles, evs, plan=plan, tz=tz)
        for per_step in (1, 3):
            out, _ = run_by_partition(profiles, evs, per_step, held=True, plan=plan, tz=tz)
            assert out == want, path.name
        ran += 1
    assert ran > 40


@given(
    scenario(),
    st.sampled_from([1, 2, 8]),
    st.sampled_from(["eager", "rare-first"]),
)
def test_generated_profiles_and_streams_loading_only_held_partitions_agree(
    case: tuple[list[tuple[str, str]], list[dict], float | None], per_step: int, plan: str
) -> None:
    """The differential tests' generated profiles and streams, `wanted` told what is held."""
    texts, events, until = case
    profiles = [parsed(text, pid) for pid, text in texts]
    evs = order_events(_events(events))
    want = _whole(profiles, evs, until, plan=plan)
    got, _ = run_by_partition(profiles, evs, per_step, until, held=True, plan=plan)
    assert got == want


def test_steps_of_several_events_and_records_stay_small() -> None:
    got = _case(CONFORMANCE / "05-partition.yaml")
    assert got is not None
    profiles, evs, tz = got
    for n in (2, 3, 7):
        out, store = run_by_partition(profiles, evs, per_step=n, tz=tz)
        assert out == _whole(profiles, evs, tz=tz)


def test_a_record_holds_one_partition_and_reads_back_as_that_partition() -> None:
    p = parse_profile('seq(a: k = "A", b: k = "B") within 10s per r', "p")
    eng = Engine([p])
    pe = PartitionedEngine(eng)
    for i, r in enumerate([1, 2, True]):
        pe.process(Event(f"a{i}", float(i), {"k": "A", "r": r}))
    recs = pe.changed()
    assert sorted(recs, key=encode_id) == sorted(
        [("p", (1,)), ("p", (2,)), ("p", ((bool, True),))], key=encode_id
    )
    dues = {k: rec.due for k, rec in recs.items() if rec is not None}
    assert dues == {("p", (1,)): 10.0, ("p", (2,)): 11.0, ("p", ((bool, True),)): 12.0}
    data = recs[("p", (2,))].data  # type: ignore[union-attr]
    head = state.header(data)
    assert head["record"] == "partition" and head["version"] == state.RECORD_VERSION
    assert b"a1" in data and b"a0" not in data  # only its own events
    assert decode_id(encode_id(("p", ((bool, True),)))) == ("p", ((bool, True),))
    assert encode_id(("p", (1.0, "x"))) == encode_id(("p", (1, "x")))  # one partition
    header = pe.end()
    with pytest.raises(state.StateError, match="expected an engine partition record, got a header"):
        pe.load(("p", (2,)), header)
    with pytest.raises(state.StateError, match="given as that of"):
        pe.load(("p", (1,)), data)
    pe.begin(header)
    assert pe.load(("p", (2,)), data)
    pe.process(Event("b", 5.0, {"k": "B", "r": 2}))
    assert [n.to_json()["events"] for n in pe.take_notifications()] == [{"a": "a1", "b": "b"}]
    # completed: its terminator stays until the window ends, to let its pool entries go
    assert pe.changed()[("p", (2,))].due == 11.0  # type: ignore[union-attr]
    pe.advance(12.0)
    assert pe.changed()[("p", (2,))] is None  # nothing left to store
    assert not pe.load(("gone", (2,)), data)  # a profile not here: the record can go
    pe.process(Event("a9", 13.0, {"k": "A", "r": 7}))
    pe.drop(("p", (7,)))  # unloaded unstored: not reported, not deleted
    assert ("p", (7,)) not in pe.changed() and not pe.loaded()


def test_an_engine_that_replans_online_is_refused() -> None:
    p = parse_profile('seq(a: k = "A", b: k = "B") within 10s per r', "p")
    with pytest.raises(ValueError, match="re-plans online"):
        PartitionedEngine(Engine([p], plan="auto", replan_every=100))


def test_records_of_the_golden_engine_restore_as_the_whole_snapshot_does() -> None:
    """Storing every partition and the header, then loading them into a fresh engine, continues
    the golden stream as a whole-engine restore does (tests/golden)."""
    golden = Path(__file__).parent / "golden"
    pset, errors = parse_profile_document((golden / "profiles.json").read_text(), "p.json")
    assert not errors
    lines = (golden / "events.jsonl").read_text().splitlines()
    evs = [event_from_obj(json.loads(line), f"#{n}") for n, line in enumerate(lines, 1)]
    for plan in ("eager", "rare-first"):
        pe = PartitionedEngine(Engine(pset.profiles, plan=plan))
        for ev in evs[: len(evs) // 2]:
            pe.process(ev)
        first = [n.to_json() for n in pe.take_notifications()]
        recs = pe.engine.store_parts(pe.loaded())
        header = pe.end()
        fresh = PartitionedEngine(Engine(pset.profiles, plan=plan))
        fresh.begin(header)
        for part, got in recs.items():
            assert got is not None
            assert fresh.load(part, got[0])
        for ev in evs[len(evs) // 2 :]:
            fresh.process(ev)
        fresh.finish()
        rest = [n.to_json() for n in fresh.take_notifications()]
        # (the golden snapshot holds the first half's notifications, not taken yet)
        assert first + rest == json.loads((golden / f"expect-{plan}.json").read_text())
        assert first + rest == _whole(pset.profiles, evs, plan=plan)


def test_a_clock_reaches_its_partition_also_when_no_event_of_the_step_does() -> None:
    """A clock fires in a step whose events reach other profiles only: its profile's
    partition is loaded (`wanted`), so the clock's match extends what was stored, not a new
    partition overwriting it."""
    night = parse_profile('seq(n: clock("22:00"), p: kind = "presence") within 30h', "night")
    other = parse_profile('kind = "x"', "x")
    day = 86400.0
    evs = [
        Event("x0", 21 * 3600.0, {"kind": "x"}),
        Event("x1", 23 * 3600.0, {"kind": "x"}),  # the first clock: a match opens
        Event("x2", day + 23 * 3600.0, {"kind": "x"}),  # the second: another opens
        Event("p", day + 23.5 * 3600.0, {"kind": "presence"}),
    ]
    want = _whole([night, other], evs)
    assert [n["events"] for n in want if n["profile"] == "night"] == [
        {"n": "clock:1970-01-01T22:00:00Z", "p": "p"}
    ]
    out, _ = run_by_partition([night, other], evs)
    assert out == want


@settings(
    max_examples=200, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    scenario(),
    st.sampled_from([1, 1, 2, 3, 8]),
    st.sampled_from(Engine.VARIANTS),
    st.sampled_from(["eager", "rare-first"]),
)
def test_generated_profiles_and_streams_by_partition_agree_with_one_engine(
    case: tuple[list[tuple[str, str]], list[dict], float | None],
    per_step: int,
    variant: str,
    plan: str,
) -> None:
    """The differential tests' generated profiles (every operator and clause, `once`, clocks,
    `absent`, `per`) and streams (ties, late `until`), in steps of `per_step` events."""
    texts, events, until = case
    profiles = [parsed(text, pid) for pid, text in texts]
    evs = order_events(_events(events))
    want = _whole(profiles, evs, until, variant=variant, plan=plan)
    got, _ = run_by_partition(profiles, evs, per_step, until, variant=variant, plan=plan)
    assert got == want


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("plan", ["eager", "rare-first"])
def test_golden_records_load_and_the_stream_ends_as_if_never_stopped(
    plan: str, version: str
) -> None:
    """Records written by the release of their format version (tests/golden/
    make_golden_records.py) load into an engine of this release and end the golden stream."""
    import base64

    golden = Path(__file__).parent / "golden"
    doc = json.loads((golden / f"{version}-records-{plan}.json").read_text())
    head = state.header(base64.b64decode(doc["header"]))
    assert head["record"] == "header" and head["version"] == int(version[1:])
    pset, errors = parse_profile_document((golden / "profiles.json").read_text(), "p.json")
    assert not errors
    lines = (golden / "events.jsonl").read_text().splitlines()
    evs = [event_from_obj(json.loads(line), f"#{n}") for n, line in enumerate(lines, 1)]
    pe = PartitionedEngine(Engine(pset.profiles, plan=plan))
    pe.begin(base64.b64decode(doc["header"]))
    for key, data in doc["partitions"].items():
        assert pe.load(decode_id(key), base64.b64decode(data))
    for ev in evs[len(evs) // 2 :]:
        pe.process(ev)
    pe.finish()
    got = [n.to_json() for n in pe.take_notifications()]
    assert got == json.loads((golden / f"expect-{plan}.json").read_text())


def test_the_schema_of_records_is_what_the_classes_store() -> None:
    """Records hold the stable names of `state.SCHEMA` with their fields, and the fields of
    `state.RECORDS` (every conformance case stopped halfway, every variant and plan)."""
    from tests.test_state import _walk

    seen: dict[str, set[str]] = {}
    kinds: dict[str, set[str]] = {}
    for path in CASES:
        got = _case(path)
        if got is None:
            continue
        profiles, evs, tz = got
        for variant in Engine.VARIANTS:
            for plan in ("eager", "rare-first"):
                pe = PartitionedEngine(Engine(profiles, variant=variant, plan=plan, tz=tz))
                for ev in evs[: max(1, len(evs) // 2)]:
                    pe.process(ev)
                datas = [rec.data for rec in pe.changed().values() if rec is not None]
                for data in [*datas, pe.header()]:
                    body = state.plain(data)
                    assert isinstance(body, dict)
                    kinds.setdefault(state.header(data)["record"], set()).update(body)
                    _walk(body, seen)
    assert {k: tuple(sorted(v)) for k, v in kinds.items()} == state.RECORDS
    assert "partial-match" in seen and "partition" in seen and "lazy-partition" in seen
    assert "engine" not in seen and "composite-runtime" not in seen  # runtimes are references
    assert {k: tuple(sorted(v)) for k, v in seen.items()} == {k: state.SCHEMA.get(k) for k in seen}


def test_records_of_another_plan_load_as_written_and_the_header_names_the_order() -> None:
    """A header says how each profile ran (eager or rare-first, its driver): an engine built
    under another plan runs the stored profiles as written (a site restarted with another
    --plan converts afterwards, `Engine.configure_plans`)."""
    import base64

    golden = Path(__file__).parent / "golden"
    doc = json.loads((golden / "v2-records-rare-first.json").read_text())
    pset, errors = parse_profile_document((golden / "profiles.json").read_text(), "p.json")
    assert not errors
    lines = (golden / "events.jsonl").read_text().splitlines()
    evs = [event_from_obj(json.loads(line), f"#{n}") for n, line in enumerate(lines, 1)]
    header = base64.b64decode(doc["header"])
    assert PartitionedEngine.profile_order(header) == [p.id for p in pset.profiles]
    pe = PartitionedEngine(Engine(pset.profiles, plan="eager"))
    pe.begin(header)
    for key, data in doc["partitions"].items():
        assert pe.load(decode_id(key), base64.b64decode(data))
    assert pe.engine.configure_plans("eager", None) == ["break-in"]  # converted
    for ev in evs[len(evs) // 2 :]:
        pe.process(ev)
    pe.finish()
    got = [n.to_json() for n in pe.take_notifications()]
    assert got == json.loads((golden / "expect-rare-first.json").read_text())


@settings(
    max_examples=150, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    scenario(),
    st.sampled_from([1, 2, 5]),
    st.sampled_from(Engine.VARIANTS),
    st.sampled_from(["eager", "rare-first"]),
)
def test_generated_profiles_and_streams_with_every_partition_loaded_store_what_changed(
    case: tuple[list[tuple[str, str]], list[dict], float | None],
    every: int,
    variant: str,
    plan: str,
) -> None:
    texts, events, until = case
    profiles = [parsed(text, pid) for pid, text in texts]
    evs = order_events(_events(events))
    check_all_loaded(profiles, evs, every, until, variant=variant, plan=plan)


def test_a_shared_engines_header_names_its_profile_order_by_a_digest_and_stays_small() -> None:
    """A shared engine (`PartitionedEngine(shared=True)`, Spark's per-worker compiled
    profiles) writes a header that names the compiled profile order by a digest: its size does
    not grow with the profiles, and another engine of the same profiles loads it. After a
    profile change the engine's order is no longer the compiled one: the list is written."""
    from filters.partstate import known_order

    def head_size(n: int, shared: bool) -> tuple[int, bytes, PartitionedEngine]:
        ps = [
            parse_profile(f'seq(a: k = "A{i}", b: k = "B") within 10s per r', f"p{i}")
            for i in range(n)
        ]
        pe = PartitionedEngine(Engine(ps), shared=shared)
        pe.process(Event("a", 1.0, {"k": "A1", "r": 1}))
        pe.changed()
        data = pe.end()
        return len(data), data, pe

    small, data, _ = head_size(500, True)
    assert small < 400 and abs(small - head_size(20, True)[0]) < 40
    assert head_size(500, False)[0] > 10 * small  # the list of 500 profile ids
    order = PartitionedEngine.profile_order(data)
    assert order == [f"p{i}" for i in range(500)]
    assert isinstance(state.load_record(data, "header")["order"], str)
    other = PartitionedEngine(
        Engine(
            [
                parse_profile(f'seq(a: k = "A{i}", b: k = "B") within 10s per r', f"p{i}")
                for i in range(500)
            ]
        ),
        shared=True,
    )
    other.begin(data)
    assert other.engine.now == 1.0
    other.engine.add_profile(parse_profile('k = "X"', "x"))
    other.changed()
    assert state.load_record(other.end(), "header")["order"][-1] == "x"
    from filters import partstate

    partstate._SHAPES.clear()  # another process: the digest is not known, the caller's order
    assert known_order(state.load_record(data, "header")["order"]) is None
    assert PartitionedEngine.profile_order(data) == []


def test_a_record_of_a_newer_record_format_is_refused_with_what_to_do() -> None:
    pe = PartitionedEngine(Engine([parse_profile('seq(a: k = "A", b: k = "B") within 10s', "p")]))
    pe.process(Event("a", 1.0, {"k": "A"}))
    data = pe.changed()[("p", ())].data  # type: ignore[union-attr]
    assert b'"version":3' in data
    newer = data.replace(b'"version":3', b'"version":4', 1)
    with pytest.raises(state.StateError, match="newer ENS .*version 4; this release reads up to 3"):
        pe.load(("p", ()), newer)
