"""`ens demo` end to end on the quickstart feed: real service process, mail and webhook sinks."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path

import psutil
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from ens.commands.demo import demo
from ens.demo import QUICKSTART, DemoConfig, print_summary, run_demo

EVENTS = QUICKSTART / "events.jsonl"


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    app.command("demo")(demo)
    app.command("noop")(lambda: None)  # keeps `demo` a sub-command, as in the real CLI
    return app


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_demo_end_to_end_on_the_quickstart_feed() -> None:
    # processes this test worker had before (e.g. the JVM of the session's Spark fixture)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    out = io.StringIO()
    res = run_demo(DemoConfig(events=EVENTS), Console(file=out, width=120))
    assert time.monotonic() - t0 < 60
    counts = {row.profile: row.count for row in res.rows}
    # the same notifications as `ens replay examples/quickstart/...`: every profile fires
    assert counts == {"hot": 1, "break-in": 1, "lab-climate": 1, "silent-sensor": 4}
    assert res.replay_match and res.replay_notifications == res.notifications == 7
    first = {row.profile: row.first for row in res.rows}
    assert first["break-in"] == 1709331000.0  # 2024-03-01T22:10:00Z, the presence event
    # every subscriber has an e-mail channel; only `security` has a webhook
    assert res.mails == res.mails_expected == 7
    assert res.webhooks_valid == res.webhooks_expected == 1 and res.webhooks_invalid == 0
    assert res.dead_letters == 0
    # clean stop: the service exited 0, it and its embedded Redis are gone, nothing left behind
    assert res.service_status == 0
    assert len(res.pids) == 2 and res.leftovers == []
    assert not any(_alive(pid) for pid in res.pids)
    left = psutil.Process().children(recursive=True)
    assert not [c for c in left if c.pid not in before and _alive(c.pid)]
    assert not Path(res.data_dir).exists()
    assert res.ok
    text = out.getvalue()
    assert "break-in" in text and "signature verified" in text and "✉ mail to" in text
    summary = io.StringIO()
    print_summary(Console(file=summary, width=120), res)
    assert "Notifications per profile" in summary.getvalue()
    assert "silent-sensor" in summary.getvalue()


def test_demo_default_feed_reports_every_injected_incident() -> None:
    """The default run (what `make demo` shows): the synthetic building, its injected incidents."""
    res = run_demo(DemoConfig(days=1.0, seed=3), Console(file=io.StringIO(), width=120))
    assert res.incidents is not None and res.incidents >= 4
    assert res.incidents_found == res.incidents
    assert res.replay_match and res.notifications == res.replay_notifications >= res.incidents
    assert res.mails == res.mails_expected and res.webhooks_valid == res.webhooks_expected
    assert res.dead_letters == 0 and res.webhooks_invalid == 0 and res.ok


def test_demo_command_prints_the_summary(app: typer.Typer) -> None:
    res = CliRunner().invoke(app, ["demo", "--events", str(EVENTS), "--show", "2"])
    assert res.exit_code == 0, res.output
    assert "Notifications per profile" in res.output
    assert "mails received by the sink" in res.output
    assert "more notifications are counted" in res.output


def test_user_errors_are_one_line_and_exit_2(app: typer.Typer, tmp_path: Path) -> None:
    bad_profiles = tmp_path / "bad.yaml"
    bad_profiles.write_text("profiles:\n  - id: x\n    expr: kind =\n")
    bad_events = tmp_path / "bad.jsonl"
    bad_events.write_text('{"id": "a", "ts": "2024-03-01T22:00:00Z"}\n{"id": "b"}\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases = {
            "--profiles": (["--profiles", str(bad_profiles)], "profile 'x'"),
            "--events": (["--events", str(bad_events)], "bad.jsonl:2: missing required key 'ts'"),
            "missing": (["--events", str(tmp_path / "nope.jsonl")], "cannot read"),
            "--port": (["--events", str(EVENTS), "--port", str(port)], f"port {port}"),
            "--dataset": (["--dataset", "nope"], "unknown data set 'nope'"),
            "both": (["--dataset", "keti", "--events", str(EVENTS)], "not both"),
        }
        for name, (args, message) in cases.items():
            res = CliRunner().invoke(app, ["demo", *args])
            assert res.exit_code == 2, (name, res.output)
            lines = res.output.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (name, res.output)
            assert message in lines[0], (name, lines[0])
