"""Issue 41.1, end to end: `ens serve` starts again after a profile with state was removed.

Before the fix, a profile removed while its partial match or terminator was inside its window
left the checkpoint referring to it, and every later start of the engine role failed with
`StateError: the snapshot refers to profile 'w', which was not supplied`. Here the real service
(`python -m ens.service serve`, a subprocess) is stopped with SIGTERM (its final snapshot) or
SIGKILL (the journal replayed at the next start) and started again, twice; each start must
come up healthy and process a fresh event with another profile.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from adapters.service import redis_store as rs
from tests.helpers_service import (
    ROOT,
    Service,
    metric,
    outbox,
    outbox_for,
    redis_server,
    wait_for,
)

pytestmark = pytest.mark.redis

W = 'seq(a: kind = "A", b: kind = "C") within 10s per room'
ARGS = ("--reorder-seconds", "0")


def ens(url: str, *args: str) -> None:
    """A management command as the operator runs it (its own process)."""
    res = subprocess.run(
        [sys.executable, "-m", "ens", *args, "--redis-url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


def post(svc: Service, key: str, *events: dict[str, object]) -> None:
    resp = httpx.post(
        svc.url + "/v1/events",
        content="".join(json.dumps(e) + "\n" for e in events),
        headers={"X-API-Key": key, "Content-Type": "application/x-ndjson"},
        timeout=10,
    )
    assert resp.status_code == 202, resp.text


def probe(svc: Service, r: redis.Redis, key: str, n: int) -> None:
    """The service is healthy and a fresh event is processed by another profile."""
    assert httpx.get(svc.url + "/healthz", timeout=5).status_code == 200
    post(svc, key, {"id": f"probe{n}", "ts": time.time(), "kind": "probe"})
    wait_for(
        lambda: f"probe{n}" in [x["events"]["e"]["id"] for x in outbox_for(r, "probe")],
        20,
        f"probe{n} processed after the restart",
    )


@contextmanager
def probed_service(tmp_path: Path) -> Iterator[tuple[str, redis.Redis, str]]:
    """A redis-server (append-only) with gateway ``gw`` and profile ``probe``: (url, a
    client decoding responses, the gateway's key)."""
    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        try:
            key = rs.add_gateway(r, "gw")
            rs.put_profile(r, "probe", 'kind = "probe"')
            yield url, r, key
        finally:
            r.close()


def start_twice(url: str, log: Path, r: redis.Redis, key: str) -> None:
    """Start the service again, twice: each start comes up and processes a fresh event."""
    for n in range(2):
        svc = Service(url, log, *ARGS).start()
        try:
            probe(svc, r, key, n)
            assert svc.stop() == 0
        finally:
            svc.kill()


@pytest.mark.parametrize(
    "stop",
    [signal.SIGTERM, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
    ids=["sigterm", "kill-9"],
)
def test_the_service_starts_again_after_a_profile_with_state_was_removed(
    tmp_path: Path, stop: signal.Signals
) -> None:
    log = tmp_path / "serve.log"
    with probed_service(tmp_path) as (url, r, key):
        svc = Service(url, log, *ARGS).start()
        try:
            ens(url, "profile", "add", "--id", "w", "--expr", W)
            wait_for(lambda: "profile w added" in log.read_text(), 20, "w active in the engine")
            now = time.time()
            post(svc, key, {"id": "a1", "ts": now, "kind": "A", "room": 1})
            post(svc, key, {"id": "c1", "ts": now + 0.01, "kind": "C", "room": 1})
            wait_for(lambda: outbox_for(r, "w"), 20, "w's match of room 1")
            post(svc, key, {"id": "a2", "ts": now + 0.02, "kind": "A", "room": 2})  # w waits
            ens(url, "profile", "rm", "w")
            wait_for(lambda: "profile w removed" in log.read_text(), 20, "w removed")
            assert svc.stop(stop) == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
            start_twice(url, log, r, key)
        finally:
            svc.kill()
    text = log.read_text()
    assert "StateError" not in text and "Traceback" not in text, text[-3000:]


def test_the_service_starts_again_after_profile_churn_with_events_in_flight(
    tmp_path: Path,
) -> None:
    """20 adds and 20 removes in two seconds of profiles that match (and so leave terminators)
    while events are posted; then SIGTERM and two starts."""
    log = tmp_path / "serve.log"
    with probed_service(tmp_path) as (url, r, key):
        svc = Service(url, log, *ARGS).start()
        done = threading.Event()

        def traffic() -> None:  # events in flight all along
            i = 0
            while not done.is_set():
                i += 1
                kind = "A" if i % 3 else "C"
                post(svc, key, {"id": f"t{i}", "ts": time.time(), "kind": kind, "room": i % 4})
                time.sleep(0.005)

        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        try:
            for i in range(24):  # as `ens profile add/rm` do; each profile lives 4 rounds
                rs.put_profile(r, f"c{i}", W.replace("10s", f"{10 + i % 3}s"))
                if i >= 4:
                    rs.delete_profile(r, f"c{i - 4}")
                now = time.time()
                room = f"k{i}"
                post(
                    svc,
                    key,
                    {"id": f"a{i}", "ts": now, "kind": "A", "room": room},
                    {"id": f"c{i}", "ts": now + 0.001, "kind": "C", "room": room},
                )
                time.sleep(0.1)
            for i in range(20, 24):
                rs.delete_profile(r, f"c{i}")
            wait_for(
                lambda: (rs.worker_status(r) or {}).get("stats", {}).get("profiles") == 1,
                20,
                "only probe left in the engine",
            )
            done.set()
            t.join(10)
            matched = {x["profile"] for x in outbox(r) if x["profile"] != "probe"}
            assert len(matched) >= 10, matched  # the removed profiles held state
            assert svc.stop() == 0
            start_twice(url, log, r, key)
        finally:
            done.set()
            svc.kill()
    text = log.read_text()
    assert "StateError" not in text and "Traceback" not in text, text[-3000:]


def test_the_service_starts_on_a_checkpoint_it_cannot_restore(tmp_path: Path) -> None:
    """A damaged checkpoint is renamed aside (ERROR in the log), counted on /metrics, and the
    service comes up on a new engine state with the checkpoint's profiles."""
    log = tmp_path / "serve.log"
    with probed_service(tmp_path) as (url, r, key):
        rb = redis.Redis.from_url(url)
        svc = Service(url, log, *ARGS).start()
        try:
            probe(svc, r, key, 0)
            assert svc.stop() == 0
            engine = rb.hget(rs.CHECKPOINT, "engine")
            assert engine is not None
            rb.hset(rs.CHECKPOINT, "engine", engine[: len(engine) // 2])
            svc = Service(url, log, *ARGS).start()
            probe(svc, r, key, 1)
            text = httpx.get(svc.url + "/metrics", timeout=5).text
            assert metric(text, "ens_checkpoints_set_aside_total") == 1, text
            assert len(r.keys(rs.CHECKPOINT_ASIDE + "*")) == 2  # the checkpoint, its profiles
            assert svc.stop() == 0
        finally:
            svc.kill()
            rb.close()
    text = log.read_text()
    assert "ERROR ens.service.worker: the engine checkpoint cannot be restored" in text, text
    assert "Traceback" not in text, text[-3000:]
