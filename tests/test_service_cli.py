"""`ens profile | subscriber | gateway | post | notifications tail` against a running service."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import typer
import typer.testing
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from ens.commands.service import register
from tests.helpers_service import ROOT, Service, free_port, outbox_for, redis_server, wait_for

BAD_FILE = """\
profiles:
  - id: broken
    expr: |
      seq(a: kind = "door",
          b: kind >) within 1m
  - id: unbounded
    expr: 'seq(a: kind = "x", b: kind = "y") select each'
  - id: fine
    expr: kind = "ok"
subscribers:
  - {id: ops, channels: [{email: "a b@example.org"}]}
  - {id: typo, chanels: [{email: "typo@example.org"}]}
"""

GOOD_FILE = """\
profiles:
  - id: cli-door
    subscriber: facilities
    expr: |
      seq(d: kind = "door" and state = "open",
          m: kind = "motion") within 10m per room
  - id: cli-alarm
    expr: kind = "cli-alarm"
subscribers:
  - id: facilities
    channels: [{email: "ops@example.org"}, {webhook: "https://hooks.example.org/ens"}]
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("svc-cli")
    with redis_server(d) as url:
        s = Service(url, d / "serve.log", "--reorder-seconds", "0.3").start()
        try:
            yield s
        finally:
            s.stop()


@pytest.fixture(scope="module")
def r(svc: Service) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(svc.redis_url or "", decode_responses=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def cli(svc: Service) -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def run(app: typer.Typer, svc: Service, *args: str, stdin: str | None = None):  # noqa: ANN201
    """Invoke with the service's Redis (as ENS_REDIS_URL would give it)."""
    env = {rs.ENV_URL: svc.redis_url, "ENS_URL": svc.url}
    return CliRunner(env=env).invoke(app, list(args), input=stdin)


def test_profile_add_reports_every_problem_like_ens_check(
    cli: typer.Typer, svc: Service, r: redis.Redis, tmp_path: Path
) -> None:
    from ens.cli import app as ens_app

    f = tmp_path / "bad.yaml"
    f.write_text(BAD_FILE)
    res = run(cli, svc, "profile", "add", str(f))
    assert res.exit_code == 2
    mine = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    check = CliRunner().invoke(ens_app, ["check", str(f)])
    assert check.exit_code == 2
    assert mine == [line for line in check.stderr.splitlines() if line.startswith("error:")]
    assert len(mine) == 4
    assert "profile 'broken': line 2, column" in mine[0] and "expected" in mine[0]
    assert "profile 'unbounded'" in mine[1] and "within" in mine[1]
    assert mine[2] == ("error: file line 11: subscriber 'ops': channels.0.email: "
                       "'a b@example.org' is not an e-mail address")
    assert mine[3] == (f"error: {f}:12:16: subscriber 'typo': chanels: unknown key "
                       "(allowed: id, channels, digest, secret)")  # was stored without channels
    assert "nothing stored" in res.stderr
    assert rs.get_profile(r, "fine") is None  # all or nothing

    res = run(cli, svc, "profile", "add", "--id", "x1", "--expr", 'seq(a: k = 1, b: k = ) within 1m')
    assert res.exit_code == 2 and "profile 'x1': line 1, column" in res.stderr
    res = run(cli, svc, "profile", "add", "--id", "x2", "--expr", "k = 1", "--subscriber", "nobody")
    assert res.exit_code == 2 and "unknown subscriber 'nobody'" in res.stderr
    assert run(cli, svc, "profile", "add").exit_code == 2


def test_profiles_from_the_cli_take_effect_without_restart(
    cli: typer.Typer, svc: Service, r: redis.Redis, tmp_path: Path
) -> None:
    f = tmp_path / "good.yaml"
    f.write_text(GOOD_FILE)
    res = run(cli, svc, "profile", "add", str(f))
    assert res.exit_code == 0, res.output
    assert "subscriber facilities stored" in res.stdout and "signing secret" in res.stdout
    assert "profile cli-door added" in res.stdout
    listed = run(cli, svc, "profile", "list")
    assert "cli-door" in listed.stdout and "facilities" in listed.stdout
    shown = run(cli, svc, "profile", "show", "cli-door")
    assert "within 10m per room" in shown.stdout
    assert run(cli, svc, "profile", "show", "nope").exit_code == 2

    key = run(cli, svc, "gateway", "add", "cli-gw").stdout.strip()
    now = time.time()
    lines = [
        {"id": "cd1", "ts": now, "kind": "door", "state": "open", "room": "7"},
        {"id": "cm1", "ts": now + 0.01, "kind": "motion", "room": "7"},
        {"id": "bad", "kind": "motion"},
        {"id": "ca1", "ts": now + 0.02, "kind": "cli-alarm"},
    ]
    ev = tmp_path / "events.jsonl"
    ev.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n"
                  + "\n".join(json.dumps(x) for x in lines[2:]) + "\n")
    res = run(cli, svc, "post", str(ev), "--api-key", key, "--batch", "2")
    assert res.exit_code == 2  # one bad line
    assert "3 accepted, 1 rejected" in res.stdout
    assert "error: line 4: missing required key 'ts'" in res.stderr
    door = wait_for(lambda: outbox_for(r, "cli-door"), 10, "cli-door notification")
    assert door[0]["subscriber"] == "facilities"
    assert {k: v["id"] for k, v in door[0]["events"].items()} == {"d": "cd1", "m": "cm1"}
    res = run(cli, svc, "post", "-", "--api-key", key,  # '-': JSON lines from stdin
              stdin=json.dumps({"id": "ca2", "ts": now + 0.03, "kind": "cli-alarm"}) + "\n")
    assert res.exit_code == 0 and "1 accepted, 0 rejected" in res.stdout
    alarms = wait_for(lambda: (lambda a: a if len(a) == 2 else None)(outbox_for(r, "cli-alarm")),
                      10, "both cli-alarm notifications")
    assert [n["events"]["e"]["id"] for n in alarms] == ["ca1", "ca2"]
    tail = run(cli, svc, "notifications", "tail")
    ids = [json.loads(line)["id"] for line in tail.stdout.splitlines()]
    assert door[0]["id"] in ids
    last = run(cli, svc, "notifications", "tail", "--last", "1")
    assert len(last.stdout.splitlines()) == 1

    assert run(cli, svc, "subscriber", "rm", "facilities").exit_code == 2  # still used
    assert run(cli, svc, "profile", "rm", "cli-door").exit_code == 0
    assert run(cli, svc, "profile", "rm", "cli-door").exit_code == 2
    assert run(cli, svc, "subscriber", "rm", "facilities").exit_code == 0


def test_gateways_and_subscribers(cli: typer.Typer, svc: Service, r: redis.Redis,
                                  tmp_path: Path) -> None:
    res = run(cli, svc, "gateway", "add", "gw-a")
    assert res.exit_code == 0 and "shown once" in res.stderr
    key = res.stdout.strip()
    assert key.startswith("gw-a.") and rs.sha256(key) in r.hget(rs.GATEWAYS, "gw-a")
    assert run(cli, svc, "gateway", "add", "gw-a").exit_code == 2
    assert run(cli, svc, "gateway", "add", "bad name").exit_code == 2
    assert "active" in run(cli, svc, "gateway", "list").stdout
    assert run(cli, svc, "gateway", "revoke", "gw-a").exit_code == 0
    assert "revoked" in run(cli, svc, "gateway", "list").stdout
    assert run(cli, svc, "gateway", "revoke", "nope").exit_code == 2
    ev = tmp_path / "one.jsonl"
    ev.write_text(json.dumps({"ts": time.time(), "kind": "x"}) + "\n")
    res = run(cli, svc, "post", str(ev), "--api-key", key)
    assert res.exit_code == 2 and "403" in res.stderr and "revoked" in res.stderr

    res = run(cli, svc, "subscriber", "add", "s1", "--email", "a@example.org",
              "--webhook", "https://h.example.org/x", "--secret", "s3cret-value")
    assert res.exit_code == 0 and "s3cret" not in res.stdout
    assert "webhook https://h.example.org/x" in run(cli, svc, "subscriber", "list").stdout
    assert "s3cret" not in run(cli, svc, "subscriber", "list").stdout
    res = run(cli, svc, "subscriber", "add", "s2", "--email", "nope", "--webhook", "ftp://x")
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: subscriber 's2': channels.0.email: 'nope' is not an "
                                  "e-mail address; channels.1.webhook: 'ftp://x' is not an "
                                  "http(s) URL")
    assert run(cli, svc, "subscriber", "add", "s3").exit_code == 2
    assert run(cli, svc, "subscriber", "rm", "s1").exit_code == 0
    assert run(cli, svc, "subscriber", "rm", "s1").exit_code == 2


def test_gateway_lateness_is_stored_and_applied_by_the_running_worker(
    cli: typer.Typer, svc: Service, r: redis.Redis
) -> None:
    assert run(cli, svc, "gateway", "add", "gw-late", "--lateness", "1.5s").exit_code == 0
    assert "1.5 s" in run(cli, svc, "gateway", "list").stdout
    wait_for(lambda: "gateway gw-late: lateness 1.5 s" in Path(svc.log).read_text(), 10,
             "the worker applies the new gateway's lateness")
    res = run(cli, svc, "gateway", "set", "gw-late", "--lateness", "0")
    assert res.exit_code == 0 and res.stdout.strip() == "gateway gw-late: lateness 0 s"
    assert rs.gateway_lateness(r, "gw-late") == {"gw-late": 0.0}
    wait_for(lambda: "gateway gw-late: lateness 0 s" in Path(svc.log).read_text(), 10,
             "the worker applies the changed lateness")
    assert run(cli, svc, "gateway", "set", "gw-late", "--lateness", "default").exit_code == 0
    assert rs.gateway_lateness(r, "gw-late") == {"gw-late": None}
    res = run(cli, svc, "gateway", "set", "gw-late", "--lateness", "soon")
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: --lateness: lateness 'soon' is not a duration "
                                  "(e.g. 0, 500ms, 2s, 1m, or default)")
    assert run(cli, svc, "gateway", "set", "nope", "--lateness", "0").exit_code == 2
    assert run(cli, svc, "gateway", "add", "gw-x", "--lateness", "-1").exit_code == 2


def test_embedded_redis_in_the_data_dir(tmp_path: Path) -> None:
    """No --redis-url: the CLI and `serve` share an embedded Redis persisted in --data-dir."""
    data = tmp_path / "ens-data"
    app = typer.Typer()
    register(app)
    env = {rs.ENV_URL: None}
    res = CliRunner(env=env).invoke(app, ["gateway", "add", "emb", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    key = res.stdout.strip()
    res = CliRunner(env=env).invoke(
        app, ["profile", "add", "--id", "emb", "--expr", 'kind = "emb"', "--data-dir", str(data)]
    )
    assert res.exit_code == 0, res.output
    svc = Service(None, tmp_path / "serve.log", data_dir=data).start()
    try:
        now = time.time()
        resp = httpx.post(svc.url + "/v1/events", json={"id": "em1", "ts": now, "kind": "emb"},
                          headers={"X-API-Key": key})
        assert resp.status_code == 202

        def notified() -> bool:
            res = CliRunner(env=env).invoke(app, ["notifications", "tail",
                                                  "--data-dir", str(data)])
            return '"em1"' in res.stdout

        wait_for(notified, 15, "notification via the embedded Redis")
    finally:
        assert svc.stop(signal.SIGTERM) == 0
    assert "stopped" in (tmp_path / "serve.log").read_text()


def test_serve_rejects_an_index_that_is_not_one(tmp_path: Path) -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--index", str(tmp_path)])
    assert res.exit_code == 2
    assert "not an `ens spark index` snapshot" in res.output and str(tmp_path) in res.output


def test_serve_rejects_an_unknown_time_zone() -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--tz", "Mars/Olympus"])
    assert res.exit_code == 2 and "unknown time zone 'Mars/Olympus'" in res.output


def test_serve_engine_option_is_checked() -> None:
    """`--engine` is builtin or spark; spark with only the engine role leaves nothing to run."""
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--engine", "flink"])
    assert res.exit_code == 2 and "--engine must be builtin or spark, not 'flink'" in res.output
    res = CliRunner().invoke(ens_app, ["serve", "--engine", "spark", "--role", "engine"])
    assert res.exit_code == 2 and "leaves nothing to run here" in res.output


def test_spark_stream_reports_bad_options_in_one_line() -> None:
    """`ens spark stream`: bad options and an unreachable Redis are one-line errors (exit 2)
    before Spark starts."""
    from ens.cli import app as ens_app

    def run(*args: str) -> typer.testing.Result:
        return CliRunner(env={"ENS_REDIS_URL": None}).invoke(ens_app, ["spark", "stream", *args])

    res = run()
    assert res.exit_code == 2 and "--redis-url (or ENS_REDIS_URL) is required" in res.output
    res = run("--redis-url", "redis://127.0.0.1:1/0", "--trigger", "soon")
    assert res.exit_code == 2 and "--trigger 'soon': expected a duration" in res.output
    res = run("--redis-url", "redis://127.0.0.1:1/0", "--clock", "sun")
    assert res.exit_code == 2 and "--clock must be wall or event" in res.output
    res = run("--redis-url", "redis://127.0.0.1:1/0")
    assert res.exit_code == 2 and "cannot reach Redis at redis://127.0.0.1:1/0" in res.output
    assert "Traceback" not in res.output


def test_serve_reports_start_up_errors_in_one_line() -> None:
    """User errors at start-up: exit status 2 and one `error:` line, no traceback."""

    def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ens.service", "serve", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**{k: v for k, v in os.environ.items() if k != rs.ENV_URL}, **env},
        )

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = serve("--no-deliver", "--port", str(port),
                    "--redis-url", f"redis://127.0.0.1:{free_port()}")
    assert res.returncode == 2, res.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}" in res.stderr
    assert "Traceback" not in res.stderr

    dead = free_port()  # nothing listens there
    res = serve("--no-deliver", "--port", str(free_port()), "--redis-url", f"redis://127.0.0.1:{dead}")
    assert res.returncode == 2, res.stderr
    assert "error: cannot reach Redis" in res.stderr and "Traceback" not in res.stderr

    res = serve("--port", str(free_port()), "--redis-url", f"redis://127.0.0.1:{dead}",
                ENS_RETRY_MAX_ATTEMPTS="0")  # the delivery worker's settings are checked first
    assert res.returncode == 2, res.stderr
    assert "error: notifier config: ENS_RETRY_MAX_ATTEMPTS (retry.max_attempts)" in res.stderr
    assert "Traceback" not in res.stderr


def test_post_retries_what_nothing_accepted_and_never_resends_the_rest(cli: typer.Typer, tmp_path: Path) -> None:
    """`ens post` against a loopback server that is restarting: 503 (Retry-After) twice, then up."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[int] = []  # status answered per request

    class Restarting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            n = len(body.splitlines())
            if len(seen) < 2:
                status, out = 503, {"error": "ingest store unavailable"}
            else:
                status, out = 202, {"accepted": n, "rejected": 0, "errors": []}
            seen.append(status)
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Restarting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ev = tmp_path / "e.jsonl"
    ev.write_text("".join(json.dumps({"id": f"e{i}", "ts": i}) + "\n" for i in range(5)))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        res = CliRunner().invoke(cli, ["post", str(ev), "--api-key", "k", "--url", url, "--batch", "3"])
        assert res.exit_code == 0, res.output
        assert seen == [503, 503, 202, 202]  # the first batch three times, the second once
        assert "5 accepted, 0 rejected" in res.stdout and "retry 2 of 5" in res.stderr
        seen.clear()
        res = CliRunner().invoke(cli, ["post", str(ev), "--api-key", "k", "--url", url, "--retries", "1"])
        assert res.exit_code == 1 and seen == [503, 503]  # gave up: nothing accepted, said so
        assert "HTTP 503" in res.output and "Traceback" not in res.output
    finally:
        httpd.shutdown()
    port = free_port()  # nothing listens: refused every time, retried, then a clear error
    res = CliRunner().invoke(cli, ["post", str(ev), "--api-key", "k", "--url", f"http://127.0.0.1:{port}",
                                   "--retries", "1"])
    assert res.exit_code == 1 and "cannot reach" in res.output and "retry 1 of 1" in res.output


def test_serve_rejects_a_negative_reorder_delay() -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--reorder-seconds", "-5"])
    assert res.exit_code == 2
    assert "--reorder-seconds" in res.output and "-5" in res.output and ">= 0" in res.output
