"""Issue 38.2: the engine worker's checkpoints are incremental (adapters/service/checkpointer.py).

In-process against a real redis-server, stepped by hand (tests/test_service_worker.py): the
header in ``ens:checkpoint``'s ``engine`` field, one record per partition in
``ens:checkpoint:parts``; a snapshot writes the partitions that changed, deletes those that went,
and a restart restores from them as from a whole snapshot.
"""

from __future__ import annotations

import time

import pytest
import redis

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.checkpointer import CHECKPOINT_PARTS
from filters import state
from filters.engine import Engine
from tests.helpers_service import outbox_for
from tests.test_service_restore import T0, _stop, _worker
from tests.test_service_worker import drain, ingest

pytestmark = pytest.mark.redis

W = 'seq(a: kind = "A", b: kind = "C") within 1h per room'


def _parts(rb: redis.Redis) -> dict[str, bytes]:
    got: dict[bytes, bytes] = rb.hgetall(CHECKPOINT_PARTS)  # type: ignore[assignment]
    return {k.decode(): v for k, v in got.items()}


def _written() -> float:
    return m.CHECKPOINT_PARTITIONS.labels("written")._value.get()


def test_a_snapshot_writes_only_the_partitions_that_changed_and_a_restart_continues(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "probe", 'kind = "probe"')
    w = _worker(rb)
    clock = [time.time()]
    ingest(rb, [{"id": f"a{i}", "ts": T0 + i, "kind": "A", "room": i} for i in range(50)])
    drain(w, clock)
    w.snapshot()
    head = rb.hget(rs.CHECKPOINT, "engine")
    assert head is not None and state.header(head)["record"] == "header"
    before = _parts(rb)
    assert sorted(before) == sorted(f'["w",[{i}]]' for i in range(50))
    written = _written()
    ingest(rb, [{"id": "b", "ts": T0 + 60, "kind": "A", "room": 3}])  # (`first`: ignored)
    drain(w, clock)
    w.snapshot()
    assert _written() == written + 1  # room 3 only, the one the event reached
    after = _parts(rb)
    assert after == before
    rb.delete(rs.ENGINE_LOCK)  # dies after the snapshot
    w = _worker(rb)
    assert w.engine.stats()["partitions"] == 50
    ingest(rb, [{"id": "c3", "ts": T0 + 61, "kind": "C", "room": 3}])
    drain(w, [time.time()])
    w.commit()
    assert [x["events"]["a"]["id"] for x in outbox_for(rt, "w")] == ["a3"]
    w.snapshot()  # room 3's match completed: its record holds the terminator only
    _stop(w)


def test_a_removed_profile_s_records_go_with_the_next_snapshot(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    rs.put_profile(rt, "w", W)
    rs.put_profile(rt, "v", W.replace('"C"', '"D"'))
    w = _worker(rb)
    clock = [time.time()]
    ingest(rb, [{"id": f"a{i}", "ts": T0 + i, "kind": "A", "room": i} for i in range(5)])
    drain(w, clock)
    w.snapshot()
    assert len(_parts(rb)) == 10
    rs.delete_profile(rt, "v")
    drain(w, clock)
    w.snapshot()
    assert sorted(_parts(rb)) == sorted(f'["w",[{i}]]' for i in range(5))
    _stop(w)


def test_a_whole_engine_checkpoint_restores_and_is_rewritten_by_partition(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """A checkpoint of an earlier release (the whole engine in ``engine``) restores as before;
    the next snapshot writes the header and every partition."""
    rs.put_profile(rt, "w", W)
    w = _worker(rb)
    ingest(rb, [{"id": f"a{i}", "ts": T0 + i, "kind": "A", "room": i} for i in range(3)])
    drain(w, [time.time()])
    _stop(w)
    whole = w.engine.snapshot(profiles_apart=True)  # what the earlier release wrote
    rb.hset(rs.CHECKPOINT, "engine", whole)
    rb.delete(CHECKPOINT_PARTS)
    w = _worker(rb)  # its start writes a snapshot
    assert w.engine.stats()["partial_matches"] == 3
    w.snapshot()
    head = rb.hget(rs.CHECKPOINT, "engine")
    assert head is not None and state.header(head)["record"] == "header"
    assert len(_parts(rb)) == 3
    ingest(rb, [{"id": "c1", "ts": T0 + 10, "kind": "C", "room": 1}])
    drain(w, [time.time()])
    w.commit()
    assert [x["events"]["a"]["id"] for x in outbox_for(rt, "w")] == ["a1"]
    _stop(w)
    assert Engine.restore(whole, {p.id: p for p in w.engine.profiles}).stats()["partitions"] == 3


def test_a_damaged_partition_record_sets_the_checkpoint_aside_with_its_parts(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """One unreadable record: the checkpoint cannot be restored as it was written, so it goes
    aside whole (``…:parts`` with it) and the engine starts on a new state, as for a damaged
    ``engine`` (tests/test_service_restore.py)."""
    rs.put_profile(rt, "w", W)
    w = _worker(rb)
    ingest(rb, [{"id": f"a{i}", "ts": T0 + i, "kind": "A", "room": i} for i in range(3)])
    drain(w, [time.time()])
    _stop(w)
    data = rb.hget(CHECKPOINT_PARTS, '["w",[1]]')
    assert data is not None
    rb.hset(CHECKPOINT_PARTS, '["w",[1]]', data[:-30])
    before = m.CHECKPOINTS_SET_ASIDE._value.get()
    w = _worker(rb)
    assert m.CHECKPOINTS_SET_ASIDE._value.get() == before + 1
    (aside,) = rb.keys(rs.CHECKPOINT_ASIDE + "*[0-9a-f]")
    assert rb.hget(aside + b":parts", '["w",[1]]') == data[:-30]
    assert sorted(w.defs) == ["w"] and w.engine.stats()["partitions"] == 0
    _stop(w)
