"""`kill -9` while escalation steps fall due: of a real `ens serve --routing` and of Redis
(append-only, fsync always). Every step of every alarm reaches the outbox exactly once
(its key ``ALARM.N.CYCLE.LEVEL@SUBSCRIBER``), none lost, none doubled."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from tests.helpers_service import Service, crash_redis, outbox, post_batch, redis_server, wait_for

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
                svc = svc.restarted()
            check_each_step_once(r)
            assert svc.stop() == 0
        finally:
            svc.kill()
        assert log.read_text().count("took over the engine lock from dead worker") == 2
        r.close()


def test_kill_9_of_redis_fires_each_escalation_step_once(tmp_path: Path) -> None:
    with crash_redis(tmp_path) as server:
        key, args = setup(server.r, tmp_path)
        svc = Service(server.url, tmp_path / "serve.log", *args).start()
        try:
            post_windows(svc, key)
            wait_for(lambda: server.r.hlen(als.ESCALATIONS) == ROOMS, 15, "escalations pending")
            for _ in range(2):
                time.sleep(0.7)
                server.kill_and_restart()
            check_each_step_once(server.r)
            assert svc.stop() == 0
        finally:
            svc.kill()
