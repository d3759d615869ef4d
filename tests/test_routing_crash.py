"""`kill -9` while escalation steps fall due: of a real `ens serve --routing` and of Redis
(append-only, fsync always). Every step of every alarm reaches the outbox exactly once
(its key ``ALARM.N.CYCLE.LEVEL@SUBSCRIBER``), none lost, none doubled."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from tests.helpers_service import Service, outbox, redis_server, wait_for
from tests.test_service_crash import _pings, _redis, post_batch

pytestmark = [pytest.mark.slow, pytest.mark.redis]

ROUTING = """
escalation_policies:
  - id: page
    levels: [{receivers: [anna]}, {receivers: [boss], delay: 1s}]
    repeat: 1s
    max_repeats: 2
route: {escalation: page}
"""
ROOMS = 5
STEPS = [(c, lv, who) for c in range(3) for lv, who in ((0, "anna"), (1, "boss"))]


def setup(r: redis.Redis, d: Path) -> tuple[str, list[str]]:
    (d / "routing.yaml").write_text(ROUTING)
    open_ = 'kind = "window" and state = "open"'
    rs.put_profile(r, "win", f"seq(w: {open_}) per room", alarm={"severity": "major"})
    return rs.add_gateway(r, "g"), [
        "--reorder-seconds",
        "0.05",
        "--routing",
        str(d / "routing.yaml"),
    ]


def post_windows(svc: Service, key: str) -> None:
    evs = [
        {"id": f"w{i}", "kind": "window", "state": "open", "room": f"r{i}"} for i in range(ROOMS)
    ]
    post_batch(svc, key, evs, 0.0)


def check_each_step_once(r: redis.Redis) -> None:
    wait_for(lambda: len(als.list_alarms(r)) == ROOMS, 15, "the alarms")
    wait_for(lambda: r.zcard(als.ESCALATION_DUE) == 0, 30, "every escalation finished")
    ids = [n["id"] for n in outbox(r) if "alarm" in n]
    assert len(ids) == len(set(ids)), "a step delivered twice"
    want = {
        f"{a['id']}.{a['occurrence']}.{c}.{lv}@{who}"
        for a in als.list_alarms(r)
        for c, lv, who in STEPS
    }
    assert set(ids) == want


def test_kill_9_of_the_service_fires_each_escalation_step_once(tmp_path: Path) -> None:
    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        key, args = setup(r, tmp_path)
        log = tmp_path / "serve.log"
        svc = Service(url, log, *args).start()
        try:
            post_windows(svc, key)
            # while the steps fall due: once into the ladder, and again soon after the restart
            wait_for(lambda: r.hlen(als.ESCALATIONS) == ROOMS, 15, "escalations pending")
            for _ in range(2):
                time.sleep(0.7)  # into the ladder: another step each time
                svc.stop(signal.SIGKILL)
                svc = Service(url, log, *args).start()
            check_each_step_once(r)
            assert svc.stop() == 0
        finally:
            svc.kill()
        assert log.read_text().count("took over the engine lock from dead worker") == 2
        r.close()


def test_kill_9_of_redis_fires_each_escalation_step_once(tmp_path: Path) -> None:
    sockdir = Path(tempfile.mkdtemp(prefix="ens-rcrash-"))
    sock = sockdir / "redis.sock"
    url = f"unix://{sock}"
    proc = _redis(sock, tmp_path)
    r = redis.Redis.from_url(url, decode_responses=True)
    svc = None
    try:
        wait_for(lambda: _pings(r), 10, "redis up")
        key, args = setup(r, tmp_path)
        svc = Service(url, tmp_path / "serve.log", *args).start()
        post_windows(svc, key)
        wait_for(lambda: r.hlen(als.ESCALATIONS) == ROOMS, 15, "escalations pending")
        for _ in range(2):
            time.sleep(0.7)
            proc.kill()
            proc.wait(10)
            time.sleep(0.3)  # the service meets a Redis that is gone
            proc = _redis(sock, tmp_path)
            wait_for(lambda: _pings(r), 10, "redis back")
        check_each_step_once(r)
        assert svc.stop() == 0
    finally:
        if svc is not None:
            svc.kill()
        r.close()
        proc.kill()
        proc.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)
