"""Alarm transitions through routing and escalation in their own time: synthetic histories and
the KETI excerpt end to end (`ens replay --alarms` then `ens route replay`)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from ens.cli import app
from notifiers.alarms import Transition
from notifiers.routing import parse_routing
from notifiers.routing.replay import replay_routing
from tests.helpers_routing import BERLIN, CREW_ROUTING, at

ROOT = Path(__file__).parent.parent
ROUTING = CREW_ROUTING


def tr(kind: str, ts: float, severity: str = "critical", delivery: str = "sent", alarm: str = "a1"):
    return Transition(
        f"{alarm}.1.x", 0, kind, alarm, 1, ts, "rule", "", None, "active-unacknowledged",  # type: ignore[arg-type]
        severity, 1, ts, ts, {"severity": severity, "room": "101"}, {}, delivery,
    )  # fmt: skip


def test_an_escalation_runs_past_the_handoff_until_acknowledged() -> None:
    routing, errors = parse_routing(ROUTING)
    assert routing is not None, errors
    history = [tr("raise", at("2026-11-03T06:30")), tr("ack", at("2026-11-03T08:15"))]
    rows, esc = replay_routing(routing, history, until=at("2026-11-03T12:00"))
    got = [(datetime.fromtimestamp(r.ts, BERLIN).strftime("%H:%M"), r.subscriber) for r in rows]
    # 06:30 night crew, 06:50 boss, 07:30 the ladder again: now the day crew; 07:50 boss;
    # acknowledged at 08:15: the 08:30 step never comes
    assert got == [("06:30", "carla"), ("06:50", "boss"), ("07:30", "anna"), ("07:50", "boss")]
    assert esc.pending == {}


def test_only_delivered_transitions_are_routed_and_a_clear_stops_either_way() -> None:
    routing, _ = parse_routing(ROUTING)
    assert routing is not None
    history = [
        tr("raise", at("2026-11-03T10:00"), delivery="silenced"),  # held back: no escalation
        tr("raise", at("2026-11-03T10:00"), alarm="a2"),
        tr("clear", at("2026-11-03T10:05"), alarm="a2", delivery="none"),  # not notified: stops
        tr("raise", at("2026-11-03T10:10"), severity="minor", alarm="a3"),
    ]
    rows, esc = replay_routing(routing, history, until=at("2026-11-03T12:00"))
    assert [(r.alarm, r.what, r.subscriber) for r in rows] == [
        ("a2", "escalation 1", "anna"),
        ("a3", "raise", "desk"),
    ]
    assert esc.pending == {}


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The KETI excerpt as events (`ens data convert keti`), converted once for the module."""
    out = tmp_path_factory.mktemp("keti") / "keti.jsonl"
    r = CliRunner().invoke(app, ["data", "convert", "keti", str(ROOT / "examples/data/keti")])
    assert r.exit_code == 0, r.output
    out.write_text(r.stdout)
    return out


def test_the_keti_excerpt_end_to_end(events: Path, tmp_path: Path) -> None:
    transitions = tmp_path / "t.jsonl"
    r = CliRunner().invoke(
        app,
        ["replay", "--alarms", str(ROOT / "examples/routing/keti-alarms.yaml"), str(events),
         "--out", str(transitions)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        app,
        ["route", "replay", str(transitions), "-c", str(ROOT / "examples/routing/keti-routing.yaml"),
         "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    la = ZoneInfo("America/Los_Angeles")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    got = [
        (datetime.fromtimestamp(x["ts"], la).strftime("%H:%M"), x["labels"]["profile"],
         x["labels"]["room"], x["what"], x["subscriber"], x["told"])
        for x in rows
    ]  # fmt: skip
    assert got == [
        ("03:00", "sensor-fault", "419", "escalation 1", "dee", True),  # the night crew
        ("03:15", "sensor-fault", "419", "escalation 2", "supervisor", True),
        ("04:15", "sensor-fault", "419", "escalation 1", "dee", True),
        ("04:30", "sensor-fault", "419", "escalation 2", "supervisor", True),
        ("05:30", "sensor-fault", "419", "escalation 1", "dee", True),
        ("05:45", "sensor-fault", "419", "escalation 2", "supervisor", True),  # max_repeats: 2
        ("06:37", "occupied", "752", "raise", "security", True),  # after hours
        ("08:09", "occupied", "621", "raise", "facility-desk", False),  # quiet until 09:00
        ("08:21", "occupied", "419", "raise", "facility-desk", False),
        ("08:58", "occupied", "621A", "raise", "facility-desk", False),
        ("09:12", "sensor-fault", "723", "escalation 1", "ana", True),  # the day crew
        ("09:15", "occupied", "419", "raise", "facility-desk", True),
        ("09:27", "sensor-fault", "723", "escalation 2", "supervisor", True),
        ("09:32", "sensor-fault", "723", "clear", "ana", True),  # cleared: escalation stops
        ("09:36", "co2-high", "419", "raise", "facility-desk", True),
    ]


def test_bad_input_to_route_replay_says_what(tmp_path: Path) -> None:
    config = str(ROOT / "examples/routing/keti-routing.yaml")
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"x": 1}\n')
    r = CliRunner().invoke(app, ["route", "replay", str(bad), "-c", config])
    assert r.exit_code == 2 and f"{bad}:1: not an alarm transition" in r.output
    bad.write_text("")
    r = CliRunner().invoke(app, ["route", "replay", str(bad), "-c", config, "--until", "never"])
    assert r.exit_code == 2 and "--until: 'never'" in r.output
    r = CliRunner().invoke(app, ["route", "replay", str(tmp_path / "none"), "-c", config])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_replay_alarms_with_routing_tells_the_same_as_route_replay(
    events: Path, tmp_path: Path
) -> None:
    """`ens replay --alarms --routing` runs the alarm rules with the service's router: the
    same decisions as `ens route replay` of its transitions, in one command."""
    routing = str(ROOT / "examples/routing/keti-routing.yaml")
    transitions = tmp_path / "t.jsonl"
    r = CliRunner().invoke(
        app,
        ["replay", "--alarms", str(ROOT / "examples/routing/keti-alarms.yaml"), str(events),
         "--routing", routing, "--json", "--out", str(transitions)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    mine = [json.loads(line) for line in r.stdout.splitlines()]
    r = CliRunner().invoke(app, ["route", "replay", str(transitions), "-c", routing, "--json"])
    theirs = [json.loads(line) for line in r.stdout.splitlines()]

    def key(x: dict) -> tuple:
        return (round(x["ts"], 3), x["alarm"], x["what"], x["subscriber"], x["told"])

    assert [key(x) for x in mine][: len(theirs)] == [key(x) for x in theirs]
    assert len(mine) >= len(theirs) >= 15
    # the table: the first hour is enough (03:00 a sensor fault, 03:15 its supervisor step)
    first_hour = tmp_path / "first-hour.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    start = json.loads(lines[0])["ts"]
    first_hour.write_text("".join(x for x in lines if json.loads(x)["ts"] < start + 3600))
    table = CliRunner().invoke(
        app,
        ["replay", "--alarms", str(ROOT / "examples/routing/keti-alarms.yaml"), str(first_hour),
         "--routing", routing, "--out", str(tmp_path / "t2.jsonl")],
    )  # fmt: skip
    assert table.exit_code == 0, table.output
    assert "who is told, when" in table.output and "supervisor" in table.output
    bad = CliRunner().invoke(app, ["replay", str(events), str(events), "--routing", routing])
    assert bad.exit_code != 0 and "go with --alarms" in bad.output


TWO_POLICIES = """
escalation_policies:
  - {id: crew-page, levels: [{receivers: [crew]}, {receivers: [boss], delay: 10m}]}
  - {id: security-page, levels: [{receivers: [guard]}]}
route:
  receivers: [desk]
  routes:
    - {name: critical, match: [severity=critical], escalation: crew-page, continue: true}
    - {name: annex, match: [building=annex], escalation: security-page}
"""


def test_one_escalation_per_occurrence_the_first_matching_routes(tmp_path: Path) -> None:
    """Two escalating routes match (`continue`): the first one's policy runs, the other's does
    not start (docs/routing.md#escalation); `ens route test` and `ens route check` say so."""
    routing, errors = parse_routing(TWO_POLICIES)
    assert routing is not None, errors
    raised = tr("raise", at("2026-11-03T10:00"))
    raised.labels["building"] = "annex"
    rows, esc = replay_routing(routing, [raised], until=at("2026-11-03T11:00"))
    assert [(r.what, r.subscriber) for r in rows] == [
        ("escalation 1", "crew"),
        ("escalation 2", "boss"),
    ]
    assert esc.pending == {}  # the ladder ran out; guard was never paged
    f = tmp_path / "r.yaml"
    f.write_text(TWO_POLICIES)
    cli = CliRunner()
    got = cli.invoke(app, ["route", "test", "-c", str(f), "-l", "severity=critical,building=annex"])
    assert got.exit_code == 0, got.output
    assert "escalation crew-page (route critical) while nobody acknowledges" in got.output
    assert "escalation security-page (route annex): not started" in got.output
    got = cli.invoke(
        app, ["route", "test", "-c", str(f), "-l", "severity=critical,building=annex", "--json"]
    )
    assert json.loads(got.stdout)["escalations"] == [
        {"policy": "crew-page", "route": "critical", "starts": True},
        {"policy": "security-page", "route": "annex", "starts": False},
    ]
    got = cli.invoke(app, ["route", "check", str(f)])
    assert got.exit_code == 0, got.output
    assert (
        "warning: routes 'critical' (crew-page) and 'annex' (security-page) may both match an "
        "alarm: only 'critical''s escalation would start"
    ) in got.output
    f.write_text(TWO_POLICIES.replace(", continue: true", ""))  # no continue: no clash
    assert "warning" not in cli.invoke(app, ["route", "check", str(f)]).output
