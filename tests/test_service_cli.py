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
from notifiers import store
from tests.helpers_service import (
    ROOT,
    Service,
    client_fixtures,
    free_port,
    outbox_for,
    redis_server,
    wait_for,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

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


r, _admin = client_fixtures()


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
    assert mine[2] == (
        "error: file line 11: subscriber 'ops': channels.0.email: "
        "'a b@example.org' is not an e-mail address"
    )
    assert mine[3] == (
        f"error: {f}:12:16: subscriber 'typo': chanels: unknown key "
        "(allowed: id, channels, digest, secret, templates)"
    )  # was stored without channels
    assert (
        "4 problem(s) (2 in 2 profile(s), 2 in subscribers); 1 of 3 profile(s) valid; "
        "nothing stored"
    ) in res.stderr
    assert rs.get_profile(r, "fine") is None  # all or nothing
    f.write_text(
        "profiles:\n  - {id: ok1, expr: 'k = 1'}\n"
        "  - {id: bad1, expr: 'k = 2', subscriber: nobody}\n"
    )
    res = run(cli, svc, "profile", "add", str(f))  # the subscriber is neither in it nor stored
    assert res.exit_code == 2
    assert "1 problem(s) (1 in 1 profile(s)); 1 of 2 profile(s) valid; nothing stored" in res.stderr

    res = run(
        cli, svc, "profile", "add", "--id", "x1", "--expr", "seq(a: k = 1, b: k = ) within 1m"
    )
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
    ev.write_text(
        "\n".join(json.dumps(x) for x in lines[:2])
        + "\n\n"
        + "\n".join(json.dumps(x) for x in lines[2:])
        + "\n"
    )
    res = run(cli, svc, "post", str(ev), "--api-key", key, "--batch", "2")
    assert res.exit_code == 2  # one bad line
    assert "3 accepted, 1 rejected" in res.stdout
    assert "error: line 4: missing required key 'ts'" in res.stderr
    door = wait_for(lambda: outbox_for(r, "cli-door"), 10, "cli-door notification")
    assert door[0]["subscriber"] == "facilities"
    assert {k: v["id"] for k, v in door[0]["events"].items()} == {"d": "cd1", "m": "cm1"}
    res = run(
        cli,
        svc,
        "post",
        "-",
        "--api-key",
        key,  # '-': JSON lines from stdin
        # stamped as it is sent (a bit ahead: a slow post must not make it late, which would
        # send it to the late output instead of the engine)
        stdin=json.dumps({"id": "ca2", "ts": time.time() + 0.5, "kind": "cli-alarm"}) + "\n",
    )
    assert res.exit_code == 0 and "1 accepted, 0 rejected" in res.stdout
    alarms = wait_for(
        lambda: (lambda a: a if len(a) == 2 else None)(outbox_for(r, "cli-alarm")),
        10,
        "both cli-alarm notifications",
    )
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


def test_gateways_and_subscribers(
    cli: typer.Typer, svc: Service, r: redis.Redis, tmp_path: Path
) -> None:
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

    res = run(
        cli,
        svc,
        "subscriber",
        "add",
        "s1",
        "--email",
        "a@example.org",
        "--webhook",
        "https://h.example.org/x",
        "--secret",
        "s3cret-value",
    )
    assert res.exit_code == 0 and "s3cret" not in res.stdout
    assert "webhook https://h.example.org/x" in run(cli, svc, "subscriber", "list").stdout
    assert "s3cret" not in run(cli, svc, "subscriber", "list").stdout
    res = run(cli, svc, "subscriber", "add", "s2", "--email", "nope", "--webhook", "ftp://x")
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        "error: subscriber 's2': channels.0.email: 'nope' is not an "
        "e-mail address; channels.1.webhook: 'ftp://x' is not an "
        "http(s) URL"
    )
    assert run(cli, svc, "subscriber", "add", "s3").exit_code == 2
    assert run(cli, svc, "subscriber", "rm", "s1").exit_code == 0
    assert run(cli, svc, "subscriber", "rm", "s1").exit_code == 2


def test_gateway_lateness_is_stored_and_applied_by_the_running_worker(
    cli: typer.Typer, svc: Service, r: redis.Redis
) -> None:
    assert run(cli, svc, "gateway", "add", "gw-late", "--lateness", "1.5s").exit_code == 0
    assert "1.5 s" in run(cli, svc, "gateway", "list").stdout
    wait_for(
        lambda: "gateway gw-late: lateness 1.5 s" in Path(svc.log).read_text(),
        10,
        "the worker applies the new gateway's lateness",
    )
    res = run(cli, svc, "gateway", "set", "gw-late", "--lateness", "0")
    assert res.exit_code == 0 and res.stdout.strip() == "gateway gw-late: lateness 0 s"
    assert rs.gateway_lateness(r, "gw-late") == {"gw-late": 0.0}
    wait_for(
        lambda: "gateway gw-late: lateness 0 s" in Path(svc.log).read_text(),
        10,
        "the worker applies the changed lateness",
    )
    assert run(cli, svc, "gateway", "set", "gw-late", "--lateness", "default").exit_code == 0
    assert rs.gateway_lateness(r, "gw-late") == {"gw-late": None}
    res = run(cli, svc, "gateway", "set", "gw-late", "--lateness", "soon")
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        "error: --lateness 'soon': expected a duration (500ms, 2s, 30m, 1h, 1d or seconds) "
        "or 'default'"
    )
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
        resp = httpx.post(
            svc.url + "/v1/events",
            json={"id": "em1", "ts": now, "kind": "emb"},
            headers={"X-API-Key": key},
        )
        assert resp.status_code == 202

        def notified() -> bool:
            res = CliRunner(env=env).invoke(app, ["notifications", "tail", "--data-dir", str(data)])
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
    res = run("--redis-url", "redis://127.0.0.1:1/0", "--state-api", "arrow")
    assert res.exit_code == 2 and "--state-api must be pandas or rows, not 'arrow'" in res.output
    res = run("--redis-url", "redis://127.0.0.1:1/0", "--jit", "c3")
    assert res.exit_code == 2 and "--jit must be c1 or full, not 'c3'" in res.output
    res = run("--redis-url", "redis://127.0.0.1:1/0")
    assert res.exit_code == 2 and "cannot reach Redis at redis://127.0.0.1:1/0" in res.output
    assert "Traceback" not in res.output


def test_serve_reports_start_up_errors_in_one_line() -> None:
    """User errors at start-up: exit status 2 and one `error:` line, no traceback."""

    def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ens.service", "serve", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**{k: v for k, v in os.environ.items() if k != rs.ENV_URL}, **env},
        )

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = serve(
            "--no-deliver", "--port", str(port), "--redis-url", f"redis://127.0.0.1:{free_port()}"
        )
    assert res.returncode == 2, res.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}" in res.stderr
    assert "Traceback" not in res.stderr

    dead = free_port()  # nothing listens there
    res = serve(
        "--no-deliver", "--port", str(free_port()), "--redis-url", f"redis://127.0.0.1:{dead}"
    )
    assert res.returncode == 2, res.stderr
    assert "error: cannot reach Redis" in res.stderr and "Traceback" not in res.stderr

    res = serve(
        "--port",
        str(free_port()),
        "--redis-url",
        f"redis://127.0.0.1:{dead}",
        ENS_RETRY_MAX_ATTEMPTS="0",
    )  # the delivery worker's settings are checked first
    assert res.returncode == 2, res.stderr
    assert "error: notifier config: ENS_RETRY_MAX_ATTEMPTS (retry.max_attempts)" in res.stderr
    assert "Traceback" not in res.stderr


def test_post_retries_what_nothing_accepted_and_never_resends_the_rest(
    cli: typer.Typer, tmp_path: Path
) -> None:
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
        res = CliRunner().invoke(
            cli, ["post", str(ev), "--api-key", "k", "--url", url, "--batch", "3"]
        )
        assert res.exit_code == 0, res.output
        assert seen == [503, 503, 202, 202]  # the first batch three times, the second once
        assert "5 accepted, 0 rejected" in res.stdout and "retry 2 in" in res.stderr
        seen.clear()
        res = CliRunner().invoke(
            cli, ["post", str(ev), "--api-key", "k", "--url", url, "--retries", "1"]
        )
        assert res.exit_code == 1 and seen == [503, 503]  # gave up: nothing accepted, said so
        assert "HTTP 503" in res.output and "Traceback" not in res.output
    finally:
        httpd.shutdown()
    port = free_port()  # nothing listens: refused every time, retried, then a clear error
    res = CliRunner().invoke(
        cli,
        ["post", str(ev), "--api-key", "k", "--url", f"http://127.0.0.1:{port}", "--retries", "1"],
    )
    assert res.exit_code == 1 and "cannot reach" in res.output and "retry 1 of 1" in res.output


def test_post_waits_out_a_long_outage_with_growing_jittered_backoff(
    cli: typer.Typer, tmp_path: Path
) -> None:
    """Issue 24.11: `Retry-After: 1` pinned every retry to 1 s and `ens post` gave up after 6.7 s
    of outage. It backs off with jitter (Retry-After a minimum) for up to --retry-for, and
    says how long it waited."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    up_at = [0.0]
    seen: list[float] = []

    class Down(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(time.monotonic())
            if time.monotonic() < up_at[0]:
                status, out = 503, {"error": "ingest store unavailable; retry later"}
            else:
                status, out = 202, {"accepted": len(body.splitlines()), "rejected": 0, "errors": []}
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ev = tmp_path / "e.jsonl"
    ev.write_text(json.dumps({"id": "e1", "ts": 1}) + "\n")
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        up_at[0] = time.monotonic() + 9.0  # longer than the 6.7 s it used to give up after
        res = CliRunner().invoke(cli, ["post", str(ev), "--api-key", "k", "--url", url])
        assert res.exit_code == 0, res.output
        assert "1 accepted, 0 rejected" in res.stdout and "waiting for the service" in res.stdout
        gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
        assert min(gaps) >= 0.95  # Retry-After is the least wait
        assert len(seen) < 10  # backed off: not one try a second

        seen.clear()
        up_at[0] = time.monotonic() + 60.0
        t0 = time.monotonic()
        res = CliRunner().invoke(
            cli, ["post", str(ev), "--api-key", "k", "--url", url, "--retry-for", "3s"]
        )
        assert res.exit_code == 1 and "HTTP 503" in res.output
        assert "gave up after waiting 3.0 s" in res.output, res.output
        assert 2.9 < time.monotonic() - t0 < 10
    finally:
        httpd.shutdown()


def test_serve_rejects_a_negative_reorder_delay() -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--reorder-seconds", "-5"])
    assert res.exit_code == 2
    assert "--reorder-seconds" in res.output and "-5" in res.output and "at least 0" in res.output


# ----------------------------------------------------------------------------- embedded Redis


def _redis_servers_in(data: Path) -> list[int]:
    """redis-server processes working in ``data`` (Redis chdirs to its data directory)."""
    import psutil

    out = []
    for p in psutil.process_iter(["name"]):
        try:
            if (p.info["name"] or "").startswith("redis") and Path(p.cwd()) == data.resolve():
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _ens(*args: str, data: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`ens ARGS` as its own process (the embedded server must be gone when it exits)."""
    env = {k: v for k, v in os.environ.items() if k != rs.ENV_URL}
    env[rs.ENV_DATA_DIR] = str(data)
    return subprocess.run(
        [sys.executable, "-m", "ens", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_management_commands_leave_no_redis_server_behind(tmp_path: Path) -> None:
    """Each command without a running service starts the embedded Redis and stops it again;
    a command refused for its input creates nothing at all."""
    data = tmp_path / "store"
    res = _ens("gateway", "add", "bad name!", data=data)
    assert res.returncode == 2 and "gateway name 'bad name!'" in res.stderr, res.stderr
    assert not data.exists()  # validated before anything was created or started
    res = _ens("profile", "add", "--id", "p0", "--expr", 'kind == "a"', data=data)
    assert res.returncode == 2 and "'==' is not an operator" in res.stderr, res.stderr
    res = _ens("subscriber", "add", "s0", "--email", "nope", data=data)
    assert res.returncode == 2 and "'nope' is not an e-mail address" in res.stderr, res.stderr
    assert not data.exists()
    commands: list[tuple[str, ...]] = [
        ("subscriber", "add", "ops", "--email", "ops@example.org"),
        ("profile", "add", "--id", "p1", "--expr", 'kind = "door"', "--subscriber", "ops"),
        ("gateway", "add", "lobby"),
        ("profile", "list"),
        ("notifications", "tail"),
        ("notifications", "dead-letter", "list"),
        ("notifications", "dead-letter", "retry", "--all"),
        ("profile", "rm", "p1"),
        ("gateway", "revoke", "lobby"),
    ]
    for cmd in commands:
        res = _ens(*cmd, data=data)
        assert res.returncode == 0, (cmd, res.stderr)
        assert _redis_servers_in(data) == [], f"`ens {' '.join(cmd)}` left a redis-server behind"


def test_a_new_store_is_announced_and_a_missing_one_is_not_read(tmp_path: Path) -> None:
    data = tmp_path / "typo"
    app = typer.Typer()
    register(app)
    env = {rs.ENV_URL: None, rs.ENV_DATA_DIR: str(data)}
    for cmd in (
        ["profile", "list"],
        ["gateway", "list"],
        ["notifications", "tail"],
        ["profile", "rm", "x"],
    ):
        res = CliRunner(env=env).invoke(app, cmd)
        assert res.exit_code == 2, (cmd, res.output)
        assert f"no ENS store in {data}" in res.output and "Traceback" not in res.output
        assert not data.exists()
    res = CliRunner(env=env).invoke(app, ["profile", "add", "--id", "p", "--expr", 'kind = "x"'])
    assert res.exit_code == 0, res.output
    assert f"created a new ENS store in {data}" in res.stderr
    res = CliRunner(env=env).invoke(app, ["profile", "add", "--id", "q", "--expr", 'kind = "y"'])
    assert res.exit_code == 0 and "new ENS store" not in res.stderr
    res = CliRunner(env=env).invoke(app, ["profile", "list"])
    assert res.exit_code == 0 and "Profiles (2)" in res.stdout
    assert _redis_servers_in(data) == []


def test_profile_add_replaces_only_with_replace_and_shows_the_change(
    cli: typer.Typer, svc: Service, r: redis.Redis
) -> None:
    res = run(cli, svc, "profile", "add", "--id", "rep1", "--expr", 'kind = "a"')
    assert res.exit_code == 0 and "profile rep1 added" in res.stdout
    res = run(cli, svc, "profile", "add", "--id", "rep1", "--expr", 'kind = "b"')
    assert res.exit_code == 2, res.output
    assert (
        "error: profile rep1 is stored with another definition (--replace replaces it):"
        in res.stderr
    )
    assert '- expr: kind = "a"' in res.stderr and '+ expr: kind = "b"' in res.stderr
    assert "nothing stored" in res.stderr
    assert rs.get_profile(r, "rep1")["expr"] == 'kind = "a"'
    res = run(cli, svc, "profile", "add", "--id", "rep1", "--expr", 'kind = "b"', "--replace")
    assert res.exit_code == 0, res.output
    assert "profile rep1 replaced" in res.stdout and '+ expr: kind = "b"' in res.stdout
    assert rs.get_profile(r, "rep1")["expr"] == 'kind = "b"'
    res = run(cli, svc, "profile", "add", "--id", "rep1", "--expr", 'kind = "b"')
    assert res.exit_code == 0 and "profile rep1 unchanged" in res.stdout


def test_profile_add_warns_about_profiles_that_will_not_fire(
    cli: typer.Typer, svc: Service, r: redis.Redis
) -> None:
    key = rs.add_gateway(r, "lint-gw")
    httpx.post(
        svc.url + "/v1/events",
        headers={"X-API-Key": key},
        json={"id": "lw1", "ts": time.time(), "kind": "window", "room": "1"},
    )
    wait_for(lambda: rs.seen_attributes(r), 10, "an ingested event")
    res = run(cli, svc, "profile", "add", "--id", "inf1", "--expr", "value > 1e400")
    assert res.exit_code == 0 and "profile inf1 added" in res.stdout  # a warning, not a refusal
    assert "warning: profile 'inf1': a number is beyond the float range" in res.stderr
    assert "warning: profile 'inf1' has no subscriber" in res.stderr
    res = run(cli, svc, "profile", "add", "--id", "typo1", "--expr", 'knd = "window"')
    assert res.exit_code == 0
    assert (
        "warning: profile 'typo1': no event seen so far has attribute 'knd' (did you mean 'kind'?)"
    ) in res.stderr


def test_post_accepts_a_url_without_scheme_and_restamps_old_examples(
    cli: typer.Typer, svc: Service, r: redis.Redis, tmp_path: Path
) -> None:
    """The quick start's events (stamped 2024) are accepted with --now; `--url HOST:PORT`
    means http://; no progress bar when stderr is not a terminal."""
    key = rs.add_gateway(r, "restamp-gw")
    ev = ROOT / "examples" / "quickstart" / "events.jsonl"
    res = CliRunner().invoke(
        cli, ["post", str(ev), "--api-key", key, "--url", svc.url.removeprefix("http://")]
    )
    assert res.exit_code == 2, res.output  # as before: too old for --max-past
    assert "--max-past" in res.stderr, res.stderr
    res = CliRunner().invoke(
        cli, ["post", str(ev), "--api-key", key, "--now", "--url", svc.url.removeprefix("http://")]
    )
    assert res.exit_code == 0, res.output
    assert "8 accepted, 0 rejected" in res.stdout
    assert "posting" not in res.stderr and "━" not in res.stderr  # no bar into a pipe
    res = CliRunner().invoke(cli, ["post", str(ev), "--api-key", key, "--url", "ftp://x:1"])
    assert (
        res.exit_code == 2
        and "--url 'ftp://x:1': expected an http:// or https:// URL" in res.stderr
    )


def test_restamp_keeps_spacing_and_leaves_bad_lines() -> None:
    from ens.commands.service import restamp

    lines = [
        '{"id": "a", "ts": "2024-03-01T22:00:00Z", "k": 1}\n',
        "not json\n",
        '{"id": "b", "ts": 1709330460}\n',
        '{"id": "c"}\n',
    ]
    out = restamp(lines, 1000.0)
    assert [json.loads(out[0])["ts"], json.loads(out[2])["ts"]] == [940.0, 1000.0]
    assert out[1] == lines[1] and out[3] == lines[3]
    assert list(json.loads(out[0])) == ["id", "ts", "k"]


def test_service_log_keeps_one_record_per_line(cli: typer.Typer, svc: Service) -> None:
    """A profile expression with line breaks is logged on one line (escaped)."""
    res = run(
        cli,
        svc,
        "profile",
        "add",
        "--id",
        "multi1",
        "--expr",
        'seq(a: kind = "x",\n    b: kind = "y") within 1m',
    )
    assert res.exit_code == 0, res.output
    line = wait_for(
        lambda: next(
            (ln for ln in svc.log.read_text().splitlines() if "profile multi1 added" in ln), None
        ),
        15,
        "the log line",
    )
    assert line.endswith('seq(a: kind = "x",\\n    b: kind = "y") within 1m'), line
    assert not any(ln.startswith('    b: kind = "y")') for ln in svc.log.read_text().splitlines())


def test_service_logging_leaves_httpx_request_lines_out() -> None:
    """Each webhook delivery is logged once, by ens.notifiers (httpx logs it at INFO too)."""
    import logging

    from notifiers.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("INFO")  # pytest's handlers stay (not forced): only the levels change
        assert root.handlers == saved[0]
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        setup_logging("DEBUG")  # asked for everything: still only their warnings
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(saved[1])
        logging.getLogger("httpx").setLevel(logging.NOTSET)


def test_list_commands_print_json_and_whole_tables_into_a_pipe(
    cli: typer.Typer, svc: Service, r: redis.Redis
) -> None:
    long_expr = 'kind = "' + "x" * 300 + '"'
    rs.put_profile(r, "wide1", long_expr)
    rs.add_gateway(r, "json-gw", 0.5)
    store.put_subscriber(
        r, {"id": "json-sub", "channels": [{"webhook": "https://h.example.org/x"}]}
    )
    res = run(cli, svc, "profile", "list")
    assert res.exit_code == 0 and "x" * 300 in res.stdout  # not cut ("xxx…") into a pipe
    res = run(cli, svc, "profile", "list", "--json")
    assert res.exit_code == 0
    assert {"id": "wide1", "expr": long_expr}.items() <= next(
        p for p in json.loads(res.stdout) if p["id"] == "wide1"
    ).items()
    gws = json.loads(run(cli, svc, "gateway", "list", "--json").stdout)
    assert next(g for g in gws if g["name"] == "json-gw")["lateness"] == 0.5
    subs = json.loads(run(cli, svc, "subscriber", "list", "--json").stdout)
    sub = next(s for s in subs if s["id"] == "json-sub")
    assert sub["channels"] == [{"webhook": "https://h.example.org/x"}] and sub["has_secret"]
    assert "secret" not in json.dumps(sub).replace("has_secret", "")
    res = run(cli, svc, "notifications", "dead-letter", "list", "--json")
    assert res.exit_code == 0 and isinstance(json.loads(res.stdout), list)


def test_data_list_json() -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["data", "list", "--json"])
    assert res.exit_code == 0, res.output
    assert "keti" in {d["name"] for d in json.loads(res.stdout)}


def test_a_relative_data_dir_works_for_commands_and_serve(tmp_path: Path) -> None:
    """--data-dir and ENS_DATA_DIR relative to the current directory: redis-server runs in the
    directory, so the path is made absolute before its configuration names it."""
    env = {k: v for k, v in os.environ.items() if k not in (rs.ENV_URL, rs.ENV_DATA_DIR)}

    def ens(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ens", *args],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    res = ens("subscriber", "add", "ops", "--email", "ops@example.org", "--data-dir", "rel")
    assert res.returncode == 0, res.stderr
    assert f"created a new ENS store in {tmp_path / 'rel'}" in res.stderr
    res = ens("subscriber", "list", "--json", **{rs.ENV_DATA_DIR: "rel"})
    assert res.returncode == 0 and '"ops"' in res.stdout, res.stderr
    assert _redis_servers_in(tmp_path / "rel") == []
    rel = Path(os.path.relpath(tmp_path / "rel", ROOT))  # `serve` runs in ROOT
    svc = Service(None, tmp_path / "serve.log", data_dir=rel).start()
    assert svc.stop(signal.SIGTERM) == 0
