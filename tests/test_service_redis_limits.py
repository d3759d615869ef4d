"""Redis' memory limits (issue 41.3, 41.4): a Redis over ``maxmemory`` and an evicting Redis,
each a real redis-server started with that configuration, with `ens serve` subprocesses or an
engine worker stepped in this process."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from adapters.errors import EvictingRedis
from adapters.service import redis_store as rs
from adapters.service.embedded import CONF
from adapters.service.redis_limits import check_policy, eviction_policy
from adapters.service.worker import EngineWorker
from tests.helpers_service import (
    ADMIN_TOKEN,
    ROOT,
    Service,
    free_port,
    outbox_for,
    redis_command,
    redis_server,
    wait_for,
    worker_config,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

MB = 1024 * 1024


def fill(r: redis.Redis, n: int = 200) -> int:
    """Put ``n`` x 40 kB into Redis; returns its used memory. Small values: no big query
    buffer that Redis frees a moment later."""
    with r.pipeline(transaction=False) as p:
        for i in range(n):
            p.set(f"filler:{i}", "x" * 40_000)
        p.execute()
    return int(r.info("memory")["used_memory"])


def fill_over_limit(r: redis.Redis) -> int:
    """Put Redis over its maxmemory (noeviction: it refuses writes now); returns XLEN ingest."""
    used = fill(r)
    r.config_set("maxmemory", str(used - 4 * MB))
    return int(r.xlen(rs.INGEST)) if r.exists(rs.INGEST) else 0


def health(url: str) -> httpx.Response:
    return httpx.get(url + "/healthz", timeout=5)


def oom_errors(r: redis.Redis) -> int:
    """OOM errors Redis has answered (INFO errorstats, Redis 6.2 on)."""
    return int(r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


# ----------------------------------------------------------------------------- 41.3 maxmemory


@pytest.mark.parametrize("dedup", ["10m", "off"])
def test_ingest_over_maxmemory_is_503_and_appends_nothing_then_resumes(
    tmp_path: Path, dedup: str
) -> None:
    """Over maxmemory every POST gets 503 with Retry-After and the reason, the ingest stream
    does not grow (with the dedup window on, the script's first write used to be a
    non-growing ZREMRANGEBYSCORE, after which Redis let the XADD through), /healthz says why,
    and `ens post` reports the 503's reason. With the limit raised, ingest and the engine
    resume by themselves."""
    with redis_server(tmp_path) as url:
        s = Service(
            url,
            tmp_path / "serve.log",
            *("--reorder-seconds", "0", "--dedup-window", dedup),
            *("--ingest-memory-share", "1"),  # up to Redis' limit: the script must refuse
        )
        s.start()
        r = redis.Redis.from_url(url, decode_responses=True)
        try:
            key = rs.add_gateway(r, "gw")
            with s.client(admin=True) as admin:
                got = admin.post("/v1/profiles", json={"id": "door", "expr": 'kind = "door"'})
                assert got.status_code == 201, got.text
            before = fill_over_limit(r)
            counted = r.get(rs.INGEST_IN)
            with s.client(key) as gw:
                for i in range(20):
                    ev = {"id": f"e{i}", "ts": time.time(), "kind": "door"}
                    got = gw.post("/v1/events", json=[ev, {**ev, "id": f"f{i}"}])
                    assert got.status_code == 503, got.text
                    assert got.headers["Retry-After"]
                    assert "maxmemory" in got.json()["error"]
            assert (r.xlen(rs.INGEST) if r.exists(rs.INGEST) else 0) == before
            assert r.get(rs.INGEST_IN) == counted
            assert r.zcard(rs.seen_key("gw")) == 0  # nothing remembered either
            got = wait_for(lambda: (h := health(s.url)).status_code == 503 and h, 10, "unhealthy")
            assert "maxmemory" in " ".join(got.json()["problems"]), got.text
            ev_file = tmp_path / "ev.jsonl"
            ev_file.write_text(json.dumps({"id": "p1", "ts": time.time(), "kind": "door"}) + "\n")
            res = subprocess.run(
                [sys.executable, "-m", "ens", "post", str(ev_file), "--url", s.url]
                + ["--api-key", key, "--retries", "1", "--retry-for", "3s"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 1, res.stderr
            assert "answered HTTP 503: ingest store is full" in res.stderr, res.stderr
            assert "Traceback" not in res.stderr

            r.config_set("maxmemory", "0")  # the operator raises the limit
            with s.client(key) as gw:
                got = gw.post("/v1/events", json={"id": "late1", "ts": time.time(), "kind": "door"})
                assert got.status_code == 202, got.text
            wait_for(lambda: outbox_for(r, "door"), 20, "the engine resumed")
            wait_for(lambda: health(s.url).status_code == 200, 20, "healthy again")
            assert s.stop() == 0
        finally:
            s.kill()
            r.close()
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_ingest_pauses_short_of_maxmemory_so_the_engine_can_still_commit(tmp_path: Path) -> None:
    """Above --ingest-memory-share of maxmemory ingest answers 503 (nothing appended) while
    Redis still takes the engine's writes, whose snapshots trim the ingest stream."""
    with redis_server(tmp_path) as url:
        s = Service(
            url, tmp_path / "serve.log", "--reorder-seconds", "0", "--ingest-memory-share", "0.5"
        )
        s.start()
        r = redis.Redis.from_url(url, decode_responses=True)
        try:
            key = rs.add_gateway(r, "gw")
            with s.client(admin=True) as admin:
                got = admin.post("/v1/profiles", json={"id": "door", "expr": 'kind = "door"'})
                assert got.status_code == 201, got.text
            used = fill(r, 100)  # a few MB: the margins below are not a few bytes
            r.config_set("maxmemory", str(int(used / 0.75)))  # 75 % used: over the 50 % share
            before = r.xlen(rs.INGEST) if r.exists(rs.INGEST) else 0
            with s.client(key) as gw:
                got = gw.post("/v1/events", json={"id": "e1", "ts": time.time(), "kind": "door"})
                assert got.status_code == 503 and got.headers["Retry-After"], got.text
                assert "nearly full" in got.json()["error"] and "50%" in got.json()["error"]
            assert (r.xlen(rs.INGEST) if r.exists(rs.INGEST) else 0) == before
            r.set("engine-room", "ok")  # Redis itself still takes writes
            assert health(s.url).status_code == 200  # under Redis' limit: all is well
            r.config_set("maxmemory", "0")
            with s.client(key) as gw:
                got = wait_for(
                    lambda: (
                        (
                            (
                                g := gw.post(
                                    "/v1/events",
                                    json={"id": "e2", "ts": time.time(), "kind": "door"},
                                )
                            ).status_code
                            == 202
                        )
                        and g
                    ),
                    10,
                    "ingest resumed",
                )
            wait_for(lambda: outbox_for(r, "door"), 20, "the engine processed it")
            assert s.stop() == 0
        finally:
            s.kill()
            r.close()


def test_engine_waits_out_maxmemory_without_restarting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine cannot commit over maxmemory: it keeps its state, backs off, logs it once
    (not per attempt; it used to restart from the snapshot every second, saying so each time)
    and commits by itself once memory frees."""
    caplog.set_level(logging.INFO, "ens.service.worker")
    with redis_server(tmp_path) as url:
        rt = redis.Redis.from_url(url, decode_responses=True)
        rb = redis.Redis.from_url(url)
        try:
            rs.put_profile(rt, "door", 'kind = "door"')
            key = rs.add_gateway(rt, "gw")
            worker = EngineWorker(rb, worker_config(reorder_seconds=0.0, oom_backoff_max=0.3))
            worker.start()
            script = rt.register_script(rs.INGEST_SCRIPT)
            event = json.dumps({"id": "e1", "ts": 1_700_000_000, "kind": "door"})
            script(
                keys=[*rs.INGEST_SCRIPT_KEYS, rs.seen_key("gw")],
                args=rs.ingest_args(
                    "gw", rs.sha256(key), rs.INGEST_EXACT, 0, 0, 10, ["e1"], [event]
                ),
            )
            fill_over_limit(rt)
            refused = oom_errors(rt)
            stop = threading.Event()
            thread = threading.Thread(target=worker.run_forever, args=(stop,), daemon=True)
            thread.start()
            try:
                wait_for(lambda: oom_errors(rt) >= refused + 5, 15, "several refused attempts")
                said = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
                assert len(said) == 1 and "over its maxmemory" in said[0].getMessage(), said
                assert "used" in said[0].getMessage()  # with the figures
                assert not outbox_for(rt, "door")
                rt.config_set("maxmemory", "0")
                wait_for(lambda: outbox_for(rt, "door"), 15, "the commit once memory freed")
                # said after the commit that wrote the outbox entry returns: waited for, too
                wait_for(
                    lambda: any(
                        "accepts writes again" in rec.getMessage() for rec in caplog.records
                    ),
                    10,
                    "the worker said Redis accepts writes again",
                )
                assert not any(
                    "restarting from the snapshot" in rec.getMessage() for rec in caplog.records
                )
            finally:
                stop.set()
                thread.join(20)
            assert len(outbox_for(rt, "door")) == 1  # once: the kept state was not redone
        finally:
            rt.close()
            rb.close()


# ----------------------------------------------------------------------------- 41.4 eviction


def serve_cmd(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "ens.service", "serve", "--redis-url", url] + [
        "--port",
        str(free_port()),
        "--no-deliver",
        *args,
    ]


def test_serve_refuses_an_evicting_redis_with_a_clear_message(tmp_path: Path) -> None:
    with redis_server(tmp_path, config={"maxmemory-policy": "allkeys-lru"}) as url:
        res = subprocess.run(
            serve_cmd(url),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "ENS_ADMIN_TOKEN": ADMIN_TOKEN},
        )
        assert res.returncode == 2, res.stderr
        err = res.stderr
        assert "allkeys-lru" in err and "CONFIG SET maxmemory-policy noeviction" in err, err
        assert "--allow-evicting-redis" in err and "Traceback" not in err, err
        r = redis.Redis.from_url(url)
        assert r.dbsize() == 0  # nothing written to it
        r.close()


def test_serve_with_the_flag_warns_and_is_unhealthy(tmp_path: Path) -> None:
    with redis_server(tmp_path, config={"maxmemory-policy": "allkeys-lru"}) as url:
        s = Service(url, tmp_path / "serve.log", "--allow-evicting-redis", http=False)
        try:
            s.start()  # waits for the engine worker (healthz is 503 by design)
            got = wait_for(lambda: (h := health(s.url)).status_code == 503 and h, 20, "healthz")
            assert any("allkeys-lru" in p for p in got.json()["problems"]), got.text
            text = httpx.get(s.url + "/metrics", timeout=5).text
            assert "ens_redis_evicting 1.0" in text
            log = (tmp_path / "serve.log").read_text()
            assert "WARNING" in log and "allkeys-lru" in log and "--allow-evicting-redis" in log
            assert s.stop() == 0
        finally:
            s.kill()


def test_a_reconnect_to_a_redis_restarted_evicting_is_detected(tmp_path: Path) -> None:
    """Redis restarted with another configuration: the engine worker checks the policy again
    when it reconnects, stops working on it and says why; /healthz reports it; once the
    policy is noeviction again the worker resumes by itself."""
    sock = tmp_path / "r.sock"
    data = tmp_path / "data"
    data.mkdir()

    def start(config: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(redis_command(sock, data, aof=False, config=config))
        c = redis.Redis(unix_socket_path=str(sock))
        wait_for(lambda: _pings(c), 10, "redis-server up")
        c.close()
        return proc

    proc = start({})
    url = f"unix://{sock}"
    s = Service(url, tmp_path / "serve.log", "--status-interval", "1")
    try:
        s.start()
        proc.terminate()
        proc.wait(10)
        proc = start({"maxmemory-policy": "allkeys-lru"})
        log = tmp_path / "serve.log"
        wait_for(lambda: "engine worker paused" in log.read_text(), 20, "the policy detected")
        assert "allkeys-lru" in log.read_text()
        got = wait_for(lambda: (h := health(s.url)).status_code == 503 and h, 20, "unhealthy")
        assert any("allkeys-lru" in p for p in got.json()["problems"]), got.text
        r = redis.Redis(unix_socket_path=str(sock))
        r.config_set("maxmemory-policy", "noeviction")
        r.close()
        wait_for(lambda: health(s.url).status_code == 200, 30, "healthy again")
        assert s.stop() == 0
    finally:
        s.kill()
        proc.terminate()
        proc.wait(10)


def _pings(c: redis.Redis) -> bool:
    try:
        return bool(c.ping())
    except redis.ConnectionError:
        return False


def test_policy_read_from_info_where_config_is_renamed(tmp_path: Path) -> None:
    """Managed Redis services rename CONFIG: the policy comes from INFO memory, and the
    message says so."""
    cfg = {"rename-command": "CONFIG xconfigx", "maxmemory-policy": "volatile-lru"}
    with redis_server(tmp_path, config=cfg) as url:
        r = redis.Redis.from_url(url)
        try:
            with pytest.raises(EvictingRedis, match="volatile-lru"):
                check_policy(r, allow=False)
            policy, note = check_policy(r, allow=True)
            assert policy == "volatile-lru" and note and "INFO memory" in note
        finally:
            r.close()


def test_embedded_redis_runs_with_noeviction(tmp_path: Path) -> None:
    conn = rs.connect(data_dir=tmp_path / "d")
    try:
        assert "maxmemory-policy noeviction" in (tmp_path / "d" / CONF).read_text()
        assert conn.text().config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert eviction_policy(conn.binary()) == ("noeviction", None)  # CONFIG GET, bytes too
    finally:
        conn.close()
