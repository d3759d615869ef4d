"""The archive written by real `ens serve` processes: `kill -9` of the archiving process, and
of Redis, mid-stream; every accepted event in the archive exactly once, in engine order."""

from __future__ import annotations

import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import redis

from adapters.archive.layout import list_files, open_archive
from adapters.service import redis_store as rs
from tests.helpers_service import Service, metric, post_batch, redis_command, redis_server, wait_for
from tests.test_service_crash import BATCH, PROFILES, make_events

pytestmark = [pytest.mark.slow, pytest.mark.redis]  # kill -9 of real processes


def archived(uri: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in list_files(open_archive(uri)):
        rows.extend(pq.read_table(f.path).to_pylist())
    return sorted(rows, key=lambda r: r["seq"])


def wait_archived(uri: str, events: list[dict[str, Any]], log: Path, timeout: float) -> None:
    """Until the archive holds as many events as were accepted; else say which are missing."""
    try:
        wait_for(lambda: len(archived(uri)) >= len(events), timeout, "every event archived")
    except AssertionError:
        have = {r["id"] for r in archived(uri)}
        missing = [e["id"] for e in events if e["id"] not in have]
        raise AssertionError(
            f"{len(missing)} events not archived ({missing[:10]}); log:\n" + log.read_text()[-4000:]
        ) from None


def check(rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "an event archived twice"
    assert sorted(ids) == sorted(e["id"] for e in events), "an accepted event missing"
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    # one in-order gateway, none late: the engine's order is ts order
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    assert {r["gateway"] for r in rows} == {"arc-gw"} and not any(r["late"] for r in rows)


def test_kill_9_of_the_archiver_process(tmp_path: Path) -> None:
    """`--role api,engine` and `--role archive` as two processes; the archiver is killed
    twice mid-stream and restarted: the archive holds every accepted event exactly once."""
    rnd = random.Random(11)
    events = make_events(rnd)
    batches = [events[i : i + BATCH] for i in range(0, len(events), BATCH)]
    uri = str(tmp_path / "archive")
    log = tmp_path / "serve.log"
    arch_args = ("--archive", uri, "--archive-flush", "0.05", "--role", "archive")
    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        for pid, expr in PROFILES.items():
            rs.put_profile(r, pid, expr)
        key = rs.add_gateway(r, "arc-gw", 0.0)
        main = Service(url, log, "--archive", uri, "--role", "api,engine").start()

        def archiver() -> Service:
            before = log.read_text().count("archive: writing")
            svc = Service(url, log, *arch_args, http=False, engine=False).start()
            wait_for(lambda: log.read_text().count("archive: writing") > before, 30, "archiver up")
            return svc

        arch = archiver()
        try:
            last = 0.0
            for i, batch in enumerate(batches):
                last = post_batch(main, key, batch, last)
                if i in (len(batches) // 3, 2 * len(batches) // 3):
                    wait_for(lambda: list_files(open_archive(uri)), 10, "a file written")
                    assert arch.stop(signal.SIGKILL) == -signal.SIGKILL
                    arch = archiver()
            wait_archived(uri, events, log, 60)

            def lag_metrics() -> bool:
                text = httpx.get(main.url + "/metrics", timeout=10).text
                return (
                    metric(text, "ens_archive_events_total") > 0
                    and "ens_archive_lag_seconds 0.0" in text
                    and "ens_archive_backlog_entries 0.0" in text
                )

            wait_for(lag_metrics, 20, "/metrics: the archiver's counts, no lag")
            assert arch.stop() == 0 and main.stop() == 0
        finally:
            arch.kill()
            main.kill()
            r.close()
    check(archived(uri), events)


def test_kill_9_of_redis(tmp_path: Path) -> None:
    """Redis (append-only file) killed mid-stream and restarted on the same files: the
    service reconnects; every event it accepted is archived exactly once."""
    rnd = random.Random(12)
    events = make_events(rnd)
    batches = [events[i : i + BATCH] for i in range(0, len(events), BATCH)]
    uri = str(tmp_path / "archive")
    log = tmp_path / "serve.log"
    data = tmp_path / "redis"
    data.mkdir()
    with redis_server(data, aof=True) as url:
        sock = url.removeprefix("unix://")
        r = redis.Redis.from_url(url, decode_responses=True)
        for pid, expr in PROFILES.items():
            rs.put_profile(r, pid, expr)
        key = rs.add_gateway(r, "arc-gw", 0.0)
        svc = Service(url, log, "--archive", uri, "--archive-flush", "0.05").start()
        own: subprocess.Popen[bytes] | None = None
        try:
            last = 0.0
            accepted: list[dict[str, Any]] = []
            for i, batch in enumerate(batches):
                if i == len(batches) // 2:
                    pid = int(r.info("server")["process_id"])
                    subprocess.run(["kill", "-9", str(pid)], check=True)
                    wait_for(lambda: not _pings(r), 10, "redis gone")
                    own = subprocess.Popen(
                        redis_command(Path(sock), data, aof=True),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    wait_for(lambda: _pings(r), 10, "redis back")
                    wait_for(svc.healthy, 30, "service healthy again")
                last = post_batch(svc, key, batch, last)
                accepted.extend(batch)
            wait_archived(uri, accepted, log, 60)
            assert svc.stop() == 0
        finally:
            svc.kill()
            if own is not None:
                own.terminate()
                own.wait(10)
            r.close()
    check(archived(uri), accepted)


def _pings(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False
