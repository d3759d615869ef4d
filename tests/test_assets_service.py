"""The asset registry end to end: a real `ens serve` on a real redis-server; the registry
imported over HTTP, events enriched by the API, a change reaching the running API, and the
sensor-silent faults (`comm-fault`) raised and cleared by the engine (docs/assets.md)."""

from __future__ import annotations

import itertools
import json
import signal
import time
from typing import Any

import httpx
import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import asset_store as ast
from adapters.service import redis_store as rs
from adapters.service.assets import parse_registry
from tests.helpers_service import Service, metric, redis_server, service_fixtures, wait_for

pytestmark = pytest.mark.redis

_ids = itertools.count(1)
HEADER = "id,kind,point,room,floor,building,tz,interval\n"


svc, r, admin, gw = service_fixtures(
    "assets", "--reorder-seconds", "0.1", "--default-lateness", "0"
)


def _import(admin: httpx.Client, rows: str, **params: Any) -> httpx.Response:
    return admin.post(
        "/v1/assets/import",
        content=HEADER + rows,
        params=params,
        headers={"Content-Type": "text/csv"},
    )


def _post(gw: httpx.Client, **attrs: Any) -> str:
    eid = f"a{next(_ids)}"
    resp = gw.post("/v1/events", json={"id": eid, "ts": time.time(), **attrs})
    assert resp.status_code == 202, resp.text
    return eid


def _stored(r: redis.Redis, eid: str) -> dict[str, Any] | None:
    """The event as the API stored it in the ingest stream (what the engine reads)."""
    for _, fields in reversed(r.xrange(rs.INGEST)):
        for ev in json.loads(fields.get(rs.INGEST_BATCH) or "[]"):
            if ev.get("id") == eid:
                return dict(ev)
    return None


def _alarm(r: redis.Redis, profile: str) -> dict[str, Any] | None:
    found = [a for a in als.list_alarms(r) if a["profile"] == profile]
    return found[0] if found else None


def test_enrichment_the_event_wins_and_a_conflict_is_counted(
    svc: Service, r: redis.Redis, admin: httpx.Client, gw: httpx.Client
) -> None:
    # a profile over the place, for a sensor that sends only its id
    expr = 'seq(c: point = "co2" and value > 400) per building, floor, room'
    rs.put_profile(r, "co2-high", expr, alarm={"severity": "minor"})
    resp = _import(admin, "en-1,sensor,co2,101,1,A,Europe/Berlin,\ngw-assets,gateway,,,,A,,\n")
    assert resp.status_code == 200, resp.text
    assert resp.json()["added"] == 2
    # the API reloads the registry within a second: poll until an event carries it
    eid = wait_for(
        lambda: (
            (e := _post(gw, sensor="en-1", value=412)) and (_stored(r, e) or {}).get("room") and e
        ),
        10,
        "an enriched event",
    )
    ev = _stored(r, eid)
    assert ev is not None
    assert (ev["point"], ev["room"], ev["floor"], ev["building"], ev["tz"]) == (
        "co2", "101", "1", "A", "Europe/Berlin",
    )  # fmt: skip
    assert metric(admin.get("/metrics").text, "ens_events_enriched_total") >= 1
    co2 = wait_for(lambda: _alarm(r, "co2-high"), 10, "the place's profile matched")
    assert {k: co2["labels"][k] for k in ("building", "floor", "room")} == {
        "building": "A", "floor": "1", "room": "101",
    }  # fmt: skip
    # an unregistered sensor of a registered gateway gets the gateway's attributes only
    other = _stored(r, _post(gw, sensor="not-registered"))
    assert other is not None and other["building"] == "A" and "room" not in other
    # the event's own attribute wins; the conflict is counted
    before = metric(admin.get("/metrics").text, "ens_asset_conflicts_total")
    own = _stored(r, _post(gw, sensor="en-1", room="999"))
    assert own is not None and own["room"] == "999" and own["building"] == "A"
    wait_for(
        lambda: metric(admin.get("/metrics").text, "ens_asset_conflicts_total") >= before + 1,
        10,
        "the conflict counted",
    )
    wait_for(lambda: "asset en-1: event attribute room" in svc.log.read_text(), 10, "logged")
    _post(gw, sensor="en-1", room="998")  # logged in the request, before its answer: not again
    assert svc.log.read_text().count("asset en-1: event attribute") == 1


def test_a_registry_change_reaches_the_running_api(
    r: redis.Redis, admin: httpx.Client, gw: httpx.Client
) -> None:
    assert _import(admin, "mv-1,sensor,temperature,201,2,B,,\n").status_code == 200
    wait_for(lambda: (_stored(r, _post(gw, sensor="mv-1")) or {}).get("room") == "201", 10, "201")
    v = ast.version(r)
    assert _import(admin, "mv-1,sensor,temperature,305,3,B,,\n").json()["changed"] == 1
    assert ast.version(r) == v + 1
    wait_for(lambda: (_stored(r, _post(gw, sensor="mv-1")) or {}).get("room") == "305", 10, "305")


def test_a_bad_file_stores_nothing(r: redis.Redis, admin: httpx.Client) -> None:
    v, before = ast.version(r), r.hgetall(ast.ASSETS)
    resp = _import(
        admin,
        "ok-1,sensor,co2,1,1,A,,1m\nok-1,sensor,co2,1,1,A,,1m\nbad-2,sensor,co2,1,1,A,Mars/Base,"
        "\nbad-3,sensor,co2,1,1,A,,soon\n",
    )
    assert resp.status_code == 422
    errors = resp.json()["errors"]
    assert errors[0] == "registry:3: duplicate sensor id 'ok-1' (first on line 2)"
    assert errors[1].startswith("registry:4: unknown time zone 'Mars/Base'")
    assert errors[2] == (
        "registry:5: interval 'soon': expected a duration (500ms, 2s, 30m, 1h, 1d or seconds)"
    )
    assert (ast.version(r), r.hgetall(ast.ASSETS)) == (v, before)
    assert not r.hexists(rs.PROFILES, "comm-fault:ok-1")
    bad = admin.post(
        "/v1/assets/import",
        content="id,room,colour\nx,1,red\n",
        headers={"Content-Type": "text/csv"},
    )
    assert bad.status_code == 422 and "unknown column 'colour'" in bad.json()["error"]


def test_a_silent_sensor_raises_comm_fault_and_clears_when_it_reports(
    r: redis.Redis, admin: httpx.Client, gw: httpx.Client
) -> None:
    """``cf-quiet`` is never heard after the import: its fault is raised ~2 s later (the
    engine's `absent` timer started at the profile's activation); ``cf-live`` reports every
    0.3 s and gets none; ``cf-quiet``'s first event clears its alarm."""
    rows = "cf-quiet,sensor,co2,411,4,C,,2s\ncf-live,sensor,co2,412,4,C,,2s\n"
    resp = _import(admin, rows, fault_severity="critical")
    assert resp.status_code == 200 and resp.json()["faults"] >= 2, resp.text
    assert json.loads(r.hget(rs.PROFILES, "comm-fault:cf-quiet") or "{}")["expr"] == (
        'absent(sensor = "cf-quiet") within 2s'
    )

    def quiet_raised() -> dict[str, Any] | None:
        _post(gw, sensor="cf-live", value=1)
        time.sleep(0.3)
        a = _alarm(r, "comm-fault:cf-quiet")
        return a if a is not None and a["state"] == "active-unacknowledged" else None

    a = wait_for(quiet_raised, 20, "the silent sensor's comm-fault alarm")
    assert a["severity"] == "critical"
    labels = a["labels"]
    assert {k: labels[k] for k in ("class", "sensor", "room", "floor", "building")} == {
        "class": "comm-fault", "sensor": "cf-quiet", "room": "411", "floor": "4", "building": "C",
    }  # fmt: skip
    assert _alarm(r, "comm-fault:cf-live") is None  # it kept reporting
    # silences and routes can match the class and the place
    found = als.list_alarms(r, matchers=als.parse_matchers(["class=comm-fault", "room=411"]))
    assert [x["profile"] for x in found] == ["comm-fault:cf-quiet"]
    _post(gw, sensor="cf-quiet", value=400)
    wait_for(
        lambda: (_alarm(r, "comm-fault:cf-quiet") or {}).get("state") == "cleared-unacknowledged",
        15,
        "the alarm cleared by the sensor's report",
    )
    # removing the asset removes its fault profile (the engine drops it)
    assert admin.delete("/v1/assets/cf-live").status_code == 204
    assert not r.hexists(rs.PROFILES, "comm-fault:cf-live")
    assert admin.get("/v1/assets/cf-live").status_code == 404
    shown = admin.get("/v1/assets/cf-quiet").json()
    assert shown[0]["fault_profile"] == "comm-fault:cf-quiet"


def test_the_asset_api_is_admin_only_and_documented(svc: Service, admin: httpx.Client) -> None:
    with svc.client() as anonymous:
        assert anonymous.get("/v1/assets").status_code == 401
        assert anonymous.post("/v1/assets/import", content="id\nx\n").status_code == 401
    paths = httpx.get(svc.url + "/openapi.json").json()["paths"]
    for path in ("/v1/assets", "/v1/assets/{aid}", "/v1/assets/import"):
        assert path in paths, path
    wrong = admin.post("/v1/assets/import", content="id\nx\n", headers={"Content-Type": "text/x"})
    assert wrong.status_code == 415 and "text/csv or application/yaml" in wrong.json()["error"]
    yaml_body = "assets:\n  - {id: y-1, room: '7', interval: 2h}\n  - {id: y-1}\n"
    bad = admin.post(
        "/v1/assets/import", content=yaml_body, headers={"Content-Type": "application/yaml"}
    )
    assert bad.status_code == 422
    assert bad.json()["errors"] == ["registry:3: duplicate sensor id 'y-1' (first on line 2)"]


@pytest.mark.slow
def test_a_fault_survives_kill_9_once(tmp_path: Any) -> None:
    """A sensor silent since the start is raised once; ``kill -9`` of the service and a
    restart keep its alarm active (no second raise: the timer fired before the crash and the
    checkpoint or the journal says so); its report after the restart clears it once."""

    with redis_server(tmp_path, aof=True) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        reg = parse_registry(HEADER + "k9-quiet,sensor,co2,1,1,K,,2s\n", "r", csv_format=True)
        ast.import_registry(r, reg)
        args = ("--reorder-seconds", "0.1", "--default-lateness", "0")
        svc = Service(url, tmp_path / "serve.log", *args).start()
        pid = "comm-fault:k9-quiet"
        try:
            wait_for(lambda: _alarm(r, pid), 20, "the raise")
            svc.stop(signal.SIGKILL)
            svc = Service(url, tmp_path / "serve.log", *args).start()
            key = rs.add_gateway(r, "gw-k9")
            with svc.client(key) as gw:
                _post(gw, sensor="k9-quiet")
            wait_for(
                lambda: (_alarm(r, pid) or {}).get("state") == "cleared-unacknowledged",
                20,
                "the clear after the restart",
            )
            kinds = [t["kind"] for t in als.history(r) if t["labels"].get("profile") == pid]
            assert kinds == ["raise", "clear"]
        finally:
            assert svc.stop() == 0, (tmp_path / "serve.log").read_text()[-2000:]
            r.close()
