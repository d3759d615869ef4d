"""Escalation: levels and delays, repeat, stop on ack/clear, snapshot/restore; against a model."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifiers.alarms import Transition
from notifiers.routing import EscalationPolicy, Escalator, Level, RoutingError, parse_policy

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

M = 60.0
POLICY = parse_policy(
    {
        "id": "night",
        "levels": [
            {"receivers": ["crew"]},
            {"receivers": ["boss"], "delay": "15m"},
            {"receivers": ["security", "owner"], "delay": "10m"},
        ],
        "repeat": "30m",
        "max_repeats": 1,
    }
)


def fired(esc: Escalator, until: float) -> list[tuple[str, float, tuple[str, ...]]]:
    out = []
    while (due := esc.due()) is not None and due <= until:
        out += [(s.id, s.due_at, s.receivers) for s in esc.advance(due)]
    return out


def test_levels_fire_after_their_delays_then_repeat_then_stop() -> None:
    esc = Escalator({"night": POLICY})
    assert esc.start("a1.1", "night", 1000.0)
    assert not esc.start("a1.1", "night", 1005.0)  # one escalation per occurrence
    assert fired(esc, 1e9) == [
        ("a1.1.0.0", 1000.0, ("crew",)),
        ("a1.1.0.1", 1000 + 15 * M, ("boss",)),
        ("a1.1.0.2", 1000 + 25 * M, ("security", "owner")),
        ("a1.1.1.0", 1000 + 55 * M, ("crew",)),  # the ladder again, 30 min after its end
        ("a1.1.1.1", 1000 + 70 * M, ("boss",)),
        ("a1.1.1.2", 1000 + 80 * M, ("security", "owner")),
    ]
    assert esc.due() is None and esc.pending == {}


def test_an_acknowledgement_or_a_clear_stops_it() -> None:
    esc = Escalator({"night": POLICY})
    raised = Transition(
        "a1.1.1", 1, "raise", "a1", 1, 1000.0, "rule", "match", None, "active-unacknowledged",
        "major", 1, 1000.0, 1000.0, {"room": "101"}, {},
    )  # fmt: skip
    assert esc.on_transition(raised, "night")
    assert [s.id for s in esc.advance(1000.0)] == ["a1.1.0.0"]
    assert esc.pending["a1.1"].labels == {"room": "101"}
    ack = Transition(
        "a1.1.2", 2, "ack", "a1", 1, 1600.0, "ops", "on it", "active-unacknowledged",
        "active-acknowledged", "major", 1, 1000.0, 1000.0, {}, {},
    )  # fmt: skip
    assert esc.on_transition(ack, None)
    assert esc.advance(1e9) == [] and esc.due() is None
    esc.start("b.1", "night", 0.0)
    assert esc.stop("b.1") is not None and esc.stop("b.1") is None


def test_snapshot_restores_the_pending_steps_after_a_restart() -> None:
    esc = Escalator({"night": POLICY})
    esc.start("a1.1", "night", 1000.0)
    esc.start("a2.1", "night", 1100.0)
    first = fired(esc, 1000 + 16 * M)
    snap = json.loads(json.dumps(esc.snapshot()))
    assert snap["version"] == 1
    again = Escalator.restore({"night": POLICY}, snap)
    assert again.due() == esc.due()
    rest = fired(again, 1e9)
    whole = Escalator({"night": POLICY})
    whole.start("a1.1", "night", 1000.0)
    whole.start("a2.1", "night", 1100.0)
    assert first + rest == fired(whole, 1e9)  # each step once, none lost, none repeated


def test_restore_refuses_another_version_and_drops_a_vanished_policy() -> None:
    with pytest.raises(RoutingError, match="version 9"):
        Escalator.restore({}, {"version": 9, "pending": []})
    with pytest.raises(RoutingError, match="bad pending entry"):
        Escalator.restore({}, {"version": 1, "pending": [{"key": "k"}]})
    esc = Escalator({"night": POLICY})
    esc.start("a1.1", "night", 0.0)
    again = Escalator.restore({}, esc.snapshot())
    assert again.pending == {} and again.dropped == ["a1.1"]
    short = EscalationPolicy("night", (Level(("crew",), 0.0),))
    esc.advance(20 * M)  # now at level 3 (index 2)
    again = Escalator.restore({"night": short}, esc.snapshot())
    assert again.pending["a1.1"].level == 0  # the policy lost levels: its last one


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"id": "p", "levels": []}, "levels: give at least one level"),
        ({"id": "p", "levels": [{"delay": "5m"}]}, "levels.0: give the receivers"),
        (
            {"id": "p", "levels": [{"receivers": "a"}, {"receivers": "b"}]},
            "levels.1: a level after",
        ),
        (
            {"id": "p", "levels": [{"receivers": "a", "delay": "soon"}]},
            "levels.0.delay: bad duration",
        ),
        ({"id": "p", "levels": [{"receivers": "a"}], "repeat": "0m"}, "repeat: repeat is"),
        ({"id": "p", "levels": [{"receivers": "a"}], "max_repeats": 2}, "max_repeats: only with"),
        ({"levels": [{"receivers": "a"}]}, "id: give the policy an id"),
        ({"id": "p", "levels": [{"receivers": "a", "who": 1}]}, "levels.0.who: unknown key"),
    ],
)
def test_bad_policies_name_the_field(data: dict, words: str) -> None:
    with pytest.raises(RoutingError) as e:
        parse_policy(data)
    assert words in str(e.value)
    with pytest.raises(RoutingError, match="no escalation policy 'x'"):
        Escalator({}).start("k", "x", 0.0)


# ---------------------------------------------------------------------- against a model
def model(p: EscalationPolicy, start: float, stop: float) -> list[tuple[str, float]]:
    """Every step's (id, time) up to ``stop``, written out as the docs say it."""
    out, t, cycle = [], start, 0
    while True:
        for i, lv in enumerate(p.levels):
            t += lv.delay if (i > 0 or cycle == 0) else 0.0
            if t > stop:
                return out
            out.append((f"k.{cycle}.{i}", t))
        if p.repeat is None or (p.max_repeats is not None and cycle >= p.max_repeats):
            return out
        t += p.repeat
        cycle += 1


policies = st.builds(
    lambda first, delays, repeat, most: EscalationPolicy(
        "p",
        tuple(Level((f"r{i}",), d * M) for i, d in enumerate([first, *delays])),
        repeat * M if repeat else None,
        most if repeat else None,
    ),
    st.integers(0, 10),
    st.lists(st.integers(1, 30), max_size=3),
    st.one_of(st.none(), st.integers(1, 60)),
    st.one_of(st.none(), st.integers(0, 4)),
)


@settings(max_examples=200, deadline=None)
@given(
    policy=policies,
    ack=st.floats(0, 600 * M),
    checks=st.lists(st.floats(0, 700 * M), max_size=8),
    restart=st.one_of(st.none(), st.floats(0, 600 * M)),
)
def test_escalation_matches_the_model(
    policy: EscalationPolicy, ack: float, checks: list[float], restart: float | None
) -> None:
    esc = Escalator({"p": policy})
    esc.start("k", "p", 0.0)
    got: list[tuple[str, float]] = []
    restarted = False
    for t in sorted(c for c in checks if c < ack) + [ack]:  # the service wakes up at any times
        if restart is not None and not restarted and restart <= t:
            esc = Escalator.restore({"p": policy}, json.loads(json.dumps(esc.snapshot())))
            restarted = True
        got += [(s.id, s.due_at) for s in esc.advance(t)]
    esc.stop("k")  # acknowledged at `ack`
    got += [(s.id, s.due_at) for s in esc.advance(1e9)]
    assert got == model(policy, 0.0, ack)
