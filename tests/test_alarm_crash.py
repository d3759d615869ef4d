"""`kill -9` of a real `ens serve` mid-stream with alarm profiles: every transition is in the
history exactly once (as an offline replay of the same events computes them) and each
delivered transition is in the outbox exactly once (docs/alarms.md, "Exactly once")."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from ens.alarm_replay import replay_alarms
from ens.replay import replay
from profiles.alarm import AlarmSpec
from profiles.events import event_from_obj
from profiles.parser import parse_profile
from tests.helpers_service import (
    Service,
    crash_redis,
    outbox,
    post_batch,
    post_resending,
    redis_server,
    settled,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]

OPEN = 'kind = "window" and state = "open"'
CLOSED = 'kind = "window" and state = "closed"'
N_EVENTS, BATCH = 500, 25


def events(rnd: random.Random) -> list[dict[str, Any]]:
    return [
        {"id": f"e{i}", "kind": "window", "state": rnd.choice(["open", "open", "closed"]),
         "room": f"r{rnd.randrange(15)}"}
        for i in range(N_EVENTS)
    ]  # fmt: skip


def test_kill_9_with_alarms_loses_and_doubles_no_transition(tmp_path: Path) -> None:
    evs = events(random.Random(7))
    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        rs.put_profile(
            r,
            "win",
            f"seq(w: {OPEN}) per room",
            alarm={"severity": "major", "clear": {"on": CLOSED}},
        )
        rs.put_profile(r, "end", 'kind = "end"')
        key = rs.add_gateway(r, "g")
        log = tmp_path / "serve.log"
        svc = Service(url, log, "--reorder-seconds", "0.05").start()
        last = 0.0
        try:
            for k, i in enumerate(range(0, N_EVENTS, BATCH)):
                last = post_batch(svc, key, evs[i : i + BATCH], last)
                if k in (6, 13):  # mid-stream, and again soon after the recovery
                    svc = svc.restarted()
            post_batch(svc, key, [{"id": "end", "kind": "end"}], last)
            wait_for(lambda: [n for n in outbox(r) if n["profile"] == "end"], 30, "the end")
        finally:
            svc.kill()
        check_exactly_once(r, evs)
        r.close()


def check_exactly_once(r: redis.Redis, evs: list[dict[str, Any]]) -> None:
    """History = the offline replay's transitions; one outbox message per delivered one."""
    profiles = [parse_profile(f"seq(w: {OPEN}) per room", "win", None)]
    alarms = {"win": AlarmSpec("major", "on", None, CLOSED)}
    history = [event_from_obj(e, "") for e in evs]
    got = replay_alarms(profiles, alarms, lambda ps: replay(ps, history), history, None)
    want = sorted((t.id, t.kind, t.after) for t in got.transitions)
    hist = als.history(r)  # repeats of one commit: one entry (docs/alarms.md, "History")
    assert sorted((i, t["kind"], t["after"]) for t in hist for i in als.transition_ids(t)) == want
    ids = [n["id"] for n in outbox(r) if "alarm" in n]
    assert len(ids) == len(set(ids))
    assert set(ids) == {t.id for t in got.transitions if t.kind in ("raise", "clear")}


def test_kill_9_of_redis_with_alarms_loses_and_doubles_no_transition(tmp_path: Path) -> None:
    """Redis (append-only, fsync always) SIGKILLed twice under load and restarted on its
    files: the engine restarts from the checkpoint and the history is still exactly the
    offline replay's."""
    evs = events(random.Random(9))
    with crash_redis(tmp_path) as server:
        r = server.r
        rs.put_profile(
            r,
            "win",
            f"seq(w: {OPEN}) per room",
            alarm={"severity": "major", "clear": {"on": CLOSED}},
        )
        key = rs.add_gateway(r, "g")
        svc = Service(server.url, tmp_path / "serve.log", "--reorder-seconds", "0.05").start()
        try:
            last = 0.0
            for k, i in enumerate(range(0, N_EVENTS, BATCH)):
                last, _ = post_resending(svc, key, evs[i : i + BATCH], last)
                if k in (6, 13):
                    server.kill_and_restart()
            wait_for(lambda: settled(r, N_EVENTS), 30, "every event processed and committed")
            assert svc.stop() == 0
        finally:
            svc.kill()
        check_exactly_once(r, evs)
