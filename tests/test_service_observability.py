"""What an operator monitors (issue 40 item 5), scraped from a real `ens serve` with its
delivery worker, a webhook receiver on loopback and `--log-format json --access-log`:
notification and delivery counts by profile and subscriber (bounded), the process_* and
python_* collectors, the build, the API latency by route template, a delivery lag that leaves
out what digests hold, JSON log lines; and the admin routes for gateways, the outbox and dead
letters."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers_notifiers import SECRET, Receiver
from tests.helpers_service import Service, client_fixtures, redis_server, wait_for

pytestmark = pytest.mark.redis

LIMIT = 2  # --metrics-label-limit


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("svc-obs")
    with redis_server(d) as url:
        s = Service(
            url,
            d / "serve.log",
            "--deliver",
            "--reorder-seconds",
            "0.2",
            "--log-format",
            "json",
            "--access-log",
            "--metrics-label-limit",
            str(LIMIT),
        ).start()
        try:
            yield s
        finally:
            s.stop()


_r, admin = client_fixtures()


def samples(svc: Service) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of /metrics."""
    out = {}
    for line in httpx.get(svc.url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(found: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in found.items() if k.startswith(prefix))


@pytest.fixture(scope="module")
def fired(svc: Service, admin: httpx.Client, receiver: Receiver) -> dict[str, float]:
    """Profiles a and b fire once each, then `noisy` three times (all to subscriber ops, a
    webhook), and `dig` once to `night`, an e-mail digest of 15 minutes."""
    ops = {"id": "ops", "channels": [{"webhook": receiver.url}], "secret": SECRET}
    night = {"id": "night", "channels": [{"email": "night@example.org"}], "digest": 900}
    for sub in (ops, night):
        assert admin.post("/v1/subscribers", json=sub).status_code == 201
    for pid, sid in (("a", "ops"), ("b", "ops"), ("noisy", "ops"), ("dig", "night")):
        body = {"id": pid, "expr": f'kind = "{pid}"', "subscriber": sid}
        assert admin.post("/v1/profiles", json=body).status_code == 201
    key = admin.post("/v1/gateways", json={"name": "obs"}).json()["api_key"]
    now = time.time()
    events = [{"id": f"e{i}", "ts": now + i * 0.01, "kind": k} for i, k in enumerate("ab")]
    events += [{"id": f"n{i}", "ts": now + 0.1 + i * 0.01, "kind": "noisy"} for i in range(3)]
    events.append({"id": "d0", "ts": now + 0.2, "kind": "dig"})
    body = "".join(json.dumps(e) + "\n" for e in events)
    with svc.client(key) as gw:
        headers = {"Content-Type": "application/x-ndjson"}
        assert gw.post("/v1/events", content=body, headers=headers).status_code == 202
    noisy = 'ens_notifications_total{profile="noisy",subscriber="ops"}'
    other = 'ens_notifications_total{profile="_other",subscriber="_other"}'
    return wait_for(
        lambda: (
            (found := samples(svc)) and found.get(noisy) == 3 and found.get(other, 0) >= 2 and found
        ),
        30,
        "the six notifications counted",
    )


def test_notification_counts_by_profile_are_bounded(svc: Service, fired: dict[str, float]) -> None:
    found = samples(svc)
    notes = {k: v for k, v in found.items() if k.startswith("ens_notifications_total{")}
    assert notes['ens_notifications_total{profile="noisy",subscriber="ops"}'] == 3
    assert notes['ens_notifications_total{profile="_other",subscriber="_other"}'] >= 2
    assert len(notes) == LIMIT + 1  # the most counted LIMIT, then _other
    webhooks = 'ens_deliveries_total{channel="webhook",outcome="delivered"}'
    found = wait_for(
        lambda: (s := samples(svc)) and s.get(webhooks) == 5 and s, 20, "five webhooks delivered"
    )
    per_profile = {k: v for k, v in found.items() if k.startswith("ens_profile_deliveries_total")}
    noisy = 'ens_profile_deliveries_total{outcome="delivered",profile="noisy",subscriber="ops"}'
    assert per_profile[noisy] == 3
    assert total(per_profile, 'ens_profile_deliveries_total{outcome="digested"') == 1
    assert len({re.sub(r'outcome="\w+",', "", k) for k in per_profile}) <= LIMIT + 1


def test_runtime_collectors_and_build_info(svc: Service, fired: dict[str, float]) -> None:
    found = samples(svc)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert found[name] > 0, name
    assert any(k.startswith("python_gc_collections_total{") for k in found)
    assert any(k.startswith("python_info{") for k in found)
    build = [k for k in found if k.startswith("ens_build_info{")]
    assert len(build) == 1 and re.search(r'version="\d+\.\d+', build[0]), build


def test_api_latency_by_route_template(
    svc: Service, admin: httpx.Client, fired: dict[str, float]
) -> None:
    """`fired` posts the events (this test may run first on its xdist worker, whose module
    fixtures are its own)."""
    assert admin.get("/v1/profiles/no-such-profile").status_code == 404
    assert admin.get("/no/such/path/42").status_code == 404
    found = samples(svc)
    key = (
        'ens_http_request_duration_seconds_count{method="GET",route="/v1/profiles/{pid}",'
        'status="404"}'
    )
    assert found[key] >= 1
    unmatched = (
        'ens_http_request_duration_seconds_count{method="GET",route="unmatched",status="404"}'
    )
    assert found[unmatched] >= 1
    assert not any("no-such-profile" in k or "/no/such" in k for k in found)
    assert any('route="/v1/events",status="202"' in k for k in found)


def test_delivery_lag_leaves_out_digests(svc: Service, fired: dict[str, float]) -> None:
    """The digest holds `dig`'s notification for 15 minutes: the lag reads 0 once the webhooks
    are out, and the digest's age is its own gauge."""
    found = wait_for(
        lambda: (s := samples(svc)) and s["ens_digest_oldest_seconds"] >= 2 and s,
        20,
        "the parked notification two seconds old",
    )
    assert found["ens_digest_held"] == 1
    assert found["ens_delivery_backlog"] >= 1  # still not delivered
    assert found["ens_delivery_lag_seconds"] < 1


def test_logs_are_json_lines_with_an_access_log(svc: Service, admin: httpx.Client) -> None:
    assert admin.get("/v1/profiles/absent-for-log").status_code == 404

    def access() -> list[dict[str, object]]:
        rows = [json.loads(line) for line in Path(svc.log).read_text().splitlines() if line]
        return [x for x in rows if x.get("path") == "/v1/profiles/absent-for-log"]

    rows = wait_for(access, 10, "the access log line")
    row = rows[0]
    assert {"time", "level", "logger", "message"} <= row.keys()
    assert row["logger"] == "ens.service.access" and row["level"] == "INFO"
    assert row["route"] == "/v1/profiles/{pid}" and row["status"] == 404
    assert row["method"] == "GET" and isinstance(row["duration_ms"], float)


def test_gateways_outbox_and_dead_letters_over_http(
    svc: Service, admin: httpx.Client, fired: dict[str, float]
) -> None:
    created = admin.post("/v1/gateways", json={"name": "gw-http", "lateness": "1s"})
    assert created.status_code == 201 and created.json()["api_key"].startswith("gw-http.")
    assert admin.post("/v1/gateways", json={"name": "gw-http"}).status_code == 409
    assert admin.post("/v1/gateways", json={"name": "bad name"}).status_code == 422
    patched = admin.patch("/v1/gateways/gw-http", json={"lateness": "default"})
    assert patched.status_code == 200 and patched.json()["lateness"] is None
    assert admin.patch("/v1/gateways/nope", json={"lateness": "1s"}).status_code == 404
    assert admin.delete("/v1/gateways/gw-http").status_code == 204
    listed = {g["name"]: g for g in admin.get("/v1/gateways").json()}
    assert listed["gw-http"]["revoked"] and "api_key" not in listed["gw-http"]

    out = admin.get("/v1/outbox", params={"limit": 2}).json()
    assert len(out) == 2 and out[-1]["notification"]["profile"] == "dig"
    after = admin.get("/v1/outbox", params={"after": out[0]["entry"]}).json()
    assert [x["entry"] for x in after] == [out[1]["entry"]]
    assert admin.get("/v1/outbox", params={"after": "x"}).status_code == 422

    assert admin.get("/v1/dead-letters").json() == []
    missing = admin.post("/v1/dead-letters/retry", json={"ids": ["nope"]})
    assert missing.status_code == 404
    assert admin.post("/v1/dead-letters/retry", json={}).status_code == 422
    assert admin.post("/v1/dead-letters/retry", json={"all": True}).json() == {
        "scheduled": 0,
        "unknown": [],
    }
    with svc.client() as anonymous:
        for path in ("/v1/gateways", "/v1/outbox", "/v1/dead-letters"):
            assert anonymous.get(path).status_code == 401, path
    paths = httpx.get(svc.url + "/openapi.json").json()["paths"]
    for path in ("/v1/gateways", "/v1/gateways/{name}", "/v1/outbox", "/v1/dead-letters"):
        assert path in paths, path
