"""The service split into processes: roles, API worker processes, back-pressure, entry format."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import redis
import typer
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from ens.commands.service import register
from tests.helpers_service import Service, metric, outbox_for, redis_server, wait_for


def test_decode_entry_reads_batch_and_legacy_entries_with_their_identities() -> None:
    batch = {b"g": b"gw1", b"b": json.dumps([{"id": "a", "ts": 1}, {"ts": 2}]).encode()}
    assert rs.decode_entry("5-1", batch) == [
        ("5-1.0", "gw1", {"id": "a", "ts": 1}), ("5-1.1", "gw1", {"ts": 2})]
    legacy = {"g": "gw2", "e": '{"ts": 3}'}  # str keys: a client with decode_responses
    assert rs.decode_entry("6-0", legacy) == [("6-0", "gw2", {"ts": 3})]
    for bad in ({b"g": b"x"}, {b"b": b'{"ts": 1}'}, {b"b": b"[{"}):
        try:
            rs.decode_entry("7-0", bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} decoded")


def test_serve_rejects_unknown_roles_and_bad_worker_counts() -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", "--role", "api,bogus"])
    assert res.exit_code == 2 and "--role bogus: expected api, engine or deliver" in res.output
    res = CliRunner().invoke(ens_app, ["serve", "--api-workers", "0"])
    assert res.exit_code == 2 and "--api-workers must be at least 1" in res.output


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_api_workers_serve_one_port_and_a_dead_one_stops_the_service(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        rs.put_profile(r, "alarm", 'kind = "alarm"')
        key = rs.add_gateway(r, "gw")
        svc = Service(url, tmp_path / "serve.log", "--reorder-seconds", "0", "--api-workers", "2",
                      "--max-backlog", "0", "--max-past", "off").start()
        try:
            assert svc.proc is not None
            kids = wait_for(lambda: len(_children(svc.proc.pid)) == 2 and _children(svc.proc.pid),
                            10, "two API processes")
            for i in range(20):  # new connections: the kernel spreads them over both
                resp = httpx.post(svc.url + "/v1/events", json={"id": f"a{i}", "ts": 100 + i,
                                  "kind": "alarm"}, headers={"X-API-Key": key}, timeout=5)
                assert resp.status_code == 202, resp.text
            wait_for(lambda: len(outbox_for(r, "alarm")) == 20, 10, "20 alarms")
            # /metrics sums the processes' counters, whichever process answers the scrape:
            # the events were counted by two API processes, processed by the engine's
            time.sleep(1.5)  # a publishing round
            for _ in range(6):
                text = httpx.get(svc.url + "/metrics", timeout=5).text
                assert metric(text, 'ens_events_received_total{gateway="gw"}') == 20
                assert metric(text, 'ens_ingest_requests_total{status="202"}') == 20
                assert metric(text, "ens_events_processed_total") == 20
                assert metric(text, "ens_notifications_total") == 20
                assert metric(text, "ens_commit_seconds_count") >= 1
            os.kill(kids[0], signal.SIGKILL)
            assert svc.proc.wait(15) == 1  # a dead part takes the service down
            assert not any(Path(f"/proc/{k}").exists() and "zombie" not in
                           Path(f"/proc/{k}/status").read_text() for k in kids)
            assert "http-0 stopped unexpectedly" in (tmp_path / "serve.log").read_text()
        finally:
            svc.kill()
            r.close()


def test_backlog_over_the_bound_answers_429_until_the_engine_catches_up(tmp_path: Path) -> None:
    """An API process with `--max-backlog 50` while its engine process is stopped."""
    log = tmp_path / "serve.log"
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        rs.put_profile(r, "alarm", 'kind = "alarm"')
        key = rs.add_gateway(r, "gw")
        args = ("--reorder-seconds", "0", "--max-past", "off")
        engine = Service(url, log, *args, "--role", "engine", http=False).start()
        api = Service(url, log, *args, "--role", "api", "--max-backlog", "50", engine=False).start()
        try:
            assert engine.stop() == 0  # the engine's last heartbeat: everything read
            events = [{"id": f"a{i}", "ts": 100 + i, "kind": "alarm"} for i in range(60)]
            post = httpx.Client(base_url=api.url, headers={"X-API-Key": key}, timeout=5)
            assert post.post("/v1/events", json=events).status_code == 202  # backlog 0 before
            time.sleep(0.3)  # the API re-reads the backlog at most every 0.2 s
            resp = post.post("/v1/events", json={"id": "x", "ts": 200, "kind": "alarm"})
            assert resp.status_code == 429 and resp.headers["Retry-After"] == "1"
            assert "backlog over 50 events" in resp.json()["error"]
            text = post.get("/metrics").text
            assert metric(text, "ens_ingest_backlog_max") == 50
            assert metric(text, "ens_ingest_backlog") == 60
            assert r.xlen(rs.INGEST) == 1  # one entry for the 60-event request, none for the 429

            # `ens post` honours 429 + Retry-After: it waits until the engine is back
            cli = typer.Typer()
            register(cli)
            f = tmp_path / "late.json"
            f.write_text(json.dumps({"id": "y", "ts": 300, "kind": "alarm"}))
            res: list[object] = []
            th = threading.Thread(target=lambda: res.append(CliRunner().invoke(
                cli, ["post", str(f), "--api-key", key, "--url", api.url])))
            th.start()
            time.sleep(1.5)
            assert th.is_alive(), "ens post waits while the backlog is over the bound"
            engine = Service(url, log, *args, "--role", "engine", http=False).start()
            th.join(30)
            assert res and res[0].exit_code == 0, res  # type: ignore[attr-defined]
            ids = wait_for(lambda: len(outbox_for(r, "alarm")) == 61 and outbox_for(r, "alarm"),
                           15, "every accepted alarm notified")
            assert {n["events"]["e"]["id"] for n in ids} == {e["id"] for e in events} | {"y"}
            wait_for(lambda: post.get("/healthz").json()["ingest_backlog"] == 0, 5,
                     "backlog 0 at the next heartbeat")
            post.close()
        finally:
            api.kill()
            engine.kill()
            r.close()
