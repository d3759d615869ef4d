"""The engine worker in-process against a real redis-server: ordering and exactly-once.

The worker is stepped by hand with its own wall clock, and "crashes" are simulated by
abandoning a worker object (no final snapshot) and letting a new one take the lock, so every
crash point (before/after commits and snapshots) can be tried in a fraction of a second. The subprocess `kill -9` test is in
test_service_crash.py.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import pytest
import redis

from adapters.service import redis_store as rs
from adapters.service.api import normalized_json
from adapters.service.late import list_late
from adapters.service.worker import EngineWorker, LockLost, WorkerConfig
from ens.replay import replay
from profiles.events import event_from_obj
from profiles.parser import parse_profile
from tests.helpers_service import outbox, replay_records, worker_config

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

PROFILES = {
    "door": 'seq(d: kind = "door" and state = "open", m: kind = "motion") within 30s per room',
    "climate": 'all(t: kind = "temp" and value > 25, h: kind = "hum" and value > 60) '
    "within 20s per room select each",
    "alarm": 'kind = "alarm"',
    "pair": 'seq(a: kind = "motion", b: kind = "motion") within 5s per room select last',
}
KINDS = ["door", "motion", "temp", "hum", "alarm"]


def make_events(n: int, seed: int, t0: float = 1_700_000_000.0) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choice(KINDS)
        ev: dict[str, Any] = {
            "id": f"e{i}",
            "ts": round(t0 + i * 1.0, 3),
            "kind": kind,
            "room": f"r{rnd.randrange(6)}",
        }
        if kind == "door":
            ev["state"] = rnd.choice(["open", "closed"])
        elif kind in ("temp", "hum"):
            ev["value"] = rnd.randrange(10, 90)
        out.append(ev)
    return out


def ingest(r: redis.Redis, events: list[dict[str, Any]]) -> None:
    """XADD the events in each entry format the worker reads: one event per entry (older
    services), a batch as received, and a batch normalized by the API (`normalized_json`)."""
    with r.pipeline() as p:
        for i in range(0, len(events), 3):
            group, kind = events[i : i + 3], (i // 3) % 3
            if kind == 0:
                for ev in group:
                    p.xadd(rs.INGEST, {rs.INGEST_EVENT: json.dumps(ev), rs.INGEST_GATEWAY: "test"})
            elif kind == 1:
                p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(group), rs.INGEST_GATEWAY: "test"})
            else:
                body = [normalized_json(ev, event_from_obj(ev, "-"))[0] for ev in group]
                p.xadd(
                    rs.INGEST,
                    {
                        rs.INGEST_BATCH: "[" + ",".join(body) + "]",
                        rs.INGEST_GATEWAY: "test",
                        rs.INGEST_FORMAT: rs.INGEST_NORMALIZED,
                    },
                )
        p.execute()


def expected(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    profiles = [parse_profile(expr, pid) for pid, expr in PROFILES.items()]
    return [n.to_json() for n in replay(profiles, [event_from_obj(e, "") for e in events])]


def canon(notes: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(n, sort_keys=True) for n in notes)


def config(**kw: Any) -> WorkerConfig:
    # max_skew off (worker_config): some tests step a made-up wall clock far behind their ts
    return worker_config(**{"reorder_seconds": 3.0, "batch": 7, "commit_min_interval": 1e9, **kw})


def feed_to_the_end(
    w: EngineWorker, r: redis.Redis, rest: list[dict[str, Any]], last_ts: float, clock: list[float]
) -> None:
    """Drain, ingest ``rest`` and a flush event 100 s after ``last_ts`` (it releases what the
    reorder window holds), drain again and snapshot: the end of a worker test's stream."""
    drain(w, clock)
    ingest(r, rest)
    ingest(r, [{"id": "flush", "ts": last_ts + 100, "kind": "none", "room": "x"}])
    drain(w, clock)
    w.snapshot()


def drain(w: EngineWorker, clock: list[float], steps: int | None = None) -> None:
    """Step until nothing is left to read (or ``steps`` times); the clock moves 10 ms a step."""
    n = 0
    while steps is None or n < steps:
        clock[0] += 0.01
        if not w.step(block=0, now=clock[0]) and steps is None:
            break
        n += 1


def test_reorder_buffer_feeds_events_in_ts_order(rb: redis.Redis, rt: redis.Redis) -> None:
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)
    events = make_events(120, seed=1)
    rnd = random.Random(2)
    # Arrival order: ts plus up to 2.5 s of jitter, less than the 3 s reorder window.
    shuffled = sorted(events, key=lambda e: e["ts"] + rnd.uniform(0, 2.5))
    assert shuffled != events
    w = EngineWorker(rb, config())
    w.start()
    clock = [time.time()]
    for i in range(0, len(shuffled), 10):
        ingest(rb, shuffled[i : i + 10])
        drain(w, clock)
    ingest(rb, [{"id": "flush", "ts": events[-1]["ts"] + 100, "kind": "none", "room": "x"}])
    drain(w, clock)
    w.snapshot()
    assert w.totals["late"] == 0 and w.totals["events"] == 120
    assert [h.item.event.id for h in w.buffer] == ["flush"]  # held: nothing is 3 s newer
    assert canon(replay_records(outbox(rt))) == canon(expected(events))

    # A really late event is not matched (issue 41 item 6) but not dropped: it is in the late
    # output, as the engine would have had it.
    rs.put_profile(rt, "probe", 'kind = "probe"')
    ingest(rb, [{"id": "old", "ts": events[0]["ts"], "kind": "probe"}])
    drain(w, clock)
    w.snapshot()
    assert w.totals["late"] == 1
    assert [n for n in outbox(rt) if n["profile"] == "probe"] == []
    recs, _ = list_late(rt)
    assert [(r.event, r.gateway) for r in recs] == [
        ({"id": "old", "ts": events[0]["ts"], "kind": "probe", "gateway": "test"}, "test")
    ]


@pytest.mark.parametrize(
    ("snapshot_at", "commit_every", "crash_at", "rename"),
    [
        (None, 1, 9, False),  # no snapshot yet: the whole journal is replayed
        (3, 2, 9, False),
        (7, 3, 10, True),  # the successor has another consumer name
        (8, 1, 9, False),  # snapshot just before the crash
        (12, 4, 30, False),
    ],
)
def test_exactly_once_across_crashes(
    rb: redis.Redis,
    rt: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    snapshot_at: int | None,
    commit_every: int,
    crash_at: int,
    rename: bool,
) -> None:
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)
    events = make_events(300, seed=crash_at * 10 + commit_every)
    rnd = random.Random(crash_at)
    arrival = sorted(events, key=lambda e: e["ts"] + rnd.uniform(0, 2.0))
    ingest(rb, arrival[:200])
    clock = [time.time()]

    a = EngineWorker(rb, config(batch=2))  # entries of up to 3 events: the crash is mid-stream
    a.start()
    for step in range(crash_at):
        clock[0] += 0.01
        a.step(block=0, now=clock[0])
        if step == snapshot_at:
            a.snapshot()
        elif step % commit_every == commit_every - 1 and a.pending:
            a.commit()
    if commit_every > 1:
        assert a.inputs.ops  # decided but uncommitted: lost in the crash, decided again
    # kill -9: no final snapshot; the lock expires.
    rb.delete(rs.ENGINE_LOCK)
    if snapshot_at is None:  # only the initial snapshot of the empty engine
        assert rb.xlen(rs.JOURNAL) > 0 and rs.load_checkpoint(rb)[1]["last_id"] == "0-0"

    b = EngineWorker(rb, config(batch=50, name="w2" if rename else "w", commit_min_interval=0))
    b.start()
    with pytest.raises(LockLost):  # the zombie cannot commit over its successor
        a.commit()
    feed_to_the_end(b, rb, arrival[200:], events[-1]["ts"], clock)

    got = outbox(rt)
    assert len({n["id"] for n in got}) == len(got)  # unique ids
    assert canon(replay_records(got)) == canon(expected(events))
    assert b.totals["events"] == 300 and b.totals["late"] == 0
    assert b.totals["notifications"] == len(got)
    assert rb.xlen(rs.INGEST) == 0 and rb.xlen(rs.JOURNAL) == 0  # all in the snapshot
    assert rb.xpending(rs.INGEST, rs.ENGINE_GROUP)["pending"] == 0
    assert "not deterministic" not in caplog.text


def test_profile_changes_apply_live_and_survive_restart(rb: redis.Redis, rt: redis.Redis) -> None:
    w = EngineWorker(rb, config(reorder_seconds=0))
    w.start()
    clock = [time.time()]
    rs.put_profile(rt, "f1", 'kind = "a"')
    ingest(rb, [{"id": "a1", "ts": 1.0, "kind": "a"}])
    drain(w, clock)
    rs.put_profile(rt, "f1", 'kind = "b"')  # replaced
    rs.put_profile(rt, "f2", 'kind = "a"')
    ingest(rb, [{"id": "a2", "ts": 2.0, "kind": "a"}, {"id": "b2", "ts": 3.0, "kind": "b"}])
    drain(w, clock)
    rs.delete_profile(rt, "f2")
    w.snapshot()
    rt.delete(rs.ENGINE_LOCK)
    # Changes made while no worker runs are picked up at start (the hash is the truth).
    rs.put_profile(rt, "f3", 'kind = "c"')
    w2 = EngineWorker(rb, config(reorder_seconds=0))
    w2.start()
    assert sorted(p.id for p in w2.engine.profiles) == ["f1", "f3"]
    ingest(rb, [{"id": "a3", "ts": 4.0, "kind": "a"}, {"id": "c3", "ts": 5.0, "kind": "c"}])
    drain(w2, clock)
    w2.snapshot()
    got = [(n["profile"], n["events"]["e"]["id"]) for n in outbox(rt)]
    assert got == [("f1", "a1"), ("f2", "a2"), ("f1", "b2"), ("f3", "c3")]


def test_entries_flagged_normalized_are_still_checked_when_odd(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker trusts the values of the API's normalized entries (only Redis writers can
    forge one), but an event not of that shape (an RFC 3339 ts, not an object, no ts) gets the
    full check: read, or skipped and counted, never a crash of the worker."""
    rs.put_profile(rt, "f", "true")
    w = EngineWorker(rb, config(reorder_seconds=0))
    w.start()
    batch = [
        {"id": "ok", "ts": 1.0, "k": 1},
        {"id": "rfc", "ts": "1970-01-01T00:00:02Z"},
        [4.0],
        {"id": "nots", "k": 2},
        {"ts": 5.0, "k": 3},
    ]
    rb.xadd(
        rs.INGEST,
        {
            rs.INGEST_BATCH: json.dumps(batch),
            rs.INGEST_GATEWAY: "g",
            rs.INGEST_FORMAT: rs.INGEST_NORMALIZED,
        },
    )
    drain(w, [time.time()])
    w.snapshot()
    got = [(n["events"]["e"]["id"], n["events"]["e"]["ts"]) for n in outbox(rt)]
    eid = rs.text(rb.xrange(rs.INGEST)[0][0]) if rb.xlen(rs.INGEST) else None
    assert got[:2] == [("ok", 1.0), ("rfc", 2.0)] and got[2][1] == 5.0 and len(got) == 3
    assert eid is None and got[2][0].endswith(".4")  # named by its ingest key
    assert w.totals["invalid"] == 2
    assert "got list" in caplog.text and "missing required key 'ts'" in caplog.text


def test_wall_clock_fires_timers_without_events(rb: redis.Redis, rt: redis.Redis) -> None:
    rs.put_profile(rt, "quiet", "absent(true) within 2s per sensor")
    w = EngineWorker(rb, config(clock="wall", reorder_seconds=0.5))
    w.start()
    now = time.time()
    ingest(rb, [{"id": "s1", "ts": now, "sensor": "t1"}])
    clock = [now]
    drain(w, clock)
    assert not outbox(rt)
    w.step(block=0, now=now + 3.0)  # no event, but the wall clock passed ts + 2 s + 0.5 s
    w.snapshot()
    notes = outbox(rt)
    assert [(n["profile"], n["partition"]) for n in notes] == [("quiet", {"sensor": "t1"})]


def test_checkpoint_keeps_profiles_apart_and_reads_old_checkpoints(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """Profiles live in ens:checkpoint:profiles, written when they change, not in every snapshot;
    a checkpoint of the previous format (profiles inside) still restores and is converted."""
    from filters.engine import Engine

    events = make_events(120, seed=5)
    # A version-2 checkpoint, as the previous release wrote it, in the middle of a stream.
    old_profiles = [parse_profile(expr, pid) for pid, expr in PROFILES.items()]
    eng = Engine(old_profiles)
    for e in events[:60]:
        eng.process(event_from_obj(e, ""))
    eng.take_notifications()
    meta = {
        "version": 2,
        "epoch": "old",
        "last_id": "0-0",
        "control_id": "0-0",
        "profiles": {pid: [expr, None] for pid, expr in PROFILES.items()},
        "buffer": [],
        "max_ts": events[59]["ts"],
        "floor": None,
        "arrival": 60,
        "totals": {},
    }
    rb.hset(rs.CHECKPOINT, mapping={"engine": eng.snapshot(), "meta": json.dumps(meta)})
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)

    w = EngineWorker(rb, config(reorder_seconds=0))
    w.start()
    clock = [time.time()]
    ingest(rb, events[60:])
    drain(w, clock)
    w.snapshot()
    stored = rb.hgetall(rs.CHECKPOINT_PROFILES)
    assert sorted(k.decode() for k in stored) == sorted(PROFILES)
    snap, meta3 = rs.load_checkpoint(rb)
    assert meta3["version"] == 4 and "profiles" not in meta3
    assert b"seq(" not in snap and b"within 30s" not in snap  # no profile text in the state

    # Only what changed is rewritten: a new profile adds one entry, the others stay as they were.
    rs.put_profile(rt, "probe", 'kind = "probe"')
    drain(w, clock)
    w.snapshot()
    after = rb.hgetall(rs.CHECKPOINT_PROFILES)
    assert set(after) == set(stored) | {b"probe"} and all(after[k] == v for k, v in stored.items())

    # A successor restores from the new format and goes on where it stopped.
    rb.delete(rs.ENGINE_LOCK)
    w2 = EngineWorker(rb, config(reorder_seconds=0))
    w2.start()
    assert sorted(w2.defs) == sorted([*PROFILES, "probe"])
    assert sorted(p.id for p in w2.engine.profiles) == sorted([*PROFILES, "probe"])
    ingest(rb, [{"id": "p1", "ts": events[-1]["ts"] + 1, "kind": "probe"}])
    drain(w2, clock)
    w2.snapshot()
    assert [n["events"]["e"]["id"] for n in outbox(rt) if n["profile"] == "probe"] == ["p1"]
    # the outbox holds what the stream's second half produced on top of the restored state:
    # a local replay of the whole stream minus what the old engine reported before it stopped
    whole = [n.to_json() for n in replay(old_profiles, [event_from_obj(e, "") for e in events])]
    first = Engine(old_profiles)
    for e in events[:60]:
        first.process(event_from_obj(e, ""))
    before = canon([n.to_json() for n in first.take_notifications()])
    got = [n for n in replay_records(outbox(rt)) if n["profile"] != "probe"]
    assert got and canon(got) + before == canon(whole)


def test_watermarks_per_gateway_give_the_ts_sorted_replay(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Interleaved gateways: g1 and g2 in order (lateness 0: g1 its own, g2 the default), g3 up
    to 0.8 s out of order (lateness 1 s, set while the worker runs), g4 idle for most of the
    stream, g5 sending one event long after its time. The notifications are those of `replay`
    of the ts-sorted stream; the one late event goes to the late output (not the engine),
    counted for g5 and logged."""
    for pid, expr in {**PROFILES, "probe": 'kind = "probe"'}.items():
        rs.put_profile(rt, pid, expr)
    rs.add_gateway(rt, "g1", lateness=0.0)
    for g in ("g2", "g3", "g4", "g5"):
        rs.add_gateway(rt, g)
    w = EngineWorker(rb, config(reorder_seconds=0.0, idle_timeout=0.5))
    w.start()
    rs.set_gateway_lateness(rt, "g3", 1.0)
    w.step(block=0, now=1000.0)
    assert (
        w.intake.wm.lateness("g3") == 1.0
        and w.intake.wm.lateness("g1") == w.intake.wm.lateness("g2") == 0.0
    )

    rnd = random.Random(3)
    t0 = 1_700_000_000.0
    stream: list[tuple[str, dict[str, Any]]] = []  # (gateway, event) in arrival order
    n = 0

    def event(ts: float) -> dict[str, Any]:
        nonlocal n
        n += 1
        kind = rnd.choice(KINDS)
        ev: dict[str, Any] = {
            "id": f"e{n}",
            "ts": round(ts, 3),
            "kind": kind,
            "room": f"r{rnd.randrange(4)}",
        }
        if kind == "door":
            ev["state"] = rnd.choice(["open", "closed"])
        elif kind in ("temp", "hum"):
            ev["value"] = rnd.randrange(10, 90)
        return ev

    late = {"id": "old", "ts": t0 + 2.0, "kind": "probe"}
    held_ages = []
    for tick in range(200):
        wall = 1000.0 + tick * 0.05
        now_ts = t0 + tick * 0.05
        batch = [("g1", event(now_ts)), ("g2", event(now_ts))]
        batch.append(("g3", event(now_ts - rnd.uniform(0, 0.8))))
        if tick < 10 or tick > 180:  # g4 is silent (idle) in between, then speaks again
            batch.append(("g4", event(now_ts)))
        if tick == 120:
            batch.append(("g5", late))
        rnd.shuffle(batch)
        stream += batch
        with rb.pipeline() as p:
            for g, ev in batch:
                p.xadd(rs.INGEST, {rs.INGEST_EVENT: json.dumps(ev), rs.INGEST_GATEWAY: g})
            p.execute()
        while w.step(block=0, now=wall):
            pass
        if 30 < tick < 180:  # g4 does not hold the others back: only g3's lateness does
            held_ages.append(max((now_ts - h.ts for h in w.buffer), default=0.0))
    w.step(block=0, now=2000.0)  # every gateway idle: the rest is released
    w.snapshot()

    assert max(held_ages) < 1.0 + 0.8 + 0.06
    assert not w.buffer
    assert w.totals["late"] == 1 and w.late_by_gateway == {"g5": 1}
    assert w.stats()["late_by_gateway"] == {"g5": 1}
    assert "late event old from gateway g5" in caplog.text
    got = outbox(rt)
    assert [n for n in got if n["profile"] == "probe"] == []
    assert [(r.event["id"], r.gateway) for r in list_late(rt)[0]] == [("old", "g5")]
    on_time = [ev for _g, ev in stream if ev is not late]
    want = expected(sorted(on_time, key=lambda e: e["ts"]))  # stable: ties in arrival order
    assert canon(replay_records([n for n in got if n["profile"] != "probe"])) == canon(want)
    assert len(want) > 50


def test_loaded_profiles_are_frozen_out_of_the_collector(rb: redis.Redis, rt: redis.Redis) -> None:
    """Issue 17 item 15: at 10^5 profiles the collector rescanning the (long-lived) engine made
    events ~1.7x dearer; a started worker has them in gc's permanent generation, and a restart
    (after a Redis error) unfreezes first, so the old engine can still be collected."""
    import gc

    gc.unfreeze()
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)
    w = EngineWorker(rb, config())
    try:
        w.start()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        w.start()  # as run_forever does after a Redis error
        assert gc.get_freeze_count() < 2 * frozen  # the first engine was not frozen for good
    finally:
        gc.unfreeze()
