"""Caps on partial matches and notifications per event (filters/caps.py, issue 41 item 5).

Each cap is shown on both engines (and the rare-first plan where it applies), with its
counter; a hypothesis test with small caps checks that the single-step engine and the
two-step baseline apply them identically.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ens.cli import app
from ens.replay import order_events
from filters.caps import CapHits, Caps
from filters.eager.matches import PartialMatch
from filters.engine import Engine
from filters.twostep.engine import TwoStepEngine
from profiles.errors import ProfileError
from profiles.events import Event
from profiles.parser import parse_profile
from tests.test_differential import _events, parsed, scenario, seq_profile_text

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

EACH = 'seq(a: kind = "x", b: kind = "y") within 1d select each consume shared'


def engines(text: str, caps: Caps) -> list[tuple[str, Any]]:
    p = parse_profile(text, "w")
    return [
        ("eager", Engine([p], caps=caps)),
        ("rare-first", Engine([p], caps=caps, plan="rare-first")),
        ("two-step", TwoStepEngine([p], caps=caps)),
    ]


def feed(eng: Any, events: list[tuple[str, float, dict[str, Any]]]) -> list[dict[str, Any]]:
    for eid, ts, attrs in events:
        eng.process(Event(eid, ts, attrs))
    return [n.to_json()["events"] for n in eng.take_notifications()]


@pytest.mark.parametrize("which", ["eager", "rare-first", "two-step"])
def test_partition_cap_drops_the_oldest_partial_match_and_counts_it(which: str) -> None:
    """The issue's shape: one PM per x event, capped at 5 in the partition; the oldest go
    (x0..x4), the newest five complete with y, and the five dropped are counted."""
    eng = dict(engines(EACH, Caps(partition=5)))[which]
    out = feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(10)])
    assert out == []
    assert eng.stats()["partial_matches"] == 5
    out = feed(eng, [("y", 20.0, {"kind": "y"})])
    assert out == [{"a": f"x{i}", "b": "y"} for i in range(5, 10)]
    assert eng.take_cap_hits() == {"w": CapHits(partial_matches=5, notifications=0)}
    assert eng.take_cap_hits() == {}  # taken


@pytest.mark.parametrize("which", ["eager", "two-step"])
def test_profile_cap_refuses_a_new_partition_and_drops_within_one(which: str) -> None:
    """Over all partitions at most 3 PMs: a partition holding none cannot open one (a busy
    room never evicts another's match); one holding some drops its own oldest."""
    text = 'seq(a: kind = "x", b: kind = "y") within 1h per room select each consume shared'
    eng = dict(engines(text, Caps(profile=3)))[which]
    xs = [("a1", 0.0, 1), ("a2", 1.0, 1), ("b1", 2.0, 2), ("c1", 3.0, 3), ("a3", 4.0, 1)]
    feed(eng, [(eid, ts, {"kind": "x", "room": room}) for eid, ts, room in xs])
    assert eng.stats()["partial_matches"] == 3
    out = feed(
        eng,
        [(f"y{room}", 10.0 + room, {"kind": "y", "room": room}) for room in (1, 2, 3)],
    )
    # room 3's PM was refused (c1), room 1's oldest (a1) made room for a3
    assert out == [{"a": "a2", "b": "y1"}, {"a": "a3", "b": "y1"}, {"a": "b1", "b": "y2"}]
    assert eng.take_cap_hits() == {"w": CapHits(partial_matches=2)}


def test_profile_cap_under_select_first_refuses_new_partitions() -> None:
    """The fast path of `select first` (one PM per partition) applies the profile's cap too."""
    text = 'seq(a: kind = "x", b: kind = "y") within 1h per room'
    for _, eng in engines(text, Caps(profile=2))[::2]:
        feed(eng, [(f"x{room}", float(room), {"kind": "x", "room": room}) for room in range(5)])
        assert eng.stats()["partial_matches"] == 2
        assert eng.take_cap_hits() == {"w": CapHits(partial_matches=3)}
        out = feed(eng, [(f"y{room}", 9.0, {"kind": "y", "room": room}) for room in range(5)])
        assert out == [{"a": "x0", "b": "y0"}, {"a": "x1", "b": "y1"}]


@pytest.mark.parametrize("which", ["eager", "rare-first", "two-step"])
def test_notification_cap_per_event_keeps_the_first_and_counts_the_rest(which: str) -> None:
    eng = dict(engines(EACH, Caps(notifications=3)))[which]
    feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(10)])
    out = feed(eng, [("y", 20.0, {"kind": "y"})])
    assert out == [{"a": f"x{i}", "b": "y"} for i in range(3)]
    assert eng.take_cap_hits() == {"w": CapHits(notifications=7)}
    # the PMs stay (shared): the next y is capped the same way
    assert len(feed(eng, [("y2", 21.0, {"kind": "y"})])) == 3
    assert eng.take_cap_hits() == {"w": CapHits(notifications=7)}


def test_notification_cap_through_the_general_path() -> None:
    """A shape off the fast paths (a where clause): `_complete` applies the cap."""
    text = 'seq(a: kind = "x", b: kind = "y") within 1d where a.v = b.v select each consume shared'
    for name, eng in engines(text, Caps(notifications=2)):
        feed(eng, [(f"x{i}", float(i), {"kind": "x", "v": 1}) for i in range(6)])
        assert len(feed(eng, [("y", 20.0, {"kind": "y", "v": 1})])) == 2, name
        assert eng.take_cap_hits() == {"w": CapHits(notifications=4)}, name


def test_defaults_and_bad_caps() -> None:
    assert Engine().caps == Caps(10_000, 100_000, 1_000)
    with pytest.raises(ValueError, match="partition must be at least 1"):
        Caps(partition=0)


def test_caps_are_configuration_not_snapshot_state() -> None:
    """A snapshot restores with the default caps and no hits (the service sets its caps
    again); the format is unchanged (tests/test_state.py checks the schema)."""
    p = parse_profile(EACH, "w")
    eng = Engine([p], caps=Caps(partition=2))
    feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(4)])
    back = Engine.restore(eng.snapshot())
    assert back.caps == Caps() and back.cap_hits == {}
    assert back.stats()["partial_matches"] == 2
    back.set_caps(Caps(partition=1))
    feed(back, [("x9", 9.0, {"kind": "x"})])
    assert back.stats()["partial_matches"] == 1


@st.composite
def capped_case(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[dict], Caps]:
    """`seq` profiles (each, first, last; per; where) over short streams, with small caps."""
    profiles, events, _ = draw(scenario(seq_profile_text()))
    texts = []
    for pid, text in profiles:
        try:
            parsed(text, pid)
        except ProfileError:
            continue
        texts.append((pid, text))
    caps = Caps(
        partition=draw(st.integers(1, 4)),
        profile=draw(st.integers(1, 6)),
        notifications=draw(st.integers(1, 3)),
    )
    return texts, events, caps


@settings(
    max_examples=300, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(capped_case())
def test_engines_apply_small_caps_alike(
    case: tuple[list[tuple[str, str]], list[dict], Caps],
) -> None:
    """Under small caps the single-step engine and the two-step baseline report the same
    notifications and count the same hits per profile."""
    texts, events, caps = case
    profiles = [parsed(text, pid) for pid, text in texts]
    outs = {}
    for name, eng in (
        ("single-step", Engine(profiles, caps=caps)),
        ("two-step", TwoStepEngine(profiles, caps=caps)),
    ):
        notes = []
        for ev in order_events(_events(events)):
            eng.process(ev)
            notes += [n.to_json() for n in eng.take_notifications()]
        eng.finish(None)
        notes += [n.to_json() for n in eng.take_notifications()]
        outs[name] = (notes, eng.take_cap_hits())
    if outs["single-step"] != outs["two-step"]:
        print("profiles:", texts, "caps:", caps, "events:", events)
    assert outs["single-step"] == outs["two-step"]


def test_explain_shows_the_caps_and_what_they_dropped(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"profiles": [{"id": "w", "expr": EACH}]}))
    ev = tmp_path / "e.jsonl"
    rows = [{"id": f"x{i}", "ts": i, "kind": "x"} for i in range(6)]
    rows.append({"id": "y", "ts": 10, "kind": "y"})
    ev.write_text("".join(json.dumps(e) + "\n" for e in rows))
    args = ["explain", str(prof), str(ev), "-p", "w"]
    r = CliRunner().invoke(
        app, [*args, "--max-partial-matches", "3", "--max-notifications-per-event", "2"]
    )
    assert r.exit_code == 0, r.stderr
    assert "capped    {a: x0} (capped by the partial-match cap)" in r.stdout
    assert "capped    1 notification(s) beyond 2" in r.stdout
    assert (
        "caps (at most 3 partial matches per partition, 100000 per profile, 2 notifications "
        "per event): REACHED, 3 partial match(es) dropped, 1 notification(s) dropped"
    ) in r.stdout
    r = CliRunner().invoke(app, args)  # within the default caps: no line about them
    assert r.exit_code == 0, r.stderr
    assert "caps" not in r.stdout and r.stdout.splitlines()[-1].startswith("6 notification(s)")


def test_check_warns_about_select_each_on_a_frequent_kind(tmp_path: Path) -> None:
    """With statistics, `ens check` names a `select each` profile whose starting kind is
    frequent for its window (the issue's: x every ~1.6 s for a day); rare kinds, short
    windows and `select first` pass; without statistics nothing is guessed."""
    prof = tmp_path / "p.yaml"
    profiles = [
        {"id": "flood", "expr": EACH},
        {"id": "rare", "expr": EACH.replace('"x"', '"r"')},
        {"id": "short", "expr": EACH.replace("1d", "10s")},
        {"id": "first", "expr": EACH.replace("select each consume shared", "")},
    ]
    prof.write_text(yaml.safe_dump({"profiles": profiles}))
    stats = tmp_path / "stats.json"
    doc = {"version": 1, "filters": {}, "profiles": {}}
    for p in profiles:
        rate = 1.0 if p["id"] == "rare" else 2205.0  # 52,920 a day
        doc["profiles"][p["id"]] = {"a": {"rate_per_hour": rate}, "b": {"rate_per_hour": 1.0}}
    stats.write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["check", str(prof), "--stats", str(stats)])
    assert r.exit_code == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1, warned
    assert "profile 'flood': `select each consume shared`" in warned[0]
    assert "about 52,920 live at once" in warned[0]
    assert "--max-partial-matches" in warned[0]
    r = CliRunner().invoke(app, ["check", str(prof)])
    assert r.exit_code == 0 and "warning" not in r.stderr
    r = CliRunner().invoke(app, ["check", str(prof), "--stats", str(tmp_path / "none.json")])
    assert r.exit_code != 0 and "--stats: no such file" in r.stderr


class _CountingList(list):  # type: ignore[type-arg]
    """A partition's PM list that counts how often the engine walks it."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _CountingList.walks += 1
        return super().__iter__()


def test_an_event_that_extends_nothing_does_not_walk_the_partial_matches() -> None:
    """Issue 41's outage: every x event walked all waiting PMs (8.5 ms per event at 52,920 of
    them, an unrelated filter's p99 at 102 s). An x can only open one: the PMs are not walked."""
    eng = Engine([parse_profile(EACH, "w")])
    feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(50)])
    part = next(iter(eng._by_id["w"].parts.values()))  # type: ignore[attr-defined]
    part.pms = _CountingList(part.pms)
    _CountingList.walks = 0
    feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(50, 60)])
    assert _CountingList.walks == 0
    assert eng.stats()["partial_matches"] == 60
    assert len(feed(eng, [("y", 99.0, {"kind": "y"})])) == 60  # the y walks them, once
    assert _CountingList.walks == 1


def _pms_alive() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, PartialMatch))


def test_removed_profile_and_capped_matches_are_freed_without_the_collector() -> None:
    """Profile churn (issue 41): a removed profile's PMs are freed by reference counting (no
    PM <-> partition cycle for the collector, whose full passes over ~100,000 of them paused
    the engine); a PM a cap dropped is not kept by its terminator for the rest of the window."""
    gc.collect()
    gc.disable()
    try:
        base = _pms_alive()
        eng = Engine([parse_profile(EACH, "w")], caps=Caps(partition=100))
        feed(eng, [(f"x{i}", float(i), {"kind": "x"}) for i in range(1000)])
        assert _pms_alive() - base == 100  # 900 dropped by the cap, none kept
        eng.remove_profile("w")
        assert _pms_alive() == base
    finally:
        gc.enable()
