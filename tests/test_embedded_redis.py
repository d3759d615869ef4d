"""The embedded Redis of a data directory: shared by every process, stopped by the last one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from adapters.service import redis_store as rs
from adapters.service.embedded import EmbeddedRedis, socket_path
from tests.helpers_service import ROOT, wait_for

pytestmark = pytest.mark.redis  # the embedded redis-server of a data directory

HOLDER = """
import sys, time
from adapters.service import redis_store as rs
conn = rs.connect(None, sys.argv[1])
conn.text().set("held", "1")
print("ready", flush=True)
time.sleep(120)
"""


def _holder(data: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_the_last_user_stops_the_server_and_a_killed_one_is_forgotten(tmp_path: Path) -> None:
    data = tmp_path / "d"
    holder = _holder(data)
    server = EmbeddedRedis(data)
    pid = server.pid()
    assert pid is not None
    conn = rs.connect(None, data, create=False)  # a second user: the same server
    assert conn.text().get("held") == "1" and server.pid() == pid
    conn.close()
    assert server.pid() == pid  # the holder still uses it
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    conn = rs.connect(None, data, create=False)
    conn.close()  # the killed holder is pruned: this was the last user
    wait_for(lambda: server.pid() is None, 15, "the server stopped")
    conn = rs.connect(None, data, create=False)  # and it starts again with the data
    try:
        assert conn.text().get("held") == "1"
    finally:
        conn.close()


def test_a_data_dir_too_long_for_a_socket_path_gets_a_private_one(
    tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    data = tmp_path / ("x" * 90) / "store"
    sock = socket_path(data)
    assert sock.parent != data and len(os.fsencode(sock)) < 108
    assert sock == socket_path(data)  # stable
    assert sock.parent.stat().st_mode & 0o077 == 0
    conn = rs.connect(None, data)
    try:
        assert conn.url == f"unix://{sock}"
        assert redis.Redis(unix_socket_path=str(sock)).ping()
    finally:
        conn.close()
    assert EmbeddedRedis(data).pid() is None


def test_a_server_whose_directory_was_deleted_is_stopped_at_release(tmp_path: Path) -> None:
    import shutil
    import time

    import psutil

    data = tmp_path / "gone"
    conn = rs.connect(None, data)
    assert conn.embedded is not None
    pid = conn.embedded.pid()
    assert pid is not None
    shutil.rmtree(data)
    t0 = time.monotonic()
    conn.close()
    assert time.monotonic() - t0 < 5

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 10, "the server of the deleted directory stopped")


def test_finding_no_server_running_costs_no_retry_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py retries a refused connection ten times with backoff (~3-4 s): every management
    command paid that when it found no server and started one. The probes ask once."""
    import redis.retry

    backoffs: list[float] = []
    monkeypatch.setattr(redis.retry, "sleep", backoffs.append)
    data = tmp_path / "d"
    data.mkdir()
    emb = EmbeddedRedis(data)
    assert emb.acquire()  # probed (nothing there), then started
    assert emb.release()  # stopped: the last user
    assert emb._ping() == "down" and emb._pid_from_server() is None
    assert backoffs == []
