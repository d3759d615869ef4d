"""Alarms end to end: a real `ens serve`, a real redis-server, the real delivery worker and a
webhook receiver on loopback; acks, clears and silences through the CLI and HTTP."""

from __future__ import annotations

import itertools
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import typer

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from notifiers.worker import DeliveryWorker
from tests.helpers_notifiers import SECRET, Receiver, drive, fast_config
from tests.helpers_service import (
    Service,
    alarm_cli,
    metric,
    outbox,
    redis_server,
    run_cli,
    service_fixtures,
    wait_for,
)

pytestmark = pytest.mark.redis

_ids = itertools.count(1)
ALARM = {
    "severity": "major",
    "clear": {"on": 'kind = "window" and state = "closed"'},
    "notify": ["raise", "ack", "clear"],
}


svc, r, admin, gw = service_fixtures("alarms", "--reorder-seconds", "0.1")


cli = pytest.fixture(scope="module", name="cli")(alarm_cli)


def post(gw: httpx.Client, *events: dict[str, Any]) -> None:
    now = time.time()
    body = [{"id": f"x{next(_ids)}", "ts": now, **e} for e in events]
    resp = gw.post("/v1/events", json=body)
    assert resp.status_code == 202, resp.text


def messages(r: redis.Redis, profile: str) -> list[dict[str, Any]]:
    return [n["alarm"] for n in outbox(r) if "alarm" in n and n["profile"] == profile]


def alarms_of(r: redis.Redis, profile: str) -> list[dict[str, Any]]:
    return [a for a in als.list_alarms(r) if a["profile"] == profile]


def setup_profile(
    cli: typer.Typer, svc: Service, admin: httpx.Client, pid: str, sub: str, hook: str
) -> None:
    resp = admin.post(
        "/v1/subscribers",
        json={"id": sub, "channels": [{"webhook": hook}], "secret": SECRET},
    )
    assert resp.status_code in (200, 201), resp.text
    res = run_cli(
        cli, svc.redis_url, "profile", "add", "--id", pid, "--subscriber", sub,
        "--expr", 'seq(w: kind = "window" and state = "open") per room',
        "--severity", "major", "--clear", 'kind = "window" and state = "closed"',
        "--notify", "raise,ack,clear",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    stored = rs.get_profile(redis.Redis.from_url(svc.redis_url or ""), pid)
    assert stored is not None and stored["alarm"] == {**ALARM, "notify": ["raise", "ack", "clear"]}


def test_raise_repeat_ack_clear_end_to_end(
    svc: Service,
    r: redis.Redis,
    admin: httpx.Client,
    gw: httpx.Client,
    cli: typer.Typer,
    receiver: Receiver,
) -> None:
    setup_profile(cli, svc, admin, "win", "night", receiver.url)
    post(gw, {"kind": "window", "state": "open", "room": "101"})
    wait_for(lambda: len(messages(r, "win")) >= 1, 15, "the raise message")
    post(gw, {"kind": "window", "state": "open", "room": "101"})  # a repeat: counted
    wait_for(lambda: (alarms_of(r, "win") or [{}])[0].get("count") == 2, 15, "the repeat")
    with DeliveryWorker(r, fast_config()) as w:
        drive(w, lambda: len(receiver.accepted) >= 1, timeout=15)
    ((key, body),) = receiver.accepted.items()
    a = body["alarm"]
    assert key == a["transition"] and a["transition_kind"] == "raise"
    assert a["severity"] == "major" and a["state"] == "active-unacknowledged"
    assert a["labels"] == {
        "room": "101",
        "profile": "win",
        "severity": "major",
        "subscriber": "night",
    }
    aid = a["alarm"]
    assert a["acknowledge"]["command"] == f"ens alarms ack {aid}"
    assert a["acknowledge"]["http"] == f"POST /v1/alarms/{aid}/ack"
    assert {"occurrence", "count", "first_seen", "last_seen"} <= set(a)

    listed = run_cli(cli, svc.redis_url, "alarms", "list", "--match", "room=101", "--json")
    assert listed.exit_code == 0 and [x["id"] for x in json.loads(listed.output)] == [aid]
    acked = run_cli(cli, svc.redis_url, "alarms", "ack", aid, "--note", "on my way")
    assert acked.exit_code == 0, acked.output
    again = admin.post(f"/v1/alarms/{aid}/ack", json={"note": "me too"})
    assert again.status_code == 409 and again.json()["state"] == "active-acknowledged"
    assert admin.post("/v1/alarms/anothing/ack").status_code == 404
    cli_again = run_cli(cli, svc.redis_url, "alarms", "ack", aid)
    assert cli_again.exit_code == 3 and "active-acknowledged" in cli_again.output

    post(gw, {"kind": "window", "state": "closed", "room": "101"})  # the companion clears it
    wait_for(
        lambda: admin.get(f"/v1/alarms/{aid}").json()["state"] == "cleared-acknowledged",
        15,
        "the clear by expression",
    )
    hist = admin.get("/v1/alarms/history", params={"match": "room=101"}).json()
    assert [t["kind"] for t in hist] == ["raise", "repeat", "ack", "clear"]
    assert hist[2]["actor"] == "cli" and hist[2]["reason"] == "on my way"
    with DeliveryWorker(r, fast_config()) as w:
        drive(w, lambda: len(receiver.accepted) >= 3, timeout=15)
    kinds = sorted(b["alarm"]["transition_kind"] for b in receiver.accepted.values())
    assert kinds == ["ack", "clear", "raise"]  # not the repeat
    assert all(h.valid for h in receiver.hits)  # signed

    def scrape() -> str:
        return httpx.get(svc.url + "/metrics").text

    wait_for(
        lambda: 'ens_alarms{severity="major",state="cleared-acknowledged"} 1.0' in scrape(),
        15,
        "the alarm gauge from the heartbeat",
    )
    text = scrape()
    for kind in ("raise", "repeat", "ack", "clear"):
        assert metric(text, f'ens_alarm_transitions_total{{kind="{kind}"}}') >= 1, kind
    assert metric(text, 'ens_alarm_messages_total{kind="single"}') >= 3


def test_silence_holds_back_delivery_but_state_and_history_change(
    svc: Service, r: redis.Redis, admin: httpx.Client, gw: httpx.Client, cli: typer.Typer
) -> None:
    setup_profile(cli, svc, admin, "win2", "day", "http://127.0.0.1:9/hook")
    bad = run_cli(cli, svc.redis_url, "silence", "add", "--match", "room=~(", "--for", "1h")
    assert bad.exit_code == 2 and "matchers" in bad.output
    bad = run_cli(
        cli, svc.redis_url, "silence", "add", "--match", "room=201", "--weekly", "Mon 7-9"
    )
    assert bad.exit_code == 2 and "weekly" in bad.output
    assert als.list_silences(r) == []
    res = run_cli(
        cli, svc.redis_url, "silence", "add", "--match", "profile=win2", "--match", "room=201",
        "--for", "2h", "--comment", "contractor",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    sid = re.search(r"silence (\S+) added", res.output).group(1)  # type: ignore[union-attr]
    assert "matches no current alarm" in res.output  # stored, with a warning
    post(gw, {"kind": "window", "state": "open", "room": "201"})
    wait_for(lambda: alarms_of(r, "win2"), 15, "the silenced alarm")
    aid = alarms_of(r, "win2")[0]["id"]
    assert admin.post(f"/v1/alarms/{aid}/clear", json={"reason": "checked"}).status_code == 200
    again = admin.post(f"/v1/alarms/{aid}/clear", json={"reason": "checked"})
    assert again.status_code == 409 and again.json()["state"] == "cleared-unacknowledged"
    hist = als.history(r, alarm=aid)
    assert [(t["kind"], t["delivery"]) for t in hist] == [
        ("raise", "silenced"),
        ("clear", "silenced"),
    ]
    assert messages(r, "win2") == []
    wait_for(
        lambda: (
            metric(httpx.get(svc.url + "/metrics").text, "ens_alarm_silenced_deliveries_total") >= 2
        ),
        10,
        "the silenced deliveries counted",
    )
    listed = json.loads(run_cli(cli, svc.redis_url, "silence", "list", "--json").output)
    assert [(s["id"], s["comment"]) for s in listed] == [(sid, "contractor")]
    assert run_cli(cli, svc.redis_url, "silence", "expire", sid).exit_code == 0
    assert admin.delete(f"/v1/silences/{sid}").status_code == 422  # expired already
    assert admin.delete("/v1/silences/s99").status_code == 404


def test_ack_token_lists_and_acknowledges_only(
    svc: Service, r: redis.Redis, admin: httpx.Client, gw: httpx.Client, cli: typer.Typer
) -> None:
    setup_profile(cli, svc, admin, "win3", "phone", "http://127.0.0.1:9/hook")
    res = run_cli(cli, svc.redis_url, "token", "add", "tech-phone", "--scope", "ack")
    assert res.exit_code == 0, res.output
    token = res.output.rsplit(" ", 1)[1].strip()
    post(gw, {"kind": "window", "state": "open", "room": "301"})
    wait_for(lambda: alarms_of(r, "win3"), 15, "the alarm")
    with svc.client(token) as tech:
        listed = tech.get("/v1/alarms", params={"match": ["profile=win3", "room=301"]})
        assert listed.status_code == 200 and len(listed.json()) == 1
        aid = listed.json()[0]["id"]
        acked = tech.post(f"/v1/alarms/{aid}/ack", json={"note": "seen"})
        assert acked.status_code == 200, acked.text
        assert acked.json()["transition"]["actor"] == "token:tech-phone"
        assert tech.post(f"/v1/alarms/{aid}/clear", json={"reason": "x"}).status_code == 403
        assert tech.post("/v1/profiles", json={"id": "p", "expr": "k = 1"}).status_code == 403
        assert tech.get("/v1/silences").status_code == 403
    assert run_cli(cli, svc.redis_url, "token", "revoke", "tech-phone").exit_code == 0
    with svc.client(token) as tech:
        assert tech.get("/v1/alarms").status_code == 403


def test_openapi_documents_the_alarm_api(svc: Service) -> None:
    paths = httpx.get(svc.url + "/openapi.json").json()["paths"]
    for path in (
        "/v1/alarms",
        "/v1/alarms/history",
        "/v1/alarms/{aid}",
        "/v1/alarms/{aid}/ack",
        "/v1/alarms/{aid}/clear",
        "/v1/silences",
        "/v1/silences/{sid}",
    ):
        assert path in paths, path
    assert "409" in paths["/v1/alarms/{aid}/ack"]["post"]["responses"]


def test_restart_keeps_open_alarms_and_does_not_redeliver(tmp_path: Path, cli: typer.Typer) -> None:
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        svc = Service(url, tmp_path / "serve.log", "--reorder-seconds", "0.1").start()
        try:
            with svc.client(admin=True) as admin, svc.client(rs.add_gateway(r, "g")) as gw:
                setup_profile(cli, svc, admin, "win", "s", "http://127.0.0.1:9/hook")
                post(gw, {"kind": "window", "state": "open", "room": "1"})
                post(gw, {"kind": "window", "state": "open", "room": "2"})
                wait_for(lambda: len(messages(r, "win")) == 2, 15, "two raises")
            assert svc.stop(signal.SIGTERM) == 0
            svc = Service(url, tmp_path / "serve.log", "--reorder-seconds", "0.1").start()
            with svc.client(admin=True) as admin, svc.client(rs.add_gateway(r, "g2")) as gw:
                post(gw, {"kind": "window", "state": "open", "room": "1"})  # a repeat now
                wait_for(
                    lambda: (
                        {a["labels"]["room"]: a["count"] for a in alarms_of(r, "win")}
                        == {"1": 2, "2": 1}
                    ),
                    15,
                    "the repeat after the restart",
                )
                aid = [a["id"] for a in alarms_of(r, "win") if a["labels"]["room"] == "2"][0]
                assert admin.post(f"/v1/alarms/{aid}/ack").status_code == 200
            wait_for(lambda: len(messages(r, "win")) == 3, 15, "the ack message")
            ids = [n["id"] for n in outbox(r) if "alarm" in n]
            assert len(ids) == len(set(ids)) == 3
            kinds = [t["kind"] for t in als.history(r)]
            assert sorted(kinds) == ["ack", "raise", "raise", "repeat"]
        finally:
            svc.kill()
            r.close()


def test_post_profile_stores_the_alarm_and_refuses_a_bad_one(admin: httpx.Client) -> None:
    body = {"id": "wp", "expr": 'kind = "w"', "alarm": {"severity": "critical"}}
    ok = admin.post("/v1/profiles", json=body)
    assert ok.status_code == 201, ok.text
    assert admin.get("/v1/profiles/wp").json()["alarm"] == {
        "severity": "critical",
        "notify": ["raise", "clear"],
        "clear": "manual",
    }
    bad = admin.post("/v1/profiles", json={**body, "id": "wq", "alarm": {"severity": "huge"}})
    assert bad.status_code == 422 and "alarm.severity" in bad.json()["error"]
    assert admin.get("/v1/profiles/wq").status_code == 404


def test_http_silences_and_cli_show_and_history(
    svc: Service, r: redis.Redis, admin: httpx.Client, gw: httpx.Client, cli: typer.Typer
) -> None:
    bad = admin.post(
        "/v1/silences",
        json={"matchers": ["room=1"], "weekly": "Mon 07:00-09:00", "tz": "Mars/Base"},
    )
    assert bad.status_code == 422 and bad.json()["field"] == "tz"
    bad = admin.post(
        "/v1/silences",
        json={
            "matchers": ["room=1"],
            "from": "2030-01-02T00:00:00Z",
            "until": "2030-01-01T00:00:00Z",
        },
    )
    assert bad.status_code == 422 and bad.json()["field"] == "until"
    before = len(admin.get("/v1/silences").json())
    ok = admin.post(
        "/v1/silences",
        json={"matchers": ["room=4xx"], "weekly": "Mon-Fri 07:00-09:00", "tz": "Europe/Berlin",
              "comment": "morning rounds"},
    )  # fmt: skip
    assert ok.status_code == 201, ok.text
    s = ok.json()["silence"]
    assert s["weekly"] == "Mon-Fri 07:00-09:00" and s["tz"] == "Europe/Berlin"
    assert len(admin.get("/v1/silences").json()) == before + 1
    assert admin.delete(f"/v1/silences/{s['id']}").status_code == 200

    setup_profile(cli, svc, admin, "win4", "show", "http://127.0.0.1:9/hook")
    post(gw, {"kind": "window", "state": "open", "room": "401"})
    wait_for(lambda: alarms_of(r, "win4"), 15, "the alarm")
    aid = alarms_of(r, "win4")[0]["id"]
    shown = run_cli(cli, svc.redis_url, "alarms", "show", aid)
    assert shown.exit_code == 0, shown.output
    rec = json.loads(shown.output)
    assert rec["state"] == "active-unacknowledged" and [t["kind"] for t in rec["history"]] == [
        "raise"
    ]
    assert run_cli(cli, svc.redis_url, "alarms", "show", "anope").exit_code == 3
    hist = run_cli(
        cli,
        svc.redis_url,
        "alarms",
        "history",
        "--match",
        "profile=win4",
        "--since",
        "1h",
        "--json",
    )
    assert hist.exit_code == 0 and [t["alarm"] for t in json.loads(hist.output)] == [aid]
    bad_since = run_cli(cli, svc.redis_url, "alarms", "history", "--since", "yesterday")
    assert bad_since.exit_code == 2 and "--since" in bad_since.output
    listed = run_cli(
        cli,
        svc.redis_url,
        "alarms",
        "list",
        "--severity",
        "major",
        "--state",
        "active-unacknowledged",
    )
    assert listed.exit_code == 0 and aid in listed.output
    bad_state = run_cli(cli, svc.redis_url, "alarms", "list", "--state", "open")
    assert bad_state.exit_code == 2 and "--state" in bad_state.output
    assert admin.get("/v1/alarms", params={"match": "room=~("}).status_code == 422
