"""Issue 41 item 6: late events go to a late side output instead of being matched out of order.

An event older than the engine's time when the worker reads it can no longer be fed in ``ts``
order. Fed anyway (as before), a ``b`` stamped an hour back completed ``seq(a, b)`` after a
fresh ``a``, and a ``close`` stamped an hour back suppressed a "door left open" alarm. Now it is
kept out of the engine, in ``ens:late`` (written by the commit that journals the decision, so
exactly once across crashes), counted per gateway, listed by ``ens notifications late list``
and ``GET /v1/late-events``, and exported for ``ens replay``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from adapters.service.late import LATE, list_late
from adapters.service.worker import EngineWorker
from tests.helpers_service import (
    Service,
    outbox,
    outbox_for,
    serving,
    wait_for,
    worker_config,
)

pytestmark = pytest.mark.redis

SEQ = 'seq(a: kind = "A", b: kind = "B") within 2h per room'
LEFT_OPEN = (
    'seq(o: kind = "door" and state = "open", not c: kind = "door" and state = "close") '
    "within 60s per door"
)
HOUR = 3600.0


def post(r: redis.Redis, gw: str, *events: dict[str, Any]) -> None:
    """What the API appends for one request of gateway ``gw``."""
    r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(list(events)), rs.INGEST_GATEWAY: gw})


def wall_worker(rb: redis.Redis, **kw: Any) -> EngineWorker:
    """A worker stepped by hand on the wall clock (as `ens serve` runs), 0.5 s behind it."""
    cfg = worker_config(**{"clock": "wall", "reorder_seconds": 0.5, "commit_min_interval": 0, **kw})
    w = EngineWorker(rb, cfg)
    w.start()
    return w


def steps(w: EngineWorker, now: float) -> None:
    while w.step(block=0, now=now):
        pass


@pytest.mark.parametrize("late_gateway", ["gw-b", "gw-a"])
def test_an_event_an_hour_late_does_not_complete_a_sequence_out_of_order(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture, late_gateway: str
) -> None:
    """An A now, then a B stamped an hour back (from another gateway, or the same): B is an hour
    before A, so seq(a, b) must not complete. B is in the late output, counted for its gateway."""
    rs.put_profile(rt, "ab", SEQ)
    t = time.time()
    w = wall_worker(rb)
    post(rb, "gw-a", {"id": "a1", "ts": t, "kind": "A", "room": "r1"})
    steps(w, t + 1)
    assert w.engine.now is not None and w.engine.now >= t  # A was fed
    post(rb, late_gateway, {"id": "b1", "ts": t - HOUR, "kind": "B", "room": "r1"})
    steps(w, t + 1.1)
    w.snapshot()

    assert outbox_for(rt, "ab") == []  # main: one notification, b an hour before a
    recs, more = list_late(rt)
    assert not more
    b1 = {"id": "b1", "ts": t - HOUR, "kind": "B", "room": "r1", "gateway": late_gateway}
    assert [(r.event, r.gateway) for r in recs] == [(b1, late_gateway)]  # stamped: its gateway
    assert 3599 < recs[0].behind < 3601
    assert w.totals["late"] == 1 and w.late_by_gateway == {late_gateway: 1}
    assert w.stats()["late_by_gateway"] == {late_gateway: 1}
    assert f"late event b1 from gateway {late_gateway}" in caplog.text
    assert "sent to the late output" in caplog.text


def test_a_close_an_hour_late_does_not_suppress_a_door_left_open_alarm(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """The door's gateway has the right clock; a `close` stamped an hour back (a buffered old
    reading) arrives after the `open`. It says nothing about the door since the open: the
    alarm must still fire 60 s after the open."""
    rs.put_profile(rt, "left-open", LEFT_OPEN)
    t = time.time()
    w = wall_worker(rb)
    post(rb, "gw-door", {"id": "o1", "ts": t, "kind": "door", "state": "open", "door": "d1"})
    steps(w, t + 1)
    post(
        rb, "gw-door", {"id": "c0", "ts": t - HOUR, "kind": "door", "state": "close", "door": "d1"}
    )
    steps(w, t + 2)
    steps(w, t + 61)  # the engine's time passes open + 60 s (0.5 s behind the wall clock)
    w.snapshot()

    got = outbox_for(rt, "left-open")
    assert [n["events"]["o"]["id"] for n in got] == ["o1"]  # main: none (suppressed)
    assert [r.event["id"] for r in list_late(rt)[0]] == ["c0"]
    assert w.late_by_gateway == {"gw-door": 1}


def test_late_events_can_still_be_fed_when_asked(rb: redis.Redis, rt: redis.Redis) -> None:
    """``--late-events feed`` keeps the old behaviour (fed at once, in arrival order)."""
    rs.put_profile(rt, "ab", SEQ)
    t = time.time()
    w = wall_worker(rb, late_events="feed")
    post(rb, "gw-a", {"id": "a1", "ts": t, "kind": "A", "room": "r1"})
    steps(w, t + 1)
    post(rb, "gw-b", {"id": "b1", "ts": t - HOUR, "kind": "B", "room": "r1"})
    steps(w, t + 1.1)
    w.snapshot()
    assert len(outbox_for(rt, "ab")) == 1 and rt.xlen(LATE) == 0
    assert w.late_by_gateway == {"gw-b": 1}


@pytest.mark.parametrize("crash_after", ["decided", "commit", "snapshot"])
def test_a_late_record_is_written_exactly_once_across_a_crash(
    rb: redis.Redis, rt: redis.Redis, caplog: pytest.LogCaptureFixture, crash_after: str
) -> None:
    """kill -9 (no final snapshot, the lock expires) after the late decision, after its commit,
    after a snapshot: the successor has exactly one late record and counts it once."""
    rs.put_profile(rt, "ab", SEQ)
    rs.put_profile(rt, "b", 'kind = "B"')
    t = time.time()
    w = wall_worker(rb, commit_min_interval=1e9)  # commits only where the test says
    post(rb, "gw-a", {"id": "a1", "ts": t, "kind": "A", "room": "r1"})
    steps(w, t + 1)
    w.commit()  # A's feed and the engine's advance are journalled
    post(
        rb,
        "gw-b",
        {"id": "b1", "ts": t - HOUR, "kind": "B", "room": "r1"},
        {"id": "b2", "ts": t + 0.9, "kind": "B", "room": "r2"},  # on time, same entry
    )
    w.step(block=0, now=t + 1.1)  # b1 late; b2 held (the wall clock is 0.5 s behind)
    assert [r.key for r in w.intake.late_out] and w.buffer
    if crash_after == "commit":
        w.commit()
        assert rt.xlen(LATE) == 1
    elif crash_after == "snapshot":
        w.snapshot()
        assert rt.xlen(LATE) == 1
    else:
        assert rt.xlen(LATE) == 0  # decided, not committed: decided again after the crash
    rb.delete(rs.ENGINE_LOCK)

    w2 = EngineWorker(rb, w.cfg)
    w2.start()
    steps(w2, t + 5)
    w2.snapshot()
    assert [(r.event["id"], r.gateway) for r in list_late(rt)[0]] == [("b1", "gw-b")]
    assert w2.totals["late"] == 1 and w2.late_by_gateway == {"gw-b": 1}
    assert outbox_for(rt, "ab") == []
    assert [n["events"]["e"]["id"] for n in outbox_for(rt, "b")] == ["b2"]  # once
    assert "not deterministic" not in caplog.text
    assert rb.xlen(rs.INGEST) == 0 and rb.xlen(rs.JOURNAL) == 0


def test_the_late_output_is_bounded(rb: redis.Redis, rt: redis.Redis) -> None:
    """``--late-max``: about that many are kept (approximate trimming), the newest."""
    t = time.time()
    w = wall_worker(rb, late_max=100)
    post(rb, "gw-a", {"id": "a1", "ts": t, "kind": "A"})
    steps(w, t + 1)
    for i in range(0, 1000, 50):
        post(
            rb,
            "gw-b",
            *({"id": f"old{j}", "ts": t - HOUR + j, "kind": "B"} for j in range(i, i + 50)),
        )
        steps(w, t + 1.1)
    w.snapshot()
    assert w.late_by_gateway == {"gw-b": 1000}
    assert 100 <= rt.xlen(LATE) < 300
    recs, more = list_late(rt, limit=10)
    assert more and [r.event["id"] for r in recs] == [f"old{j}" for j in range(990, 1000)]


# ----------------------------------------------------------------------------- end to end


def metrics_text(svc: Service) -> str:
    return httpx.get(svc.url + "/metrics").text


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("svc-late")
    with serving(d, "--default-lateness", "0.2") as s:
        yield s


def test_late_events_end_to_end_listed_exported_and_replayed(svc: Service, tmp_path: Path) -> None:
    """`ens serve`: gateway gw-b's events arrive an hour late. No sequence completes out of
    order and the door alarm still fires; the late events are counted per gateway in
    /metrics, listed by the CLI and GET /v1/late-events, and exported for `ens replay`."""
    from ens.cli import app as ens_app

    r = redis.Redis.from_url(svc.redis_url or "", decode_responses=True)
    rs.put_profile(r, "ab", SEQ)
    rs.put_profile(r, "seen-a", 'kind = "A"')
    rs.put_profile(r, "left-open", LEFT_OPEN.replace("60s", "2s"))
    gw_a = svc.client(rs.add_gateway(r, "gw-a"))
    gw_b = svc.client(rs.add_gateway(r, "gw-b"))
    admin = svc.client(admin=True)
    t = time.time()
    a = {"id": "a1", "ts": t, "kind": "A", "room": "r1"}
    assert gw_a.post("/v1/events", json=[a]).status_code == 202
    wait_for(lambda: outbox_for(r, "seen-a"), 10, "A fed")
    b = {"id": "b1", "ts": round(t - HOUR, 3), "kind": "B", "room": "r1"}
    opened = {"id": "o1", "ts": time.time(), "kind": "door", "state": "open", "door": "d1"}
    close = {"id": "c0", "ts": round(t - HOUR, 3), "kind": "door", "state": "close", "door": "d1"}
    assert gw_b.post("/v1/events", json=[b]).status_code == 202
    assert gw_a.post("/v1/events", json=[opened]).status_code == 202
    wait_for(lambda: r.xlen(LATE) >= 1, 10, "b1 in the late output")
    assert gw_a.post("/v1/events", json=[close]).status_code == 202
    wait_for(lambda: outbox_for(r, "left-open"), 10, "the door alarm")  # open + 2 s
    assert outbox_for(r, "ab") == []

    wait_for(lambda: 'ens_events_late_total{gateway="gw-a"} 1.0' in metrics_text(svc), 10, "metric")
    assert 'ens_events_late_total{gateway="gw-b"} 1.0' in metrics_text(svc)
    assert "\nens_late_events 2.0\n" in metrics_text(svc)

    resp = admin.get("/v1/late-events")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # the events as the engine would have had them: stamped with their gateway
    b["gateway"], close["gateway"] = "gw-b", "gw-a"
    assert [(e["gateway"], e["event"]) for e in body["events"]] == [("gw-b", b), ("gw-a", close)]
    assert body["truncated"] is False and body["stored"] == 2
    resp = admin.get("/v1/late-events", params={"gateway": "gw-b", "limit": 5})
    assert [e["event"]["id"] for e in resp.json()["events"]] == ["b1"]
    assert httpx.get(svc.url + "/v1/late-events").status_code == 401
    assert "/v1/late-events" in admin.get("/openapi.json").json()["paths"]

    cli = CliRunner(env={rs.ENV_URL: svc.redis_url})
    res = cli.invoke(ens_app, ["notifications", "late", "list", "--json"])
    assert res.exit_code == 0, res.output
    assert [(e["gateway"], e["event"]["id"]) for e in json.loads(res.stdout)] == [
        ("gw-b", "b1"),
        ("gw-a", "c0"),
    ]
    res = cli.invoke(ens_app, ["notifications", "late", "list", "--gateway", "gw-a"])
    assert res.exit_code == 0 and "c0" in res.stdout and "b1" not in res.stdout

    # offline: export, then replay alone and merged into the historical file
    late_file = tmp_path / "late.jsonl"
    res = cli.invoke(ens_app, ["notifications", "late", "export", "--out", str(late_file)])
    assert res.exit_code == 0, res.output
    assert [json.loads(line) for line in late_file.read_text().splitlines()] == [b, close]
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        f"profiles:\n  - id: ab\n    expr: '{SEQ}'\n  - id: b\n    expr: 'kind = \"B\"'\n"
    )
    res = CliRunner().invoke(ens_app, ["replay", str(profiles), str(late_file)])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["events"] for line in res.stdout.splitlines()] == [{"e": "b1"}]
    history = tmp_path / "all.jsonl"
    history.write_text(json.dumps(a) + "\n" + late_file.read_text())
    res = CliRunner().invoke(ens_app, ["replay", str(profiles), str(history)])
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in res.stdout.splitlines()]
    assert [n["profile"] for n in got] == ["b"]  # in ts order b is an hour before a
    assert not any(n["profile"] == "ab" for n in outbox(r))
    for c in (gw_a, gw_b, admin):
        c.close()
    r.close()


def test_an_idle_engine_does_not_make_a_lateness_0_gateway_late(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """With lateness 0 the wall-clock floor is the wall clock itself; an event always arrives a
    little after its ts. While nothing is due (no timer fired, nothing newer fed), the engine
    keeps the time of its last event, so such an event is fed, not sent to the late output —
    and once a window end falls due the engine's time does follow the wall clock."""
    rs.put_profile(rt, "door", 'kind = "door"')
    rs.put_profile(rt, "ab", 'seq(a: kind = "A", b: kind = "B") within 5s per room')
    t = time.time()
    w = wall_worker(rb, reorder_seconds=0.0)
    steps(w, t)  # the start: engine time is the wall clock
    for i in range(5):  # each read 50 ms after its ts; the worker polled (idle) meanwhile
        ts = t + 1 + i
        steps(w, ts + 0.04)
        post(rb, "gw", {"id": f"d{i}", "ts": ts, "kind": "door"})
        steps(w, ts + 0.05)
    w.snapshot()
    assert [n["events"]["e"]["id"] for n in outbox_for(rt, "door")] == [f"d{i}" for i in range(5)]
    assert w.totals["late"] == 0 and list_late(rt)[0] == []
    # a pending window end is a timer: when it falls due, engine time moves to the wall clock
    post(rb, "gw", {"id": "a1", "ts": t + 10, "kind": "A", "room": "r1"})
    steps(w, t + 10.05)
    steps(w, t + 20)  # the window (a1 + 5 s) ended at t + 15
    assert w.engine.now is not None and w.engine.now >= t + 19.9
    post(rb, "gw", {"id": "b1", "ts": t + 12, "kind": "B", "room": "r1"})
    steps(w, t + 20.05)
    w.snapshot()
    assert outbox_for(rt, "ab") == [] and [r.event["id"] for r in list_late(rt)[0]] == ["b1"]
