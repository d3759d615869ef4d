"""`ens spark stream`: live detection on Spark Structured Streaming (local mode, real Redis).

The service runs as a subprocess with `--engine spark` (API and delivery, no engine thread);
events are posted over HTTP; the query reads ``ens:ingest`` through the Python streaming data
source and writes ``ens:outbox``. The outbox must equal `ens.replay` of the ts-sorted stream,
and what the in-process engine worker writes for the same ingest entries.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from adapters.service import redis_store as rs
from adapters.service.late import LATE, list_late
from adapters.service.worker import EngineWorker, WorkerConfig
from ens.replay import replay
from profiles.events import event_from_obj
from profiles.parser import parse_profile
from tests.helpers_service import ROOT, Service, outbox, redis_server, replay_records, wait_for

PROFILES = {  # keyed (per room), global, stateless; timers: within, trailing not, absent
    "door": 'seq(d: kind = "door" and state = "open", not c: kind = "door" and state = "closed") '
    "within 10s per room",
    "climate": 'all(t: kind = "temp" and value > 25, h: kind = "hum" and value > 60) '
    "within 10m per room select each",
    "quiet": 'absent(kind = "alarm") within 60s per room',
    "storm": 'seq(a: kind = "alarm", b: kind = "alarm") within 30s',
    "first": 'kind = "alarm" and level > 8 once',
    "alarm": 'kind = "alarm" and level > 5',
}
KINDS = ["door", "motion", "temp", "hum", "alarm"]
T0 = 1_700_000_000.0


# `spark`: the session-wide fixture of tests/conftest.py (which marks its users `spark`)


def make_events(
    n: int, rooms: int, seed: int, t0: float = T0, step: float = 0.05
) -> list[dict[str, Any]]:
    """A facility feed: ts about `step` apart, posted up to 1 s out of ts order."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choices(KINDS, weights=[3, 4, 3, 3, 1])[0]
        ev: dict[str, Any] = {
            "id": f"e{seed}-{i}",
            "ts": round(t0 + i * step, 3),
            "kind": kind,
            "room": f"r{rnd.randrange(rooms)}",
        }
        if kind == "door":
            ev["state"] = rnd.choice(["open", "closed"])
        elif kind in ("temp", "hum"):
            ev["value"] = rnd.randrange(10, 90)
        elif kind == "alarm":
            ev["level"] = rnd.randrange(10)
        out.append(ev)
    # arrival order: ts plus up to 1 s of jitter (the lateness is 2 s: nothing is late)
    return sorted(out, key=lambda e: e["ts"] + rnd.uniform(0, 1.0))


def post(svc: Service, key: str, events: list[dict[str, Any]], batch: int = 2000) -> None:
    with httpx.Client(
        base_url=svc.url,
        timeout=30,
        headers={"X-API-Key": key, "Content-Type": "application/x-ndjson"},
    ) as c:
        for i in range(0, len(events), batch):
            body = "".join(json.dumps(e) + "\n" for e in events[i : i + batch])
            resp = c.post("/v1/events", content=body)
            assert resp.status_code == 202, resp.text


def expected(profiles: dict[str, str], events: list[dict[str, Any]], upto: float) -> Counter[str]:
    """`ens replay` of the ts-sorted stream (ties in arrival order), up to `upto`."""
    ps = [parse_profile(expr, pid) for pid, expr in profiles.items()]
    ordered = sorted(events, key=lambda e: e["ts"])
    return canon(n.to_json() for n in replay(ps, [event_from_obj(e, "") for e in ordered], upto))


def canon(notes: Any, upto: float = float("inf")) -> Counter[str]:
    return Counter(json.dumps(n, sort_keys=True) for n in notes if n["ts"] <= upto)


def flushes(last: float) -> list[dict[str, Any]]:
    """Two events far after the stream (matching no profile): the watermark passes everything."""
    return [
        {"id": "flush1", "ts": last + 100, "kind": "none"},
        {"id": "flush2", "ts": last + 200, "kind": "none"},
    ]


def settled(r: redis.Redis, n_out: int) -> bool:
    """The outbox holds `n_out` entries and the query holds no event back."""
    st = rs.worker_status(r)
    return bool(r.xlen("ens:outbox") >= n_out and st and st["stats"].get("buffered") == 0)


def provision(
    r: redis.Redis, profiles: dict[str, str], gateways: dict[str, float | None] | None = None
) -> dict[str, str]:
    """Store ``profiles`` and create ``gateways`` (name -> own lateness, None: the default)
    as the management commands do; returns each gateway's API key."""
    for pid, expr in profiles.items():
        rs.put_profile(r, pid, expr)
    return {gw: rs.add_gateway(r, gw, lateness=lat) for gw, lat in (gateways or {}).items()}


def stream_stats(r: redis.Redis) -> dict[str, Any]:
    """The query's totals in its heartbeat (``{}`` before its first batch)."""
    st = rs.worker_status(r)
    return st["stats"] if st else {}


@dataclass
class LiveStream:
    """A running streaming query and its Redis (`live_stream`)."""

    url: str
    r: redis.Redis  # decodes responses
    q: Any  # the StreamingQuery
    keys: dict[str, str]  # gateway -> its API key


@contextmanager
def live_stream(
    spark: Any,
    tmp_path: Path,
    profiles: dict[str, str],
    gateways: dict[str, float | None] | None = None,
    **config: Any,
) -> Iterator[LiveStream]:
    """A redis-server holding ``profiles`` and ``gateways`` (name -> own lateness), and the
    query started over it: keyed by room, event clock, a 300 ms trigger, its checkpoint in
    ``tmp_path``, unless ``config`` (`StreamConfig` fields) says otherwise. Stopped on exit."""
    from adapters.spark.stream import StreamConfig, start_query

    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        keys = provision(r, profiles, gateways)
        settings = {"key": "room", "trigger": "300 milliseconds", "clock": "event", **config}
        q = start_query(spark, StreamConfig(url, checkpoint=str(tmp_path / "cp"), **settings))
        try:
            yield LiveStream(url, r, q, keys)
        finally:
            q.stop()
            r.close()


def event_worker(rb: redis.Redis, **config: Any) -> EngineWorker:
    """The in-process engine worker to compare with: event clock, no blocking reads, no
    snapshots or status on its own (``config``: other `WorkerConfig` fields)."""
    base: dict[str, Any] = dict(
        clock="event",
        name="w",
        block=0,
        snapshot_interval=1e9,
        snapshot_inputs=10**9,
        status_interval=1e9,
    )
    w = EngineWorker(rb, WorkerConfig(**{**base, **config}))
    w.start()
    return w


def worker_outbox(tmp: Path, entries: list[Any], profiles: dict[str, str]) -> list[dict[str, Any]]:
    """The in-process engine worker (event clock, same lateness) over a copy of the entries."""
    tmp.mkdir(exist_ok=True)
    with redis_server(tmp) as url:
        rb = redis.Redis.from_url(url)
        rt = redis.Redis.from_url(url, decode_responses=True)
        provision(rt, profiles)
        with rb.pipeline() as p:
            for eid, fields in entries:
                p.xadd(rs.INGEST, fields, id=eid)
            p.execute()
        w = event_worker(rb, reorder_seconds=2.0, batch=5000)
        while w.step(block=0):
            pass
        w.snapshot()
        got = outbox(rt)
        rb.close()
        rt.close()
    return got


def test_stream_equals_replay_and_the_worker_on_a_facility_feed(spark: Any, tmp_path: Path) -> None:
    """12k events over 24 rooms (every profile fires, ~2000 notifications) posted through
    POST /v1/events in two halves while the query runs."""
    n = 12_000
    events = make_events(n, rooms=24, seed=5)
    last = max(e["ts"] for e in events)
    upto = last + 50  # every notification up to here is final once flush2 is posted
    want = expected(PROFILES, events, upto)
    assert len(want) > 1000 and {json.loads(k)["profile"] for k in want} == set(PROFILES)
    # the test waits between the two halves: with the idle rule (0.5 s) the first half's tail
    # would be released and the second half's first second turn late
    with live_stream(
        spark, tmp_path, PROFILES, {"gw": None}, trigger="500 milliseconds", idle_timeout=3600
    ) as live:
        r, url = live.r, live.url
        svc = Service(
            url,
            tmp_path / "serve.log",
            "--engine",
            "spark",
            "--max-past",
            "off",
            "--max-future",
            "off",
            engine=False,
        )
        try:
            svc.start()  # healthy: the query's heartbeat is in ens:engine:status
            post(svc, live.keys["gw"], events[: n // 2])
            wait_for(lambda: r.xlen("ens:outbox") > 0, 120, "first notifications")
            post(svc, live.keys["gw"], events[n // 2 :] + flushes(last))
            n_all = sum(want.values())
            wait_for(lambda: settled(r, n_all), 240, "the outbox complete")
            time.sleep(1.5)  # a few more micro-batches: nothing more may arrive
            assert live.q.exception() is None
            got = outbox(r)
            entries = redis.Redis.from_url(url).xrange(rs.INGEST)
            assert "engine worker" not in (tmp_path / "serve.log").read_text()
        finally:
            svc.stop()
            svc.kill()
    ids = [n["id"] for n in got]
    assert len(set(ids)) == len(ids)
    assert all(i.count(":") == 2 for i in ids)  # the worker's "{profile}:{epoch}:{seq}"
    assert canon(replay_records(got), upto) == want
    by_worker = worker_outbox(tmp_path / "w", entries, PROFILES)
    assert canon(replay_records(by_worker), upto) == want


def test_profile_changes_live_and_bad_entries_are_skipped(spark: Any, tmp_path: Path) -> None:
    """Profiles added and removed while the query runs take effect without a restart; an
    entry the job cannot decode is counted and skipped, and the query keeps going."""

    def ingest(r: redis.Redis, evs: list[dict[str, Any]]) -> None:
        r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(evs), rs.INGEST_GATEWAY: "gw"})

    def pairs(t: float, n: int) -> list[dict[str, Any]]:
        """n door-then-motion pairs over 3 rooms, and an event that moves the watermark on."""
        return [
            e
            for i in range(n)
            for e in (
                {
                    "id": f"o{t}-{i}",
                    "ts": t + 2 * i,
                    "kind": "door",
                    "state": "open",
                    "room": f"r{i % 3}",
                },
                {"id": f"m{t}-{i}", "ts": t + 2 * i + 1, "kind": "motion", "room": f"r{i % 3}"},
            )
        ] + [{"id": f"tick{t}", "ts": t + 50, "kind": "none"}]

    opened = {"opened": 'seq(d: kind = "door", m: kind = "motion") within 5s per room'}
    with live_stream(spark, tmp_path, opened, lateness=0.5) as live:
        r, q = live.r, live.q
        ingest(r, pairs(1000, 6))
        wait_for(lambda: len(outbox(r)) == 6, 90, "first profile's notifications")
        rs.put_profile(r, "moved", 'kind = "motion"')  # stateless
        rs.put_profile(r, "late_door", 'seq(d: kind = "door", m: kind = "motion") within 5s')
        r.xadd(rs.INGEST, {rs.INGEST_BATCH: "not json", rs.INGEST_GATEWAY: "gw"})
        r.xadd(rs.INGEST, {"x": "neither e nor b"})
        ingest(r, [{"id": "nots", "kind": "door"}])  # no ts: cannot be an event
        ingest(r, pairs(2000, 6))

        def count(pid: str) -> int:
            return sum(1 for n in outbox(r) if n["profile"] == pid)

        wait_for(
            lambda: count("moved") == 6 and count("late_door") == 6 and count("opened") == 12,
            90,
            "the added profiles' notifications",
        )
        rs.delete_profile(r, "opened")
        ingest(r, pairs(3000, 6))
        wait_for(
            lambda: count("moved") == 12 and count("late_door") == 12,
            90,
            "notifications after the removal",
        )
        # an event behind its engine's time is fed (late), counted, never dropped
        ingest(
            r,
            [
                {"id": "old", "ts": 3001.5, "kind": "door", "room": "r0"},
                {"id": "tick-late", "ts": 3100, "kind": "none"},
            ],
        )

        def late() -> int:
            st = rs.worker_status(r)
            return st["stats"].get("total_late", 0) if st else 0

        wait_for(lambda: late() == 1, 60, "the late event counted")
        # removing a profile reaches idle keys too: r9's armed timer never reports, while
        # the same profile under another id (kept) does
        expr = 'seq(d: kind = "door", not c: kind = "close") within 5s per room'
        rs.put_profile(r, "unclosed", expr)
        rs.put_profile(r, "kept", expr)
        wait_for(
            lambda: all(
                any(pid in f["d"] for _, f in r.xrange("ens:spark:plog"))
                for pid in ("unclosed", "kept")
            ),
            30,
            "the profiles logged",
        )
        ingest(
            r,
            [
                {"id": "d9", "ts": 4000, "kind": "door", "room": "r9"},
                {"id": "tick9", "ts": 4001, "kind": "none"},
            ],
        )
        wait_for(
            lambda: r.hget("ens:spark:held", "ksr9") == "0",
            60,
            "r9's engine fed the door (its timer armed)",
        )
        rs.delete_profile(r, "unclosed")
        ingest(r, [{"id": "tick10", "ts": 4100, "kind": "none"}])
        wait_for(lambda: count("kept") == 1, 60, "the kept profile's timer")
        time.sleep(1.0)
        assert count("opened") == 12 and count("late_door") == 12 and count("unclosed") == 0
        assert q.isActive and q.exception() is None
        assert r.hlen("ens:spark:invalid") == 3
        st = rs.worker_status(r)
        assert st is not None and st["stats"]["total_invalid"] == 3 and late() == 1


def test_gateway_lateness_idle_rule_and_late_counts_match_the_worker(
    spark: Any, tmp_path: Path
) -> None:
    """Per-gateway lateness: a gateway 4 s behind with lateness 5 s holds the watermark back
    (one watermark of 0.5 s would make its events late); both gateways idle release everything
    with no event to move event time; an event fed to its key's engine and the global engine
    counts once in total_events; one late for both is counted once in total_late and written
    once to the late output ``ens:late`` (the default, `--late-events output`). Outbox, late
    output and those totals equal the in-process worker's."""
    profiles = {
        "pair": 'seq(d: kind = "door", m: kind = "motion") within 5s per room',  # keyed
        "any2": 'seq(d: kind = "door", m: kind = "motion") within 2s',
    }  # global
    rnd = random.Random(4)
    feed = [
        (
            gw,
            {
                "id": f"{gw}{i}",
                "ts": 100 + i * 0.5 + (0.25 if gw == "slow" else 0),
                "kind": rnd.choice(["door", "motion"]),
                "room": f"r{rnd.randrange(3)}",
            },
        )
        for gw in ("fast", "slow")
        for i in range(60)
    ]
    feed.sort(key=lambda x: x[1]["ts"] + (3.9 if x[0] == "slow" else 0))  # slow: 3.9 s behind
    late_ev = ("fast", {"id": "late", "ts": 100.1, "kind": "door", "room": "r0"})

    gateways = {"fast": None, "slow": 5.0}

    def write(r: redis.Redis, items: list[tuple[str, dict[str, Any]]]) -> None:
        with r.pipeline() as p:
            for gw, ev in items:
                p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([ev]), rs.INGEST_GATEWAY: gw})
            p.execute()

    def stats(r: redis.Redis) -> dict[str, Any]:
        st = rs.worker_status(r)
        return st["stats"] if st else {}

    with live_stream(spark, tmp_path, profiles, gateways, lateness=0.5, idle_timeout=0.5) as live:
        r = live.r
        write(r, feed)
        # no flush event: only the idle rule can release the last events
        # every event goes to its room's engine and the global one: counted once
        wait_for(
            lambda: stats(r).get("total_events") == len(feed) and stats(r)["buffered"] == 0,
            90,
            "every event fed",
        )
        assert stats(r)["total_late"] == 0
        write(r, [late_ev])
        wait_for(lambda: stats(r).get("total_late") == 1, 60, "the late event counted")
        time.sleep(1.0)
        got, st, late = outbox(r), stats(r), list_late(r)[0]
        assert live.q.exception() is None
    # late for its room's engine and the global one: counted once, one record, not fed
    assert st["total_late"] == 1 and st["late_by_gateway"] == {"fast": 1}
    assert st["total_events"] == len(feed)
    (tmp_path / "w").mkdir()
    with redis_server(tmp_path / "w") as url:  # the worker, live on the same entries
        rb = redis.Redis.from_url(url)
        provision(redis.Redis.from_url(url, decode_responses=True), profiles, gateways)
        w = event_worker(rb, reorder_seconds=0.5, idle_timeout=0.5)  # late events: output
        write(rb, feed)
        wait_for(
            lambda: (
                w.step(block=0.05) is not None and w.totals["events"] == len(feed) and not w.buffer
            ),
            30,
            "the worker fed everything",
        )
        write(rb, [late_ev])
        wait_for(
            lambda: w.step(block=0.05) is not None and w.totals["late"] == 1,
            30,
            "the worker sent the late event to the late output",
        )
        w.snapshot()
        rw = redis.Redis.from_url(url, decode_responses=True)
        by_worker, late_by_worker = outbox(rw), list_late(rw)[0]
    assert w.totals["late"] == 1 and w.late_by_gateway == {"fast": 1}
    assert w.totals["events"] == st["total_events"] == len(feed)
    want = {**late_ev[1], "gateway": "fast"}
    assert [(x.event, x.gateway) for x in late] == [(want, "fast")]
    assert [(x.event, x.gateway) for x in late_by_worker] == [(want, "fast")]
    assert len(by_worker) > 20 and {n["profile"] for n in by_worker} == set(profiles)
    assert canon(replay_records(got)) == canon(replay_records(by_worker))


@pytest.mark.spark
def test_an_event_an_hour_late_goes_to_the_late_output_not_into_a_sequence(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 41 item 6 on the Spark path (tests/test_service_late.py's sequence case): an A
    now, then a B stamped an hour back from another gateway. B is an hour before A, so
    seq(a, b) must not complete: no notification, B in ``ens:late`` (as the worker writes it:
    its event with the gateway stamp, its gateway, how far behind), counted for its gateway.
    A's ts has sub-ms digits: once every gateway is idle the watermark (a whole ms, Spark's
    unit) is rounded up to it, or A's engine, invoked by its timeout alone, would hold it."""
    seq = {"ab": 'seq(a: kind = "A", b: kind = "B") within 2h per room'}
    t = time.time()  # sub-ms digits: the watermark that releases A is a whole ms above it
    a1 = {"id": "a1", "ts": t, "kind": "A", "room": "r1"}
    b1 = {"id": "b1", "ts": t - 3600.0, "kind": "B", "room": "r1"}
    with live_stream(spark, tmp_path, seq, {"gw-a": None, "gw-b": None}) as live:
        r = live.r
        r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([a1]), rs.INGEST_GATEWAY: "gw-a"})
        wait_for(lambda: stream_stats(r).get("total_events") == 1, 60, "A fed")
        r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([b1]), rs.INGEST_GATEWAY: "gw-b"})
        wait_for(lambda: r.xlen(LATE) == 1, 60, "B in the late output")
        wait_for(lambda: stream_stats(r).get("total_late") == 1, 30, "B counted")
        st = stream_stats(r)
        recs, more = list_late(r)
        got = outbox(r)
        assert live.q.exception() is None
    assert got == []  # main: one notification, b an hour before a
    assert not more and [(x.event, x.gateway) for x in recs] == [
        ({**b1, "gateway": "gw-b"}, "gw-b")
    ]
    assert 3599 < recs[0].behind < 3601
    assert st["late_by_gateway"] == {"gw-b": 1} and st["total_events"] == 1


def _stream_proc(url: str, cp: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "ens",
        "spark",
        "stream",
        "--redis-url",
        url,
        "--key",
        "room",
        "--checkpoint",
        str(cp),
        "--trigger",
        "300ms",
        "--lateness",
        "2s",
        "--clock",
        "event",
        "--idle-timeout",
        "1h",
        "--master",
        "local[1]",
    ]  # posts pause: see the facility test
    with log.open("ab") as fh:  # its own process group: kill -9 reaches the JVM child too
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=fh,
            stderr=fh,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    try:  # the JVM child of the group, if it outlived its parent
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.spark
@pytest.mark.slow
def test_kill_9_of_the_driver_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """`ens spark stream` is SIGKILLed (with its JVM) while a micro-batch is in flight, then
    restarted from its --checkpoint: the outbox has every notification exactly once, and the
    late output every late event (a door closed an hour back, posted with the batch in flight
    once every room's engine has a time) exactly once."""
    events = make_events(6000, rooms=20, seed=9, step=0.2)
    late = [
        {"id": f"old{i}", "ts": T0 - 3600, "kind": "door", "state": "closed", "room": f"r{i}"}
        for i in range(20)
    ]
    last = max(e["ts"] for e in events)
    upto = last + 50
    want = expected(PROFILES, events, upto)
    cp, log = tmp_path / "cp", tmp_path / "stream.log"
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        key = provision(r, PROFILES, {"gw": None})["gw"]
        svc = Service(
            url,
            tmp_path / "serve.log",
            "--no-engine",
            "--max-past",
            "off",
            "--max-future",
            "off",
            engine=False,
        )
        proc = _stream_proc(url, cp, log)
        try:
            svc.start(timeout=90)  # healthy once the query's heartbeat is there
            post(svc, key, events[:2000], batch=500)
            wait_for(lambda: r.xlen("ens:outbox") > 0, 120, f"first notifications (log: {log})")

            def in_flight() -> bool:  # an offset written whose batch has not committed
                offs = {p.name for p in (cp / "offsets").iterdir() if p.name.isdigit()}
                done = {p.name for p in (cp / "commits").iterdir() if p.name.isdigit()}
                return bool(offs - done)

            # the events no engine wants (motion, ...) are not counted: ~1090 of the first 2000
            wait_for(lambda: stream_stats(r).get("total_events", 0) >= 900, 120, "events fed")
            post(svc, key, late + events[2000:4000], batch=500)
            wait_for(in_flight, 60, "a micro-batch in flight")
            before = r.xlen("ens:outbox")
            _killpg(proc)
            post(svc, key, events[4000:] + flushes(last), batch=500)  # the API keeps accepting
            proc = _stream_proc(url, cp, log)
            wait_for(lambda: settled(r, sum(want.values())), 240, f"the outbox complete ({log})")
            time.sleep(1.5)
            got, recs, st = outbox(r), list_late(r)[0], stream_stats(r)
        finally:
            _killpg(proc)
            svc.stop()
            svc.kill()
    assert 0 < before < len(got)
    ids = [n["id"] for n in got]
    assert len(set(ids)) == len(ids), "duplicate notification ids"
    content = Counter(
        json.dumps({k: v for k, v in n.items() if k != "id"}, sort_keys=True) for n in got
    )
    assert max(content.values()) == 1, "the same notification under two ids"
    assert canon(replay_records(got), upto) == want
    assert sorted(x.event["id"] for x in recs) == sorted(e["id"] for e in late)  # once each
    assert st["total_late"] == len(late) and st["late_by_gateway"] == {"gw": len(late)}


def test_wall_clock_fires_timers_without_events(spark: Any, tmp_path: Path) -> None:
    """`--clock wall`: an `absent` fires once the batch's wall clock minus the lateness passes
    its deadline, with no later event to move event time."""
    silent = {"silent": 'absent(kind = "beat") within 2s per room'}
    with live_stream(spark, tmp_path, silent, lateness=0.5, clock="wall") as live:
        now = time.time()
        beat = {"id": "b1", "ts": now, "kind": "beat", "room": "r1"}
        live.r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([beat]), rs.INGEST_GATEWAY: "gw"})
        got = wait_for(lambda: outbox(live.r), 60, "the absent notification")
        fired = time.time()
    assert [(n["profile"], n["events"]["last"]["id"]) for n in got] == [("silent", "b1")]
    assert abs(got[0]["ts"] - (now + 2.0)) < 1e-3
    assert fired >= now + 2.5  # not before the wall clock passed deadline + lateness


def test_a_checkpoint_keeps_the_state_api_it_was_started_with(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark will not resume a checkpoint under another stateful operator
    (STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA): a checkpoint the pandas
    operator wrote goes on under it when the query asks for the Row API (the default), with a
    warning; the A held in its state matches a B sent after the restart."""
    from adapters.spark.keyed import checkpoint_api
    from adapters.spark.stream import StreamConfig, start_query

    caplog.set_level("WARNING", "ens.spark.stream")
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        provision(r, {"ab": SEQ_2H})
        cp = str(tmp_path / "cp")
        settings: dict[str, Any] = {"key": "room", "trigger": "300 milliseconds", "clock": "event"}
        evs = [{"id": "a1", "ts": 1000.0, "kind": "A", "room": "r1"}]
        for n, api in enumerate(("pandas", "rows")):
            q = start_query(spark, StreamConfig(url, checkpoint=cp, state_api=api, **settings))
            try:
                r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(evs), rs.INGEST_GATEWAY: "gw"})
                r.incrby(rs.INGEST_IN, 1)
                wait_for(
                    lambda n=n, q=q: (
                        stream_stats(r).get("total_read") == n + 1
                        and stream_stats(r).get("buffered") == 0
                        or q.exception()
                    ),
                    90,
                    "the batch",
                )
                assert q.exception() is None
            finally:
                q.stop()
            evs = [{"id": "b1", "ts": 1010.0, "kind": "B", "room": "r1"}]
        assert checkpoint_api(cp) == "pandas"
        got = outbox(r)
        r.close()
    assert [(n["profile"], n["events"]["b"]["id"]) for n in got] == [("ab", "b1")]
    assert "was written by the pandas operator" in caplog.text


CASES = sorted((ROOT / "tests" / "conformance").glob("*.yaml")) + sorted(
    (ROOT / "tests" / "cases").glob("*.yaml")
)


@pytest.mark.parametrize("plan", ["eager", "rare-first"])
def test_stream_tasks_reproduce_every_conformance_case(tmp_path: Path, plan: str) -> None:
    """What the query's tasks do, without Spark: the source's `read_range` over the case's
    events in ``ens:ingest`` (routing, bare filters into the outbox), then one `KeyEngine`
    step per route with the watermark at the end of the stream: the case's notifications,
    under either plan (`ens spark stream --plan`)."""
    from adapters.spark import stream
    from adapters.spark.live import TICK, KeyEngine, ProfileLog, Row, Versions, _compiled
    from adapters.spark.stream import read_range
    from profiles.events import parse_ts
    from tests.conftest import canon as case_canon
    from tests.conftest import load_case

    checked = lazy = 0
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url)
        rt = redis.Redis.from_url(url, decode_responses=True)
        for path in CASES:
            case = load_case(path)
            # a file's tz: is not stored by the service (ens profile add refuses it)
            if "expect_error" in case or "tz" in case:
                continue
            zone = case.get("replay_tz", "UTC")
            r.flushall()  # a new service each time: the per-process caches go too
            _compiled.clear()
            stream._versions.clear()
            stream._relevance.clear()
            pers = [a for p in case["profiles"] for a in parse_profile(p["expr"], p["id"]).per]
            key = pers[0] if pers else "building"
            for p in case["profiles"]:
                rs.put_profile(rt, p["id"], p["expr"])
            log_id = ProfileLog(r).sync()
            last = "0-0"
            for ev in case["events"]:
                last = rs.text(r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([ev], default=str)}))
            offset = {"plog": log_id, "epoch": "t", "n": 0}
            rows = [
                x
                for b in read_range(url, key, zone, "0-0", last, offset, True)
                for x in b.to_pylist()
            ]
            stamps = [x["ts"] for x in rows if x["ts"] is not None]  # the tick: the newest ts
            rows = [x for x in rows if x["route"] != TICK]
            if "until" in case:
                u = case["until"]
                end = parse_ts(float(u) if isinstance(u, (int, float)) else str(u))
            else:
                end = max(stamps, default=0.0)
            got = replay_records(outbox(rt))  # bare filters, written by the source
            versions = Versions(r, key)
            for route in sorted({x["route"] for x in rows}):
                mine = [
                    Row(x["key"], x["gw"], x["ts"], x["ev"], x["plog"], x["epoch"])
                    for x in rows
                    if x["route"] == route
                ]
                ke = KeyEngine(route, versions, zone, (plan, None))
                out = ke.step(None, mine, end + 1e-6)
                engine = ke.engine
                assert engine is not None
                assert engine.plan == plan
                lazy += sum(type(x).__name__ == "LazySeqRuntime" for x in engine._rts.values())
                got += replay_records(out.records)
            assert case_canon(got) == case_canon(case["expect"]), path.stem
            checked += 1
    assert checked >= 30
    assert (lazy > 10) == (plan == "rare-first")  # the rare-first runs do run rare-first engines


def test_the_watermark_is_a_whole_ms_rounded_up_only_to_the_newest_ts() -> None:
    """Spark keeps its watermark in ms: the offset's is a whole ms, so a route invoked by its
    timeout alone gets exactly the offset's. Rounded down (never past what the gateways
    promise), except when it is the newest ts of all (every gateway idle): rounded up, so the
    newest event is released although its ts has sub-ms digits."""
    from adapters.spark.live import whole_ms

    newest = 1795827870.3793552
    assert whole_ms(newest, newest) == 1795827870.38  # main: Spark's 1795827870.379 < newest
    assert whole_ms(newest - 2.0, newest) == 1795827868.379
    assert whole_ms(100.25, 101.0) == 100.25 and whole_ms(100.1, 100.1) == 100.1  # whole already
    assert whole_ms(None, None) is None
    for x in (newest, 100.1, 1.7e9 + 0.0005):
        ms = whole_ms(x, x)
        assert ms is not None and round(ms * 1e6) % 1000 == 0  # `evtime`: whole ms in Spark


def test_gateway_watermark_is_the_services() -> None:
    """`live.gateway_watermark` over gateway progress = `Watermarks` over the same events
    (own latenesses, the idle rule); all gateways idle: the newest ts instead of +inf."""
    from adapters.service.watermarks import Watermarks
    from adapters.spark.live import gateway_watermark, merge_progress

    rnd = random.Random(7)
    for _ in range(200):
        default, idle = rnd.choice([0.0, 0.5, 2.0]), rnd.choice([0.5, 3.0])
        lateness = {g: rnd.choice([None, 0.0, 1.0, 5.0]) for g in ("a", "b", "c")}
        wm = Watermarks(default, idle, 10**6)
        for g, lat in lateness.items():
            wm.set_lateness(g, lat)
        progress: dict[str, list[float]] = {}
        for i in range(rnd.randrange(1, 30)):
            g, ts, wall = rnd.choice("abc"), rnd.uniform(0, 100), i * rnd.uniform(0, 0.5)
            wm.observe(g, ts, wall)
            progress = merge_progress(progress, {g: [ts, wall]})
        now = rnd.uniform(0, 15)
        got, lag = gateway_watermark(
            {g: (ts, w) for g, (ts, w) in progress.items()}, lateness, default, idle, now
        )
        want = wm.watermark(now)
        newest = max(ts for ts, _w in progress.values())
        assert got == (want if want != float("inf") else newest)
        assert lag == wm.max_active_lateness(now)


# ------------------------------------------------------------------ tasks, without Spark

SEQ_2H = 'seq(a: kind = "A", b: kind = "B") within 2h per room'


def _task_setup(rb: redis.Redis, rt: redis.Redis, profiles: dict[str, str]) -> tuple[str, Any]:
    """``profiles`` stored and folded into the profile log: (its head id, a `Versions`)."""
    from adapters.spark.live import ProfileLog, Versions, _compiled

    _compiled.clear()
    for pid, expr in profiles.items():
        rs.put_profile(rt, pid, expr)
    return ProfileLog(rb).sync(), Versions(rb, "room")


def _row(plog: str, key: str, ev: dict[str, Any], gw: str = "gw", counted: bool = True) -> Any:
    import pickle

    from adapters.spark.live import Row

    e = event_from_obj(ev, key)
    return Row(key, gw, e.ts, pickle.dumps(e), plog, "t", counted)


def test_late_records_are_written_once_per_event_across_re_executions(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A B an hour late for its room's engine and for the global engine is not fed to either:
    each gives its late record; written by both, and again by a re-execution of the batch
    (Spark restores the same state and reads the same rows after a crash), it is in ``ens:late``
    once, in the worker's format. ``--late-events feed`` feeds it instead."""
    from adapters.spark.live import KeyEngine, LateOutput

    plog, versions = _task_setup(rb, rt, {"ab": SEQ_2H, "g": SEQ_2H.replace(" per room", "")})
    a1 = {"id": "a1", "ts": 5000.0, "kind": "A", "room": "r1"}
    b1 = {"id": "b1", "ts": 1400.0, "kind": "B", "room": "r1", "gateway": "gw-b"}
    blobs: dict[str, bytes | None] = {}
    for route in ("kr1", "g"):
        out = KeyEngine(route, versions).step(None, [_row(plog, "1-0.0", a1)], 5000.0)
        blobs[route] = out.blob
    keyed = KeyEngine("kr1", versions).step(blobs["kr1"], [_row(plog, "2-0.0", b1, "gw-b")], 5000.0)
    glob = KeyEngine("g", versions).step(
        blobs["g"], [_row(plog, "2-0.0", b1, "gw-b", counted=False)], 5000.0
    )
    again = KeyEngine("kr1", versions).step(  # the batch re-executed
        blobs["kr1"], [_row(plog, "2-0.0", b1, "gw-b")], 5000.0
    )
    assert keyed.records == glob.records == again.records == []  # not matched
    assert keyed.late_keys == glob.late_keys == {"2-0.0": "gw-b"} and keyed.events == 0
    out = LateOutput(rb, ttl=60, maxlen=100)
    written = [out.write(x.late_records) for x in (keyed, glob, again)]
    assert written == [1, 0, 0]
    recs, more = list_late(rt)
    assert not more and [(x.event, x.gateway, x.key, x.behind) for x in recs] == [
        (b1, "gw-b", "2-0.0", 3600.0)
    ]
    assert "late event b1 from gateway gw-b" in caplog.text
    assert "sent to the late output (not matched)" in caplog.text

    fed = KeyEngine("kr1", versions, late_events="feed").step(
        blobs["kr1"], [_row(plog, "3-0.0", {**b1, "id": "b2"}, "gw-b")], 5000.0
    )
    assert len(fed.records) == 1 and fed.late == 1 and not fed.late_records  # fed, out of order


def test_an_engine_with_nothing_due_keeps_its_time(rb: redis.Redis, rt: redis.Redis) -> None:
    """The worker's rule: engine time moves to the watermark only when a timer falls due
    before it. With nothing due, the engine keeps the time of its last event, so an event
    between it and the watermark (its gateway broke its promise, or `--clock wall` moved the
    watermark) is still fed in ts order, not late; once a timer fired past it, it is late."""
    from adapters.spark.live import KeyEngine

    plog, versions = _task_setup(rb, rt, {"ab": SEQ_2H, "ab1": SEQ_2H.replace("2h", "1s")})
    a1 = {"id": "a1", "ts": 1000.0, "kind": "A", "room": "r1"}
    b1 = {"id": "b1", "ts": 1002.0, "kind": "B", "room": "r1"}
    first = KeyEngine("kr1", versions).step(None, [_row(plog, "1-0.0", a1)], 1005.0)
    # ab1's `within 1s` expires at 1001 < 1005: the engine advanced, past b1
    late = KeyEngine("kr1", versions).step(first.blob, [_row(plog, "2-0.0", b1)], 1005.0)
    assert late.late == 1 and late.records == []

    plog, versions = _task_setup(rb, rt, {})
    rs.delete_profile(rt, "ab1")
    from adapters.spark.live import ProfileLog

    plog = ProfileLog(rb).sync()
    first = KeyEngine("kr2", versions).step(None, [_row(plog, "1-0.0", a1)], 1005.0)
    # only ab: its 2 h expiry is not due before 1005: the engine stays at 1000 (main: 1005)
    out = KeyEngine("kr2", versions).step(first.blob, [_row(plog, "2-0.0", b1)], 1005.0)
    assert out.late == 0 and [n["profile"] for n in out.records] == ["ab"]


def test_a_restore_that_leaves_out_removed_profiles_logs_it_once_per_profile(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """A route's state holding state of a profile its profile version lacks (written by a
    release that kept removed profiles' state, issue 41 item 1): the restore leaves it out and
    logs a WARNING naming the profile, once per profile (every restore of every route that
    holds it would say it again), as the service's checkpointer does."""
    import pickle

    from adapters.spark import live
    from adapters.spark.live import KeyEngine, ProfileLog

    monkeypatch.setattr(live, "_skip_warned", set(), raising=False)
    plog, versions = _task_setup(rb, rt, {"ab": SEQ_2H, "other": 'kind = "X" once'})
    a1 = {"id": "a1", "ts": 1000.0, "kind": "A", "room": "r1"}
    blob = KeyEngine("kr1", versions).step(None, [_row(plog, "1-0.0", a1)], 1000.0).blob
    assert blob is not None
    rs.delete_profile(rt, "ab")
    st = pickle.loads(blob)  # noqa: S301 - ours
    st["hdr"]["ver"] = ProfileLog(rb).sync()  # the version without ab, as if applied already
    stale = pickle.dumps(st)
    caplog.set_level("WARNING", "ens.spark.stream")
    for route in ("kr1", "kr1", "kr9"):
        live._compiled.clear()  # another Python worker, or a re-execution
        out = KeyEngine(route, versions).step(stale, [], 9000.0)  # ab's timer was due
        assert out.records == [] and out.parts_read == 1
    warned = [x for x in caplog.records if "left out engine state" in x.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    assert "removed profile 'ab' (1 partitions)" in warned[0].getMessage()


def test_a_checkpoint_of_the_earlier_operator_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A checkpoint that has offsets but not this operator's marker was written by the earlier
    operator (applyInPandasWithState, one pickled engine per route), whose state this one
    cannot read: `ens spark stream` says so and what to do, before starting anything."""
    from typer.testing import CliRunner

    from adapters.spark.keyed import MARKER, check_checkpoint, mark_checkpoint
    from ens.commands.spark import app

    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"ingest":"0-0"}\n')
    res = CliRunner().invoke(
        app, ["stream", "--redis-url", "redis://127.0.0.1:1/0", "--checkpoint", str(old)]
    )
    assert res.exit_code != 0 and "Traceback" not in res.output
    err = " ".join(res.output.split())
    assert f"checkpoint {old} holds the state of an earlier" in err
    assert "new --checkpoint" in err and "XTRIM" in err
    assert check_checkpoint(str(tmp_path / "new")) is None  # a new one, and ours, run
    mark_checkpoint(str(old))
    assert (old / MARKER).exists() and check_checkpoint(str(old)) is None


def _records(blob: bytes | None) -> dict[str, bytes]:
    """Every partition record of a `KeyEngine.step` blob: the map's and the inline ones."""
    import pickle

    from filters.partitions import encode_id

    st = pickle.loads(blob)  # type: ignore[arg-type]  # noqa: S301 - the test's own
    inline = st["eng"][1].get("inline", {}) if st["eng"] else {}
    return {**st["parts"], **{encode_id(p): d for p, d in inline.items()}}


def test_small_records_are_kept_inline_and_large_ones_in_the_map() -> None:
    """`Known` keeps a route's small records in the engine header's value (no state call
    each) up to `INLINE_TOTAL`, larger ones in the map; a record that grows moves to the map
    (its inline copy goes), one that shrinks moves back (its map entry goes)."""
    from adapters.spark.live import DictRecords, Known
    from filters.partitions import encode_id

    recs = DictRecords()
    k = Known(recs, set())
    k.put(("a", (1,)), b"x" * 100)
    k.put(("big", (1,)), b"y" * (Known.INLINE_MAX + 1))
    assert set(k.inline) == {("a", (1,))} and list(recs) == [encode_id(("big", (1,)))]
    for i in range(Known.INLINE_TOTAL // 1000 + 2):
        k.put(("s", (i,)), b"z" * 1000)
    assert k.size <= Known.INLINE_TOTAL and len(recs) > 1  # the rest spilled to the map
    assert all(k.get(p) is not None for p in k.have) and len(k.have) == len(k.inline) + len(recs)
    k.put(("a", (1,)), b"x" * (Known.INLINE_MAX + 1))  # grew: to the map
    assert ("a", (1,)) not in k.inline and encode_id(("a", (1,))) in recs
    k.delete(("s", (0,)))
    k.put(("a", (1,)), b"x")  # small again, room again: back inline, the map's copy gone
    assert k.inline[("a", (1,))] == b"x" and encode_id(("a", (1,))) not in recs
    assert k.size == sum(len(d) for d in k.inline.values())
    again = Known(recs, set(k.have), dict(k.inline))  # as the next step reads it
    assert {p: again.get(p) for p in again.keys()} == {p: k.get(p) for p in k.keys()}
    for p in list(k.have):
        again.delete(p)
    assert not recs and not again.inline and not again.have and again.size == 0


def test_a_step_reads_and_writes_only_the_partitions_its_events_reach_or_has_due(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """A route's engine state is one record per profile partition: 50 sensors' partial
    matches in one room's route, then a B of one sensor reads and changes that one record;
    a step with nothing due reads none (the new event waits in the held list); a profile
    change loads the route's records once (a `restore`) and drops the removed profile's."""

    from adapters.spark.live import KeyEngine, ProfileLog

    seq = 'seq(a: kind = "A", b: kind = "B") within 2h per room, sensor'
    plog, versions = _task_setup(rb, rt, {"ab": seq})

    def ev(i: str, ts: float, kind: str, sensor: str) -> dict[str, Any]:
        return {"id": i, "ts": ts, "kind": kind, "room": "r1", "sensor": sensor}

    rows = [_row(plog, f"1-0.{i}", ev(f"a{i}", 1000.0 + i, "A", f"s{i}")) for i in range(50)]
    first = KeyEngine("kr1", versions).step(None, rows, 1100.0)
    assert len(_records(first.blob)) == 50
    b7 = _row(plog, "2-0.0", ev("b7", 1200.0, "B", "s7"))
    waits = KeyEngine("kr1", versions).step(first.blob, [b7], 1150.0)  # b7 not released yet
    assert waits.parts_read == 0 and waits.eng is None and waits.held == 1
    out = KeyEngine("kr1", versions).step(waits.blob, [], 1300.0)
    assert [n["events"]["a"]["id"] for n in out.records] == ["a7"]
    assert out.parts_read == out.parts_written == 1 and out.restores == 0
    before, after = _records(waits.blob), _records(out.blob)
    assert [k for k in after if after[k] != before[k]] == ['["ab",["r1","s7"]]']

    rs.put_profile(rt, "c", 'seq(a: kind = "C", b: kind = "D") within 1h per room')
    rs.delete_profile(rt, "ab")
    plog2 = ProfileLog(rb).sync()
    changed = KeyEngine("kr1", versions).step(
        out.blob, [_row(plog2, "3-0.0", ev("c1", 1400.0, "C", "s1"))], 1500.0
    )
    assert changed.restores == 1 and changed.parts_read == 50
    parts = _records(changed.blob)
    assert [json.loads(k)[0] for k in parts] == ["c"]


def test_the_bare_filters_engine_is_built_once_per_profile_version(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """The source's bare filters (`live.stateless`) run on an engine built once per Python
    worker and profile version (it was built for every page of every micro-batch), give each
    match on its own whatever the order, and a profile change gets an engine of its own."""
    from adapters.spark import live
    from adapters.spark.live import ProfileLog, stateless

    plog, versions = _task_setup(rb, rt, {"hot": 'kind = "T" and value > 30'})
    evs = [
        (f"1-0.{i}", event_from_obj({"id": f"e{i}", "ts": ts, "kind": "T", "value": v}, "k"))
        for i, (ts, v) in enumerate([(10.0, 31), (5.0, 35), (7.0, 10)])
    ]
    first = stateless(versions, plog, "t", evs[:2])
    engine = live._bare[(plog, "UTC")][1]
    again = stateless(versions, plog, "t", evs[2:] + evs[:1])  # older ts after newer: matched
    assert live._bare[(plog, "UTC")][1] is engine  # not built again
    assert [x["id"] for x in first] == ["hot:ts:1-0.0", "hot:ts:1-0.1"]
    assert [x["id"] for x in again] == ["hot:ts:1-0.0"]  # the same id: the outbox dedupes it
    rs.put_profile(rt, "cold", 'kind = "T" and value < 20')
    plog2 = ProfileLog(rb).sync()
    got = stateless(versions, plog2, "t", evs[2:])
    assert [x["id"] for x in got] == ["cold:ts:1-0.2"]
    assert live._bare[(plog2, "UTC")][1] is not engine


class _FakeState:
    """Spark's per-key state of one route in memory (ValueState, ListState, MapState and
    timers as `keyed.processor` calls them), for running the processor without Spark; a
    `snapshot` taken and put back is a micro-batch re-executed after a failure."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}
        self.calls = 0

    def snapshot(self) -> dict[str, Any]:
        import copy

        return copy.deepcopy(self.store)

    def value(self, name: str) -> Any:
        fake = self

        class Value:
            def get(self) -> Any:
                fake.calls += 1
                return fake.store.get(name)

            def update(self, v: Any) -> None:
                fake.calls += 1
                fake.store[name] = tuple(v)

        return Value()

    def list_(self, name: str) -> Any:
        fake = self

        class List:
            def get(self) -> Any:
                fake.calls += 1
                return iter(list(fake.store.get(name, [])))

            def put(self, rows: list[Any]) -> None:
                fake.calls += 1
                fake.store[name] = list(rows)

            def appendList(self, rows: list[Any]) -> None:  # noqa: N802 - Spark's name
                fake.calls += 1
                fake.store[name] = [*fake.store.get(name, []), *rows]

            def clear(self) -> None:
                fake.calls += 1
                fake.store.pop(name, None)

        return List()

    def map_(self, name: str) -> Any:
        fake = self

        class Map:
            def getValue(self, k: Any) -> Any:  # noqa: N802
                fake.calls += 1
                return fake.store.get(name, {}).get(k)

            def updateValue(self, k: Any, v: Any) -> None:  # noqa: N802
                fake.calls += 1
                fake.store.setdefault(name, {})[k] = tuple(v)

            def removeKey(self, k: Any) -> None:  # noqa: N802
                fake.calls += 1
                fake.store.get(name, {}).pop(k, None)

            def keys(self) -> Any:
                fake.calls += 1
                return iter(list(fake.store.get(name, {})))

        return Map()


def _fake_processor(url: str, state: _FakeState, api: str = "pandas") -> Any:
    from types import SimpleNamespace

    from adapters.spark import keyed

    cfg = SimpleNamespace(
        redis_url=url,
        key="room",
        tz="UTC",
        dedup_ttl=3600,
        plan="eager",
        rates=None,
        late_events="output",
        late_max=1000,
        state_api=api,
    )
    proc = keyed.processor(cfg)
    handle = SimpleNamespace(
        getValueState=lambda n, _ddl: state.value(n),
        getListState=lambda n, _ddl: state.list_(n),
        getMapState=lambda n, _k, _v: state.map_(n),
        registerTimer=lambda _t: None,
        deleteTimer=lambda _t: None,
    )
    proc.init(handle)
    return proc


def test_a_workers_cache_of_a_route_is_used_only_while_the_routes_token_is_its_own(
    rb: redis.Redis, rt: redis.Redis, redis_url: str
) -> None:
    """`keyed.RouteCache`: a worker that wrote a route's state answers its next step's reads
    from its cache (no state call for the engine header, the held list or records); another
    worker's step in between, or the same micro-batch re-executed after its writes were
    rolled back, gives the route a token the cache does not have: the state is read again,
    and the notifications are those of a run that never cached anything."""
    from adapters.spark import keyed

    seq = 'seq(a: kind = "A", b: kind = "B") within 2h per room, sensor'
    plog, _versions = _task_setup(rb, rt, {"ab": seq})

    def ev(i: str, ts: float, kind: str, sensor: str) -> dict[str, Any]:
        return {"id": i, "ts": ts, "kind": kind, "room": "r1", "sensor": sensor}

    batches = [
        [_row(plog, f"1-0.{i}", ev(f"a{i}", 1000.0 + i, "A", f"s{i % 5}")) for i in range(10)],
        [_row(plog, f"2-0.{i}", ev(f"b{i}", 1100.0 + i, "B", f"s{i}")) for i in range(2)],
        [_row(plog, f"3-0.{i}", ev(f"a{i}x", 1200.0 + i, "A", f"s{i}")) for i in range(3)],
        [_row(plog, f"4-0.{i}", ev(f"b{i}x", 1300.0 + i, "B", f"s{i}")) for i in range(5)],
        [_row(plog, "5-0.0", ev("b9", 1400.0, "B", "s4"))],
    ]

    def step(proc: Any, i: int) -> dict[str, Any]:
        wm = 1000.0 + 100 * i + 50
        out = list(proc._step("kr1", batches[i], wm, int(wm * 1000), None))
        return out[0].iloc[0].to_dict() if out else {}

    # reference: no cache survives a step
    ref = _FakeState()
    proc = _fake_processor(redis_url, ref)
    for i in range(len(batches)):
        keyed._cache.clear()
        step(proc, i)
    want = _outbox_ids(rt)
    assert want  # the B's matched
    rt.flushall()
    _task_setup(rb, rt, {"ab": seq})

    a_cache: dict[str, Any] = {}
    b_cache: dict[str, Any] = {}
    st = _FakeState()
    proc = _fake_processor(redis_url, st)
    keyed._cache = a_cache
    try:
        step(proc, 0)  # worker A writes the route
        before = st.calls
        got = step(proc, 1)  # A again: its cache answers (only the route header is read)
        assert got["cached"] >= 1
        keyed._cache = b_cache
        got = step(proc, 2)  # worker B: no cache, reads the store; writes a new token
        assert got["cached"] == 0
        keyed._cache = a_cache
        got = step(proc, 3)  # A: B's token is not its own: reads the store again
        assert got["cached"] == 0 and st.calls > before
        saved = st.snapshot()
        step(proc, 4)  # A writes batch 4 and caches it ...
        st.store = saved  # ... the batch failed: its writes rolled back, re-executed on A
        got = step(proc, 4)
        assert got["cached"] == 0  # the rolled-back token is not the cached one
    finally:
        keyed._cache = {}
    assert _outbox_ids(rt) == want
    assert {k: v for k, v in st.store.items() if k != "hdr"} == {
        k: v for k, v in ref.store.items() if k != "hdr"
    }


def _outbox_ids(r: redis.Redis) -> list[str]:
    return sorted(x["id"] for x in outbox(r))


def test_the_route_cache_outlives_a_task_as_spark_ships_the_processor(
    rb: redis.Redis, rt: redis.Redis, redis_url: str
) -> None:
    """Spark sends the processor to each task by cloudpickle, which copies the module-level
    objects a function defined inside `processor` refers to: the cache must be the module's
    (reached through it), or each task starts with an empty one. Two tasks on one worker:
    the second step's reads are answered from the first's cache."""
    from pyspark import cloudpickle

    from adapters.spark import keyed

    plog, _versions = _task_setup(
        rb, rt, {"ab": 'seq(a: kind = "A", b: kind = "B") within 2h per room'}
    )
    ev = {"id": "a1", "ts": 1000.0, "kind": "A", "room": "r1"}
    keyed._cache.clear()
    blob = cloudpickle.dumps(_fake_processor(redis_url, _FakeState()))
    st = _FakeState()
    stats = []
    # the A, released; then a watermark past its window: its timer is due, the engine runs
    for rows, wm in [([_row(plog, "1-0.0", ev)], 1100.0), ([], 9000.0)]:
        proc = cloudpickle.loads(blob)  # a task: the processor as the worker receives it
        proc.init(_fake_processor(redis_url, st).handle)
        out = list(proc._step("kr1", rows, wm, int(wm * 1000), None))
        stats.append(out[0].iloc[0].to_dict())
    assert "kr1" in keyed._cache
    assert stats[1]["cached"] >= 1


def test_the_row_api_processor_gives_what_the_pandas_one_gives(
    rb: redis.Redis, rt: redis.Redis, redis_url: str
) -> None:
    """`--state-api rows` (``transformWithState``: input and status as Spark `Row`s, nulls
    as None) and pandas (``transformWithStateInPandas``: frames, NaN for a null ts) run the
    same step on the same state: equal status rows, stored state and notifications."""
    from types import SimpleNamespace

    import pandas as pd
    from pyspark.sql import Row as SparkRow

    from adapters.spark import keyed
    from adapters.spark.stream import ROW_DDL

    seq = 'seq(a: kind = "A", b: kind = "B") within 2h per room, sensor'
    cols = [c.split()[0] for c in ROW_DDL.split(", ")]

    def inputs(plog: str, i: int) -> list[dict[str, Any]]:
        evs = [
            {"id": f"e{i}.{j}", "ts": 1000.0 + 100 * i + j, "kind": "AB"[(i + j) % 2]}
            for j in range(4)
        ]
        out = []
        for j, ev in enumerate(evs):
            x = _row(plog, f"{i + 1}-0.{j}", {**ev, "room": "r1", "sensor": f"s{j % 2}"})
            out.append(
                dict(
                    zip(
                        cols,
                        (
                            "kr1",
                            x.key,
                            x.gw,
                            x.ts,
                            None,
                            x.ev,
                            x.plog,
                            x.epoch,
                            0,
                            1000.0 + 100 * i + 50,
                            0.0,
                            x.counted,
                        ),
                        strict=True,
                    )
                )
            )
        out.append({**out[0], "key": None, "ts": None, "ev": None, "counted": False})  # a tick
        return out

    runs: dict[str, tuple[list[dict[str, Any]], dict[str, Any], list[str]]] = {}
    for api in ("pandas", "rows"):
        rt.flushall()
        plog, _versions = _task_setup(rb, rt, {"ab": seq})
        keyed._cache.clear()
        st = _FakeState()
        proc = _fake_processor(redis_url, st, api)
        stats = []
        for i in range(4):
            rows = inputs(plog, i)
            given: Any = (
                iter([pd.DataFrame(rows, columns=cols)])
                if api == "pandas"
                else iter(SparkRow(**x) for x in rows)
            )
            tv = SimpleNamespace(getCurrentWatermarkInMs=lambda i=i: (1000 + 100 * i) * 1000)
            for out in proc.handleInputRows(("kr1",), given, tv):
                got = out.iloc[0].to_dict() if api == "pandas" else out.asDict()
                assert set(got) == {*keyed.STATS_COLS, *keyed.COUNTERS}
                stats.append({k: v for k, v in got.items() if k not in ("cpu", "ts", "wall", "gw")})
        runs[api] = (stats, {k: v for k, v in st.store.items() if k != "hdr"}, _outbox_ids(rt))
    assert runs["pandas"][2]  # the B's matched
    assert runs["rows"] == runs["pandas"]


@pytest.mark.spark
def test_the_jit_setting_reaches_the_jvm() -> None:
    """`get_spark(jit="c1")` (what `ens spark stream` runs by default) starts the JVM with C1
    only; a bad value is refused before a JVM starts."""
    from adapters.spark.session import check_jit

    with pytest.raises(ValueError, match="jit must be one of full, c1, not 'c3'"):
        check_jit("c3")
    code = (
        "from adapters.spark.session import get_spark\n"
        "s = get_spark('local[1]', jit='c1')\n"
        "mx = s.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()\n"
        "print('ARGS', mx.getInputArguments().toString())\n"
        "s.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ENS_SPARK_JIT"}
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
        env=env,
    )
    assert res.returncode == 0, res.stderr
    args = next(x for x in res.stdout.splitlines() if x.startswith("ARGS"))
    assert "-XX:TieredStopAtLevel=1" in args and "-Xss16m" in args, args
