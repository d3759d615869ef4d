"""The rules the service's worker and `ens spark stream` share (issue 39 item 4): the gateways'
watermark, the outbox record and its id, feeding one event. Each is one implementation; these
tests run the service's side and Spark's side on the same input (no Redis, no Spark)."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest

from adapters.service.feeding import feed, is_late, log_late
from adapters.service.journal import Journal
from adapters.service.watermarks import Watermarks
from adapters.spark import live
from adapters.spark.watermark import merge_progress, offset_watermark
from filters.engine import Engine
from filters.notification import Notification
from notifiers.records import OutboxRecord, outbox_notification
from profiles.events import Event
from profiles.parser import parse_profile

pytestmark = pytest.mark.fast


def test_spark_and_the_service_release_up_to_the_same_watermark() -> None:
    """Events of three gateways (own latenesses, some idle), read by the service's worker one at
    a time and by Spark's source in micro-batches (each batch's progress merged by the sink):
    the micro-batch's watermark is the service's release bound in whole ms, and the service
    releases exactly the events (stamped in whole ms) at or below it."""
    rnd = random.Random(39)
    for _ in range(300):
        default, idle = rnd.choice([0.0, 0.5, 2.0]), rnd.choice([0.5, 3.0])
        lateness = {g: rnd.choice([None, 0.0, 1.0]) for g in "abc"}
        service = Watermarks(default, idle, 10**6)
        for g, lat in lateness.items():
            service.set_lateness(g, lat)
        progress: dict[str, list[float]] = {}
        wall = 0.0
        stamps = []
        for _batch in range(rnd.randrange(1, 5)):
            seen = Watermarks(0.0, 0.0, 0)  # a source partition's progress (`read_range`)
            for _ in range(rnd.randrange(0, 8)):
                g, ts = rnd.choice("abc"), rnd.randrange(0, 60_000) / 1000
                wall += rnd.uniform(0, 0.5)
                service.observe(g, ts, wall)
                service.hold(g, ts, wall, ts)
                seen.observe(g, ts, wall)
                stamps.append(ts)
            progress = merge_progress(progress, seen.progress())  # the status sink
        now = wall + rnd.uniform(0, 4)
        clock = rnd.choice([None, now])  # --clock wall: the wall clock's floor
        spark = offset_watermark(progress, lateness, default, idle, now, clock)
        floor = float("-inf") if clock is None else now - service.max_active_lateness(now)
        assert spark == (None if not stamps and clock is None else service.bound(now, floor, 1000))
        released = sorted(h.item for h in service.release(now, floor))
        assert released == sorted(ts for ts in stamps if spark is not None and ts <= spark)


def _notification() -> Notification:
    engine = Engine([parse_profile('kind = "A"', "p")])
    engine.process(Event("e1", 10.0, {"kind": "A"}))
    return engine.take_notifications()[0]


def test_the_outbox_record_and_its_id_are_the_services() -> None:
    """A detection gives the same outbox record through the service's journal and through a
    Spark engine (`live.record`), accepted by the outbox; Spark's bare filters give the event
    key for the engine's counter."""
    n = _notification()
    service = Journal.record(SimpleNamespace(live=SimpleNamespace(epoch="E")), n)  # type: ignore[arg-type]
    assert live.record(n, "E") == service == outbox_notification(n, "E")
    assert service["id"] == f"p:E:{n.seq}" and service["events"]["e"]["id"] == "e1"
    OutboxRecord(service).check()
    assert live.record(n, "Es", "1-0.0")["id"] == "p:Es:1-0.0"


def test_a_poison_event_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """`feed`: an event the engine raises on is logged with its traceback and skipped; the
    next one is fed. The late line names the event, its gateway and how far behind it is."""
    engine = Engine([parse_profile('kind = "A"', "p")])
    log = logging.getLogger("ens.test.feeding")

    def process(ev: Event) -> None:
        if ev.id == "bad":
            raise ValueError("poison")
        engine.process(ev)

    assert not feed(process, Event("bad", 1.0, {"kind": "A"}), "gw1", log)
    assert feed(process, Event("ok", 2.0, {"kind": "A"}), "gw1", log)
    assert [n.events["e"].id for n in engine.take_notifications()] == ["ok"]
    assert "engine failed on event bad from gateway gw1; skipped" in caplog.text
    assert "ValueError: poison" in caplog.text
    assert is_late(2.0, 1.5) and not is_late(None, 1.5) and not is_late(2.0, 2.0)
    log_late(log, 2.0, Event("old", 1.5, {}), "gw2", "sent to the late output (not matched)")
    assert (
        "late event old from gateway gw2: ts 1.500 is 0.500 s behind engine time; "
        "sent to the late output (not matched)"
    ) in caplog.text
