"""The engine's state per partition (filters/partstate.py, filters/partitions.py): records
loaded, changed and stored alone give what one engine gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from filters import state
from filters.engine import Engine
from filters.partitions import PartitionedEngine, decode_id, due_by, encode_id
from profiles.events import Event, event_from_obj
from profiles.parser import parse_profile
from profiles.profile_file import parse_profile_document
from tests.conftest import CONFORMANCE, load_case

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


def _whole(profiles: list, evs: list[Event], **opts: str) -> list[dict]:
    eng = Engine(profiles, **opts)
    for ev in evs:
        eng.process(ev)
    eng.finish()
    return [n.to_json() for n in eng.take_notifications()]


def run_by_partition(
    profiles: list, evs: list[Event], per_step: int = 1, **opts: str
) -> tuple[list[dict], dict[str, bytes]]:
    """Steps of `per_step` events, each on an engine holding only the header and the
    partitions the step reaches or has due, read from and written back to a key-value map."""
    pe = PartitionedEngine(Engine(profiles, **opts))
    store: dict[str, bytes] = {}
    dues: dict = {}
    out: list[dict] = []

    def step(events: list[Event], until: float | None) -> None:
        pe.begin(store.get("header"))
        wanted = {p for ev in events for p in pe.reached(ev)}
        horizon = max([ev.ts for ev in events] + ([until] if until is not None else []))
        wanted.update(due_by(dues, horizon))
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
        step([], max(ev.ts for ev in evs))
    return out, store


@pytest.mark.parametrize("plan", ["eager", "rare-first"])
@pytest.mark.parametrize("variant", Engine.VARIANTS)
def test_every_case_one_event_per_step_gives_what_one_engine_gives(variant, plan) -> None:
    """Every conformance case, one event per step: each step loads only the partitions the
    event reaches or has due, and the notifications are those of one engine, in order."""
    ran = 0
    for path in CASES:
        got = _case(path)
        if got is None:
            continue
        profiles, evs, tz = got
        opts = {"variant": variant, "plan": plan, "tz": tz}
        want = _whole(profiles, evs, **opts)
        out, _ = run_by_partition(profiles, evs, **opts)
        assert out == want, path.name
        ran += 1
    assert ran > 40


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
    assert all(
        rec is not None and rec.due == float(i) + 10.0 for i, rec in enumerate(recs.values())
    )
    data = recs[("p", (2,))].data  # type: ignore[union-attr]
    head = state.header(data)
    assert head["record"] == "partition" and head["version"] == state.VERSION
    assert b"a1" in data and b"a0" not in data  # only its own events
    assert decode_id(encode_id(("p", ((bool, True),)))) == ("p", ((bool, True),))
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
