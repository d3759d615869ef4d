"""`ens schedule who`, `ens route test` and `ens route check` on the example routing file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ens.cli import app

EXAMPLE = str(Path(__file__).parent.parent / "examples" / "routing" / "night-shift.yaml")


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_check_accepts_the_example_and_lists_every_problem_of_a_bad_file(tmp_path: Path) -> None:
    r = run("route", "check", EXAMPLE)
    assert r.exit_code == 0, r.output
    assert "ok (1 schedule(s), 4 route(s)" in r.output
    assert "warning" not in r.output  # day and night layers cover the week
    assert "0 grouping entries)" in r.output
    week = Path(EXAMPLE).parent / "keti-week-routing.yaml"
    r = run("route", "check", str(week))
    assert r.exit_code == 0, r.output
    assert "1 quiet-hours entries, 2 grouping entries)" in r.output  # facility-desk, security
    gappy = tmp_path / "gappy.yaml"
    gappy.write_text(
        Path(EXAMPLE)
        .read_text()
        .replace("restrict: Mon-Sun 07:00-19:00", "restrict: Mon-Fri 07:00-19:00")
    )
    r = run("route", "check", str(gappy))
    assert r.exit_code == 0, r.output
    assert (
        "warning: schedule 'technicians': nobody on call Sat 07:00-19:00, Sun 07:00-19:00 "
        "(Europe/Berlin; unless an override says so)"
    ) in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "tz: Mars/Base\nroute:\n  receivers: [desk]\n  routes: [{transitions: [boom]}]\n"
    )
    r = run("route", "check", str(bad))
    assert r.exit_code == 2
    assert f"error: {bad}:1:5: tz: " in r.output and "unknown time zone" in r.output
    assert f"error: {bad}:4:27: routes.0.transitions.0: 'boom' is not a transition" in r.output
    assert "2 problems" in r.output and "Traceback" not in r.output


def test_schedule_who_at_a_time() -> None:
    r = run("schedule", "who", "technicians", "--config", EXAMPLE, "--at", "2026-11-03T02:00")
    assert r.exit_code == 0, r.output
    assert (
        "carla (layer night, since Mon 2026-11-02 19:00 CET, until Tue 2026-11-03 07:00 CET)"
        in r.output
    )
    r = run(
        "schedule", "who", "technicians", "-c", EXAMPLE, "--at", "2026-12-24T23:00+01:00", "--json"
    )
    assert json.loads(r.output)["who"] == ["supervisor"]
    r = run("schedule", "who", "nope", "-c", EXAMPLE)
    assert r.exit_code == 2 and "no schedule 'nope'" in r.output and "technicians" in r.output
    r = run("schedule", "who", "technicians", "-c", EXAMPLE, "--at", "soon")
    assert r.exit_code == 2 and "--at: 'soon'" in r.output


def test_route_test_prints_who_gets_it_and_why() -> None:
    r = run(
        "route", "test", "-c", EXAMPLE, "--labels", "severity=critical,profile=window-open",
        "--at", "2026-11-03T02:00",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (
        "routes tried" in r.output and "windows-at-night matched and does not continue" in r.output
    )
    assert "escalation night-escalation (route critical)" in r.output
    assert "Tue 2026-11-03 02:15 CET" in r.output  # the second level, 15 minutes later
    r = run(
        "route", "test", "-c", EXAMPLE, "-l", "severity=minor,profile=door",
        "--at", "2026-11-03T02:00", "--json",
    )  # fmt: skip
    out = json.loads(r.output)
    assert out["receivers"] == []
    assert "quiet hours" in out["deliveries"][0]["reason"]
    r = run("route", "test", "-c", EXAMPLE, "-l", "severity", "--at", "2026-11-03T02:00")
    assert r.exit_code == 2 and "expected LABEL=VALUE" in r.output
    r = run("route", "test", "-c", EXAMPLE, "-l", "a=b", "-t", "explode")
    assert r.exit_code == 2 and "--transition: 'explode'" in r.output


def test_reasons_are_printed_as_text_not_as_markup() -> None:
    r = run(
        "route", "test", "-c", EXAMPLE, "-l", "building=annex,kind=laptop,room=[b]",
        "-t", "clear", "--at", "2026-11-04T10:00",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "transition clear not in [raise]" in r.output and "room=[b]" in r.output


def test_the_schedule_examples_of_the_docs_are_what_the_command_prints() -> None:
    import shlex

    docs = (Path(__file__).parent.parent / "docs" / "routing.md").read_text().splitlines()
    shown = [
        (line[2:], docs[i + 1])
        for i, line in enumerate(docs)
        if line.startswith("$ ens schedule who") or line.startswith("$ ens route check bad")
    ]
    assert len(shown) >= 3
    for command, first_line in shown:
        if "bad.yaml" in command:
            continue  # its file is the one of tests/test_routing_routes.py
        args = shlex.split(command)[1:]
        args = [EXAMPLE if a == "examples/routing/night-shift.yaml" else a for a in args]
        r = run(*args)
        assert r.output.splitlines()[0] == first_line, command


def test_route_test_shows_an_escalation_level_held_back_by_quiet_hours(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "tz: UTC\nescalation_policies:\n  - {id: p, levels: [{receivers: [desk]}]}\n"
        "quiet_hours:\n  - {subscriber: desk, windows: Mon-Sun 00:00-24:00}\n"
        "route:\n  routes: [{match: {room: 101}, escalation: p}]\n"
    )
    r = run("route", "test", "-c", str(f), "-l", "room=101,severity=minor", "--at", "0")
    assert r.exit_code == 0, r.output
    assert "desk (not told: quiet hours Mon-Sun 00:00-24:00: minor is below critical)" in r.output
