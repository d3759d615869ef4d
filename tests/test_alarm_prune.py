"""Retention of closed alarms (docs/alarms.md, "Retention"): an alarm cleared and
acknowledged longer than ``--alarm-closed-retention`` ago leaves ``ens:alarms`` and its label
sets, a bounded number per commit, journalled so a replay forgets the same ones; its history
stays, and a later match of its key raises the next occurrence. Real redis-server, the engine
worker stepped in-process."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import alarm_worker
from adapters.service import redis_store as rs
from adapters.service.worker import EngineWorker
from tests.helpers_service import worker_config
from tests.test_service_worker import drain, ingest

pytestmark = pytest.mark.redis

T0 = 1_700_000_000.0
OPEN = 'kind = "window" and state = "open"'
ALARM = {"severity": "major", "clear": {"on": 'kind = "window" and state = "closed"'}}


def config(**kw: Any) -> Any:
    base = {"reorder_seconds": 0.0, "commit_min_interval": 0, "alarm_closed_retention": 60.0}
    return worker_config(**{**base, **kw})


def window(i: float, room: str, state: str = "open") -> dict[str, Any]:
    return {"id": f"e{i}-{room}-{state}", "ts": T0 + i, "kind": "window", "state": state,
            "room": room}  # fmt: skip


def ids_by_room(rt: redis.Redis) -> dict[str, str]:
    return {json.loads(v)["labels"]["room"]: k for k, v in rt.hgetall(als.ALARMS).items()}


def command(w: EngineWorker, rt: redis.Redis, clock: list[float], op: str, **a: Any) -> Any:
    eid = als.post_command(rt, op, a)
    drain(w, clock)
    return als.wait_reply(rt, eid, timeout=2)


def test_closed_alarms_leave_the_index_after_the_retention(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    rs.put_profile(rt, "win", f"seq(w: {OPEN}) per room", alarm=ALARM)
    a = EngineWorker(rb, config())
    a.start()
    clock = [time.time()]
    ingest(rb, [window(1, r) for r in ("101", "102", "103")])
    ingest(rb, [window(2, "101", "closed"), window(3, "102", "closed")])
    drain(a, clock)
    ids = ids_by_room(rt)
    assert command(a, rt, clock, "ack", id=ids["101"])["status"] == 200  # cleared-acknowledged
    assert command(a, rt, clock, "ack", id=ids["103"])["status"] == 200  # active: stays
    a.snapshot()
    ingest(rb, [window(30, "104")])  # 30 s later: not yet
    drain(a, clock)
    assert set(ids_by_room(rt)) == {"101", "102", "103", "104"}
    ingest(rb, [window(100, "105")])  # engine time 100 s on: 101 closed > 60 s ago
    drain(a, clock)
    assert set(ids_by_room(rt)) == {"102", "103", "104", "105"}  # 102: not acknowledged
    assert not rt.exists(als.label_key("room", "101"))
    assert rt.sismember(als.label_key("severity", "major"), ids["102"])
    assert not rt.sismember(als.label_key("severity", "major"), ids["101"])
    assert [t["kind"] for t in als.history(rt, alarm=ids["101"])] == ["raise", "clear", "ack"]
    assert command(a, rt, clock, "ack", id=ids["101"])["status"] == 404
    ingest(rb, [window(101, "101")])  # the key again: its next occurrence, new transition ids
    drain(a, clock)
    rec = als.get_alarm(rt, ids["101"])
    assert rec is not None and rec["occurrence"] == 2 and rec["state"] == "active-unacknowledged"
    hist = als.history(rt, alarm=ids["101"])
    assert len({t["id"] for t in hist}) == 4 and hist[-1]["reason"] == "re-arm"
    state = a.alarms.rules.snapshot()
    rb.delete(rs.ENGINE_LOCK)  # kill -9: the journal since the snapshot holds the prune

    b = EngineWorker(rb, config(name="w2", alarm_closed_retention=None))  # setting changed
    b.start()
    assert b.alarms.rules.snapshot() == state
    assert als.history(rt, alarm=ids["101"]) == hist


def test_pruning_is_bounded_per_commit(
    rb: redis.Redis, rt: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(alarm_worker, "PRUNE_PER_STEP", 2)
    rs.put_profile(rt, "win", f"seq(w: {OPEN}) per room", alarm=ALARM)
    w = EngineWorker(rb, config())
    w.start()
    clock = [time.time()]
    rooms = [f"r{i}" for i in range(7)]
    ingest(rb, [window(1, r) for r in rooms] + [window(2, r, "closed") for r in rooms])
    drain(w, clock)
    for aid in ids_by_room(rt).values():
        assert command(w, rt, clock, "ack", id=aid)["status"] == 200
    ingest(rb, [window(200, "other")])
    drain(w, clock)
    drain(w, clock, steps=4)  # the loop goes on stepping: each step may commit
    assert set(ids_by_room(rt)) == {"other"}  # the worker commits again until none is due
    pruned = [
        len(json.loads(f[b"al"]).get("pruned", [])) for _, f in rb.xrange(rs.JOURNAL) if b"al" in f
    ]
    assert max(pruned) == 2 and sum(pruned) == 7, pruned
