"""`ens serve --routing FILE` end to end: a real service, redis-server, delivery worker and a
webhook receiver on loopback. Alarm transitions go through the route tree (schedules resolved
at the transition's time), escalate while unacknowledged, and stop on acknowledgement."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import typer
from typer.testing import CliRunner

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from notifiers import schedule_store
from notifiers.worker import DeliveryWorker
from tests.helpers_notifiers import SECRET, Receiver, drive, fast_config
from tests.helpers_service import (
    Service,
    alarm_cli,
    client_fixtures,
    metric,
    outbox,
    post_batch,
    redis_server,
    run_cli,
    serving,
    wait_for,
)

pytestmark = pytest.mark.redis

ROUTING = """
tz: UTC
schedules:
  - id: crew
    layers:
      - {name: all, participants: [anna], rotation: 1d, handoff: "00:00", start: 2020-01-01}
escalation_policies:
  - id: page
    levels: [{receivers: [crew]}, {receivers: [boss], delay: 2s}]
    repeat: 3s
grouping:
  - {subscriber: desk, group_by: [profile], group_wait: 0s, group_interval: 1s}
route:
  receivers: [desk]
  routes:
    - {name: majors, match: [severity=major], escalation: page, continue: true}
    - {name: desk, transitions: [raise, ack, clear]}
"""
PEOPLE = ("anna", "boss", "desk", "owner")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("svc-routing")
    (d / "routing.yaml").write_text(ROUTING)
    with serving(d, "--reorder-seconds", "0.1", "--routing", str(d / "routing.yaml")) as s:
        yield s


r, _admin = client_fixtures()


cli = pytest.fixture(scope="module", name="cli")(alarm_cli)


def alarm_messages(r: redis.Redis) -> list[dict[str, Any]]:
    return [n for n in outbox(r) if "alarm" in n]


def test_routes_escalate_until_acknowledged_and_show_the_next_step(
    svc: Service, r: redis.Redis, cli: typer.Typer, receiver: Receiver
) -> None:
    with svc.client(admin=True) as admin:
        for sub in PEOPLE:
            resp = admin.post(
                "/v1/subscribers",
                json={"id": sub, "channels": [{"webhook": receiver.url}], "secret": SECRET},
            )
            assert resp.status_code in (200, 201), resp.text
    res = run_cli(
        cli, svc.redis_url, "profile", "add", "--id", "win", "--subscriber", "owner",
        "--expr", 'seq(w: kind = "window" and state = "open") per room',
        "--severity", "major", "--clear", "manual", "--notify", "raise,ack,clear",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    with svc.client(rs.add_gateway(r, "gw-routing")) as gw:
        resp = gw.post(
            "/v1/events",
            json=[{"id": "w1", "ts": time.time(), "kind": "window", "state": "open", "room": "7"}],
        )
        assert resp.status_code == 202, resp.text

    def by(sub: str) -> list[dict[str, Any]]:
        return [n for n in alarm_messages(r) if n["subscriber"] == sub]

    # the raise: the desk (a route of its own) and the first level (the crew's anna) at once
    wait_for(lambda: by("desk") and by("anna"), 15, "the raise to the desk and the crew")
    (a,) = als.list_alarms(r)
    occ = f"{a['id']}.{a['occurrence']}"
    shown = run_cli(cli, svc.redis_url, "alarms", "show", a["id"])
    assert shown.exit_code == 0, shown.output
    esc = json.loads(shown.stdout)["escalation"]
    assert esc["policy"] == "page" and esc["occurrence"] == occ
    assert (esc["level"], esc["receivers"]) in ((2, ["boss"]), (1, ["crew"]))
    assert "next escalation: page level" in shown.stderr
    wait_for(lambda: by("boss"), 15, "the second level (boss) 2 s later")
    assert r.zscore(als.ESCALATION_DUE, occ) is not None
    with svc.client(admin=True) as admin:
        detail = admin.get(f"/v1/alarms/{a['id']}").json()
        assert detail["escalation"]["occurrence"] == occ
        assert admin.post(f"/v1/alarms/{a['id']}/ack", json={"note": "mine"}).status_code == 200
        wait_for(lambda: r.zscore(als.ESCALATION_DUE, occ) is None, 15, "the ack stops it")
        assert admin.get(f"/v1/alarms/{a['id']}").json()["escalation"] is None
    wait_for(
        lambda: any(n["alarm"]["notices"][-1]["transition_kind"] == "ack" for n in by("desk")), 15
    )
    steps = [n["id"] for n in alarm_messages(r) if n["alarm"]["message_kind"] == "single"]
    assert not by("owner"), "the route tree decides, not the profile's subscriber"
    assert len(steps) == len(set(steps))
    assert all("@" in s for s in steps)  # a transition's key per subscriber

    with DeliveryWorker(r, fast_config()) as w:
        n = len(alarm_messages(r))
        drive(w, lambda: len(receiver.accepted) >= n, timeout=15)
    assert all(h.valid for h in receiver.hits)
    text = httpx.get(svc.url + "/metrics").text
    assert metric(text, "ens_escalation_steps_total") >= 2


def test_a_group_wait_ends_without_further_events(tmp_path: Path, cli: typer.Typer) -> None:
    """A group's wait (and any alarm deadline) moves engine time by itself: on main, a
    grouped raise stayed in its group until some later event or engine timer came."""
    with serving(tmp_path, "--reorder-seconds", "0.1", "--alarm-group-by", "room",
                 "--alarm-group-wait", "1s") as svc:  # fmt: skip
        r = redis.Redis.from_url(svc.redis_url or "", decode_responses=True)
        with svc.client(admin=True) as admin:
            sub = {"id": "owner", "channels": [{"webhook": "http://127.0.0.1:9/"}]}
            assert admin.post("/v1/subscribers", json=sub).status_code in (200, 201)
        res = run_cli(
            cli, svc.redis_url, "profile", "add", "--id", "g", "--subscriber", "owner",
            "--expr", 'seq(x: kind = "leak") per room', "--severity", "major", "--clear", "manual",
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        with svc.client(rs.add_gateway(r, "gw")) as gw:
            ev = {"id": "l1", "ts": time.time(), "kind": "leak", "room": "7"}
            assert gw.post("/v1/events", json=[ev]).status_code == 202
        wait_for(lambda: als.list_alarms(r), 15, "the alarm")
        (msg,) = wait_for(lambda: alarm_messages(r), 15, "the group's message after its wait")
        assert msg["alarm"]["message_kind"] == "group" and msg["alarm"]["group"] == {"room": "7"}
        r.close()


def test_a_bad_routing_file_stops_the_start_naming_each_place(tmp_path: Path) -> None:
    from ens.cli import app

    bad = tmp_path / "r.yaml"
    bad.write_text(
        "route:\n  receivers: [desk]\n  escalation: nowhere\ngrouping: [{subscriber: a, cap_per_hour: 0}]\n"
    )
    res = CliRunner().invoke(app, ["serve", "--routing", str(bad), "--port", "1"])
    assert res.exit_code == 2, res.output
    assert f"{bad}:3:15: route 'root': escalation: no escalation policy 'nowhere'" in res.output
    assert f"{bad}:4:" in res.output and "cap_per_hour" in res.output
    res = CliRunner().invoke(app, ["serve", "--routing", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2 and "cannot read routing file" in res.output


def test_pending_escalations_carry_over_a_restart_and_go_without_routing(tmp_path: Path) -> None:
    routing = tmp_path / "routing.yaml"
    routing.write_text(
        "escalation_policies: [{id: slow, levels: [{receivers: [boss], delay: 1h}]}]\n"
        "route: {escalation: slow}\n"
    )
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        rs.put_profile(r, "leak", 'seq(x: kind = "leak") per room', alarm={"severity": "major"})
        key = rs.add_gateway(r, "g")
        log = tmp_path / "serve.log"
        svc = Service(url, log, "--reorder-seconds", "0.05", "--routing", str(routing)).start()
        try:
            post_batch(svc, key, [{"id": "l1", "kind": "leak", "room": "1"}], 0.0)
            (occ,) = wait_for(lambda: r.zrange(als.ESCALATION_DUE, 0, -1), 15, "a pending step")
            due = r.zscore(als.ESCALATION_DUE, occ)
            assert svc.stop() == 0
            svc = Service(url, log, "--reorder-seconds", "0.05", "--routing", str(routing)).start()
            assert r.zscore(als.ESCALATION_DUE, occ) == due  # restored, not restarted
            assert svc.stop() == 0
            svc = Service(url, log, "--reorder-seconds", "0.05").start()
            wait_for(lambda: not r.exists(als.ESCALATION_DUE, als.ESCALATIONS), 15, "dropped")
            assert "pending escalation(s) of the last run dropped" in log.read_text()
            assert svc.stop() == 0
        finally:
            svc.kill()
            r.close()


def _schedule(sid: str, who: str) -> str:
    return (
        f"  - {{id: {sid}, layers: [{{name: all, participants: [{who}], rotation: 1d, "
        "handoff: '00:00', start: 2020-01-01}]}\n"
    )


def test_receivers_resolve_stored_schedules_and_their_changes_without_a_restart(
    tmp_path: Path,
) -> None:
    """`ens schedule add` stores `crew`; the routing file names it (and defines `front`, which
    wins over the stored `front`). A change of `crew` reaches the running service."""
    from ens.cli import app

    routing = tmp_path / "routing.yaml"
    routing.write_text(
        "subscribers: [anna, boss, desk]\nschedules:\n"
        + _schedule("front", "desk")
        + "route: {receivers: [crew, front]}\n"
    )
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("schedules:\n" + _schedule("crew", "anna") + _schedule("front", "boss"))
    second.write_text("schedules:\n" + _schedule("crew", "boss"))
    ghost = tmp_path / "ghost.yaml"
    ghost.write_text("subscribers: [desk]\nroute: {receivers: [ghost]}\n")
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        cli = CliRunner(env={rs.ENV_URL: url})
        res = cli.invoke(app, ["schedule", "add", str(first)])
        assert res.exit_code == 0, res.output
        res = cli.invoke(app, ["serve", "--routing", str(ghost), "--port", "1"])
        assert res.exit_code == 2, res.output
        assert "unknown receiver 'ghost': not a schedule (of the file or stored)" in res.output
        rs.put_profile(r, "leak", 'seq(x: kind = "leak") per room', alarm={"severity": "major"})
        key = rs.add_gateway(r, "g")
        log = tmp_path / "serve.log"
        svc = Service(url, log, "--reorder-seconds", "0.05", "--routing", str(routing)).start()
        try:

            def told(seen: set[str]) -> set[str]:
                return {n["subscriber"] for n in alarm_messages(r) if n["id"] not in seen}

            post_batch(svc, key, [{"id": "l1", "kind": "leak", "room": "1"}], 0.0)
            wait_for(lambda: told(set()) >= {"anna", "desk"}, 15, "the raise to crew and front")
            seen = {n["id"] for n in alarm_messages(r)}
            assert told(set()) == {"anna", "desk"}  # the file's `front` (desk), not boss
            assert "routing file's schedules front win over the stored ones" in log.read_text()
            res = cli.invoke(app, ["schedule", "add", str(second), "--replace"])
            assert res.exit_code == 0 and "replaced: schedule crew" in res.output, res.output
            wait_for(lambda: log.read_text().count("stored schedule(s) in use") >= 2, 15)
            post_batch(svc, key, [{"id": "l2", "kind": "leak", "room": "2"}], 0.0)
            wait_for(lambda: told(seen) >= {"boss", "desk"}, 15, "the raise to the new crew")
            assert told(seen) == {"boss", "desk"}
            r.hset(schedule_store.SCHEDULES, "broken", "{")  # hand-edited: left out, logged
            r.xadd(rs.CONTROL, {"op": "schedules"})
            wait_for(lambda: "stored schedule 'broken' cannot be read" in log.read_text(), 15)
            text = httpx.get(svc.url + "/metrics").text
            assert metric(text, "ens_routing_schedule_loads_total") >= 2
            assert svc.stop() == 0
        finally:
            svc.kill()
            r.close()
