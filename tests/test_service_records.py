"""Ingest entries, journal entries and checkpoint metadata: one model each
(`adapters.service.records`), and what the previous release wrote (no ``ver``; the golden
samples below are its layouts) is still read, by the models and by a restarted worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from adapters.service import redis_store as rs
from adapters.service.records import (
    Advanced,
    CheckpointMeta,
    EventFed,
    HeldRow,
    JournalEntry,
    ProfileChanged,
    decode_ingest,
    ingest_normalized,
    op_advance,
    op_event,
    op_profile,
)
from adapters.service.worker import EngineWorker
from notifiers.records import VERSION_FIELD
from tests.helpers_service import outbox, redis_server, replay_records
from tests.test_service_worker import (
    PROFILES,
    canon,
    config,
    expected,
    feed_to_the_end,
    ingest,
    make_events,
)

pytestmark = pytest.mark.redis

# ------------------------------------------------------------------ golden samples (previous release)
INGEST_ONE_EVENT = {"e": '{"id":"a","ts":1.5,"kind":"door"}', "g": "gw1"}  # oldest services
INGEST_RAW_BATCH = {"b": '[{"id":"a","ts":"1970-01-01T00:00:01.5Z","kind":"door"}]', "g": "gw1"}
INGEST_NORMALIZED = {
    "b": '[{"id":"a","ts":1.5,"kind":"door"},{"ts":2.0,"kind":"x"}]',
    "g": "gw1",
    "v": "n",
}
INGEST_EXACT = {
    "b": '[{"id":"a","ts":1.5,"n":123456789012345678901234567890}]',
    "g": "gw1",
    "v": "x",
}
JOURNAL_V1 = {
    b"ops": b'[["c","door","kind = \\"door\\"",null],["e","1-0.0"],["a",12.5],'
    b'["c","old",null,null]]',
    b"n": b"2",
    b"ctl": b"5-0",
}
CHECKPOINT_V4 = {
    "version": 4,
    "epoch": "ab12cd34",
    "last_id": "17-0",
    "control_id": "3-0",
    "buffer": [["17-0.1", 41, 1700000000.5, {"id": "x", "ts": 12.0, "kind": "door"}, "gw1"]],
    "watermarks": {"seq": 42, "gateways": {"gw1": [12.0, 1700000000.5]}},
    "totals": {"events": 40, "late": 1, "notifications": 7, "invalid": 0, "read": 41},
    "late_by_gateway": {"gw1": 1},
    "written_at": 1700000001.25,
}
CHECKPOINT_V3 = {  # before watermarks per gateway and the read count
    "version": 3,
    "epoch": "e3",
    "last_id": "9-0",
    "control_id": "0-0",
    "buffer": [["9-0", 8, 1700000000.0, {"id": "y", "ts": 3.0, "kind": "door"}]],
    "arrival": 9,
    "totals": {"events": 8},
}


@pytest.mark.parametrize("as_bytes", [False, True])
def test_ingest_entries_of_the_previous_release_are_read(as_bytes: bool) -> None:
    def enc(d: dict[str, str]) -> dict:
        return {k.encode(): v.encode() for k, v in d.items()} if as_bytes else d

    assert decode_ingest("5-0", enc(INGEST_ONE_EVENT)) == [
        ("5-0", "gw1", {"id": "a", "ts": 1.5, "kind": "door", "gateway": "gw1"})
    ]  # every event carries its entry's gateway (issue 41.7)
    assert [key for key, _, _ in decode_ingest("6-0", enc(INGEST_RAW_BATCH))] == ["6-0.0"]
    assert not ingest_normalized(enc(INGEST_RAW_BATCH))
    evs = decode_ingest("7-0", enc(INGEST_NORMALIZED))
    assert [(key, gw, obj["ts"]) for key, gw, obj in evs] == [
        ("7-0.0", "gw1", 1.5),
        ("7-0.1", "gw1", 2.0),
    ]
    assert ingest_normalized(enc(INGEST_NORMALIZED)) and ingest_normalized(enc(INGEST_EXACT))
    ((_, _, big),) = decode_ingest("8-0", enc(INGEST_EXACT))
    assert big["n"] == 123456789012345678901234567890  # exact, not a float


def test_ingest_entry_of_a_newer_version_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ingest entry version 2 was written by a newer ENS"):
        decode_ingest("1-0", {**INGEST_NORMALIZED, VERSION_FIELD: "2"})
    with pytest.raises(ValueError, match="neither 'b' nor 'e'"):
        decode_ingest("1-0", {"g": "gw1"})


def test_the_api_script_writes_a_versioned_entry(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        key = rs.add_gateway(r, "gw1")
        script = r.register_script(rs.INGEST_SCRIPT)
        # gateway, key hash, format, max backlog, dedup window ms, ids kept, ids, events
        res = script(
            keys=[*rs.INGEST_SCRIPT_KEYS, rs.seen_key("gw1")],
            args=rs.ingest_args(
                "gw1", rs.sha256(key), rs.INGEST_NORMALIZED, 0, 0, 0, ["a"], ['{"id":"a","ts":1.5}']
            ),
        )
        assert res[0] == "ok"
        eid = res[1]
        ((got_id, fields),) = r.xrange(rs.INGEST)
        r.close()
    assert got_id == eid and fields[VERSION_FIELD] == "1" and fields["v"] == "n"
    assert decode_ingest(eid, fields) == [
        (f"{eid}.0", "gw1", {"id": "a", "ts": 1.5, "gateway": "gw1"})
    ]


def test_journal_entry_of_the_previous_release_is_read_as_typed_operations() -> None:
    entry = JournalEntry.read(JOURNAL_V1)
    assert (entry.notifications, entry.control_id) == (2, "5-0")
    assert list(entry.operations()) == [
        ProfileChanged("door", 'kind = "door"', None),
        EventFed("1-0.0"),
        Advanced(12.5),
        ProfileChanged("old", None, None),
    ]
    # the writer's wire form is the same layout, plus the version
    ops = [
        op_profile("door", 'kind = "door"', None),
        op_event("1-0.0"),
        op_advance(12.5),
        op_profile("old", None, None),
    ]
    fields = JournalEntry(ops, 2, "5-0").fields()
    assert json.loads(fields["ops"]) == json.loads(JOURNAL_V1[b"ops"])
    assert (fields["n"], fields["ctl"], fields[VERSION_FIELD]) == (2, "5-0", "1")
    with pytest.raises(ValueError, match="journal entry version 9 was written by a newer ENS"):
        JournalEntry.read({**JOURNAL_V1, b"ver": b"9"})
    with pytest.raises(ValueError, match="journal operation 'z' is unknown"):
        list(JournalEntry.read({**JOURNAL_V1, b"ops": b'[["z", 1]]'}).operations())


def test_checkpoint_meta_of_the_previous_versions_is_read() -> None:
    m4 = CheckpointMeta.from_json(json.dumps(CHECKPOINT_V4))
    assert (m4.version, m4.epoch, m4.last_id, m4.control_id, m4.profiles, m4.counted_reads) == (
        4,
        "ab12cd34",
        "17-0",
        "3-0",
        None,
        True,
    )
    assert m4.buffer == [
        HeldRow("17-0.1", 41, 1700000000.5, {"id": "x", "ts": 12.0, "kind": "door"}, "gw1")
    ]
    assert json.loads(m4.to_json()) == CHECKPOINT_V4  # today's layout, written back unchanged

    m3 = CheckpointMeta.from_dict(CHECKPOINT_V3)
    assert m3.buffer[0].gateway == "?" and m3.watermarks == {"seq": 9}
    assert not m3.counted_reads and m3.late_by_gateway == {} and m3.profiles is None

    v2 = {**CHECKPOINT_V3, "version": 2, "profiles": {"p": ['kind = "a"', None]}}
    del v2["version"]  # the first checkpoints had no version at all
    assert CheckpointMeta.from_dict(v2).profiles == {"p": ['kind = "a"', None]}
    with pytest.raises(ValueError, match="checkpoint version 5 was written by a newer ENS"):
        CheckpointMeta.from_dict({**CHECKPOINT_V4, "version": 5})


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """(binary client, decoding client) of one fresh redis-server."""
    with redis_server(tmp_path) as url:
        rb, rt = redis.Redis.from_url(url), redis.Redis.from_url(url, decode_responses=True)
        yield rb, rt
        rb.close()
        rt.close()


def test_a_restarted_worker_replays_a_journal_written_without_versions(
    clients: tuple[redis.Redis, redis.Redis],
) -> None:
    """A worker stops after commits (no snapshot); its journal is rewritten as the previous
    release wrote it (no ``ver``); the successor replays it and the outbox is exactly once."""
    rb, rt = clients
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)
    events = make_events(120, seed=7)
    ingest(rb, events[:80])
    clock = [time.time()]
    a = EngineWorker(rb, config(batch=5))
    a.start()
    for _ in range(30):
        clock[0] += 0.01
        a.step(block=0, now=clock[0])
        if a.pending or a.inputs.ops:
            a.commit()
    journal = rb.xrange(rs.JOURNAL)
    assert journal and all(f[b"ver"] == b"1" for _, f in journal)
    with rb.pipeline() as p:  # the same entries, in order, without the version
        p.delete(rs.JOURNAL)
        for _, f in journal:
            p.xadd(rs.JOURNAL, {k: v for k, v in f.items() if k != b"ver"})
        p.execute()
    rb.delete(rs.ENGINE_LOCK)  # kill -9: no final snapshot

    b = EngineWorker(rb, config(batch=50, commit_min_interval=0))
    b.start()
    feed_to_the_end(b, rb, events[80:], events[-1]["ts"], clock)
    got = outbox(rt)
    assert len({n["id"] for n in got}) == len(got)
    assert canon(replay_records(got)) == canon(expected(events))


def test_journal_entry_with_an_alarm_step_is_version_3_and_reads_back() -> None:
    step = {"ops": [{"op": "ack", "id": "a1", "actor": "ann"}], "t": 12.5, "ctl": "7-0"}
    fields = JournalEntry([["e", "1-0.0"]], 1, "5-0", alarm=step).fields()
    assert fields["ver"] == "3"
    back = JournalEntry.read({k.encode(): str(v).encode() for k, v in fields.items()})
    assert back.alarm == step and back.notifications == 1
    assert JournalEntry([["e", "1-0.0"]], 1, "5-0").fields()["ver"] == "1"  # as before
