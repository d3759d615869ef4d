"""The HTTP API against a real service subprocess and a real redis-server."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from adapters.service import redis_store as rs
from ens.replay import replay
from profiles.events import event_from_obj
from profiles.parser import parse_profile
from tests.helpers_service import (
    Service,
    metric,
    outbox_for,
    replay_records,
    service_fixtures,
    wait_for,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

REORDER = 1.0
MAX_BODY = 100_000
_ids = itertools.count(1)


svc, r, admin, gw = service_fixtures(
    "api", "--reorder-seconds", str(REORDER), "--max-body", str(MAX_BODY)
)


def uid(prefix: str) -> str:
    return f"{prefix}{next(_ids)}"


def add_profile(admin: httpx.Client, pid: str, expr: str) -> None:
    resp = admin.post("/v1/profiles", json={"id": pid, "expr": expr})
    assert resp.status_code == 201, resp.text


def wait_notes(r: redis.Redis, pid: str, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    wait_for(lambda: len(outbox_for(r, pid)) >= n, timeout, f"{n} notifications of {pid}")
    time.sleep(0.05)  # a surplus notification would come with the same commit
    return outbox_for(r, pid)


def metrics(svc: Service) -> str:
    return httpx.get(svc.url + "/metrics").text


# ----------------------------------------------------------------------------- ingestion


def test_posted_events_reach_the_outbox_like_replay(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis
) -> None:
    pid = uid("door")
    expr = 'seq(d: kind = "door", m: kind = "motion") within 10m per room'
    add_profile(admin, pid, expr)
    now = time.time()
    evs = [
        {"id": "d1", "ts": now, "kind": "door", "room": "101"},
        {"id": "d2", "ts": now + 0.01, "kind": "door", "room": "102"},
        {"id": "m1", "ts": now + 0.02, "kind": "motion", "room": "101", "level": 3},
        {"id": "x1", "ts": now + 0.03, "kind": "motion", "room": "103"},
    ]
    one = gw.post("/v1/events", json=evs[0])
    assert one.status_code == 202 and one.json() == {"accepted": 1, "rejected": 0, "errors": []}
    many = gw.post("/v1/events", json=evs[1:])
    assert many.status_code == 202 and many.json()["accepted"] == 3
    notes = wait_notes(r, pid, 1)
    assert len(notes) == 1
    n = notes[0]
    assert n["id"].startswith(f"{pid}:") and n["subscriber"] is None
    assert n["events"]["m"] == {
        "id": "m1",
        "ts": now + 0.02,
        "kind": "motion",
        "room": "101",
        "level": 3,
        "gateway": "gw-api",  # stamped: the gateway of the API key
    }
    expected = replay([parse_profile(expr, pid)], [event_from_obj(e, "") for e in evs])
    assert replay_records(notes) == [x.to_json() for x in expected]


def test_stored_events_are_normalized_and_read_back_exactly(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis
) -> None:
    """The API stores validated, normalized events that the worker builds without validating
    again; an integer beyond 64 bits is flagged so that it is read back exactly, not as the
    float orjson would make of it."""
    pid = uid("norm")
    add_profile(admin, pid, 'kind = "norm-probe"')
    now = time.time()
    stamp = datetime.fromtimestamp(now, UTC).isoformat()
    evs = [
        {"id": "n1", "ts": stamp, "kind": "norm-probe", "gone": None, "v": 1.5},
        {"ts": now, "kind": "norm-probe", "big": 10**30},
    ]
    resp = gw.post("/v1/events", json=evs)
    assert resp.status_code == 202, resp.text
    last = r.xrevrange(rs.INGEST, count=1)[0][1]
    assert last[rs.INGEST_FORMAT] == rs.INGEST_EXACT  # because of `big`
    stored = json.loads(last[rs.INGEST_BATCH])
    assert stored[0] == {
        "id": "n1",
        "ts": pytest.approx(now, abs=1e-5),
        "kind": "norm-probe",
        "v": 1.5,
    }  # ts in epoch seconds, the null dropped
    assert "id" not in stored[1]  # the worker names it by its ingest key
    notes = wait_notes(r, pid, 2)
    by_id = {n["events"]["e"]["id"]: n["events"]["e"] for n in notes}
    assert by_id["n1"]["v"] == 1.5 and "gone" not in by_id["n1"]
    (big,) = [e for i, e in by_id.items() if i != "n1"]
    assert big["big"] == 10**30 and type(big["big"]) is int
    gw.post("/v1/events", json={"ts": now, "kind": "norm-probe"})
    assert r.xrevrange(rs.INGEST, count=1)[0][1][rs.INGEST_FORMAT] == rs.INGEST_NORMALIZED


def test_batch_with_invalid_events_accepts_the_valid_ones(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis
) -> None:
    pid = uid("probe")
    add_profile(admin, pid, f'kind = "{pid}"')
    now = time.time()
    batch = [
        {"id": "ok1", "ts": now, "kind": pid},
        {"id": "bad1", "kind": pid},
        {"id": "bad2", "ts": now, "kind": pid, "loc": {"x": 1}},
        {"id": "ok2", "ts": now + 0.001, "kind": pid},
        {"id": "bad3", "ts": "yesterday", "kind": pid},
        "not an object",
    ]
    resp = gw.post("/v1/events", json=batch)
    assert resp.status_code == 422
    body = resp.json()
    assert body["accepted"] == 2 and body["rejected"] == 4
    assert [e["index"] for e in body["errors"]] == [1, 2, 4, 5]
    assert [e.get("id") for e in body["errors"]] == [
        "bad1",
        "bad2",
        "bad3",
        None,
    ]  # named when known
    msgs = {e["index"]: e["error"] for e in body["errors"]}
    assert "'ts'" in msgs[1] and "'loc'" in msgs[2] and "yesterday" in msgs[4]
    notes = wait_notes(r, pid, 2)
    assert sorted(n["events"]["e"]["id"] for n in notes) == ["ok1", "ok2"]


def test_json_lines_errors_name_their_lines(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis
) -> None:
    pid = uid("lines")
    add_profile(admin, pid, f'kind = "{pid}"')
    now = time.time()
    body = "\n".join(
        [
            json.dumps({"id": "l1", "ts": now, "kind": pid}),
            "",
            "{broken",
            json.dumps({"id": "l2", "ts": now, "kind": pid, "v": float("nan")}),  # NaN: not JSON
            json.dumps({"id": "l3", "ts": now + 0.001, "kind": pid}),
        ]
    )
    resp = gw.post(
        "/v1/events", content=body, headers={"Content-Type": "application/x-ndjson; charset=utf-8"}
    )
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert data["accepted"] == 2
    assert [(e["index"], e["line"]) for e in data["errors"]] == [(1, 3), (2, 4)]
    assert "invalid JSON" in data["errors"][0]["error"]
    assert "NaN" in data["errors"][1]["error"]
    notes = wait_notes(r, pid, 2)
    assert sorted(n["events"]["e"]["id"] for n in notes) == ["l1", "l3"]


@pytest.mark.parametrize(
    ("body", "ctype", "needle"),
    [
        (b"{not json", "application/json", "invalid JSON"),
        (b"", "application/json", "empty body"),
        (b"42", "application/json", "expected a JSON object or array"),
        (b'{"ts": 1}\n{"ts": 2}', "application/json", "application/x-ndjson"),
        (b"\xff\xfe", "application/json", "UTF-8"),
    ],
)
def test_unparseable_bodies_are_400(gw: httpx.Client, body: bytes, ctype: str, needle: str) -> None:
    resp = gw.post("/v1/events", content=body, headers={"Content-Type": ctype})
    assert resp.status_code == 400
    assert needle in resp.json()["error"]


def test_oversized_bodies_are_413(svc: Service, r: redis.Redis, gw: httpx.Client) -> None:
    before = r.xlen(rs.INGEST)
    big = json.dumps([{"ts": 1, "pad": "x" * 1000}] * 200).encode()  # ~220 kB
    assert len(big) > MAX_BODY
    resp = gw.post("/v1/events", content=big, headers={"Content-Type": "application/json"})
    assert resp.status_code == 413 and "limit" in resp.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield b"["
        for _ in range(150):
            yield json.dumps({"ts": 1, "pad": "y" * 1000}).encode() + b","
        yield b'{"ts": 1}]'

    with svc.client(gw.headers["Authorization"].split()[1]) as c:
        resp = c.post("/v1/events", content=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert r.xlen(rs.INGEST) <= before  # nothing of either body was accepted


def test_api_keys(svc: Service, r: redis.Redis) -> None:
    ev = {"ts": time.time(), "kind": "auth-probe"}
    assert httpx.post(svc.url + "/v1/events", json=ev).status_code == 401
    with svc.client("gw-api.not-the-key") as c:
        assert c.post("/v1/events", json=ev).status_code == 401
    with svc.client("garbage") as c:
        assert c.post("/v1/events", json=ev).status_code == 401
    key = rs.add_gateway(r, "gw-revoked")
    resp = httpx.post(svc.url + "/v1/events", json=ev, headers={"X-API-Key": key})
    assert resp.status_code == 202
    assert rs.revoke_gateway(r, "gw-revoked")
    n = r.xlen(rs.INGEST)
    # the API cached the key on its first use; the ingest write re-checks it atomically
    resp = httpx.post(svc.url + "/v1/events", json=ev, headers={"X-API-Key": key})
    assert resp.status_code == 403 and "revoked" in resp.json()["error"]
    assert r.xlen(rs.INGEST) == n  # nothing of the revoked gateway's request was stored
    with pytest.raises(ValueError, match="already exists"):
        rs.add_gateway(r, "gw-api")
    new_key = rs.add_gateway(r, "gw-revoked")  # a revoked gateway may get a new key
    assert (
        httpx.post(svc.url + "/v1/events", json=ev, headers={"X-API-Key": new_key}).status_code
        == 202
    )
    assert (
        httpx.post(svc.url + "/v1/events", json=ev, headers={"X-API-Key": key}).status_code == 401
    )


# ----------------------------------------------------------------------------- management


def test_admin_endpoints_need_the_admin_token(svc: Service, gw: httpx.Client) -> None:
    assert httpx.get(svc.url + "/v1/profiles").status_code == 401
    assert gw.get("/v1/profiles").status_code == 403  # a gateway key is not an admin token
    with svc.client("wrong") as c:
        assert c.post("/v1/subscribers", json={"id": "x", "channels": []}).status_code == 403


def test_admin_bodies_reject_unknown_keys_and_non_json(admin: httpx.Client, r: redis.Redis) -> None:
    """A misspelt key is named, not silently dropped; a form body says it is not JSON."""
    typo = admin.post("/v1/profiles", json={"id": "h2", "expr": 'kind = "a"', "subscribr": "x"})
    assert typo.status_code == 422, typo.text
    assert typo.json()["error"].startswith("subscribr: unknown key")
    assert rs.get_profile(r, "h2") is None
    sub = admin.post(
        "/v1/subscribers", json={"id": "s2", "channels": [{"email": "a@b.c"}], "digets": 60}
    )
    assert sub.status_code == 422 and "digets" in sub.json()["error"]
    form = admin.post(
        "/v1/profiles",
        content=b"id=h3&expr=x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form.status_code == 415, form.text
    assert "'application/x-www-form-urlencoded' is not application/json" in form.json()["error"]


def test_stored_profiles_carry_warnings(
    admin: httpx.Client, gw: httpx.Client, r: redis.Redis
) -> None:
    """Valid but likely wrong: infinity, no subscriber, an attribute no event has carried."""
    gw.post("/v1/events", json={"id": "lint1", "ts": time.time(), "kind": "window", "room": "1"})
    wait_for(lambda: rs.seen_attributes(r), 10, "an ingested event")
    resp = admin.post("/v1/profiles", json={"id": uid("inf"), "expr": "value > 1e400"})
    assert resp.status_code == 201
    ws = resp.json()["warnings"]
    assert any("reads as infinity" in w for w in ws) and any("no subscriber" in w for w in ws)
    resp = admin.post("/v1/profiles", json={"id": uid("knd"), "expr": 'knd = "window"'})
    assert resp.status_code == 201
    assert any(
        "no event seen so far has attribute 'knd' (did you mean 'kind'?)" in w
        for w in resp.json()["warnings"]
    )


def test_profile_crud_and_errors(
    admin: httpx.Client, gw: httpx.Client, r: redis.Redis, svc: Service
) -> None:
    bad = admin.post(
        "/v1/profiles", json={"id": "badp", "expr": "seq(a: k = 1,\n b: k >) within 1m"}
    )
    assert bad.status_code == 422
    err = bad.json()
    assert err["profile"] == "badp" and err["line"] == 2 and err["column"] is not None
    assert err["expected"] and "badp" in err["error"]
    unbounded = admin.post(
        "/v1/profiles", json={"id": "unb", "expr": "seq(a: k = 1, b: k = 2) select each"}
    )
    assert unbounded.status_code == 422 and "within" in unbounded.json()["error"]
    nosub = admin.post("/v1/profiles", json={"id": "ns", "expr": "k = 1", "subscriber": "nobody"})
    assert nosub.status_code == 422 and "unknown subscriber" in nosub.json()["error"]
    assert admin.post("/v1/profiles", json={"id": "bad id", "expr": "k = 1"}).status_code == 422
    noexpr = admin.post("/v1/profiles", json={"id": "p"})  # the body model: same {"error"} shape
    assert noexpr.status_code == 422 and noexpr.json()["error"] == "expr: Field required"
    assert noexpr.json()["detail"][0]["loc"] == ["body", "expr"]

    pid = uid("crud")
    add_profile(admin, pid, f'kind = "{pid}"')
    again = admin.post("/v1/profiles", json={"id": pid, "expr": f'kind = "{pid}" and v > 1'})
    assert again.status_code == 200 and again.json()["expr"].endswith("v > 1")
    assert admin.get(f"/v1/profiles/{pid}").json()["expr"].endswith("v > 1")
    assert pid in [p["id"] for p in admin.get("/v1/profiles").json()]
    now = time.time()
    gw.post(
        "/v1/events",
        json=[
            {"id": "c1", "ts": now, "kind": pid, "v": 1},
            {"id": "c2", "ts": now, "kind": pid, "v": 2},
        ],
    )
    assert [n["events"]["e"]["id"] for n in wait_notes(r, pid, 1)] == ["c2"]  # replaced expr
    assert admin.delete(f"/v1/profiles/{pid}").status_code == 204
    assert admin.get(f"/v1/profiles/{pid}").status_code == 404
    assert admin.delete(f"/v1/profiles/{pid}").status_code == 404
    # Gone from the running engine: later events do not notify (a marker profile shows the
    # worker got past them).
    marker = uid("marker")
    add_profile(admin, marker, f'kind = "{marker}"')
    gw.post(
        "/v1/events",
        json=[
            {"id": "c3", "ts": time.time(), "kind": pid, "v": 5},
            {"id": "mk", "ts": time.time(), "kind": marker},
        ],
    )
    wait_notes(r, marker, 1)
    assert len(outbox_for(r, pid)) == 1


def test_subscribers(admin: httpx.Client, r: redis.Redis) -> None:
    resp = admin.post(
        "/v1/subscribers",
        json={
            "id": "ops",
            "channels": [
                {"email": "ops@example.org"},
                {"webhook": "https://hooks.example.org/ens"},
            ],
        },
    )
    assert resp.status_code == 201
    secret = resp.json()["secret"]
    assert len(secret) > 20  # generated for the webhook, shown once
    listed = admin.get("/v1/subscribers").json()
    ops = next(s for s in listed if s["id"] == "ops")
    assert ops["has_secret"] and secret not in json.dumps(listed)
    assert admin.get("/v1/subscribers/ops").json()["channels"][0] == {"email": "ops@example.org"}
    status = admin.get("/v1/subscribers/ops/status").json()  # issue 41 item 9
    assert (status["delivered"], status["retrying"], status["dead_letters"]) == (0, 0, 0)
    assert status["breakers"] == {"https://hooks.example.org:443": {"state": "closed"}}
    assert admin.get("/v1/subscribers/nobody/status").status_code == 404
    bad = admin.post("/v1/subscribers", json={"id": "x", "channels": [{"email": "nope"}]})
    assert bad.status_code == 422
    assert bad.json()["error"] == "channels.0.email: 'nope' is not an e-mail address"
    bad = admin.post("/v1/subscribers", json={"id": "x", "channels": [{"sms": "+1"}]})
    assert bad.status_code == 422 and bad.json()["error"].startswith("channels.0: a channel is")
    pid = uid("subp")
    assert (
        admin.post(
            "/v1/profiles", json={"id": pid, "expr": "k = 1", "subscriber": "ops"}
        ).status_code
        == 201
    )
    conflict = admin.delete("/v1/subscribers/ops")
    assert conflict.status_code == 409 and pid in conflict.json()["error"]
    admin.delete(f"/v1/profiles/{pid}")
    assert admin.delete("/v1/subscribers/ops").status_code == 204
    assert admin.delete("/v1/subscribers/ops").status_code == 404


# ----------------------------------------------------------------------------- ordering


def test_reorder_buffer_sorts_slightly_late_events(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis, svc: Service
) -> None:
    pid = uid("reorder")
    add_profile(admin, pid, 'seq(a: kind = "A", b: kind = "B") within 1m per room')
    late_before = metric(metrics(svc), "ens_events_late_total")
    now = time.time()
    # b arrives first but happened 0.2 s after a: fed in ts order, the sequence matches.
    assert (
        gw.post("/v1/events", json={"id": "rb", "ts": now, "kind": "B", "room": pid}).status_code
        == 202
    )
    assert (
        gw.post(
            "/v1/events", json={"id": "ra", "ts": now - 0.2, "kind": "A", "room": pid}
        ).status_code
        == 202
    )
    notes = wait_notes(r, pid, 1)
    assert [(n["events"]["a"]["id"], n["events"]["b"]["id"]) for n in notes] == [("ra", "rb")]
    assert metric(metrics(svc), "ens_events_late_total") == late_before


def test_late_events_go_to_the_late_output_and_are_counted(
    gw: httpx.Client, admin: httpx.Client, r: redis.Redis, svc: Service
) -> None:
    """Issue 41 item 6: events older than the engine's time are not matched (they were fed at
    once, out of order); they are in the late output, counted per gateway and logged."""
    pid = uid("late")
    add_profile(admin, pid, f'kind = "{pid}"')
    before = metric(metrics(svc), "ens_events_late_total")
    old = time.time() - 120  # long behind the engine's wall-clock time
    resp = gw.post(
        "/v1/events",
        json=[{"id": "old1", "ts": old, "kind": pid}, {"id": "old2", "ts": old - 5, "kind": pid}],
    )
    assert resp.status_code == 202
    wait_for(lambda: metric(metrics(svc), "ens_events_late_total") >= before + 2, 5, "late count")
    assert 'ens_events_late_total{gateway="gw-api"}' in metrics(svc)  # counted per gateway
    assert "late event old1 from gateway gw-api" in Path(svc.log).read_text()
    late = admin.get("/v1/late-events", params={"gateway": "gw-api"}).json()["events"]
    assert [e["event"]["id"] for e in late if e["event"]["kind"] == pid] == ["old1", "old2"]
    assert outbox_for(r, pid) == []  # not matched


# ----------------------------------------------------------------------------- operations


def test_healthz_and_metrics(svc: Service, gw: httpx.Client, admin: httpx.Client) -> None:
    # the test order is random: this test's own profile makes the worker's count >= 1
    add_profile(admin, uid("health"), 'kind = "health-probe"')
    gw.post("/v1/events", json={"ts": time.time(), "kind": "health-probe"})

    def healthy() -> dict[str, Any] | None:
        h = admin.get("/healthz")  # the worker's details are the admin's
        assert h.status_code == 200
        body = h.json()
        return body if body["worker"]["stats"]["profiles"] >= 1 else None

    body = wait_for(healthy, 10, "the worker's stats to count the profile")
    assert body["status"] == "ok" and body["redis"] == "ok"
    assert body["worker"]["age"] < 5
    assert body["ingest_backlog"] >= 0
    text = wait_for(
        lambda: (lambda t: t if metric(t, "ens_profiles") >= 1 else None)(metrics(svc)),
        5,
        "engine stats in /metrics",
    )
    for name in (
        "ens_events_received_total",
        "ens_events_invalid_total",
        "ens_events_processed_total",
        "ens_events_late_total",
        "ens_notifications_total",
        "ens_ingest_backlog",
        "ens_ingest_lag_seconds",
        "ens_partial_matches",
        "ens_pool_filters",
        "ens_reorder_buffer_events",
        "ens_worker_heartbeat_age_seconds",
        "ens_commit_seconds_count",
        "ens_delivery_backlog",
        "ens_delivery_lag_seconds",
        "ens_dead_letters",
        "ens_late_events",
        "ens_deliveries_total",
        "ens_delivery_latency_seconds",
    ):
        assert f"\n{name}" in text or f"# TYPE {name.removesuffix('_total')}" in text, name
    assert metric(text, "ens_events_received_total") >= 1
    assert metric(text, "ens_notifications_total") >= 1
    # --no-deliver: every notification so far waits in the outbox
    assert metric(text, "ens_delivery_backlog") >= metric(text, "ens_notifications_total")
    assert metric(text, "ens_delivery_lag_seconds") > 0 and metric(text, "ens_dead_letters") == 0


def test_openapi_documents_the_api(svc: Service) -> None:
    spec = httpx.get(svc.url + "/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/v1/events",
        "/v1/profiles",
        "/v1/profiles/{pid}",
        "/v1/subscribers",
        "/v1/subscribers/{sid}",
        "/healthz",
        "/metrics",
    ):
        assert path in paths, path
    post = paths["/v1/events"]["post"]
    assert {"application/json", "application/x-ndjson"} <= set(post["requestBody"]["content"])
    assert {"202", "400", "401", "403", "413", "422"} <= set(post["responses"])
    assert {"GatewayKey", "AdminToken"} <= set(spec["components"]["securitySchemes"])


def test_api_docs_work_without_internet(svc: Service) -> None:
    """/docs loads Swagger UI from the service itself, not from a CDN."""
    page = httpx.get(svc.url + "/docs", timeout=10)
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', page.text)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets), page.text
    for a in assets:
        resp = httpx.get(svc.url + a, timeout=10)
        assert resp.status_code == 200 and len(resp.content) > 1000, a
    assert "openapi: 3.1" in httpx.get(svc.url + "/docs-static/swagger-ui-bundle.js").text


def test_subscriber_templates_and_chat_channels(admin: httpx.Client, r: redis.Redis) -> None:
    """Templates and a Slack channel are stored and shown; a bad template is a 422 naming the
    template and its line, and nothing is stored (issue 36 item 5)."""
    rec = {
        "id": "chat-ops",
        "channels": [{"webhook": "https://hooks.example.org/slack", "format": "slack"}],
        "templates": {"slack": "*{{ profile }}* {{ transition }}"},
    }
    assert admin.post("/v1/subscribers", json=rec).status_code == 201
    shown = admin.get("/v1/subscribers/chat-ops").json()
    assert shown["templates"] == rec["templates"] and shown["channels"][0]["format"] == "slack"
    bad = {**rec, "id": "chat-bad", "templates": {"slack": "ok\n{{ profile|nope }}"}}
    resp = admin.post("/v1/subscribers", json=bad)
    assert resp.status_code == 422, resp.text
    assert "templates.slack: line 2: No filter named 'nope'." in resp.json()["error"]
    assert r.hget("ens:subscribers", "chat-bad") is None
