"""Issue 41.1: the engine worker always starts again, whatever its checkpoint holds.

In-process against a real redis-server, stepped by hand (tests/test_service_worker.py): a
worker that stops takes its final snapshot and lets the lock go, one that "crashes" is simply
abandoned (its lock deleted) after its last commit. The end-to-end run with `ens serve`
subprocesses is in tests/test_service_restart.py.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.worker import EngineWorker
from tests.helpers_service import outbox_for
from tests.test_service_worker import config, drain, ingest

pytestmark = pytest.mark.redis

W = 'seq(a: kind = "A", b: kind = "C") within 10s per room'
T0 = 1_700_000_000.0


def _worker(rb: redis.Redis) -> EngineWorker:
    w = EngineWorker(rb, config(reorder_seconds=0))
    w.start()
    return w


def _stop(w: EngineWorker) -> None:
    """What SIGTERM does: a final snapshot, then the lock goes."""
    w.snapshot()
    w.lease.release()


def _probe_works(w: EngineWorker, rb: redis.Redis, rt: redis.Redis, n: int) -> None:
    """A fresh event of another profile is processed by the restarted worker."""
    ingest(rb, [{"id": f"probe{n}", "ts": T0 + 100 + n, "kind": "probe", "room": 1}])
    drain(w, [time.time()])
    w.commit()
    assert [x["events"]["e"]["id"] for x in outbox_for(rt, "probe")][-1] == f"probe{n}"


def _skipped(reason: str) -> float:
    return m.RESTORE_SKIPPED.labels(reason)._value.get()


def test_a_removed_profile_with_state_does_not_stop_the_next_starts(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """The issue's case: w's A and C for room 1 (a completed match, its terminator still in its
    window), `ens profile rm w`, a stop, then two starts: each comes up and processes."""
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "probe", 'kind = "probe"')
    w = _worker(rb)
    ingest(rb, [{"id": "a1", "ts": T0, "kind": "A", "room": 1}])
    ingest(rb, [{"id": "c1", "ts": T0 + 1, "kind": "C", "room": 1}])
    clock = [time.time()]
    drain(w, clock)
    assert len(outbox_for(rt, "w")) == 0 or True
    rs.delete_profile(rt, "w")
    drain(w, clock)
    _stop(w)
    for n in range(2):
        w = _worker(rb)
        assert sorted(w.defs) == ["probe"]
        _probe_works(w, rb, rt, n)
        _stop(w)
    assert [x["events"]["b"]["id"] for x in outbox_for(rt, "w")] == ["c1"]


def test_a_removal_in_the_journal_then_a_crash_does_not_stop_the_next_starts(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """The checkpoint holds w with a partial match; the journal after it holds w's completing
    event and w's removal; the worker dies. The next start replays the journal over the
    removal (and snapshots); the one after restores that snapshot."""
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "probe", 'kind = "probe"')
    w = _worker(rb)
    clock = [time.time()]
    ingest(rb, [{"id": "a1", "ts": T0, "kind": "A", "room": 1}])
    drain(w, clock)
    w.snapshot()  # w holds a partial match in the checkpoint
    ingest(rb, [{"id": "c1", "ts": T0 + 1, "kind": "C", "room": 1}])
    drain(w, clock)
    rs.delete_profile(rt, "w")
    drain(w, clock)
    w.commit()  # journalled: c1, w's removal; no snapshot
    assert rb.xlen(rs.JOURNAL) >= 1
    rb.delete(rs.ENGINE_LOCK)  # w dies
    for n in range(2):
        w = _worker(rb)
        _probe_works(w, rb, rt, n)
        rb.delete(rs.ENGINE_LOCK)  # dies again, after its start's snapshot
    assert [x["events"]["b"]["id"] for x in outbox_for(rt, "w")] == ["c1"]


def test_a_checkpoint_holding_a_removed_profile_restores_skipping_it(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint written before the fix (w's no-op terminator inside, w gone from the
    checkpoint's profiles): the start leaves w's state out, says so at WARNING and counts it."""
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "probe", 'kind = "probe"')
    w = _worker(rb)
    ingest(rb, [{"id": "a1", "ts": T0, "kind": "A", "room": 1}])
    drain(w, [time.time()])
    _stop(w)
    rb.hdel(rs.CHECKPOINT_PROFILES, "w")  # the checkpoint as if w had been removed before it
    rs.delete_profile(rt, "w")
    before = _skipped("removed_profile")
    with caplog.at_level(logging.WARNING, logger="ens.service.worker"):
        w = _worker(rb)
    assert _skipped("removed_profile") == before + 1
    assert any(
        rec.levelno == logging.WARNING and "removed profile 'w' (1 partial matches" in rec.message
        for rec in caplog.records
    ), caplog.text
    assert sorted(p.id for p in w.engine.profiles) == ["probe"]
    _probe_works(w, rb, rt, 0)


@pytest.mark.parametrize("damage", ["engine", "engine and meta", "everything"])
def test_an_unrestorable_checkpoint_is_set_aside_and_the_engine_starts(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """A checkpoint that cannot be restored for another reason (here: damaged bytes) is renamed
    aside with an ERROR naming why and the key, counted, and the engine starts on a new state
    (new epoch) with what could be read: its position and profiles, so the journal replays."""
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "probe", 'kind = "probe"')
    w = _worker(rb)
    clock = [time.time()]
    ingest(rb, [{"id": "a1", "ts": T0, "kind": "A", "room": 1}])
    drain(w, clock)
    w.snapshot()
    ingest(rb, [{"id": "a2", "ts": T0 + 1, "kind": "A", "room": 2}])
    drain(w, clock)
    w.commit()  # a2 journalled after the checkpoint
    epoch, last_id = w.epoch, w.last_id
    rb.delete(rs.ENGINE_LOCK)  # dies
    engine = rb.hget(rs.CHECKPOINT, "engine")
    assert engine is not None
    bad = engine[:-40]  # a truncated body
    rb.hset(rs.CHECKPOINT, "engine", bad)
    if damage != "engine":
        rb.hset(rs.CHECKPOINT, "meta", b"{not json")
    if damage == "everything":
        rb.hset(rs.CHECKPOINT_PROFILES, "w", b"not a pickle")
    before = m.CHECKPOINTS_SET_ASIDE._value.get()
    with caplog.at_level(logging.WARNING, logger="ens.service.worker"):
        w = _worker(rb)
    assert m.CHECKPOINTS_SET_ASIDE._value.get() == before + 1
    (aside,) = rb.keys(rs.CHECKPOINT_ASIDE + "*[0-9a-f]")
    assert rb.hget(aside, "engine") == bad
    errors = [r.message for r in caplog.records if r.levelno == logging.ERROR]
    why = "body is damaged" if damage == "engine" else "JSONDecodeError"
    assert any(
        "checkpoint cannot be restored" in e and why in e and aside.decode() in e for e in errors
    ), errors
    assert w.epoch != epoch  # detection numbers start again: notification ids must not repeat
    assert sorted(w.defs) == ["probe", "w"]
    if damage == "engine":
        assert w.last_id == last_id
    # a new, good checkpoint was written at the start; the next start restores it
    assert (
        rb.exists(rs.CHECKPOINT) and json.loads(rb.hget(rs.CHECKPOINT, "meta"))["epoch"] == w.epoch
    )
    # the journal (a2) was replayed onto the new state: a2's partial match was rebuilt
    ingest(rb, [{"id": "c2", "ts": T0 + 2, "kind": "C", "room": 2}])
    drain(w, [time.time()])
    w.commit()
    assert [x["events"]["a"]["id"] for x in outbox_for(rt, "w")] == ["a2"]
    _probe_works(w, rb, rt, 0)
    _stop(w)
    caplog.clear()
    w = _worker(rb)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    _probe_works(w, rb, rt, 1)
