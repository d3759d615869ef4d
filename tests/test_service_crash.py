"""`kill -9` of the real service mid-stream: no notification lost, none duplicated.

The service runs as a subprocess (`python -m adapters.service serve`) against a redis-server
that outlives it, either as one process or split into `--role api` and `--role engine`
processes (then each of them is killed alone). Events for composite profiles are posted over HTTP; the service is killed
with SIGKILL twice (once mid-stream, once right after it recovered) and restarted; then the
outbox must hold exactly what `ens.replay.replay` computes for the same events.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.service import redis_store as rs
from ens.replay import replay
from notifiers import store
from profiles.events import event_from_obj
from profiles.parser import parse_profile
from tests.helpers_notifiers import SECRET, Receiver, notification
from tests.helpers_service import (
    Service,
    crash_redis,
    outbox,
    post_batch,
    post_resending,
    redis_server,
    replay_records,
    settled,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]  # kill -9 of real service processes

PROFILES = {
    "door": 'seq(d: kind = "door" and state = "open", m: kind = "motion") within 10m per room',
    "climate": 'all(t: kind = "temp" and value > 25, h: kind = "hum" and value > 60) '
    "within 10m per room select each",
    "alarm": 'kind = "alarm"',
}
N_EVENTS = 600
BATCH = 30


def make_events(rnd: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(N_EVENTS):
        kind = rnd.choice(["door", "motion", "temp", "hum", "alarm"])
        ev: dict[str, Any] = {"id": f"e{i}", "kind": kind, "room": f"r{rnd.randrange(12)}"}
        if kind == "door":
            ev["state"] = rnd.choice(["open", "closed"])
        elif kind in ("temp", "hum"):
            ev["value"] = rnd.randrange(10, 90)
        out.append(ev)
    return out


def test_kill_9_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    got, events, text = run_with_kills(tmp_path, "together")
    assert text.count("took over the engine lock from dead worker") == 2
    recovered = text.count("replayed ") + text.count("re-read ")
    assert recovered >= 2, "each restart recovers read-but-unacknowledged entries"
    check_exactly_once(got, events)


def test_kill_9_of_the_engine_process_alone(tmp_path: Path) -> None:
    """`--role api` and `--role engine` as two processes: the engine dies, the API keeps
    accepting; the restarted engine takes over and nothing is lost or duplicated."""
    got, events, text = run_with_kills(tmp_path, "engine")
    assert text.count("took over the engine lock from dead worker") == 2
    check_exactly_once(got, events)


def test_kill_9_of_the_api_process_alone(tmp_path: Path) -> None:
    """The API process dies between two answered requests; the engine never stops."""
    got, events, text = run_with_kills(tmp_path, "api")
    assert "took over the engine lock" not in text
    check_exactly_once(got, events)


def run_with_kills(
    tmp_path: Path, split: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Post every batch, SIGKILLing a process twice mid-stream; (outbox, events, log).

    ``split``: "together" (one process, killed), "engine" or "api" (two processes,
    `--role api` and `--role engine`; the named one is killed and restarted).
    """
    rnd = random.Random(7)
    events = make_events(rnd)
    batches = [events[i : i + BATCH] for i in range(0, N_EVENTS, BATCH)]
    log = tmp_path / "serve.log"
    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        for pid, expr in PROFILES.items():
            rs.put_profile(r, pid, expr)
        key = rs.add_gateway(r, "crash-gw")
        args = ("--reorder-seconds", "0.3")

        def api() -> Service:
            return Service(url, log, *args, "--role", "api", engine=False)

        def engine() -> Service:
            return Service(url, log, *args, "--role", "engine", http=False)

        if split == "together":
            svc = other = Service(url, log, *args).start()
        elif split == "engine":
            svc = engine().start()
            other = api().start()
        else:
            other = engine().start()
            svc = api().start()
        http = other if split == "engine" else svc
        try:
            last = 0.0
            kills = 0
            for i, batch in enumerate(batches):
                last = post_batch(http, key, batch, last)
                if i in (len(batches) // 3, len(batches) // 3 + 1):
                    if split != "api":
                        # SIGKILL once the worker holds read-but-unacknowledged entries, so the
                        # restart has something to recover (journal replay or re-read).
                        wait_for(
                            lambda: r.xpending(rs.INGEST, rs.ENGINE_GROUP)["pending"] > 0,
                            10,
                            "the worker read the batch",
                        )
                    svc = svc.restarted()
                    kills += 1
                    if split != "engine":
                        http = svc
                    if split == "together":
                        other = svc
                else:
                    time.sleep(rnd.uniform(0, 0.03))
            assert kills == 2
            wait_for(
                lambda: settled(r, N_EVENTS, backlog=True),
                20,
                "every event processed and committed",
            )
            got = outbox(r)
            assert svc.stop() == 0
            assert other.stop() == 0
        finally:
            svc.kill()
            other.kill()
            r.close()
    return got, events, log.read_text()


def check_exactly_once(got: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    """The outbox equals `ens.replay` of the events as posted: none lost, none duplicated."""
    profiles = [parse_profile(expr, pid) for pid, expr in PROFILES.items()]
    want = [n.to_json() for n in replay(profiles, [event_from_obj(e, "") for e in events])]
    assert len(want) > 100
    ids = [n["id"] for n in got]
    assert len(set(ids)) == len(ids), "duplicate notification ids"
    canon = Counter(json.dumps(n, sort_keys=True) for n in replay_records(got))
    assert canon == Counter(json.dumps(n, sort_keys=True) for n in want)


def test_kill_9_of_redis_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Issue 24.2: a Redis connection lost during an engine commit ended the engine process
    (exit 1). Redis is SIGKILLed twice under load and restarted on its files: the service
    stays up (503 meanwhile), its engine resumes from the checkpoint, and the outbox is still
    exactly `ens replay` of the events. A POST whose answer was lost is sent again; its events
    are stored once (ingest idempotency)."""
    rnd = random.Random(11)
    events = make_events(rnd)
    batches = [events[i : i + BATCH] for i in range(0, N_EVENTS, BATCH)]
    log = tmp_path / "serve.log"
    with crash_redis(tmp_path) as server:
        r = server.r
        for pid, expr in PROFILES.items():
            rs.put_profile(r, pid, expr)
        key = rs.add_gateway(r, "crash-gw")
        svc = Service(server.url, log, "--reorder-seconds", "0.3").start()
        try:
            last, kills = 0.0, 0
            for i, batch in enumerate(batches):
                last, _ = post_resending(svc, key, batch, last)
                if i in (len(batches) // 3, 2 * len(batches) // 3):
                    time.sleep(rnd.uniform(0, 0.05))  # somewhere in the engine's commits
                    server.kill_and_restart(down=0.5)
                    kills += 1
                assert svc.proc is not None and svc.proc.poll() is None, log.read_text()[-3000:]
            assert kills == 2
            wait_for(lambda: settled(r, N_EVENTS), 30, "every event processed and committed")
            got = outbox(r)
            assert svc.stop() == 0
        finally:
            svc.kill()
    check_exactly_once(got, events)
    assert "restarting from the snapshot" in log.read_text()


def test_kill_9_of_the_deliverer_mid_send_hands_its_deliveries_over_within_seconds(
    tmp_path: Path,
) -> None:
    """Issue 24.9 with real processes: `ens notifications deliver` is SIGKILLed while its sends
    hang at the receiver. A second deliverer takes the abandoned deliveries over when their
    short lease runs out (seconds, not the old 120 s) and delivers every notification; a
    delivery sent twice carries the same Idempotency-Key, so the receiver keeps one."""
    n = 12
    receiver = Receiver()
    receiver.script.append((200, {}, 60.0))  # the first send hangs past the kill
    receiver.start()
    log = tmp_path / "deliver.log"
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url)
        procs: list[subprocess.Popen[bytes]] = []

        def deliverer() -> subprocess.Popen[bytes]:
            with log.open("ab") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ens", "notifications", "deliver", "--redis-url", url],
                    stdout=fh,
                    stderr=fh,
                )
            procs.append(proc)
            return proc

        try:
            store.put_subscriber(
                r, {"id": "s1", "channels": [{"webhook": receiver.url}], "secret": SECRET}
            )
            for i in range(n):
                store.enqueue(r, notification(f"n{i}"))
            first = deliverer()
            wait_for(lambda: len(receiver.hits) >= 1, 60, "a send in flight")
            hung = receiver.hits[0].key
            first.kill()
            first.wait(10)
            killed = time.monotonic()
            deliverer()
            # the defaults' lease (10 s) plus a deliverer's start on a busy machine; it was 120 s
            wait_for(lambda: receiver.counts()[hung] >= 2, 45, "the hung send taken over")
            took = time.monotonic() - killed
            print(f"the hung delivery was sent again {took:.1f} s after the kill")
            wait_for(lambda: len(receiver.accepted) == n, 30, "every notification delivered")
            keys = set(receiver.counts())
            assert keys == set(receiver.accepted) and len(keys) == n  # no delivery re-keyed
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            receiver.stop()
            r.close()
