"""Alarms in the engine worker, in-process against a real redis-server: the alarm step is
committed with the journal entry that produced it, restored from the checkpoint and rebuilt
by the journal replay without writing anything twice (docs/alarms.md, "The service")."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from adapters.service.worker import EngineWorker
from tests.helpers_service import outbox, worker_config
from tests.test_service_worker import drain, ingest

pytestmark = pytest.mark.redis

T0 = 1_700_000_000.0
WINDOW = 'kind = "window" and state = "open"'
ALARM = {"severity": "major", "clear": {"on": 'kind = "window" and state = "closed"'}}


def config(**kw: Any) -> Any:
    return worker_config(**{"reorder_seconds": 0.0, "batch": 50, "commit_min_interval": 0, **kw})


def window(i: int, room: str, state: str = "open", dt: float = 0.0) -> dict[str, Any]:
    return {"id": f"e{i}", "ts": T0 + i + dt, "kind": "window", "state": state, "room": room}


def history(rt: redis.Redis) -> list[dict[str, Any]]:
    return als.history(rt)


def alarm_messages(rt: redis.Redis) -> list[dict[str, Any]]:
    return [n for n in outbox(rt) if "alarm" in n]


def command(
    w: EngineWorker, rt: redis.Redis, clock: list[float], op: str, **args: Any
) -> dict[str, Any]:
    eid = als.post_command(rt, op, args)
    drain(w, clock)
    return als.wait_reply(rt, eid, timeout=1)


def test_raise_repeat_clear_ack_with_outbox_history_and_index(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    rs.put_profile(rt, "plain", 'kind = "door"')  # no alarm: as before
    rs.put_profile(rt, "win", f"seq(w: {WINDOW}) per room", alarm=ALARM)
    w = EngineWorker(rb, config())
    w.start()
    clock = [time.time()]
    ingest(rb, [window(1, "101"), window(2, "101"), {"id": "d", "ts": T0 + 3, "kind": "door"}])
    ingest(rb, [window(4, "102"), window(5, "101", "closed")])
    drain(w, clock)
    plain = [n for n in outbox(rt) if n["profile"] == "plain"]
    assert len(plain) == 1 and "alarm" not in plain[0]  # a profile without alarm: as before
    msgs = alarm_messages(rt)
    kinds = [(m["alarm"]["transition_kind"], m["alarm"]["labels"]["room"]) for m in msgs]
    assert kinds == [("raise", "101"), ("raise", "102"), ("clear", "101")]  # repeat: not notified
    first = msgs[0]
    assert first["id"] == first["alarm"]["transition"]  # the Idempotency-Key, per transition
    assert first["alarm"]["severity"] == "major" and first["alarm"]["count"] == 1
    aid = first["alarm"]["alarm"]
    assert first["alarm"]["acknowledge"] == {
        "command": f"ens alarms ack {aid}",
        "http": f"POST /v1/alarms/{aid}/ack",
    }
    assert not [n for n in outbox(rt) if n["profile"].startswith("win") and "alarm" not in n]
    assert [t["kind"] for t in history(rt)] == ["raise", "repeat", "raise", "clear"]
    rec = als.get_alarm(rt, aid)
    assert rec is not None and rec["state"] == "cleared-unacknowledged" and rec["count"] == 2
    listed = als.list_alarms(rt, matchers=als.parse_matchers(["room=102"]))
    assert [a["labels"]["room"] for a in listed] == ["102"]

    got = command(w, rt, clock, "ack", id=aid, actor="ann", note="seen")
    assert got["status"] == 200 and got["alarm"]["state"] == "cleared-acknowledged"
    again = command(w, rt, clock, "ack", id=aid, actor="ann")
    assert again["status"] == 409 and again["state"] == "cleared-acknowledged"
    assert command(w, rt, clock, "ack", id="anope", actor="ann")["status"] == 404
    other = listed[0]["id"]
    cleared = command(w, rt, clock, "clear", id=other, actor="bob", reason="fixed")
    assert cleared["status"] == 200 and cleared["alarm"]["state"] == "cleared-unacknowledged"
    assert command(w, rt, clock, "clear", id=other, actor="bob", reason="x")["status"] == 409
    assert [t["kind"] for t in history(rt)][-2:] == ["ack", "clear"]
    assert history(rt)[-2]["actor"] == "ann"


def test_crash_replays_alarm_steps_without_writing_twice(rb: redis.Redis, rt: redis.Redis) -> None:
    rs.put_profile(rt, "win", f"seq(w: {WINDOW}) per room", alarm=ALARM)
    a = EngineWorker(rb, config())
    a.start()
    clock = [time.time()]
    ingest(rb, [window(1, "101"), window(2, "102")])
    drain(a, clock)
    a.snapshot()
    ingest(rb, [window(3, "101", "closed"), window(4, "103")])
    drain(a, clock)  # committed, journalled: not in the snapshot
    eid = als.post_command(rt, "ack", {"id": json.loads(rt.hvals(als.ALARMS)[0])["id"]})
    drain(a, clock)
    assert als.wait_reply(rt, eid, 1)["status"] == 200
    ingest(rb, [window(5, "104")])
    clock[0] += 0.01
    a.step(block=0, now=clock[0])  # read, maybe fed: not committed if the crash comes first
    before = (history(rt), alarm_messages(rt))
    rb.delete(rs.ENGINE_LOCK)  # kill -9

    b = EngineWorker(rb, config(name="w2"))
    b.start()
    drain(b, clock)
    b.snapshot()
    hist, msgs = history(rt), alarm_messages(rt)
    assert hist[: len(before[0])] == before[0]
    assert len({t["id"] for t in hist}) == len(hist)  # none twice
    assert len({m["id"] for m in msgs}) == len(msgs)
    assert [t["labels"]["room"] for t in hist if t["kind"] == "raise"] == [
        "101", "102", "103", "104"
    ]  # fmt: skip
    # the restarted worker knows what the first one acknowledged
    states = sorted(a["state"] for a in als.list_alarms(rt))
    assert states.count("cleared-acknowledged") + states.count("active-acknowledged") == 1
    assert rb.xlen(rs.JOURNAL) == 0

    # a third start from the snapshot alone gives the same rules state
    rb.delete(rs.ENGINE_LOCK)
    c = EngineWorker(rb, config(name="w3"))
    c.start()
    assert c.alarms.rules.snapshot()["alarms"] == b.alarms.rules.snapshot()["alarms"]


def test_clear_after_by_engine_time_and_silence(rb: redis.Redis, rt: redis.Redis) -> None:
    rs.put_profile(
        rt, "win", f"seq(w: {WINDOW}) per room", alarm={"severity": "minor", "clear": "after 10s"}
    )
    w = EngineWorker(rb, config())
    w.start()
    clock = [time.time()]
    ingest(rb, [window(1, "101")])
    drain(w, clock)
    got = command(w, rt, clock, "silence", silence={"matchers": ["room=102"], "for": "1h"})
    assert got["status"] == 200 and got["silence"]["id"] == "s1"
    assert json.loads(rt.hget(als.SILENCES, "s1"))["matchers"] == ["room=102"]
    ingest(rb, [window(2, "102"), {"id": "tick", "ts": T0 + 30, "kind": "tick"}])
    drain(w, clock)
    hist = history(rt)
    assert [(t["kind"], t["labels"]["room"], t["delivery"]) for t in hist] == [
        ("raise", "101", "sent"),
        ("raise", "102", "silenced"),
        ("clear", "101", "sent"),
        ("clear", "102", "silenced"),
    ]
    assert hist[2]["ts"] == T0 + 11  # 10 s of engine time after the last match
    rooms = [m["alarm"]["labels"]["room"] for m in alarm_messages(rt)]
    assert rooms == ["101", "101"]
    bad = command(w, rt, clock, "silence", silence={"matchers": ["room=~("], "for": "1h"})
    assert bad["status"] == 422 and bad["field"] == "matchers"
    assert rt.hlen(als.SILENCES) == 1
    assert command(w, rt, clock, "expire", id="s9")["status"] == 404
    assert command(w, rt, clock, "expire", id="s1")["status"] == 200
    assert json.loads(rt.hget(als.SILENCES, "s1"))["expired_at"] is not None


def test_grouping_by_building_folds_raises_into_one_message(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    from notifiers.alarms import GroupPolicy

    rs.put_profile(rt, "win", f"seq(w: {WINDOW}) per building, room", alarm=ALARM)
    w = EngineWorker(rb, config(alarm_policy=GroupPolicy(("building",), 30.0, 300.0)))
    w.start()
    clock = [time.time()]
    evs = [{**window(i, f"{i}"), "building": "A" if i < 4 else "B"} for i in range(1, 6)]
    ingest(rb, evs)
    drain(w, clock)
    assert alarm_messages(rt) == []  # waiting for group_wait (engine time)
    ingest(rb, [{"id": "tick", "ts": T0 + 60, "kind": "tick"}])
    drain(w, clock)
    msgs = alarm_messages(rt)
    groups = sorted((m["alarm"]["group"]["building"], len(m["alarm"]["notices"])) for m in msgs)
    assert groups == [("A", 3), ("B", 2)]
    assert all(m["alarm"]["message_kind"] == "group" and m["id"].startswith("msg:") for m in msgs)
    assert len(history(rt)) == 5


def test_commands_without_a_worker_and_across_a_crash_apply_once(
    rb: redis.Redis, rt: redis.Redis
) -> None:
    """No worker reading: the sender gets WorkerUnavailable, and the command is applied when
    one reads it; a command read but not committed when the worker dies is read again by its
    successor and applied once (one reply, one history entry); one older than
    COMMAND_MAX_AGE is not applied."""
    rs.put_profile(rt, "win", f"seq(w: {WINDOW}) per room", alarm=ALARM)
    a = EngineWorker(rb, config())
    a.start()
    clock = [time.time()]
    ingest(rb, [window(1, "101"), window(2, "102")])
    drain(a, clock)
    ids = {x["labels"]["room"]: x["id"] for x in als.list_alarms(rt)}
    with pytest.raises(als.WorkerUnavailable):
        als.send_command(rt, "ack", {"id": ids["101"], "actor": "ann"}, timeout=1)
    drain(a, clock)  # read now: applied
    assert als.get_alarm(rt, ids["101"])["state"] == "active-acknowledged"  # type: ignore[index]

    eid = als.post_command(rt, "ack", {"id": ids["102"], "actor": "bob"})
    stale = {"op": "clear", "at": time.time() - als.COMMAND_MAX_AGE - 60, "id": ids["101"]}
    old = rt.xadd(als.CONTROL, {"c": json.dumps({**stale, "reason": "x"})})
    a.control.poll()  # read, not committed: then kill -9
    assert [c[0] for c in a.alarms.alarm_cmds] == [eid]
    rb.delete(rs.ENGINE_LOCK)
    b = EngineWorker(rb, config(name="w2"))
    b.start()
    drain(b, clock)
    assert als.wait_reply(rt, eid, 1)["status"] == 200
    assert rt.llen(als.REPLY + eid) == 0 and not rt.exists(als.REPLY + str(old))
    acks = [t for t in history(rt) if t["kind"] == "ack"]
    assert [t["actor"] for t in acks] == ["ann", "bob"]
    assert als.get_alarm(rt, ids["101"])["state"] == "active-acknowledged"  # type: ignore[index]


def test_repeats_of_one_commit_are_one_history_entry(rb: redis.Redis, rt: redis.Redis) -> None:
    """Consecutive repeats of an alarm in one commit: one history entry with ``repeats`` and
    ``since``, standing for every repeat id (docs/alarms.md, "History"); a clear ends the run,
    and the next commit's repeats are an entry of their own."""
    rs.put_profile(rt, "win", f"seq(w: {WINDOW}) per room", alarm=ALARM)
    w = EngineWorker(rb, config())
    w.start()
    clock = [time.time()]
    ingest(rb, [window(i, "101") for i in range(1, 6)] + [window(6, "102"), window(7, "101")])
    drain(w, clock)
    ingest(rb, [window(8, "101"), window(9, "101"), window(10, "101", "closed")])
    drain(w, clock)
    got = [(t["labels"]["room"], t["kind"], t.get("repeats", 1)) for t in history(rt)]
    assert got == [
        ("101", "raise", 1),
        ("102", "raise", 1),
        ("101", "repeat", 5),  # e2-e5 and e7, at the last one's place
        ("101", "repeat", 2),
        ("101", "clear", 1),
    ]
    run = history(rt)[2]
    assert run["since"] == T0 + 2 and run["last_seen"] == T0 + 7 and run["count"] == 6
    aid = run["alarm"]
    ids = [i for t in history(rt) if t["alarm"] == aid for i in als.transition_ids(t)]
    assert ids == [f"{aid}.1.{n}" for n in range(1, 10)]  # every transition, once, in order
    rec = als.get_alarm(rt, aid)
    assert rec is not None and rec["count"] == 8
