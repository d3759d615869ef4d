"""The engine's state format (filters/state.py): versioned plain data, golden files, migrations."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest

from filters import state
from filters.engine import Engine
from profiles.events import event_from_obj
from profiles.profile_file import parse_profile_document
from tests.conftest import CONFORMANCE, load_case

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(CONFORMANCE.glob("*.yaml")) + sorted(
    (Path(__file__).parent / "cases").glob("*.yaml")
)


def _golden_profiles() -> dict:
    pset, errors = parse_profile_document((GOLDEN / "profiles.json").read_text(), "profiles.json")
    assert not errors
    return {p.id: p for p in pset.profiles}


def _events() -> list:
    lines = (GOLDEN / "events.jsonl").read_text().splitlines()
    return [event_from_obj(json.loads(line), f"#{n}") for n, line in enumerate(lines, 1)]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("plan", ["eager", "rare-first"])
@pytest.mark.parametrize("profiles", ["inline", "apart"])
def test_a_golden_snapshot_restores_and_the_stream_ends_as_if_never_stopped(
    version, plan, profiles
) -> None:
    """Every release restores the snapshots of every earlier format version (v1: the pickle of
    ENS 0.1, read and then written as v2), and the rest of the stream gives the notifications of
    an uninterrupted run (written with the golden files by the release that made them)."""
    data = (GOLDEN / f"{version}-{plan}-{profiles}.bin").read_bytes()
    assert state.header(data)["version"] == int(version[1:])
    by_id = _golden_profiles() if profiles == "apart" else None
    eng = Engine.restore(data, by_id)
    evs = _events()
    for ev in evs[len(evs) // 2 :]:
        eng.process(ev)
    eng.finish()
    got = [n.to_json() for n in eng.take_notifications()]
    assert got == json.loads((GOLDEN / f"expect-{plan}.json").read_text())


def test_a_v1_snapshot_is_rewritten_in_the_current_format() -> None:
    eng = Engine.restore((GOLDEN / "v1-eager-inline.bin").read_bytes())
    again = eng.snapshot()
    assert state.header(again) == {
        "format": state.FORMAT,
        "version": state.VERSION,
        "profiles": "inline",
    }
    assert Engine.restore(again).stats() == eng.stats()


def test_a_v1_snapshot_whose_classes_are_gone_is_refused_saying_what_to_do() -> None:
    data = (GOLDEN / "v1-eager-inline.bin").read_bytes()
    assert b"_PM" in data
    broken = data.replace(b"_PM", b"_PX")  # what a renamed class does to the old format
    with pytest.raises(state.StateError) as err:
        Engine.restore(broken)
    msg = str(err.value)
    assert "version 1" in msg and "_PX" in msg and "release that wrote it" in msg


def test_a_snapshot_of_a_newer_release_is_refused() -> None:
    data = (GOLDEN / "v2-eager-inline.bin").read_bytes()
    newer = data.replace(b'"version":2', b'"version":9', 1)
    with pytest.raises(state.StateError, match="newer ENS .*version 9.*upgrade"):
        Engine.restore(newer)


def test_the_body_never_loads_a_class_by_its_python_path() -> None:
    head = state.MAGIC + b'{"format":"ens.engine-state","version":2,"profiles":"inline"}\n'
    evil = head + pickle.dumps({"engine": io.BytesIO()})
    with pytest.raises(state.StateError, match="names the class _io.BytesIO"):
        Engine.restore(evil)
    renamed = (
        (GOLDEN / "v2-eager-inline.bin")
        .read_bytes()
        .replace(b"class:partial-match", b"class:partial-mutch")
    )
    with pytest.raises(
        state.StateError, match="holds a 'partial-mutch', which this release does not know"
    ):
        Engine.restore(renamed)
    with pytest.raises(state.StateError, match="no ENS-STATE header"):
        Engine.restore(b"hello")


def test_a_profile_missing_from_an_apart_snapshot_is_named() -> None:
    """Read strictly (no `missing`), a reference to a profile not supplied is refused by name;
    `Engine.restore` leaves its state out instead (tests/test_state_removed.py)."""
    data = (GOLDEN / "v2-eager-apart.bin").read_bytes()
    by_id = _golden_profiles()
    del by_id["break-in"]
    with pytest.raises(state.StateError, match="profile 'break-in', which was not supplied"):
        state.load(data, by_id)


def _stored_of_every_case() -> list[state.Stored]:
    """The engines stopped halfway through every conformance case, under every variant and plan
    (the states a running site can hold), seen as plain data."""
    out = []
    for path in CASES:
        case = load_case(path)
        if "expect_error" in case:
            continue
        pset, errors = parse_profile_document(
            json.dumps({"profiles": case["profiles"]}, default=str)
        )
        if errors:
            continue
        evs = [
            event_from_obj(json.loads(json.dumps(e, default=str)), f"#{n}")
            for n, e in enumerate(case["events"], 1)
        ]
        for variant in Engine.VARIANTS:
            for plan in ("eager", "rare-first"):
                eng = Engine(pset.profiles, variant=variant, plan=plan)
                for ev in evs[: max(1, len(evs) // 2)]:
                    eng.process(ev)
                out.append(state.plain(eng.snapshot()))
    return out


def _walk(root: object, seen: dict[str, set[str]]) -> None:
    stack, done = [root], set()
    while stack:
        v = stack.pop()
        if id(v) in done:
            continue
        done.add(id(v))
        if isinstance(v, state.Stored):
            if v.state is not None and not v.name.startswith("ast."):
                seen.setdefault(v.name, set()).update(state.fields_of(v.state))
            stack.extend(v.args)
            stack.append(v.state)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)


def test_the_schema_of_this_version_is_what_the_classes_store() -> None:
    """A class whose stored fields change changes the format: bump `state.VERSION`, add a
    migration from the previous version to `state.MIGRATIONS`, write the golden files of the new
    version (tests/golden/make_golden.py) and record the new fields in `state.SCHEMA`."""
    seen: dict[str, set[str]] = {}
    for root in _stored_of_every_case():
        _walk(root, seen)
    assert "partial-match" in seen and "engine" in seen
    assert {k: tuple(sorted(v)) for k, v in seen.items()} == {k: state.SCHEMA.get(k) for k in seen}


def _stored(root: object, name: str) -> list[state.Stored]:
    """Every stored object called `name` in a plain snapshot graph."""
    found: list[state.Stored] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, state.Stored):
            if x.name == name:
                found.append(x)
            todo.extend([x.args, x.state])
        elif isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo.extend(x)
        elif hasattr(x, "__iter__") and not isinstance(x, (str, bytes)):
            todo.extend(list(x))  # the temporal pool's sorted list
    return found


def test_a_finished_match_is_stored_without_its_events_and_the_stream_continues_the_same() -> None:
    from profiles.events import Event
    from profiles.parser import parse_profile

    # with `per`: a completed match's terminator stays to release the partition's auxiliary
    # profiles (without, it is taken out at once and nothing of the match is stored)
    p = parse_profile('seq(a: k = "A", b: k = "B") within 10s per r', "p")
    evs = [Event(f"e{i}", float(i), {"k": k, "r": 1}) for i, k in enumerate("ABAAB")]
    whole = Engine([p])
    for ev in evs:
        whole.process(ev)
    whole.finish()
    stopped = Engine([p])
    for ev in evs[:2]:  # a1 b1: one match completed, its terminator still in the pool
        stopped.process(ev)
    first = [n.to_json() for n in stopped.take_notifications()]
    data = stopped.snapshot()
    pms = _stored(state.plain(data), "partial-match")
    assert pms and all(not pm.state[1]["alive"] for pm in pms)
    assert all(pm.state[1]["binds"] == [] for pm in pms)  # no events of a finished match
    assert sorted(state.SCHEMA["partial-match"]) == sorted(pms[0].state[1])  # same fields
    back = Engine.restore(data)
    for ev in evs[2:]:
        back.process(ev)
    back.finish()
    rest = [n.to_json() for n in back.take_notifications()]
    assert first + rest == [n.to_json() for n in whole.take_notifications()]
    assert len(first + rest) == 2


def test_reading_and_writing_pause_the_collector_and_leave_it_as_it_was() -> None:
    import gc

    data = (GOLDEN / "v2-eager-apart.bin").read_bytes()
    seen: list[bool] = []
    gc.callbacks.append(lambda phase, info: seen.append(phase == "start"))
    try:
        assert gc.isenabled()
        eng = Engine.restore(data, _golden_profiles())
        assert gc.isenabled()
        eng.snapshot()
        assert gc.isenabled()
        with pytest.raises(state.StateError):
            Engine.restore(data[:-20], _golden_profiles())  # a cut body: refused while paused
        assert gc.isenabled()
        gc.disable()
        Engine.restore(data, _golden_profiles())
        assert not gc.isenabled()  # an outer pause is kept
    finally:
        gc.enable()
        gc.callbacks.pop()
    with state.collector_paused():
        seen.clear()
        [[i] for i in range(100_000)]  # would trigger young collections
        assert not seen


def test_a_partition_stored_by_older_releases_restores_without_its_pool_entries() -> None:
    """`Partition.entries` is not stored and is made on first use: a state written before
    (without `until`, or with an `entries` dict of the pool's objects) restores with none."""
    from filters.eager.matches import Partition

    old = {
        "pms": [],
        "regs": {(1, ()): 1},
        "dormant": 0,
        "values": None,
        "key": (),
        "held": {(1, ())},
        "entries": {(1, ()): object()},  # a release that stored them
        "starts": 0,
        "starts_ts": 0.0,
        "history": [],
        "handle": None,
    }
    part = Partition.__new__(Partition)
    part.__setstate__(old)
    assert part.entries is None and part.until == 0.0 and part.regs == {(1, ()): 1}


@pytest.mark.parametrize("variant", ["references", "dynamic", "marking"])
@pytest.mark.parametrize("per", ["", " per r"])
def test_registrations_without_per_restore_into_the_runtime_entry(variant: str, per: str) -> None:
    """A snapshot taken while partial matches wait (their auxiliary profiles in the pool, kept
    dormant or held after a completion) continues as if never stopped, with or without `per`."""
    from profiles.events import Event
    from profiles.parser import parse_profile

    ps = [
        parse_profile(f'seq(a: k = "A", b: k = "B", c: k = "C") within 10s{per}', "p"),
        parse_profile(f'seq(a: k = "A", b: k = "B") within 5s select each{per}', "q"),
    ]
    evs = [Event(f"e{i}", float(i), {"k": k, "r": 1}) for i, k in enumerate("ABCABBACABCBA")]
    whole = Engine(ps, variant=variant)
    for ev in evs:
        whole.process(ev)
    whole.finish()
    want = [n.to_json() for n in whole.take_notifications()]
    assert len(want) > 3
    for cut in range(1, len(evs)):
        first = Engine(ps, variant=variant)
        for ev in evs[:cut]:
            first.process(ev)
        got = [n.to_json() for n in first.take_notifications()]
        back = Engine.restore(first.snapshot())
        for ev in evs[cut:]:
            back.process(ev)
        back.finish()
        got += [n.to_json() for n in back.take_notifications()]
        assert [(n["profile"], n["events"]) for n in got] == [
            (n["profile"], n["events"]) for n in want
        ], cut
