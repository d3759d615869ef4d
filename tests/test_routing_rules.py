"""The alarm rules with a router (`notifiers.routing.router`): routed deliveries, escalation
as timers of the rules, grouping per subscriber from the routing file, snapshot/restore."""

from __future__ import annotations

from datetime import datetime

import pytest

from notifiers.alarms import AlarmRules, GroupPolicy
from notifiers.routing import parse_routing
from notifiers.routing.router import Router
from profiles.alarm import AlarmSpec
from tests.helpers_routing import BERLIN, CREW_ROUTING, at

ROUTING = (
    CREW_ROUTING
    + """
quiet_hours:
  - {subscriber: desk, windows: Mon-Sun 22:00-06:00, min_severity: major}
grouping:
  - {subscriber: desk, group_by: [building], group_wait: 1m, group_interval: 5m}
"""
)
SPECS = {
    "leak": AlarmSpec("critical", "manual", notify=("raise", "ack", "clear")),
    "temp": AlarmSpec("minor", "manual"),
}


def hm(ts: float) -> str:
    return datetime.fromtimestamp(ts, BERLIN).strftime("%H:%M")


def make() -> tuple[AlarmRules, Router]:
    routing, errors = parse_routing(ROUTING)
    assert routing is not None, errors
    policies = dict(routing.grouping)
    router = Router(routing)
    return AlarmRules(SPECS, policies, GroupPolicy(), router), router


def sent(effects_list: list) -> list[tuple[str, str, str]]:  # (time, subscriber, kinds)
    out = []
    for eff in effects_list:
        for m in eff.messages:
            out.append((hm(m.ts), m.subscriber, ",".join(n.kind for n in m.notices)))
    return out


def test_a_critical_alarm_escalates_by_schedule_until_acknowledged() -> None:
    rules, router = make()
    effs = [rules.on_match("leak", at("2026-11-03T06:30"), {"room": "101"}, {}, "ops")]
    aid = effs[0].transitions[0].alarm
    assert router.next_step(f"{aid}.1")["level"] == 2  # the first level fired at the raise
    effs.append(rules.advance(at("2026-11-03T07:40")))
    effs.append(rules.acknowledge(aid, at("2026-11-03T08:15"), "anna"))
    effs.append(rules.advance(at("2026-11-03T12:00")))
    # the raise goes nowhere directly (the route escalates): night crew, boss, day crew, boss;
    # the ack goes through the same route (no receivers of its own): nothing after it
    assert sent(effs) == [
        ("06:30", "carla", "escalation"),
        ("06:50", "boss", "escalation"),
        ("07:30", "anna", "escalation"),
        ("07:50", "boss", "escalation"),
    ]
    assert router.escalator.pending == {}
    assert router.take_changed() == {f"{aid}.1"}


def test_quiet_hours_hold_back_a_minor_alarm_and_the_desk_groups_by_building() -> None:
    rules, router = make()
    effs = [rules.on_match("temp", at("2026-11-03T23:00"), {"building": "A", "room": "1"})]
    effs.append(rules.on_match("temp", at("2026-11-04T09:00"), {"building": "A", "room": "1"}))
    effs.append(rules.on_match("temp", at("2026-11-04T09:00"), {"building": "A", "room": "2"}))
    effs.append(rules.advance(at("2026-11-04T10:00")))
    assert [t.delivery for t in effs[0].transitions] == ["sent"]
    assert router.held == 1  # 23:00 is inside the desk's quiet hours, minor < major
    assert sent(effs) == [("09:01", "desk", "raise")]
    (msg,) = effs[-1].messages
    assert {n.labels["room"] for n in msg.notices} == {"2"}  # room 1 is open: no new raise


def test_a_restored_router_fires_each_remaining_step_once() -> None:
    rules, router = make()
    rules.on_match("leak", at("2026-11-03T06:30"), {"room": "101"}, {}, "ops")
    first = rules.advance(at("2026-11-03T06:55"))
    snap = rules.snapshot()
    routing = router.routing
    again = AlarmRules.restore(snap, SPECS, dict(routing.grouping), GroupPolicy(), Router(routing))
    rest = again.advance(at("2026-11-03T07:35"))
    assert sent([first]) == [("06:50", "boss", "escalation")]
    assert sent([rest]) == [("07:30", "anna", "escalation")]


def test_clear_stops_the_escalation_and_a_silence_holds_a_step_back() -> None:
    rules, router = make()
    eff = rules.on_match("leak", at("2026-11-03T06:30"), {"room": "101"}, {}, "ops")
    aid = eff.transitions[0].alarm
    rules.add_silence(
        {"matchers": ["room=101"], "for": "20m", "comment": "work", "notify_after": False},
        at("2026-11-03T06:40"),
    )  # fmt: skip
    held = rules.advance(at("2026-11-03T06:55"))
    assert sent([held]) == []
    assert rules.stats["ops"]["silenced"] == 1
    rules.clear(aid, at("2026-11-03T07:10"), "anna", "fixed")
    assert router.escalator.pending == {}
    assert sent([rules.advance(at("2026-11-03T09:00"))]) == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("grouping: [{subscriber: a, group_wait: soon}]\nroute: {receivers: [a]}", "group_wait"),
        ("grouping: [{subscriber: a, cap_per_hour: 0}]\nroute: {receivers: [a]}", "cap_per_hour"),
        ("grouping: [{subscriber: a, colour: red}]\nroute: {receivers: [a]}", "unknown key"),
        ("subscribers: [a]\ngrouping: [{subscriber: b}]\nroute: {receivers: [a]}", "'b'"),
    ],
)
def test_bad_grouping_is_refused_with_its_place(text: str, error: str) -> None:
    routing, errors = parse_routing(text, "r.yaml")
    assert routing is None
    assert error in str(errors[0]) and str(errors[0]).startswith("r.yaml:"), errors


def test_a_file_without_a_route_groups_per_subscriber_and_keeps_the_profiles_subscriber() -> None:
    text = """
grouping:
  - {subscriber: ops, group_by: [room], group_wait: 1m, group_interval: 5m}
  - {subscriber: "*", group_by: [], group_wait: 10m}
"""
    routing, errors = parse_routing(text, need_route=False)
    assert routing is not None and not routing.routed, errors
    policies = dict(routing.grouping)
    default = policies.pop("*")
    rules = AlarmRules(SPECS, policies, default, Router(routing))
    t0 = at("2026-11-03T10:00")
    effs = [
        rules.on_match("leak", t0, {"room": "1"}, {}, "ops"),
        rules.on_match("leak", t0, {"room": "2"}, {}, "ops"),
        rules.on_match("leak", t0, {"room": "3"}, {}, "desk"),
        rules.on_match("leak", t0, {"room": "4"}, {}, "desk"),
        rules.advance(t0 + 3600),
    ]
    got = sorted((hm(m.ts), m.subscriber, len(m.notices)) for e in effs for m in e.messages)
    # ops: a group per room after 1 min; desk (the "*" policy): one group after 10 min
    assert got == [("10:01", "ops", 1), ("10:01", "ops", 1), ("10:10", "desk", 2)]


def test_an_alarm_still_active_when_its_silence_ends_starts_its_escalation() -> None:
    rules, router = make()
    t0 = at("2026-11-03T10:00")
    rules.add_silence({"matchers": ["room=101"], "for": "30m", "comment": "work"}, t0)
    eff = rules.on_match("leak", t0 + 60, {"room": "101"}, {}, "ops")
    assert [t.delivery for t in eff.transitions] == ["silenced"]
    assert router.escalator.pending == {}  # a silenced raise starts nothing
    got = sent([rules.advance(at("2026-11-03T11:00"))])
    # the silence ends at 10:30: the day crew (anna) at once, the boss 20 min later
    assert got == [("10:30", "anna", "escalation"), ("10:50", "boss", "escalation")]
