"""Alarms while Redis is over ``maxmemory`` (noeviction): the engine worker keeps its state
and commits again (`adapters.service.pressure`), and the alarm step of a refused commit is
kept until a commit writes it — its transitions, command replies and messages exactly once
(docs/alarms.md, "Exactly once"). A real redis-server, the engine worker's own loop in a
thread, and a real `ens alarms ack` waiting for its answer meanwhile."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from adapters.service.worker import EngineWorker
from tests.helpers_service import ROOT, outbox, redis_server, wait_for, worker_config
from tests.test_service_redis_limits import fill_over_limit, oom_errors
from tests.test_service_worker import drain, ingest

pytestmark = pytest.mark.redis

T0 = 1_700_000_000.0
OPEN = 'kind = "window" and state = "open"'
ALARM = {
    "severity": "major",
    "clear": {"on": 'kind = "window" and state = "closed"'},
    "notify": ["raise", "ack", "clear"],
}


def window(i: int, room: str, state: str = "open") -> dict[str, Any]:
    return {"id": f"e{i}", "ts": T0 + i, "kind": "window", "state": state, "room": room}


def alarm_of(rt: redis.Redis, room: str) -> dict[str, Any]:
    (rec,) = als.list_alarms(rt, matchers=als.parse_matchers([f"room={room}"]))
    return rec


def test_alarm_step_of_a_commit_refused_over_maxmemory_is_written_once(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        rt = redis.Redis.from_url(url, decode_responses=True)
        rb = redis.Redis.from_url(url)
        stop = threading.Event()
        thread: threading.Thread | None = None
        ack: subprocess.Popen[str] | None = None
        try:
            rs.put_profile(rt, "win", f"seq(w: {OPEN}) per room", alarm=ALARM)
            cfg = worker_config(reorder_seconds=0.0, commit_min_interval=0, oom_backoff_max=0.3)
            w = EngineWorker(rb, cfg)
            w.start()
            clock = [time.time()]
            ingest(rb, [window(1, "101"), window(2, "102"), window(3, "103")])
            drain(w, clock)
            a101 = alarm_of(rt, "101")["id"]
            # pending while Redis fills up: a repeat, a clear, a raise, and an operator's ack
            ingest(rb, [window(4, "101"), window(5, "102", "closed"), window(6, "104")])
            ctl = rt.xlen(als.CONTROL) if rt.exists(als.CONTROL) else 0
            ack = subprocess.Popen(
                [sys.executable, "-m", "ens", "alarms", "ack", a101, "--note", "on it"]
                + ["--wait", "12", "--redis-url", url],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_for(lambda: rt.xlen(als.CONTROL) > ctl, 20, "the ack command posted")
            fill_over_limit(rt)
            refused = oom_errors(rt)
            thread = threading.Thread(target=w.run_forever, args=(stop,), daemon=True)
            thread.start()
            wait_for(lambda: oom_errors(rt) >= refused + 3, 15, "commits refused over maxmemory")
            assert not als.history(rt)[3:]  # nothing of the pending step written yet
            rt.config_set("maxmemory", "0")
            out, err = ack.communicate(timeout=30)
            assert ack.returncode == 0, err  # main: no answer (the refused step took the ack)
            assert a101 in out
            wait_for(lambda: len(als.history(rt)) >= 7, 15, "the pending step's transitions")
        finally:
            stop.set()
            if thread is not None:
                thread.join(20)
            if ack is not None and ack.poll() is None:
                ack.kill()
        hist = als.history(rt)
        got = Counter((t["labels"]["room"], t["kind"]) for t in hist)
        assert got == Counter(
            {
                ("101", "raise"): 1,
                ("101", "repeat"): 1,
                ("101", "ack"): 1,
                ("102", "raise"): 1,
                ("102", "clear"): 1,
                ("103", "raise"): 1,
                ("104", "raise"): 1,
            }
        ), hist
        assert len({t["id"] for t in hist}) == len(hist)
        rec = alarm_of(rt, "101")
        assert rec["count"] == 2 and rec["state"] == "active-acknowledged"
        assert rec["ack_note"] == "on it"
        assert alarm_of(rt, "104")["count"] == 1
        msgs = Counter(
            (n["alarm"]["labels"]["room"], n["alarm"]["transition_kind"])
            for n in outbox(rt)
            if "alarm" in n
        )
        assert msgs == Counter(
            {
                ("101", "raise"): 1,
                ("101", "ack"): 1,
                ("102", "raise"): 1,
                ("102", "clear"): 1,
                ("103", "raise"): 1,
                ("104", "raise"): 1,
            }
        ), msgs
        rt.close()
        rb.close()


def test_a_commit_of_held_steps_replays_step_by_step(tmp_path: Path) -> None:
    """Two refused commits with matches and a command between them, then one commit of the
    three steps (journal entry version 4): a worker that replays it after a crash has the same
    alarm state and writes nothing again."""
    with redis_server(tmp_path) as url:
        rt = redis.Redis.from_url(url, decode_responses=True)
        rb = redis.Redis.from_url(url)
        rs.put_profile(rt, "win", f"seq(w: {OPEN}) per room", alarm=ALARM)
        a = EngineWorker(rb, worker_config(reorder_seconds=0.0, commit_min_interval=0))
        a.start()
        clock = [time.time()]
        ingest(rb, [window(1, "101"), window(2, "102")])
        drain(a, clock)
        a.snapshot()
        a101 = alarm_of(rt, "101")["id"]
        fill_over_limit(rt)
        limit = rt.config_get("maxmemory")["maxmemory"]
        eid = ""
        for batch, ack in (
            ([window(3, "101"), window(4, "103")], False),
            ([window(5, "102", "closed")], True),  # read after the first refusal
        ):
            rt.config_set("maxmemory", "0")
            ingest(rb, batch)
            if ack:
                eid = als.post_command(rt, "ack", {"id": a101, "actor": "ann"})
            rt.config_set("maxmemory", limit)
            clock[0] += 1
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                a.step(block=0, now=clock[0])
        rt.config_set("maxmemory", "0")
        drain(a, clock)
        assert als.wait_reply(rt, eid, 5)["status"] == 200
        (entry,) = rb.xrange(rs.JOURNAL)
        assert entry[1][b"ver"] == b"4", entry
        hist = als.history(rt)
        kinds = Counter((t["labels"]["room"], t["kind"]) for t in hist)
        assert kinds == Counter(
            {("101", "raise"): 1, ("101", "repeat"): 1, ("101", "ack"): 1, ("102", "raise"): 1,
             ("102", "clear"): 1, ("103", "raise"): 1}
        ), hist  # fmt: skip
        state, msgs = a.alarms.rules.snapshot(), outbox(rt)
        rb.delete(rs.ENGINE_LOCK)  # kill -9

        b = EngineWorker(rb, worker_config(name="w2", reorder_seconds=0.0))
        b.start()
        assert b.alarms.rules.snapshot() == state
        assert als.history(rt) == hist and outbox(rt) == msgs
        rt.close()
        rb.close()


def test_ack_waits_longer_than_the_client_socket_timeout(tmp_path: Path) -> None:
    """`ens alarms ack --wait 7` with no engine worker: the clear "did not answer" error after
    7 s, not redis-py's "Timeout reading from socket" traceback after its 5 s socket timeout."""
    with redis_server(tmp_path) as url:
        t0 = time.monotonic()
        got = subprocess.run(
            [sys.executable, "-m", "ens", "alarms", "ack", "a1", "--wait", "7", "--redis-url", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert got.returncode == 1, got.stderr
        assert "did not answer within 7 s" in got.stderr and "Traceback" not in got.stderr
        assert time.monotonic() - t0 >= 7
