"""`ens serve` as a subprocess of the demo (embedded Redis, a free port, `--clock event`):
started, watched and stopped in order, with no process left behind."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

from ens.demo.config import HOST, REPO
from ens.errors import DemoFailure

# ----------------------------------------------------------------------------- the service


class Service:
    """``python -m adapters.service serve`` on an embedded Redis in ``data_dir``."""

    def __init__(self, data_dir: Path, port: int, reorder: float, env: dict[str, str]) -> None:
        self.data_dir, self.port = data_dir, port
        self.url = f"http://{HOST}:{port}"
        self.admin_token = secrets.token_urlsafe(24)
        self.log_path = data_dir / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.redis_pid: int | None = None
        self.redis_socket: str | None = None
        self.redis_url: str | None = None
        self._embedded: Any = None
        self._clients: list[Any] = []
        self.cmd = [
            sys.executable,
            "-m",
            "ens.service",
            "serve",
            "--host",
            HOST,
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--clock",
            "event",
            "--reorder-seconds",
            f"{reorder:g}",
            "--status-interval",
            "5",
            "--log-level",
            "INFO",
            # the feed's days are replayed in event time, far from the wall clock
            "--max-past",
            "off",
            "--max-future",
            "off",
        ]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ENS_")}
        # the sinks are on loopback: webhooks must not go through a proxy from the environment
        self.env.update(env, ENS_ADMIN_TOKEN=self.admin_token, NO_PROXY=HOST, no_proxy=HOST)

    def start(self, timeout: float = 60.0) -> None:
        """Start the process and wait until /healthz reports the engine worker alive."""
        with self.log_path.open("wb") as log:
            # Own session: Ctrl-C reaches the demo only, which then stops things in order.
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise DemoFailure(
                    f"the service exited with status {self.proc.returncode}:\n" + self.log_tail()
                )
            with suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise DemoFailure(
                    f"the service did not become healthy in {timeout:g} s:\n" + self.log_tail()
                )
            time.sleep(0.1)
        self._attach()

    def _attach(self) -> None:
        """A client of the service's embedded Redis (found through its data directory)."""
        from adapters.service import redis_store as rs

        # One more user of the service's embedded server: the service stays a user while it
        # runs, so our release (in stop(), before the service's) never stops it.
        conn = rs.connect(None, self.data_dir, create=False)
        self._embedded = conn
        self.redis_url = conn.url
        self.redis_socket = conn.url.removeprefix("unix://")
        r = self.redis()
        self.redis_pid = int(r.info("server")["process_id"])

    def redis(self) -> Any:
        import redis

        assert self.redis_url is not None
        c = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self._clients.append(c)
        return c

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("  | " + line for line in text[-lines:])

    def stop(self) -> int | None:
        """Close our clients, SIGTERM the service, then make sure its Redis is gone too."""
        import psutil

        for c in self._clients:
            with suppress(Exception):
                c.close()
        self._clients.clear()
        if self._embedded is not None:
            with suppress(Exception):
                self._embedded.close()
            self._embedded = None
        status = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                status = self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                status = None
        # The service, the last user of its embedded server, stops it at exit; one that was
        # killed cannot, so stop it here in that case (the data dir is temporary).
        if self.redis_pid is not None and running(self.redis_pid):
            # SIGTERM = SHUTDOWN; redis-py's shutdown() retries the lost connection for seconds
            with suppress(OSError, psutil.Error):
                if psutil.Process(self.redis_pid).name().startswith("redis"):
                    os.kill(self.redis_pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while running(self.redis_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        return status

    def pids(self) -> list[int]:
        return [p for p in (self.proc.pid if self.proc else None, self.redis_pid) if p]


def running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
