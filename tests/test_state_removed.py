"""Issue 41.1: the state of a removed profile in snapshots and restores (filters/restore.py).

A removed profile's finished partial matches left their terminators in the temporal pool, so
every later snapshot referred to the profile, and a restore without it raised `StateError`
(the service could never start again). Now a removal leaves nothing a snapshot stores, and a
restore leaves out, and reports, the state of profiles it is not given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from filters import state
from filters.engine import Engine
from filters.twostep.engine import TwoStepEngine
from profiles.events import Event
from profiles.parser import parse_profile
from tests.test_state import GOLDEN, _events, _golden_profiles

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

W = 'seq(a: kind = "A", b: kind = "C") within 10s per room'
W2 = 'seq(a: kind = "A", d: kind = "D", e: kind = "E") within 10s per room'
K = 'seq(x: kind = "X", y: kind = "Y") within 1h per room'
F = 'kind = "F"'
PLANS = [(v, p) for v in Engine.VARIANTS for p in ("eager", "rare-first")]


def _profiles(**exprs: str) -> dict[str, Any]:
    return {pid: parse_profile(expr, pid) for pid, expr in exprs.items()}


def _refs(data: bytes) -> set[str]:
    """The profile ids an `apart` snapshot refers to."""
    out: set[str] = set()
    seen: set[int] = set()
    todo: list[Any] = [state.plain(data)]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, str) and o.startswith("profile:"):
            out.add(o[len("profile:") :])
        elif isinstance(o, state.Stored):
            todo += [o.args, o.state]
        elif isinstance(o, dict):
            todo += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += list(o)
    return out


def _feed(eng: Engine, *events: tuple[str, float, str, int]) -> list[dict[str, Any]]:
    for eid, ts, kind, room in events:
        eng.process(Event(eid, ts, {"kind": kind, "room": room}))
    return [n.to_json() for n in eng.take_notifications()]


@pytest.mark.parametrize(("variant", "plan"), PLANS)
def test_a_removed_profile_leaves_nothing_a_snapshot_refers_to(variant: str, plan: str) -> None:
    """The issue's case: w's match completed (its terminator stays as a no-op), another of its
    partial matches is open; w is removed: the snapshot no longer mentions it and restores
    with the remaining profiles."""
    by_id = _profiles(w=W, k=K, f=F)
    eng = Engine(by_id.values(), variant=variant, plan=plan)
    got = _feed(eng, ("x1", 0.0, "X", 1), ("a1", 1.0, "A", 1), ("c1", 2.0, "C", 1))
    assert [n["profile"] for n in got] == ["w"]
    _feed(eng, ("a2", 3.0, "A", 2))  # an open partial match of w
    eng.remove_profile("w")
    data = eng.snapshot(profiles_apart=True)
    assert _refs(data) == {"k", "f"}
    del by_id["w"]
    back, skipped = Engine.restore_reporting(data, by_id)
    assert not skipped
    assert back.stats() == {**eng.stats(), "timers": back.stats()["timers"]}
    assert [n["profile"] for n in _feed(back, ("y1", 4.0, "Y", 1), ("c2", 5.0, "C", 2))] == ["k"]


@pytest.mark.parametrize(("variant", "plan"), PLANS)
def test_state_of_a_profile_not_supplied_is_left_out_and_reported(variant: str, plan: str) -> None:
    """A snapshot taken while w held partial matches and partitions, restored without w: the
    engine restores, w's state is left out and reported, the others go on as if never stopped,
    and the restored engine's own snapshot no longer mentions w."""
    by_id = _profiles(w=W, k=K, f=F)
    eng = Engine(by_id.values(), variant=variant, plan=plan)
    _feed(eng, ("x1", 0.0, "X", 1), ("a1", 1.0, "A", 1), ("a2", 1.5, "A", 2))
    data = eng.snapshot(profiles_apart=True)
    assert "w" in _refs(data)
    del by_id["w"]
    back, skipped = Engine.restore_reporting(data, by_id)
    assert set(skipped.removed) == {"w"} and not skipped.inactive
    held = skipped.removed["w"]
    assert held["partitions"] == 2 and held["partial_matches"] >= 1, held
    assert "removed profile 'w'" in skipped.describe()
    assert sorted(p.id for p in back.profiles) == ["f", "k"]
    rest = (("c1", 2.0, "C", 1), ("y1", 3.0, "Y", 1), ("f1", 4.0, "F", 2))
    want = [n for n in _feed(eng, *rest) if n["profile"] != "w"]
    assert _feed(back, *rest) == want and len(want) == 2
    assert _refs(back.snapshot(profiles_apart=True)) == {"k", "f"}


def test_a_profile_re_added_under_its_id_starts_fresh() -> None:
    """w removed with a finished match, then added again with another expression: the new w
    owns no state of the old one, before and after a restore."""
    by_id = _profiles(w=W, k=K, f=F)
    eng = Engine(by_id.values())
    _feed(eng, ("a1", 1.0, "A", 1), ("c1", 2.0, "C", 1))
    eng.remove_profile("w")
    by_id["w"] = parse_profile(W2, "w")
    eng.add_profile(by_id["w"])
    _feed(eng, ("a2", 3.0, "A", 1))
    back, skipped = Engine.restore_reporting(eng.snapshot(profiles_apart=True), by_id)
    assert not skipped
    rest = (("d1", 4.0, "D", 1), ("e1", 5.0, "E", 1), ("e2", 13.5, "E", 1))
    got = _feed(back, *rest)
    assert got == _feed(eng, *rest)
    assert [(n["profile"], n["events"]) for n in got] == [("w", {"a": "a2", "d": "d1", "e": "e1"})]


def test_a_snapshot_written_before_the_fix_restores_without_the_removed_profile() -> None:
    """The golden snapshot ENS wrote before the fix (tests/golden/make_golden_removed.py) holds
    the no-op terminator of removed w: it restores without w (left out, reported), and k's
    open partial match completes."""
    data = (GOLDEN / "v2-removed-apart.bin").read_bytes()
    assert "w" in _refs(data)
    back, skipped = Engine.restore_reporting(data, _profiles(k=K, f=F))
    assert skipped.removed == {"w": {"partial_matches": 0, "partitions": 0, "timers": 1}}
    assert [n["events"] for n in _feed(back, ("y1", 5.0, "Y", 1))] == [{"x": "x1", "y": "y1"}]
    assert _refs(back.snapshot(profiles_apart=True)) == {"k", "f"}


def test_a_snapshot_written_before_the_fix_with_the_id_given_again_restores() -> None:
    """Same, but w was added again with another expression before the snapshot: the old w's
    no-op timer is left out (never rebuilt against the new expression), the new w goes on."""
    data = (GOLDEN / "v2-readded-apart.bin").read_bytes()
    back, skipped = Engine.restore_reporting(data, _profiles(w=W2, k=K, f=F))
    assert skipped.inactive == {"w": 1} and not skipped.removed
    got = _feed(back, ("d1", 4.0, "D", 1), ("e1", 5.0, "E", 1), ("y1", 6.0, "Y", 1))
    assert [(n["profile"], n["events"]) for n in got] == [
        ("w", {"a": "a2", "d": "d1", "e": "e1"}),
        ("k", {"x": "x1", "y": "y1"}),
    ]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("plan", ["eager", "rare-first"])
@pytest.mark.parametrize("gone", sorted(_golden_profiles()))
def test_each_golden_profile_left_out_the_rest_ends_as_if_never_stopped(
    version: str, plan: str, gone: str
) -> None:
    """Whichever profile of the golden snapshots is not supplied (composites, `absent`, a
    clock, a filter), the others give the notifications of an uninterrupted run (those
    detected before the snapshot and not yet taken stay as they were)."""
    data = (GOLDEN / f"{version}-{plan}-apart.bin").read_bytes()
    evs = _events()

    def rest(eng: Engine) -> list[dict[str, Any]]:
        for ev in evs[len(evs) // 2 :]:
            eng.process(ev)
        eng.finish()
        return [n.to_json() for n in eng.take_notifications()]

    full = Engine.restore(data, _golden_profiles())
    before = full.take_notifications()
    want = rest(full)
    assert [n.to_json() for n in before] + want == json.loads(
        (GOLDEN / f"expect-{plan}.json").read_text()
    )
    by_id = _golden_profiles()
    del by_id[gone]
    eng, skipped = Engine.restore_reporting(data, by_id)
    assert set(skipped.removed) <= {gone}
    assert eng.take_notifications() == before
    assert rest(eng) == [n for n in want if n["profile"] != gone]
    assert gone not in _refs(eng.snapshot(profiles_apart=True))


def test_the_two_step_engine_keeps_no_timer_of_a_removed_profile() -> None:
    """The two-step baseline cannot be snapshotted (no stable name), but its removal too must
    leave nothing behind that refers to the profile."""
    eng = TwoStepEngine([parse_profile(W, "w"), parse_profile(K, "k")])
    for eid, ts, kind, room in (("a1", 1.0, "A", 1), ("c1", 2.0, "C", 1), ("a2", 3.0, "A", 2)):
        eng.process(Event(eid, ts, {"kind": kind, "room": room}))
    eng.remove_profile("w")
    timers = eng.timers
    left = list(timers._items) + [h for ln in timers._lanes.values() for h in ln.items]
    assert all(h[3][0].profile.id != "w" for h in left if isinstance(h[3], tuple))
    with pytest.raises(state.StateError, match="no stable name"):
        state.dump(eng)


def test_no_restore_leaves_a_placeholder_in_the_engine(tmp_path: Path) -> None:
    """An `Unresolved` never reaches a runtime the restored engine keeps: its next snapshot
    would fail on it."""
    by_id = _profiles(w=W, k=K)
    eng = Engine(by_id.values())
    _feed(eng, ("a1", 1.0, "A", 1), ("x1", 1.0, "X", 1))
    back = Engine.restore(eng.snapshot(profiles_apart=True), {"k": by_id["k"]})
    assert all(p.__class__.__name__ == "Profile" for p in back.profiles)
    state.dump(back)
