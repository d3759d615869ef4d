"""Issue 41.7 and 41.8 through HTTP and the CLI, against a real `ens serve`, a real
redis-server, a real delivery worker and real webhook receivers on loopback.

7: an event's `gateway` is the gateway of the API key that posted it: a body naming another is
refused for that event (422 entry), profiles match on the stamped one, and notifications carry it.
8: credentials in a webhook URL (user info, query values) are never shown or logged; the stored
URL stays whole, and is what is sent.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import typer
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from adapters.service.records import decode_ingest
from ens.commands.service import register
from ens.replay import replay
from notifiers import store
from notifiers.worker import DeliveryWorker
from profiles.events import read_events
from profiles.parser import parse_profile
from tests.helpers_notifiers import SECRET, Receiver, drive, fast_config
from tests.helpers_service import Service, outbox_for, service_fixtures, wait_for

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

PW, TOKEN = "pw-9f3Kq2", "tok-7Zx2Lm"  # what must never be shown


svc, r, admin, _gw = service_fixtures("identity", "--reorder-seconds", "0.2")


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def run(app: typer.Typer, svc: Service, *args: str) -> Any:
    return CliRunner(env={rs.ENV_URL: svc.redis_url, "ENS_URL": svc.url}).invoke(app, list(args))


def add_profile(admin: httpx.Client, pid: str, expr: str, subscriber: str | None = None) -> None:
    resp = admin.post("/v1/profiles", json={"id": pid, "expr": expr, "subscriber": subscriber})
    assert resp.status_code == 201, resp.text


# ----------------------------------------------------------------------------- 41.7


def test_decode_stamps_the_entry_gateway_over_the_body() -> None:
    """An ingest entry's events carry its gateway, whatever they say (an entry an older API
    wrote with a body's `gateway` included); an entry without one is left as it is."""
    batch = json.dumps([{"ts": 1, "gateway": "gwb"}, {"ts": 2}, "odd"])
    evs = decode_ingest("5-0", {"b": batch, "g": "gwa", "v": "n"})
    assert [e for _, _, e in evs] == [
        {"ts": 1, "gateway": "gwa"},
        {"ts": 2, "gateway": "gwa"},
        "odd",
    ]
    (one,) = decode_ingest("6-0", {"e": json.dumps({"ts": 1, "gateway": "gwb"}), "g": "gwa"})
    assert one[2] == {"ts": 1, "gateway": "gwa"}
    (legacy,) = decode_ingest("7-0", {"e": json.dumps({"ts": 1, "gateway": "x"})})
    assert legacy[2] == {"ts": 1, "gateway": "x"}


def test_a_gateway_cannot_pose_as_another_and_notifications_carry_its_name(
    svc: Service, r: redis.Redis, admin: httpx.Client, receiver: Receiver
) -> None:
    """gwa posts a batch in which one event says `"gateway": "gwb"`: that event alone gets a
    422 entry naming its index, id and the key; the others are accepted (also those naming
    gwa itself or null). A profile on `gateway = "gwb"` fires for gwb's event only; the one on
    gwa for gwa's three; the delivered webhooks show the stamped gateway."""
    resp = admin.post(
        "/v1/subscribers",
        json={"id": "watch", "channels": [{"webhook": receiver.url}], "secret": SECRET},
    )
    assert resp.status_code == 201, resp.text
    add_profile(admin, "door-of-b", 'kind = "door7" and gateway = "gwb"', "watch")
    add_profile(admin, "door-of-a", 'kind = "door7" and gateway = "gwa"', "watch")
    key_a, key_b = rs.add_gateway(r, "gwa"), rs.add_gateway(r, "gwb")
    now = time.time()
    batch = [
        {"id": "a1", "ts": now, "kind": "door7"},
        {"id": "spoof", "ts": now + 0.001, "kind": "door7", "gateway": "gwb"},
        {"id": "a2", "ts": now + 0.002, "kind": "door7", "gateway": "gwa"},
        {"id": "a3", "ts": now + 0.003, "kind": "door7", "gateway": None},
    ]
    with svc.client(key_a) as gwa, svc.client(key_b) as gwb:
        resp = gwa.post("/v1/events", json=batch)
        assert resp.status_code == 422, resp.text
        body = resp.json()
        assert body["accepted"] == 3 and body["rejected"] == 1
        (err,) = body["errors"]
        assert err["index"] == 1 and err["id"] == "spoof"
        assert err["error"] == (
            "key 'gateway' is reserved: the service sets it to the gateway of the API key "
            "('gwa'); remove it from the event (got 'gwb')"
        )
        assert (
            gwb.post("/v1/events", json={"id": "b1", "ts": now + 0.004, "kind": "door7"}).json()[
                "accepted"
            ]
            == 1
        )

    def notes(pid: str, n: int) -> list[dict[str, Any]]:
        return wait_for(
            lambda: (lambda got: got if len(got) >= n else None)(outbox_for(r, pid)),
            15,
            f"{n} notification(s) of {pid}",
        )

    assert (
        'ens_events_rejected_gateway_total{gateway="gwa"} 1.0'
        in httpx.get(svc.url + "/metrics").text
    )
    of_a = notes("door-of-a", 3)
    of_b = notes("door-of-b", 1)  # b1 comes after the refused event: it would be first
    assert [n["events"]["e"]["id"] for n in of_b] == ["b1"]
    assert sorted(n["events"]["e"]["id"] for n in of_a) == ["a1", "a2", "a3"]
    assert {n["events"]["e"]["gateway"] for n in of_a} == {"gwa"}
    assert of_b[0]["events"]["e"] == {
        "id": "b1",
        "ts": pytest.approx(now + 0.004),
        "kind": "door7",
        "gateway": "gwb",
    }
    with DeliveryWorker(r, fast_config()) as w:
        drive(w, lambda: len(receiver.accepted) >= 4, timeout=15)
    sent = {b["events"]["e"]["id"]: b["events"]["e"]["gateway"] for b in receiver.accepted.values()}
    assert sent == {"a1": "gwa", "a2": "gwa", "a3": "gwa", "b1": "gwb"}


def test_ens_post_reports_the_spoofing_line_and_stores_the_rest(
    svc: Service, r: redis.Redis, admin: httpx.Client, cli: typer.Typer, tmp_path: Path
) -> None:
    add_profile(admin, "cli-of-c", 'kind = "door8" and gateway = "gwc"')
    add_profile(admin, "cli-of-x", 'kind = "door8" and gateway = "gwx"')
    key = run(cli, svc, "gateway", "add", "gwc").stdout.strip()
    now = time.time()
    lines = [
        {"id": "c1", "ts": now, "kind": "door8"},
        {"id": "c2", "ts": now + 0.001, "kind": "door8", "gateway": "gwx"},
        {"id": "c3", "ts": now + 0.002, "kind": "door8"},
    ]
    f = tmp_path / "events.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = run(cli, svc, "post", str(f), "--api-key", key)
    assert res.exit_code == 2
    assert "2 accepted, 1 rejected" in res.stdout
    assert "error: line 2" in res.stderr and "key 'gateway' is reserved" in res.stderr
    got = wait_for(
        lambda: (lambda n: n if len(n) == 2 else None)(outbox_for(r, "cli-of-c")), 15, "gwc's"
    )
    assert [n["events"]["e"]["id"] for n in got] == ["c1", "c3"]
    assert outbox_for(r, "cli-of-x") == []


def test_replay_files_keep_their_gateway_attribute() -> None:
    """Offline, `gateway` is an attribute like any other (files exported from the service
    carry the stamped one)."""
    events = read_events(
        [
            json.dumps({"id": "e1", "ts": 1, "kind": "door", "gateway": "gwb"}),
            json.dumps({"id": "e2", "ts": 2, "kind": "door", "gateway": "gwa"}),
        ]
    )
    (n,) = replay([parse_profile('kind = "door" and gateway = "gwb"', "p")], events)
    assert n.to_json()["events"] == {"e": "e1"}


# ----------------------------------------------------------------------------- 41.8


def test_webhook_credentials_are_never_shown_nor_logged(
    svc: Service,
    r: redis.Redis,
    admin: httpx.Client,
    cli: typer.Typer,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """A URL with a password and a token in its query, stored by the CLI and by the API:
    `ens subscriber list` (table and JSON), GET /v1/subscribers, the API's answers, the
    delivery log and `ens notifications dead-letter list` show `<secret>` in their place; the
    receiver still gets the request with the credentials (the stored URL is whole)."""
    good = f"http://ens:{PW}@127.0.0.1:{receiver.port}/hook?token={TOKEN}"
    masked = f"http://ens:<secret>@127.0.0.1:{receiver.port}/hook?token=<secret>"
    refusing = Receiver(secret="another").start()  # answers 401: a dead letter at once
    shown: dict[str, str] = {}  # where -> what it showed; none may hold PW or TOKEN
    try:
        bad = f"http://ens:{PW}@127.0.0.1:{refusing.port}/hook?token={TOKEN}&x=1"
        res = run(cli, svc, "subscriber", "add", "leaky", "--webhook", good, "--secret", SECRET)
        assert res.exit_code == 0, res.output
        shown["ens subscriber add"] = res.output
        resp = admin.post(
            "/v1/subscribers",
            json={"id": "leaky-dead", "channels": [{"webhook": bad}], "secret": SECRET},
        )
        assert resp.status_code == 201
        shown["POST /v1/subscribers"] = resp.text
        assert PW in r.hget(store.SUBSCRIBERS, "leaky") and TOKEN in r.hget(
            store.SUBSCRIBERS, "leaky-dead"
        )  # stored whole: it is what is sent

        listed = run(cli, svc, "subscriber", "list")
        shown["ens subscriber list"] = listed.stdout
        as_json = run(cli, svc, "subscriber", "list", "--json")
        shown["ens subscriber list --json"] = as_json.stdout
        for path in ("/v1/subscribers", "/v1/subscribers/leaky", "/v1/subscribers/leaky-dead"):
            got = admin.get(path)
            assert got.status_code == 200
            shown[f"GET {path}"] = got.text
        typo = {"id": "typo", "channels": [{"webhook": f"ftp://ens:{PW}@h/x?token={TOKEN}"}]}
        refused = admin.post("/v1/subscribers", json=typo)
        assert refused.status_code == 422
        shown["POST /v1/subscribers (422)"] = refused.text
        res = run(
            cli, svc, "subscriber", "add", "typo", "--webhook", typo["channels"][0]["webhook"]
        )
        assert res.exit_code == 2
        shown["ens subscriber add (error)"] = res.output

        add_profile(admin, "leak", 'kind = "leak"', "leaky")
        add_profile(admin, "leak-dead", 'kind = "leak"', "leaky-dead")
        key = rs.add_gateway(r, "gw-leak")
        with svc.client(key) as gw:
            assert (
                gw.post("/v1/events", json={"ts": time.time(), "kind": "leak"}).status_code == 202
            )
        wait_for(lambda: outbox_for(r, "leak") and outbox_for(r, "leak-dead"), 15, "both")
        caplog.set_level(logging.INFO, logger="ens.notifiers")
        with DeliveryWorker(r, fast_config()) as w:
            drive(w, lambda: bool(receiver.accepted) and r.xlen(store.DEADLETTER) > 0, 15)
        (hit,) = [h for h in receiver.hits if h.status == 200]
        assert (
            hit.headers["authorization"]
            == "Basic " + base64.b64encode(f"ens:{PW}".encode()).decode()
        )  # sent with the credentials of the stored URL
        log_text = "\n".join(rec.getMessage() for rec in caplog.records)
        shown["delivery log"] = log_text
        shown["ens:deadletter"] = json.dumps(r.xrange(store.DEADLETTER))  # kept masked, too
        dead = run(cli, svc, "notifications", "dead-letter", "list")
        assert dead.exit_code == 0
        shown["ens notifications dead-letter list"] = dead.stdout
        dead_json = run(cli, svc, "notifications", "dead-letter", "list", "--json")
        shown["ens notifications dead-letter list --json"] = dead_json.stdout
        changed = tmp_path / "leaky.yaml"  # the same URL with another token: a replacement
        changed.write_text(
            "subscribers:\n  - id: leaky\n    channels:\n"
            f"      - webhook: '{good.replace(TOKEN, TOKEN[::-1])}'\n"
        )
        replaced = run(cli, svc, "profile", "add", str(changed))
        assert replaced.exit_code == 2
        shown["ens profile add (replacement refused)"] = replaced.output
        assert TOKEN[::-1] not in replaced.output
    finally:
        refusing.stop()

    assert [where for where, text in shown.items() if PW in text or TOKEN in text] == []
    assert masked in listed.stdout
    assert {"webhook": masked} in next(s for s in json.loads(as_json.stdout) if s["id"] == "leaky")[
        "channels"
    ]
    assert admin.get("/v1/subscribers/leaky").json()["channels"] == [{"webhook": masked}]
    assert "'ftp://ens:<secret>@h/x?token=<secret>' is not an http(s) URL" in refused.text
    assert "delivered nid=leak:" in log_text and f"webhook {masked} attempt=1" in log_text
    assert "dead-lettered" in log_text
    assert "<secret>" in dead.stdout
    assert "(credentials or query values of a webhook URL changed)" in replaced.output
    (letter,) = json.loads(dead_json.stdout)
    assert letter["channel"] == (
        f"webhook http://ens:<secret>@127.0.0.1:{refusing.port}/hook?token=<secret>&x=<secret>"
    )
