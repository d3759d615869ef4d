"""The service under hostile or faulty conditions: Redis down, request floods, malformed or
slow bodies, absurd timestamps. Real service subprocess, real redis-server, real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from adapters.service.late import list_late
from tests.helpers_service import (
    ROOT,
    Service,
    client_fixtures,
    metric,
    outbox_for,
    redis_server,
    serving,
    wait_for,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

MAX_BODY = 100_000


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("svc-robust")
    with serving(
        d, "--reorder-seconds", "0.2", "--max-body", str(MAX_BODY), "--body-timeout", "1s"
    ) as s:
        yield s


r, admin = client_fixtures()


@pytest.fixture(scope="module")
def key(r: redis.Redis) -> str:
    return rs.add_gateway(r, "gw-robust")


def add_profile(admin: httpx.Client, pid: str, expr: str) -> None:
    resp = admin.post("/v1/profiles", json={"id": pid, "expr": expr})
    assert resp.status_code == 201, resp.text


@pytest.fixture(scope="module")
def gw(svc: Service, key: str) -> Iterator[httpx.Client]:
    with svc.client(key) as c:
        yield c


# ----------------------------------------------------------------------------- Redis down


def test_redis_down_is_503_for_gateways_and_admins_and_ens_post_retries(
    tmp_path: Path,
) -> None:
    redis_cm = redis_server(tmp_path)
    url = redis_cm.__enter__()
    s = Service(url, tmp_path / "serve.log")
    try:
        s.start()
        r = redis.Redis.from_url(url, decode_responses=True)
        key = rs.add_gateway(r, "gw-down")
        r.close()
        ev = {"ts": time.time(), "kind": "x"}
        assert (
            httpx.post(s.url + "/v1/events", json=ev, headers={"X-API-Key": key}).status_code == 202
        )
    finally:
        redis_cm.__exit__(None, None, None)  # Redis stops; the service keeps running
    try:
        resp = httpx.post(s.url + "/v1/events", json=ev, headers={"X-API-Key": key}, timeout=10)
        assert resp.status_code == 503, resp.text
        assert "unavailable" in resp.json()["error"] and resp.headers["Retry-After"]
        admin = {"Authorization": "Bearer test-admin-token"}
        for path in ("/v1/profiles", "/v1/subscribers", "/v1/profiles/p1"):
            got = httpx.get(s.url + path, headers=admin, timeout=10)
            assert got.status_code == 503, (path, got.text)
            assert "unavailable" in got.json()["error"]
        events = tmp_path / "ev.jsonl"
        events.write_text(json.dumps(ev) + "\n")
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "ens",
                "post",
                str(events),
                "--url",
                s.url,
                "--api-key",
                key,
                "--retries",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "answered HTTP 503: " in res.stderr and "retry 1 of 1" in res.stderr, res.stderr
        assert res.returncode == 1 and "HTTP 503" in res.stderr
    finally:
        s.kill()


# ----------------------------------------------------------------------------- floods


def test_hundreds_of_concurrent_requests_are_all_served(
    svc: Service, key: str, r: redis.Redis
) -> None:
    """More requests at once than Redis connections: they wait for one, none gets a 500."""
    n = 400
    before = r.xlen(rs.INGEST)

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=svc.url, limits=limits, timeout=60, headers={"X-API-Key": key}
        ) as c:
            now = time.time()
            return await asyncio.gather(
                *(
                    c.post(
                        "/v1/events",
                        json=[{"id": f"f{i}-{j}", "ts": now, "kind": "flood"} for j in range(5)],
                    )
                    for i in range(n)
                )
            )

    answers = asyncio.run(flood())
    statuses = sorted({a.status_code for a in answers})
    assert statuses == [202], [a.text for a in answers if a.status_code != 202][:3]
    assert r.xlen(rs.INGEST) - before >= n  # one entry per event, or per batch


# ----------------------------------------------------------------------------- malformed bodies


@pytest.mark.parametrize("ctype", ["application/json", "application/x-ndjson"])
def test_deeply_nested_json_is_400_not_500(gw: httpx.Client, ctype: str) -> None:
    resp = gw.post("/v1/events", content=b"[" * 100_000, headers={"Content-Type": ctype})
    if ctype == "application/json":
        assert resp.status_code == 400, resp.text
        assert "nested too deeply" in resp.json()["error"]
    else:  # JSON lines: that line is rejected, like any broken line
        assert resp.status_code == 422, resp.text
        (err,) = resp.json()["errors"]
        assert err["line"] == 1 and "nested too deeply" in err["error"]


@pytest.mark.parametrize("ctype", ["application/json", "application/x-ndjson"])
def test_lone_surrogate_rejects_that_event_only(
    gw: httpx.Client, r: redis.Redis, admin: httpx.Client, ctype: str
) -> None:
    kind = "sur-" + ctype.rsplit("/", 1)[1]
    add_profile(admin, kind, f'kind = "{kind}"')
    now = time.time()
    # ids of their own: the gateway's ids are remembered (--dedup-window) across the two runs
    good = [json.dumps({"id": f"{kind}-ok{i}", "ts": now + i / 1000, "kind": kind}) for i in (1, 2)]
    # JSON may escape a lone surrogate: "\ud800" (json.dumps would not write one)
    bad = json.dumps({"id": "s-bad", "ts": now, "kind": kind, "note": "xSURy"})
    bad = bad.replace("SUR", "\\ud800")
    bad_id = json.dumps({"id": "SUR", "ts": now, "kind": kind}).replace("SUR", "\\udfff")
    items = [good[0], bad, good[1], bad_id]
    body = ("[" + ",".join(items) + "]") if ctype == "application/json" else "\n".join(items)
    resp = gw.post("/v1/events", content=body.encode(), headers={"Content-Type": ctype})
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert data["accepted"] == 2 and data["rejected"] == 2
    err, err_id = data["errors"]
    assert err["index"] == 1 and err["id"] == "s-bad"
    assert "'note'" in err["error"] and "surrogate" in err["error"]
    assert err_id["index"] == 3 and "id" not in err_id and "'id'" in err_id["error"]
    wait_for(lambda: len(outbox_for(r, kind)) >= 2, 10, "2 notifications")
    assert sorted(n["events"]["e"]["id"] for n in outbox_for(r, kind)) == [
        f"{kind}-ok1",
        f"{kind}-ok2",
    ]


def test_a_number_too_long_for_python_rejects_that_event_only(
    gw: httpx.Client, r: redis.Redis, admin: httpx.Client
) -> None:
    kind = "longnum"
    add_profile(admin, kind, f'kind = "{kind}"')
    now = time.time()
    items = [
        json.dumps({"id": "n-ok1", "ts": now, "kind": kind}),
        json.dumps({"id": "n-bad", "ts": now, "kind": kind, "v": 0}).replace(
            '"v": 0', '"v": ' + "9" * 5000
        ),
        json.dumps({"id": "n-ok2", "ts": now + 0.001, "kind": kind}),
        json.dumps({"id": "n-bad2", "ts": 0, "kind": kind}).replace(
            '"ts": 0', '"ts": ' + "1" * 5000
        ),
    ]
    resp = gw.post(
        "/v1/events",
        content=("[" + ",".join(items) + "]").encode(),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert data["accepted"] == 2 and data["rejected"] == 2
    assert [(e["index"], e["id"]) for e in data["errors"]] == [(1, "n-bad"), (3, "n-bad2")]
    assert "'v'" in data["errors"][0]["error"] and "5000 digits" in data["errors"][0]["error"]
    assert "'ts'" in data["errors"][1]["error"]
    wait_for(lambda: len(outbox_for(r, kind)) >= 2, 10, "2 notifications")
    assert sorted(n["events"]["e"]["id"] for n in outbox_for(r, kind)) == ["n-ok1", "n-ok2"]


# ----------------------------------------------------------------------------- ts window


def test_ts_outside_the_window_around_the_wall_clock_is_rejected(
    svc: Service, gw: httpx.Client, r: redis.Redis, admin: httpx.Client
) -> None:
    kind = "tswin"
    add_profile(admin, kind, f'kind = "{kind}"')
    before = metric(httpx.get(svc.url + "/metrics").text, "ens_events_rejected_ts_total")
    now = time.time()
    batch = [
        {"id": "t-ok", "ts": now, "kind": kind},
        {"id": "t-10y", "ts": now + 10 * 365 * 86400, "kind": kind},
        {"id": "t-1h", "ts": now + 3600, "kind": kind},
        {"id": "t-40d", "ts": now - 40 * 86400, "kind": kind},
        {"id": "t-1d", "ts": now - 86400, "kind": kind},  # old but inside the default 30 days
        {"id": "t-huge", "ts": 1e300, "kind": kind},
    ]
    resp = gw.post("/v1/events", json=batch)
    assert resp.status_code == 422, resp.text
    data = resp.json()
    assert data["accepted"] == 2
    errs = {e["id"]: e["error"] for e in data["errors"]}
    assert sorted(errs) == ["t-10y", "t-1h", "t-40d", "t-huge"]
    assert "ahead of the server clock" in errs["t-1h"] and "--max-future" in errs["t-1h"]
    assert "300 s" in errs["t-1h"] and "20" in errs["t-10y"]  # names the ts and the bound
    assert "behind the server clock" in errs["t-40d"] and "--max-past" in errs["t-40d"]
    text = httpx.get(svc.url + "/metrics").text
    # 1e300 is no time at all: event validation rejects it before the window is looked at
    assert "out of range" in errs["t-huge"]
    assert metric(text, "ens_events_rejected_ts_total") == before + 3
    assert 'ens_events_rejected_ts_total{bound="future",gateway="gw-robust"}' in text
    # t-1d is accepted, but a day behind the engine's time: in the late output, not matched
    wait_for(
        lambda: any(rec.event["id"] == "t-1d" for rec in list_late(r, "gw-robust")[0]),
        10,
        "t-1d in the late output",
    )
    wait_for(lambda: outbox_for(r, kind), 10, "t-ok notified")
    assert [n["events"]["e"]["id"] for n in outbox_for(r, kind)] == ["t-ok"]


def test_ts_window_flags_widen_or_disable_the_bounds(tmp_path: Path) -> None:
    """`--max-past off` for backfills of old data (with --clock event)."""
    with redis_server(tmp_path) as url:
        s = Service(
            url,
            tmp_path / "serve.log",
            "--max-past",
            "off",
            "--max-future",
            "2h",
            "--clock",
            "event",
        ).start()
        try:
            r = redis.Redis.from_url(url, decode_responses=True)
            key = rs.add_gateway(r, "gw-backfill")
            r.close()
            now = time.time()
            with s.client(key) as c:
                resp = c.post(
                    "/v1/events",
                    json=[
                        {"ts": 86400.0, "kind": "old"},
                        {"ts": now + 3600, "kind": "soon"},
                        {"ts": now + 3 * 3600, "kind": "later"},
                    ],
                )
            assert resp.status_code == 422 and resp.json()["accepted"] == 2, resp.text
            assert [e["index"] for e in resp.json()["errors"]] == [2]
            assert "7200 s" in resp.json()["errors"][0]["error"]
        finally:
            s.kill()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-future", "soon"),
        ("--max-past", "-1d"),
        ("--body-timeout", "0"),
        # issue 24.7: NaN, infinities and out-of-range values of every number and duration
        ("--default-lateness", "nan"),
        ("--default-lateness", "-1"),
        ("--reorder-seconds", "inf"),
        ("--max-future", "nan"),
        ("--max-past", "inf"),
        ("--body-timeout", "nan"),
        ("--idle-timeout", "nan"),
        ("--idle-timeout", "-0.5"),
        ("--snapshot-interval", "-1"),
        ("--snapshot-interval", "0"),
        ("--status-interval", "nan"),
        ("--max-body", "-1"),
        ("--max-body", "0"),
        ("--max-backlog", "-5"),
        ("--reorder-max-events", "0"),
        ("--drift", "nan"),
        ("--drift", "0.5"),
        ("--replan-every", "-1"),
        ("--max-skew", "inf"),
        ("--dedup-window", "nan"),
        ("--dedup-max", "0"),
        ("--keepalive-timeout", "0"),
        ("--header-timeout", "-1s"),
        ("--max-connections", "-1"),
        ("--default-lateness", "²"),
    ],
)
def test_serve_rejects_bad_limits(flag: str, value: str) -> None:
    from ens.cli import app as ens_app

    res = CliRunner().invoke(ens_app, ["serve", flag, value])
    assert res.exit_code == 2 and flag in res.output and value in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--timeout", "nan"), ("--timeout", "0"), ("--retry-for", "inf"), ("--retry-for", "-1s")],
)
def test_post_rejects_bad_durations(flag: str, value: str, tmp_path: Path) -> None:
    from ens.cli import app as ens_app

    f = tmp_path / "e.jsonl"
    f.write_text('{"ts": 1}\n')
    res = CliRunner().invoke(ens_app, ["post", str(f), "--api-key", "k", flag, value])
    assert res.exit_code == 2 and flag in res.output and value in res.output, res.output


def test_every_time_option_takes_the_same_durations() -> None:
    """One parser (ens.options.parse_duration) for all of them: `--default-lateness 500ms`
    works like `ens gateway set --lateness 500ms`."""
    from ens.options import parse_duration

    assert parse_duration("--x", "500ms") == 0.5
    assert parse_duration("--x", "2s") == 2.0 and parse_duration("--x", "2") == 2.0
    assert parse_duration("--x", "30m") == 1800.0 and parse_duration("--x", "1d") == 86400.0
    assert parse_duration("--x", "off", off=True) is None
    from ens.cli import app as ens_app

    for flag in (
        "--default-lateness",
        "--idle-timeout",
        "--snapshot-interval",
        "--max-skew",
        "--keepalive-timeout",
        "--header-timeout",
        "--status-interval",
    ):
        res = CliRunner().invoke(ens_app, ["serve", flag, "500ms", "--port", "-1"])
        assert res.exit_code == 2 and "--port" in res.output, (flag, res.output)  # flag passed


def test_a_trailing_slash_is_not_redirected(gw: httpx.Client) -> None:
    """Issue 24.13: `POST /v1/events/` answered 307 to the client's Host header."""
    resp = gw.post("/v1/events/", json={"ts": time.time(), "kind": "slash"}, follow_redirects=False)
    assert resp.status_code == 404 and "location" not in resp.headers
    assert gw.get("/v1/profiles/", follow_redirects=False).status_code in (401, 404)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/events/", [{"ts": "now", "kind": "x"}], {404}),
        ("/v1/events/", [], {404}),
        ("/v1/events", [{"id": "dup-in-batch", "ts": "now", "kind": "x"}] * 2, {202}),
        ("/v1/events", [{"ts": "now+240", "kind": "x"}], {202}),  # inside --max-future
        ("/v1/events", [{"ts": "\u00b2", "kind": "x"}], {422}),  # a Unicode digit
        ("/v1/events", [{"ts": "\u0661\u0662", "kind": "x"}], {422}),  # Arabic-Indic digits
        # NaN and Infinity are not JSON: the body is refused whole, naming the token
        ("/v1/events", [{"ts": "NaN", "kind": "x"}], {400}),
        ("/v1/events", [{"ts": "Infinity", "kind": "x"}], {400}),
        ("/v1/events", [{"ts": "now", "kind": "x", "v": "NaN"}], {400}),
        ("/v1/events", [{"id": 7, "ts": "now", "kind": "x"}], {202, 422}),
    ],
)
def test_the_issue_24_inputs_are_never_a_server_error(
    gw: httpx.Client, path: str, body: list[dict], status: set[int]
) -> None:
    """The bad or odd inputs of issue 24's second probe (a trailing slash, an event id twice,
    a clock ahead inside --max-future, Unicode digits and non-finite numbers), each next to a
    good event: never 5xx, and the good event is kept unless the body is not JSON at all."""
    now = time.time()
    events = [
        {**ev, "ts": now + (240 if ev["ts"] == "now+240" else 0)}
        if ev["ts"] in ("now", "now+240")
        else ev
        for ev in body
    ]
    text = json.dumps([*events, {"ts": now, "kind": "good"}]).replace('"NaN"', "NaN")
    text = text.replace('"Infinity"', "Infinity")
    resp = gw.post(path, content=text, headers={"Content-Type": "application/json"})
    assert resp.status_code in status, resp.text
    if resp.status_code == 400:
        assert "is not valid JSON" in resp.json()["error"], resp.text
    elif resp.status_code != 404:
        assert resp.json()["accepted"] >= 1, resp.text  # the good event


def test_a_retried_event_id_is_stored_once_and_answered_as_accepted(
    svc: Service, gw: httpx.Client, r: redis.Redis, admin: httpx.Client
) -> None:
    """Issue 24.4: a gateway retrying after a timeout posted the same event twice, and got two
    notifications. Its id is remembered (per gateway, --dedup-window) and the copy dropped."""
    kind = f"dup{time.time_ns()}"
    add_profile(admin, f"p-{kind}", f'kind = "{kind}"')
    now = time.time()
    batch = [
        {"id": f"{kind}-1", "ts": now, "kind": kind},
        {"id": f"{kind}-2", "ts": now, "kind": kind},
    ]
    first = gw.post("/v1/events", json=batch)
    assert first.status_code == 202 and first.json() == {"accepted": 2, "rejected": 0, "errors": []}
    again = gw.post(
        "/v1/events",
        json=[
            *batch,
            {"id": f"{kind}-3", "ts": now, "kind": kind},
            {"id": f"{kind}-3", "ts": now, "kind": kind},
        ],
    )
    assert again.status_code == 202, again.text
    assert again.json() == {"accepted": 4, "duplicates": 3, "rejected": 0, "errors": []}
    only_dups = gw.post("/v1/events", json=batch[0])
    assert only_dups.status_code == 202 and only_dups.json()["duplicates"] == 1
    wait_for(lambda: len(outbox_for(r, f"p-{kind}")) >= 3, 10, "3 notifications")
    time.sleep(0.5)  # nothing more comes
    assert sorted(n["events"]["e"]["id"] for n in outbox_for(r, f"p-{kind}")) == [
        f"{kind}-1",
        f"{kind}-2",
        f"{kind}-3",
    ]
    text = gw.get("/metrics").text
    assert metric(text, "ens_events_duplicate_total") >= 4
    assert r.zcard(rs.seen_key("gw-robust")) >= 3 and r.pttl(rs.seen_key("gw-robust")) > 0


# ----------------------------------------------------------------------------- slow bodies


def _raw_post(svc: Service, key: str, length: int, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
    sock.sendall(
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
        + body
    )
    return sock


def _status(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    with sock:
        while True:  # to the end: these answers close the connection
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_declared_oversized_body_gets_413_without_sending_it(svc: Service, key: str) -> None:
    t0 = time.monotonic()
    status, head = _status(_raw_post(svc, key, 4 << 20))  # headers only: 4 MiB announced
    assert status == 413 and b"limit" in head
    assert time.monotonic() - t0 < 1.0  # not after --body-timeout (1 s here)


def test_half_sent_bodies_get_408_after_the_body_timeout(svc: Service, key: str) -> None:
    t0 = time.monotonic()
    socks = [_raw_post(svc, key, 1000, b'[{"ts": 1') for _ in range(200)]
    answers = [_status(s) for s in socks]
    elapsed = time.monotonic() - t0
    assert {a[0] for a in answers} == {408}, answers[0]
    assert b"1 s" in answers[0][1] and elapsed < 8


# ----------------------------------------------------------------------------- what is private


def test_embedded_redis_files_are_private(tmp_path: Path) -> None:
    """Issue 17 item 9: the AOF holds webhook secrets and gateway key hashes; the data dir was
    0755 and the Redis files 0644. A new dir is 0700, and every Redis file (old ones too) 0600."""
    fresh = tmp_path / "fresh"
    conn = rs.connect(None, fresh)
    try:
        r = conn.text()
        r.hset("ens:subscribers", "s", '{"secret": "s3cret"}')
        r.save()
    finally:
        conn.close()
    assert fresh.stat().st_mode & 0o777 == 0o700
    files = [p for p in fresh.iterdir() if p.is_file()]
    assert {"redis.db", "appendonly.aof"} <= {p.name for p in files}
    for p in files:
        assert p.stat().st_mode & 0o777 == 0o600, p
    old = tmp_path / "old"  # written by an earlier version
    old.mkdir(mode=0o755)
    for p in files:
        (old / p.name).write_bytes(p.read_bytes())
        (old / p.name).chmod(0o644)
    conn = rs.connect(None, old)
    try:
        assert conn.text().hget("ens:subscribers", "s")
    finally:
        conn.close()
    for p in old.iterdir():
        if p.is_file():
            assert p.stat().st_mode & 0o777 == 0o600, p


def test_healthz_shows_worker_details_only_to_the_admin(svc: Service) -> None:
    """Issue 17 item 9: an unauthenticated /healthz showed the worker's host, pid and lock
    token (``holder``) and its engine stats."""
    public = httpx.get(svc.url + "/healthz")
    assert public.status_code == 200
    body = public.json()
    assert body["status"] == "ok" and body["redis"] == "ok"
    assert set(body["worker"]) == {"age"}  # no holder, ts or stats
    assert "test-engine" not in public.text and str(svc.proc.pid) not in public.text
    with svc.client(admin=True) as admin:
        detail = admin.get("/healthz").json()
    assert detail["worker"]["holder"].startswith("test-engine|")
    assert detail["worker"]["stats"]["profiles"] >= 0
    bad = httpx.get(svc.url + "/healthz", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 403


def test_metrics_token_guards_the_scrape(svc: Service, tmp_path: Path) -> None:
    """Issue 17 left /metrics public (its labels name the gateways): with ENS_METRICS_TOKEN
    set, a scrape needs that token or the admin token; without it, it stays public."""
    api = Service(
        svc.redis_url,
        tmp_path / "api.log",
        "--role",
        "api",
        engine=False,
        env={rs.ENV_METRICS_TOKEN: "scrape-me"},
    ).start()
    try:
        assert httpx.get(api.url + "/metrics").status_code == 401
        assert (
            httpx.get(api.url + "/metrics", headers={"Authorization": "Bearer nope"}).status_code
            == 403
        )
        ok = httpx.get(api.url + "/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert ok.status_code == 200 and "ens_events_received_total" in ok.text
        with api.client(admin=True) as admin:
            assert admin.get("/metrics").status_code == 200
        assert httpx.get(api.url + "/healthz").status_code in (200, 503)  # still public
    finally:
        assert api.stop() == 0, (tmp_path / "api.log").read_text()[-2000:]
    assert httpx.get(svc.url + "/metrics").status_code == 200  # no token set: public


# ----------------------------------------------------------------------------- idle connections


def test_idle_and_trickling_connections_cannot_starve_the_service(tmp_path: Path) -> None:
    """Issue 24.5: with `ulimit -n 1024`, 1,100 idle connections made every POST fail for 60 s.
    Here the limit is 256 and 300 connections sit idle: the longest idle ones are closed to
    make room, headers that trickle in are cut off at --header-timeout, and an idle
    keep-alive connection at --keepalive-timeout; the service answers meanwhile."""
    with redis_server(tmp_path) as url:
        s = Service(
            url,
            tmp_path / "serve.log",
            "--header-timeout",
            "1s",
            "--keepalive-timeout",
            "1s",
            nofile=256,
        ).start()
        idle: list[socket.socket] = []
        try:
            r = redis.Redis.from_url(url, decode_responses=True)
            key = rs.add_gateway(r, "gw-idle")
            r.close()
            for _ in range(300):
                idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
            t0 = time.monotonic()

            def posted() -> bool:
                try:
                    resp = httpx.post(
                        s.url + "/v1/events",
                        json={"ts": time.time(), "kind": "x"},
                        headers={"X-API-Key": key},
                        timeout=2,
                    )
                except httpx.HTTPError:
                    return False
                return resp.status_code == 202

            wait_for(posted, 15, "a POST answered while 300 connections sit idle")
            assert time.monotonic() - t0 < 5  # not after some long timeout

            trickle = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            trickle.sendall(b"POST /v1/events HTTP/1.1\r\nHo")  # and nothing more
            t1 = time.monotonic()
            assert trickle.recv(100) == b""  # closed by the server ...
            assert 0.5 < time.monotonic() - t1 < 5  # ... at --header-timeout
            trickle.close()

            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as ka:
                ka.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                t2 = time.monotonic()
                data = b""
                while chunk := ka.recv(65536):  # the answer, then the close of the idle
                    data += chunk  # keep-alive connection
                assert data.startswith(b"HTTP/1.1 200") and time.monotonic() - t2 < 5
            assert s.proc is not None and s.proc.poll() is None
        finally:
            for c in idle:
                c.close()
            s.kill()


def test_duplicates_are_found_in_batches_larger_than_the_script_chunks(
    gw: httpx.Client, r: redis.Redis
) -> None:
    """The ingest script looks ids up 500 at a time and adds them 500 at a time."""
    now = time.time()
    batch = [{"id": f"big-{i}", "ts": now, "kind": "big"} for i in range(1200)]
    first = gw.post("/v1/events", json=batch)
    assert first.status_code == 202 and "duplicates" not in first.json(), first.text
    again = gw.post("/v1/events", json=[*batch[::-1], {"id": "big-new", "ts": now, "kind": "big"}])
    assert again.json() == {"accepted": 1201, "duplicates": 1200, "rejected": 0, "errors": []}
    assert r.zscore(rs.seen_key("gw-robust"), "big-1199") is not None
