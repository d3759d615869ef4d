"""`ens schedule add|list|show|rm|who` against a real Redis (the service's store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ens.cli import app
from notifiers.routing import load_routing, parse_schedule
from notifiers.routing.schedules import schedule_to_json

EXAMPLE = Path(__file__).parent.parent / "examples" / "routing" / "night-shift.yaml"
pytestmark = pytest.mark.redis


def test_a_schedule_reads_back_equal_from_its_stored_definition() -> None:
    s = load_routing(EXAMPLE).schedules["technicians"]
    assert parse_schedule(json.loads(json.dumps(schedule_to_json(s)))) == s


def test_add_list_show_who_rm(redis_url: str, tmp_path: Path) -> None:
    def run(*args: str):
        return CliRunner(env={"ENS_REDIS_URL": redis_url}).invoke(app, list(args))

    r = run("schedule", "add", str(EXAMPLE))
    assert r.exit_code == 0, r.output
    assert r.output == "added: schedule technicians\n"
    assert run("schedule", "add", str(EXAMPLE)).output == "unchanged: schedule technicians\n"
    r = run("schedule", "who", "technicians", "--at", "2026-11-03T02:00+01:00")
    assert r.exit_code == 0, r.output
    assert "carla (layer night" in r.output
    r = run("schedule", "list", "--json")
    assert [row["id"] for row in json.loads(r.output)] == ["technicians"]
    shown = json.loads(run("schedule", "show", "technicians").output)
    assert shown["tz"] == "Europe/Berlin" and shown["layers"][1]["handoff"] == "19:00"

    changed = tmp_path / "s.yaml"
    changed.write_text(EXAMPLE.read_text().replace("[carla, dmitri, erik]", "[dmitri, carla]"))
    r = run("schedule", "add", str(changed))
    assert r.exit_code == 2 and "exists with another definition" in r.output
    assert (
        "carla (layer night" in run("schedule", "who", "technicians", "--at", "1793667600").output
    )
    assert (
        run("schedule", "add", str(changed), "--replace").output
        == "replaced: schedule technicians\n"
    )
    assert (
        "dmitri (layer night" in run("schedule", "who", "technicians", "--at", "1793667600").output
    )

    bad = tmp_path / "bad.yaml"
    bad.write_text("schedules:\n  - id: x\n    layers: [{participants: [], start: 2026-01-01}]\n")
    r = run("schedule", "add", str(bad))
    assert r.exit_code == 2 and f"{bad}:3:29: schedule 'x': layers.0.participants:" in r.output
    assert [row["id"] for row in json.loads(run("schedule", "list", "--json").output)] == [
        "technicians"
    ]  # nothing of the bad file was stored

    assert run("schedule", "rm", "technicians").output == "removed: schedule technicians\n"
    r = run("schedule", "rm", "technicians")
    assert r.exit_code == 2 and "no schedule 'technicians' stored" in r.output
    r = run("schedule", "who", "technicians")
    assert r.exit_code == 2 and "no schedule 'technicians' in the service" in r.output


def test_each_change_is_announced_on_the_engine_control_stream(r) -> None:  # noqa: ANN001
    """A running `ens serve --routing` rereads the stored schedules at each announcement."""
    from adapters.service import redis_store as rs
    from notifiers import schedule_store as ss

    assert (ss.CONTROL, ss.CONTROL_MAXLEN) == (rs.CONTROL, rs.CONTROL_MAXLEN)
    s = load_routing(EXAMPLE).schedules["technicians"]

    def announced() -> int:
        return sum(1 for _, f in r.xrange(rs.CONTROL) if f.get("op") == "schedules")

    ss.put_schedules(r, [s])
    assert announced() == 1
    ss.put_schedules(r, [s])  # unchanged: nothing to reread
    assert announced() == 1
    assert ss.schedule_ids(r) == ["technicians"]
    assert ss.remove_schedule(r, "technicians")
    assert announced() == 2 and ss.schedule_ids(r) == []
