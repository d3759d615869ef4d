"""The `alarm:` block of a profile file (profiles/alarm.py): parsed, or rejected with FILE:LINE:COL."""

from __future__ import annotations

import textwrap

import pytest

from profiles.alarm import AlarmSpec, clear_companion
from profiles.profile_file import parse_profile_document

GOOD = textwrap.dedent(
    """\
    profiles:
      - id: window-open
        subscriber: security
        expr: 'seq(w: kind = "window" and state = "open") per room'
        alarm:
          severity: major
          clear: after 30m
          notify: [clear, raise, ack]
      - id: door
        expr: 'seq(d: kind = "door" and state = "open") per building, room'
        alarm:
          clear: {on: 'kind = "door" and state = "closed"'}
      - id: leak
        expr: kind = "leak"
        alarm: {severity: critical}
      - id: plain
        expr: kind = "x"
    subscribers:
      - id: security
        channels: [{email: "s@example.org"}]
    """
)


def test_alarm_blocks_parsed() -> None:
    pset, errors = parse_profile_document(GOOD, "p.yaml")
    assert errors == []
    assert [p.id for p in pset.profiles] == ["window-open", "door", "leak", "plain"]
    assert pset.alarms["window-open"] == AlarmSpec(
        "major", "after", 1800.0, None, ("raise", "ack", "clear")
    )
    assert pset.alarms["door"].clear == "on"
    assert pset.alarms["door"].notify == ("raise", "clear")  # the default
    assert pset.alarms["leak"] == AlarmSpec("critical", "manual")
    assert "plain" not in pset.alarms  # no alarm: the profile is as before


def test_profile_without_alarm_is_unchanged() -> None:
    with_block, _ = parse_profile_document(GOOD, "p.yaml")
    without = GOOD.replace("alarm: {severity: critical}", "description: x")
    plain, _ = parse_profile_document(without, "p.yaml")
    assert with_block.profiles == plain.profiles  # the alarm is beside the profile, not in it


def test_clear_companion_has_the_alarms_partition() -> None:
    pset, _ = parse_profile_document(GOOD, "p.yaml")
    door = next(p for p in pset.profiles if p.id == "door")
    comp = clear_companion(door, pset.alarms["door"])
    assert comp is not None and comp.id == "door#clear"
    assert comp.per == ("building", "room")
    leak = next(p for p in pset.profiles if p.id == "leak")
    assert clear_companion(leak, pset.alarms["leak"]) is None


def _errors(alarm_yaml: str) -> list[str]:
    text = (
        "profiles:\n  - id: p\n    expr: 'seq(a: k = 1) per room'\n    alarm:\n"
        + textwrap.indent(textwrap.dedent(alarm_yaml), "      ")
    )
    pset, errors = parse_profile_document(text, "f.yaml")
    assert pset.profiles == []  # a bad alarm makes the profile invalid
    return [str(e) for e in errors]


@pytest.mark.parametrize(
    ("alarm", "message"),
    [
        ("colour: red\n", "f.yaml:5:7: profile 'p': alarm.colour: unknown key 'colour'"),
        (
            "severity: huge\n",
            "f.yaml:5:17: profile 'p': alarm.severity: unknown severity 'huge' "
            "(one of critical, major, minor, warning, info)",
        ),
        ("notify: [raise, bogus]\n", "f.yaml:5:15: profile 'p': alarm.notify:"),
        ("clear: after 3x\n", "f.yaml:5:14: profile 'p': alarm.clear: bad duration '3x'"),
        ("clear: sometimes\n", "f.yaml:5:14: profile 'p': alarm.clear: 'sometimes': expected"),
        (
            "clear: {on: 'seq(a: k = 1)'}\n",
            "f.yaml:5:19: profile 'p': alarm.clear.on: must be a filter",
        ),
        # the parser's column inside the expression, mapped to the file (after the quote)
        (
            "clear: {on: 'state = = 1'}\n",
            "f.yaml:5:28: profile 'p': alarm.clear.on: unexpected '='",
        ),
        # a block scalar: the expression's second line is the file's line 8, indented 10
        (
            "clear:\n  on: |\n    kind = 1 and\n    state = = 1\n",
            "f.yaml:8:19: profile 'p': alarm.clear.on: unexpected '='",
        ),
        ("- 1\n", "f.yaml:5:7: profile 'p': alarm.: must be a mapping"),
    ],
)
def test_bad_alarm_rejected_with_file_line_column(alarm: str, message: str) -> None:
    errors = _errors(alarm)
    assert len(errors) == 1, errors
    assert errors[0].startswith(message), errors[0]


def test_every_problem_reported() -> None:
    assert len(_errors("severity: huge\ncolour: red\nclear: after 0s\n")) == 3


def test_ens_check_reports_alarm_problems(tmp_path: object) -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    from ens.cli import app

    f = Path(str(tmp_path)) / "p.yaml"
    f.write_text(
        "profiles:\n  - id: p\n    expr: 'seq(a: k = 1) per room'\n    alarm: {severity: huge}\n"
    )
    r = CliRunner().invoke(app, ["check", str(f)])
    assert r.exit_code == 2
    assert f"{f}:4:23: profile 'p': alarm.severity: unknown severity 'huge'" in r.stderr
    assert "Traceback" not in r.stderr
    f.write_text(GOOD)
    r = CliRunner().invoke(app, ["check", str(f)])
    assert r.exit_code == 0, r.stderr


@pytest.mark.redis
def test_profile_add_stores_alarm_blocks(redis_url: str, tmp_path: object) -> None:
    """`ens profile add FILE` keeps each profile's `alarm:` (its normal form) and the plain
    profile stays plain; --severity/--clear/--notify describe one with --expr, and a bad one is
    refused naming the field, nothing stored."""
    from pathlib import Path

    import redis
    from typer.testing import CliRunner

    from adapters.service import redis_store as rs
    from ens.cli import app

    f = Path(str(tmp_path)) / "p.yaml"
    f.write_text(GOOD)
    runner = CliRunner(env={rs.ENV_URL: redis_url})
    r = runner.invoke(app, ["profile", "add", str(f)])
    assert r.exit_code == 0, r.stderr
    assert "alarm" not in r.stderr
    c = redis.Redis.from_url(redis_url)
    stored = {p["id"]: p.get("alarm") for p in rs.list_profiles(c)}
    assert stored == {
        "window-open": {
            "severity": "major",
            "notify": ["raise", "ack", "clear"],
            "clear": "after 1800s",
        },
        "door": {
            "severity": "warning",
            "notify": ["raise", "clear"],
            "clear": {"on": 'kind = "door" and state = "closed"'},
        },
        "leak": {"severity": "critical", "notify": ["raise", "clear"], "clear": "manual"},
        "plain": None,
    }
    again = runner.invoke(app, ["profile", "add", str(f)])
    assert again.exit_code == 0 and "replace" not in again.stderr  # the same definition
    bad = runner.invoke(
        app, ["profile", "add", "--id", "x", "--expr", 'kind = "x"', "--severity", "huge"]
    )
    assert bad.exit_code == 2 and "alarm.severity: unknown severity 'huge'" in bad.stderr
    bad = runner.invoke(
        app, ["profile", "add", "--id", "x", "--expr", 'kind = "x"', "--clear", "kind = = 1"]
    )
    assert bad.exit_code == 2 and "alarm.clear.on" in bad.stderr
    assert rs.get_profile(c, "x") is None
    ok = runner.invoke(
        app,
        ["profile", "add", "--id", "x", "--expr", 'kind = "x"', "--severity", "minor",
         "--clear", "after 5m", "--notify", "raise", "--notify", "repeat"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.stderr
    x = rs.get_profile(c, "x")
    assert x is not None
    shown = runner.invoke(app, ["profile", "show", "x"])
    assert "alarm:      severity minor, clear after 300s, notify raise, repeat" in shown.stdout
    assert x["alarm"] == {"severity": "minor", "notify": ["raise", "repeat"], "clear": "after 300s"}
