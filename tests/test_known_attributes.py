"""The unknown-attribute warning (`knd = "window"`) against the attributes events carried,
kept by the engine worker in ``ens:attrs`` (`adapters.service.known_attrs`) and not trimmed
with the ingest stream; `ens check --events/--service`; no warning for `exists`-only and
reserved attributes."""

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

from adapters.service import known_attrs
from adapters.service import redis_store as rs
from adapters.service.records import GATEWAY_ATTR
from adapters.service.worker import EngineWorker
from ens.cli import app
from notifiers import store
from profiles.lint import SERVICE_KEYS, warnings
from profiles.parser import parse_profile
from tests.helpers_service import ADMIN_TOKEN, Service, redis_server, wait_for, worker_config

pytestmark = pytest.mark.redis

T0 = 1_700_000_000.0
TYPO = "no event seen so far has attribute 'knd' (did you mean 'kind'?)"
runner = CliRunner()


def post(r: redis.Redis, *events: dict[str, Any]) -> None:
    r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(list(events)), rs.INGEST_GATEWAY: "gw"})
    r.incrby(rs.INGEST_IN, len(events))


def _warned(expr: str, seen: set[str] | None) -> list[str]:
    return warnings(parse_profile(expr, "p"), seen)


# ----------------------------------------------------------------------------- the worker


def test_the_worker_keeps_the_attributes_after_the_stream_is_trimmed(rb: redis.Redis) -> None:
    w = EngineWorker(rb, worker_config(reorder_seconds=0.0, known_attrs_interval=0))
    w.start()
    post(
        rb,
        {"id": "a", "ts": T0, "kind": "window", "room": "1", "state": "broken"},
        {"id": "b", "ts": T0 + 1, "kind": "window", "room": "2"},
        {"id": "c", "ts": T0 + 2, "kind": "temperature", "room": "2", "value": 21.5},
    )
    deadline = time.monotonic() + 10
    while "value" not in known_attrs.known(rb) and time.monotonic() < deadline:
        w.step()
    recs = known_attrs.known(rb)
    assert {"kind", "room", "state", "value", GATEWAY_ATTR} <= set(recs), recs
    assert recs["kind"]["count"] == 3 and recs["state"]["count"] == 1
    assert set(recs["kind"]["values"]) <= {"window", "temperature"} and recs["kind"]["values"]
    assert recs["value"]["types"] == ["number"] and recs["kind"]["types"] == ["string"]
    assert not any(n.startswith("\x00") for n in recs)  # not the engine's derived keys
    w.snapshot()  # what the service does every --snapshot-interval: trims ens:ingest
    assert rb.xlen(rs.INGEST) == 0
    seen = rs.seen_attributes(rb)
    assert seen is not None and {"kind", "room", "state", "value"} <= seen
    assert any(TYPO in x for x in _warned('knd = "window"', seen))
    assert not _warned('kind = "window" and room = "1"', seen)


def test_the_sketch_counts_per_step_and_stays_bounded(rb: redis.Redis) -> None:
    """Written once per interval, not per event; at most ``limit`` names, the ones seen
    longest ago dropped first; counts add up across writes."""
    w = EngineWorker(
        rb, worker_config(reorder_seconds=0.0, known_attrs_interval=3600, known_attrs_max=10)
    )
    w.start()
    post(rb, {"id": "a", "ts": T0, "kind": "x", "old0": 1})
    w.step()  # the first write (nothing written yet)
    assert set(known_attrs.known(rb)) >= {"kind", "old0"}
    post(rb, {"id": "b", "ts": T0 + 1, "kind": "y", "new": 1})
    w.step()
    assert "new" not in known_attrs.known(rb)  # within the interval: kept in memory
    w.intake.write_known(force=True)
    assert known_attrs.known(rb)["kind"]["count"] == 2
    # more names than the limit: those seen longest ago go (down to 90 %)
    seen = {f"a{i}": {"count": 1, "values": [i], "types": ["number"]} for i in range(12)}
    size = known_attrs.write(rb, seen, time.time() + 10, limit=10)
    kept = known_attrs.known(rb)
    assert size == len(kept) == 9
    assert "old0" not in kept and "kind" not in kept  # written earlier: seen longest ago


def test_observe_folds_many_shapes_and_keeps_few_samples() -> None:
    s = known_attrs.Sketch()
    for i in range(known_attrs._SHAPES + 10):
        s.observe({"kind": f"k{i}", f"x{i}": i})
    out = s.take()
    assert out["kind"]["count"] == known_attrs._SHAPES + 10
    assert len(out["kind"]["values"]) == known_attrs.SAMPLES
    assert not s and s.take() == {}


# ----------------------------------------------------------------------------- the rules


def test_no_warning_for_reserved_or_exists_only_attributes() -> None:
    seen = {"kind", "room"}
    assert not _warned('gateway = "lobby" and kind = "door"', seen)
    assert not _warned('kind = "door" and localtime between "22:00" and "06:00"', seen)
    assert not _warned('kind = "door" and weekday in ("sat", "sun")', seen)
    assert not _warned('kind = "door" and not (suspect exists)', seen)
    assert any("'suspct'" in x for x in _warned('kind = "door" and suspct = 1', seen))
    assert GATEWAY_ATTR in SERVICE_KEYS  # the name the service stamps


def test_check_warns_against_an_events_file(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "profiles:\n"
        "  - {id: typo, expr: 'knd = \"window\"'}\n"
        '  - {id: fine, expr: \'kind = "window" and gateway = "lobby"\'}\n'
        "  - {id: guard, expr: 'kind = \"window\" and not (suspect exists)'}\n"
    )
    evs = tmp_path / "e.jsonl"
    evs.write_text('{"id": "e1", "ts": 1, "kind": "window", "room": "1"}\n')
    res = runner.invoke(app, ["check", str(prof), "--events", str(evs)])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [f"warning: profile 'typo': {TYPO}"], res.stderr
    res = runner.invoke(app, ["check", str(prof)])  # offline, no events: nothing to compare
    assert res.exit_code == 0 and TYPO not in res.stderr
    res = runner.invoke(app, ["check", str(prof), "--events", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "no such file" in res.stderr, res.output


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`ens serve` snapshotting every second: the ingest stream is trimmed right away."""
    d = tmp_path_factory.mktemp("svc-attrs")
    with redis_server(d) as url:
        s = Service(url, d / "serve.log", "--reorder-seconds", "0.1", "--snapshot-interval", "1")
        s.start()
        try:
            yield s
        finally:
            s.stop()


def test_the_typo_warning_outlives_the_trimmed_stream(svc: Service, tmp_path: Path) -> None:
    """Posted, processed, snapshotted, trimmed: `ens profile add`, POST /v1/profiles and
    `ens check --service` still know `kind` (on main they knew nothing once ens:ingest was
    trimmed, 30 s after the event by default)."""
    r = redis.Redis.from_url(svc.redis_url or "", decode_responses=True)
    key = rs.add_gateway(r, "attrs-gw")
    resp = httpx.post(
        svc.url + "/v1/events",
        headers={"X-API-Key": key},
        json={"id": "k1", "ts": time.time(), "kind": "window", "room": "1"},
    )
    assert resp.status_code == 202, resp.text
    wait_for(lambda: r.xlen(rs.INGEST) == 0 and r.exists(rs.INGEST), 20, "ens:ingest trimmed")

    cli = ["--redis-url", svc.redis_url or ""]
    res = runner.invoke(app, ["profile", "add", "--id", "typo1", "--expr", 'knd = "x"', *cli])
    assert res.exit_code == 0, res.output
    assert TYPO in res.stderr, res.stderr
    res = runner.invoke(app, ["profile", "add", "--id", "ok1", "--expr", 'kind = "x"', *cli])
    assert res.exit_code == 0 and "no event seen" not in res.stderr, res.stderr

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    resp = httpx.post(
        svc.url + "/v1/profiles", headers=admin, json={"id": "typo2", "expr": 'knd = "x"'}
    )
    assert resp.status_code == 201 and any(TYPO in w for w in resp.json()["warnings"])

    prof = tmp_path / "p.yaml"
    prof.write_text('profiles:\n  - {id: t, expr: \'knd = "x" and gateway = "attrs-gw"\'}\n')
    res = runner.invoke(app, ["check", str(prof), "--service", *cli])
    assert res.exit_code == 0 and TYPO in res.stderr, res.output
    assert "gateway" not in res.stderr
    metrics = httpx.get(svc.url + "/metrics", headers=admin).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("ens_known_attributes "))
    assert float(line.split()[1]) == len(known_attrs.known(r)) >= 3  # kind, room, gateway
    r.close()


def test_a_failed_write_of_the_attributes_does_not_stop_the_engine(
    rb: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """``ens:attrs`` is advisory: a write Redis refuses (here: the key holds a string) is
    logged and skipped; events are processed and notified as before."""
    rb.set(known_attrs.KEY, "not a hash")
    w = EngineWorker(rb, worker_config(reorder_seconds=0.0, commit_min_interval=0))
    w.start()
    w.control.set_def("hot", "value > 30", None)
    post(rb, {"id": "h1", "ts": T0, "kind": "temperature", "value": 35})
    deadline = time.monotonic() + 10
    while not rb.xlen(store.OUTBOX) and time.monotonic() < deadline:
        w.step()
    assert rb.xlen(store.OUTBOX) == 1 and w.started
    assert "could not record the attributes of recent events" in caplog.text
    rb.delete(known_attrs.KEY)  # repaired: the next events are recorded again
    post(rb, {"id": "h2", "ts": T0 + 1, "kind": "temperature", "value": 36, "room": "9"})
    w.cfg.known_attrs_interval = 0
    deadline = time.monotonic() + 10
    while "room" not in known_attrs.known(rb) and time.monotonic() < deadline:
        w.step()
    assert "room" in known_attrs.known(rb)
