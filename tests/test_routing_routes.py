"""The routing tree: matching with continue, active times, transitions, schedules as receivers,
quiet hours with a minimum severity, and routes that can never match."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifiers.routing import explain, parse_routing

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

BERLIN = ZoneInfo("Europe/Berlin")
MON_NOON = datetime(2026, 11, 2, 12, 0, tzinfo=BERLIN).timestamp()
MON_NIGHT = datetime(2026, 11, 2, 23, 0, tzinfo=BERLIN).timestamp()

BASE = """
tz: Europe/Berlin
schedules:
  - id: crew
    layers:
      - {name: day, participants: [anna, ben], rotation: 1w, handoff: Mon 07:00,
         start: 2026-11-02, restrict: Mon-Sun 07:00-19:00}
      - {name: night, participants: [carla], rotation: 1d, handoff: "19:00",
         start: 2026-11-02, restrict: Mon-Sun 19:00-07:00}
escalation_policies:
  - id: page
    levels: [{receivers: [crew]}, {receivers: [boss], delay: 15m}]
quiet_hours:
  - {subscriber: desk, windows: Mon-Sun 18:00-08:00, min_severity: major}
route:
  receivers: [desk]
  routes:
    - name: fire
      match: [kind=fire]
      receivers: [crew, boss]
      continue: true
    - name: building-a
      match: [building=A]
      routes:
        - name: a-criticals
          match: ['severity=~critical|major']
          receivers: [crew]
          escalation: page
        - name: a-office-hours
          active: Mon-Fri 08:00-18:00
          receivers: [facility]
    - name: clears
      transitions: [clear]
      receivers: [log]
"""


def routing(text: str = BASE):
    r, errors = parse_routing(text, "r.yaml")
    assert errors == [] and r is not None
    return r


def test_first_match_wins_unless_continue() -> None:
    d = explain(
        routing(), {"kind": "fire", "building": "A", "severity": "major"}, "raise", MON_NOON
    )
    # fire continues, so building-a is tried and its criticals child delivers (escalation only)
    assert [(t.route, t.matched) for t in d.tried] == [
        ("root", True), ("fire", True), ("building-a", True), ("a-criticals", True),
        ("a-office-hours", False), ("clears", False),
    ]  # fmt: skip
    assert "does not continue" in d.tried[4].reason
    assert d.receivers == ["anna", "boss"]  # the crew schedule stands for anna at noon
    assert d.escalations == (("page", "a-criticals"),)
    assert d.deliveries[0].via == "schedule crew (layer day)"


def test_a_route_outside_its_active_time_lets_the_next_sibling_match() -> None:
    labels = {"building": "A", "severity": "minor"}
    day = explain(routing(), labels, "raise", MON_NOON)
    assert day.receivers == ["facility"]
    night = explain(routing(), labels, "raise", MON_NIGHT)
    office = next(t for t in night.tried if t.route == "a-office-hours")
    assert not office.matched and "outside its active time" in office.reason
    # building-a matched (through no child): its receivers are inherited from the root
    assert [d.route for d in night.deliveries] == ["building-a"]
    assert night.deliveries[0].subscriber == "desk" and not night.deliveries[0].told
    assert "quiet hours" in night.deliveries[0].reason


def test_transitions_limit_a_route() -> None:
    r = routing()
    assert explain(r, {"kind": "door"}, "clear", MON_NOON).receivers == ["log"]
    raised = explain(r, {"kind": "door"}, "raise", MON_NOON)
    assert raised.receivers == ["desk"]
    assert "transition raise not in [clear]" in raised.tried[-1].reason


def test_quiet_hours_let_the_minimum_severity_through() -> None:
    r = routing()
    for sev, told in [("critical", True), ("major", True), ("minor", False), ("info", False)]:
        d = explain(r, {"kind": "door", "severity": sev}, "raise", MON_NIGHT)
        assert [x.told for x in d.deliveries] == [told], sev
    assert explain(r, {"kind": "door", "severity": "info"}, "raise", MON_NOON).receivers == ["desk"]


def test_a_subscriber_is_told_once_and_nobody_on_call_is_said() -> None:
    text = BASE.replace("receivers: [crew, boss]", "receivers: [crew, boss, boss]")
    d = explain(routing(text), {"kind": "fire"}, "raise", MON_NIGHT)
    assert d.receivers == ["carla", "boss"]  # a child matched: the root does not deliver
    assert any("already told" in x.reason for x in d.deliveries)
    early = datetime(2026, 11, 1, 12, 0, tzinfo=BERLIN).timestamp()  # before the first handoff
    d = explain(routing(), {"kind": "fire"}, "raise", early)
    assert [(x.receiver, x.told, x.reason) for x in d.deliveries][0] == (
        "crew",
        False,
        "nobody on call",
    )


def problems(text: str) -> list[str]:
    r, errors = parse_routing(text, "r.yaml")
    assert r is None
    return [str(e) for e in errors]


def test_routes_that_can_never_match_are_errors_at_their_place() -> None:
    text = """route:
  receivers: [desk]
  routes:
    - match: [room=101]
      routes:
        - match: [room=102]
          receivers: [x]
    - receivers: [y]
    - match: [room=7]
      receivers: [z]
"""
    got = problems(text)
    assert got[0] == (
        "r.yaml:6:18: routes.0.routes.0.match: route 'root.1.1' can never match: "
        "room=101 and room=102 cannot both hold"
    )
    assert len(got) == 1  # the first problem of a tree stops its parse
    shadow = problems(text.replace("match: [room=102]", "match: [floor=2]"))
    assert shadow == [
        "r.yaml:9:7: routes.2: route 'root.3' can never match: route 'root.2' before it takes everything "
        "and does not continue"
    ]
    assert (
        "room=101 and room!=101"
        in problems("route:\n  routes:\n    - match: [room=101, room!=101]\n")[0]
    )


def test_bad_configuration_is_reported_with_file_line_column() -> None:
    text = """tz: Europe/Berlin
subscribers: [desk, anna]
schedules:
  - id: crew
    layers:
      - {participants: [anna], rotation: 1d, handoff: "02:30", start: 2026-03-01}
escalation_policies:
  - id: page
    levels: [{receivers: [nobody]}]
quiet_hours:
  - {subscriber: desk, windows: Mon-Sun 18:00-08:00, min_severity: huge}
route:
  receivers: [desk, ghost]
  escalation: pages
  colour: red
"""
    got = problems(text)
    assert got == [
        "r.yaml:6:55: schedule 'crew': layers.0.handoff: handoff at 02:30 does not exist on "
        "2026-03-29 in Europe/Berlin (a DST gap): choose a time outside it",
        "r.yaml:11:68: quiet hours #1: min_severity: unknown severity 'huge' (one of critical, "
        "major, minor, warning, info)",
        "r.yaml:15:3: colour: unknown key (allowed: name, match, receivers, escalation, continue, "
        "active, tz, transitions, routes)",
    ]
    got = problems(
        text.replace('"02:30"', '"03:30"').replace("huge", "major").replace("  colour: red\n", "")
    )
    assert got == [
        "r.yaml:13:21: route 'root': receivers.1: unknown receiver 'ghost': not a schedule nor one of the subscribers",
        "r.yaml:14:15: route 'root': escalation: no escalation policy 'pages'",
        "r.yaml:9:27: policy 'page': levels.0.receivers.0: unknown receiver 'nobody': not a "
        "schedule nor one of the subscribers",
    ]


@pytest.mark.parametrize(
    ("yaml_text", "words"),
    [
        ("route: {match: [a=b]}", "the root route takes every alarm"),
        ("schedules: 3\nroute: {}", "schedules: expected a list"),
        ("route: {routes: [{transitions: [bounce]}]}", "'bounce' is not a transition"),
        ("route: {routes: [{active: 'Mon-Fri 25:00-26:00'}]}", "bad time"),
        ("route: {routes: [{match: ['room=~(']}]}", "bad regex"),
        ("tz: Mars/Base\nroute: {}", "unknown time zone"),
        ("{}", "give the route tree"),
        ("route: [", "not valid YAML"),
    ],
)
def test_each_bad_input_says_what(yaml_text: str, words: str) -> None:
    got = problems(yaml_text)
    assert any(words in g for g in got), got


def test_an_escalation_step_is_told_through_schedules_and_quiet_hours() -> None:
    from notifiers.routing import tell

    r = routing()
    got = tell(r, ("crew", "desk"), "minor", MON_NIGHT, "page level 1")
    assert [(d.subscriber, d.told) for d in got] == [("carla", True), ("desk", False)]
    assert got[0].route == "page level 1" and "quiet hours" in got[1].reason


def test_an_unquoted_handoff_time_is_read_as_a_time() -> None:
    text = BASE.replace('handoff: "19:00"', "handoff: 19:00")  # YAML 1.1: the int 1140
    assert routing(text).schedules["crew"].layers[1].anchor.hour == 19


# ---------------------------------------------------------------------- against a definition
def _trees():
    from hypothesis import strategies as st

    from notifiers.alarms import Matcher

    matcher = st.builds(
        Matcher.of, st.sampled_from(["a", "b"]), st.sampled_from(["=", "!=", "=~"]),
        st.sampled_from(["x", "y", "x|y"]),
    )  # fmt: skip
    leaf = st.tuples(st.lists(matcher, max_size=2), st.booleans(), st.sets(st.sampled_from(["raise", "clear"]), max_size=2), st.just([]))  # fmt: skip
    return st.recursive(
        leaf,
        lambda kids: st.tuples(
            st.lists(matcher, max_size=2), st.booleans(), st.just(set()), st.lists(kids, max_size=3)
        ),  # fmt: skip
        max_leaves=10,
    )


def _build(shape, name: str):
    from notifiers.routing import Route

    matchers, cont, kinds, kids = shape
    children = tuple(_build(k, f"{name}.{i + 1}") for i, k in enumerate(kids))
    return Route(name, tuple(matchers), (name,), None, cont, (), frozenset(kinds) or None, children)


def _delivering(route, labels, kind) -> list[str]:
    """Alertmanager's rule, stated per node: a node delivers when it is reached and matches
    and no child of it is reached and matches; a child is reached when its parent is reached
    and matches and no earlier sibling matched without `continue`."""

    def own(r) -> bool:
        ok = all(m.matches(labels) for m in r.matchers)
        return ok and (r.transitions is None or kind in r.transitions)

    out: list[str] = []

    def visit(r) -> None:  # r is reached and matches
        reached = []
        for c in r.routes:
            if own(c):
                reached.append(c)
                if not c.cont:
                    break
        if not reached:
            out.append(r.name)
        for c in reached:
            visit(c)

    visit(route)
    return out


@settings(max_examples=300, deadline=None)
@given(
    shape=_trees(),
    a=st.sampled_from(["x", "y", ""]),
    b=st.sampled_from(["x", "y", ""]),
    kind=st.sampled_from(["raise", "clear"]),
)
def test_explain_delivers_exactly_the_routes_the_rule_names(
    shape, a: str, b: str, kind: str
) -> None:
    from notifiers.routing import Route, Routing

    root = _build(([], False, set(), shape[3]), "root")  # the root takes everything
    assert isinstance(root, Route)
    labels = {"a": a, "b": b}
    d = explain(Routing(root), labels, kind, 0.0)
    assert [x.route for x in d.deliveries] == _delivering(root, labels, kind)
    assert all(x.told for x in d.deliveries)
