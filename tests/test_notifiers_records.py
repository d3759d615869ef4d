"""Outbox entries and dead letters: one model each (`notifiers.records`), and what the previous
release wrote (no ``ver``: the golden entries below, copied from its layout) is still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notifiers import store
from notifiers.records import VERSION_FIELD, DeadLetter, OutboxRecord
from tests.helpers_notifiers import notification, redis_server

pytestmark = pytest.mark.redis

# An outbox entry as the release before versions wrote it: only ``n``
GOLDEN_OUTBOX_V1 = {
    "n": '{"id":"p4:1:1","profile":"p4","ts":1709331005.0,"events":{"a":{"id":"e1","ts":'
    '1709330990.0,"kind":"door","room":"101"}},"partition":{"room":"101"},"subscriber":"s1"}',
}
# A dead letter as that release wrote it (store.dead_letter_fields): no ``ver``
GOLDEN_DEAD_LETTER_V1 = {
    "n": '{"id":"p4:1:1","profile":"p4","ts":1709331005.0,"events":{},"subscriber":"s1"}',
    "channel": '{"webhook":"http://127.0.0.1:9/hook"}',
    "error": "HTTP 500",
    "attempts": "5",
    "ts": "1709331100.25",
    "ch": "0",
    "nch": "2",
    "entry": "1709331005000-0",
}


@pytest.mark.parametrize("as_bytes", [False, True])
def test_outbox_reads_the_previous_release(as_bytes: bool) -> None:
    fields = (
        {k.encode(): v.encode() for k, v in GOLDEN_OUTBOX_V1.items()}
        if as_bytes
        else GOLDEN_OUTBOX_V1
    )
    rec = OutboxRecord.read(fields)
    assert rec.id == "p4:1:1" and rec.subscriber == "s1"
    assert rec.notification == json.loads(GOLDEN_OUTBOX_V1["n"])


def test_outbox_round_trip_carries_a_version_outside_the_notification() -> None:
    n = notification("n1")
    fields = OutboxRecord(n).fields()
    assert fields[VERSION_FIELD] == str(OutboxRecord.VERSION)
    assert "ver" not in json.loads(fields["n"])  # webhooks and e-mails carry the notification
    assert OutboxRecord.read(fields).notification == n


def test_outbox_refuses_a_newer_version_and_a_malformed_entry() -> None:
    fields = {**OutboxRecord(notification("n1")).fields(), VERSION_FIELD: "99"}
    with pytest.raises(ValueError, match="outbox entry version 99 was written by a newer ENS"):
        OutboxRecord.read(fields)
    with pytest.raises(ValueError, match="string id"):
        OutboxRecord.read({"n": '{"profile": "p"}'})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": ""}, "non-empty string 'id'"),
        ({"profile": 3}, "string 'profile'"),
        ({"ts": True}, "numeric 'ts'"),
        ({"events": []}, "'events' object"),
        ({"subscriber": 5}, "'subscriber' must be a string or null"),
    ],
)
def test_outbox_writer_refuses_what_cannot_be_delivered(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutboxRecord({**notification("n1"), **change}).fields()


def test_dead_letter_reads_the_previous_release_and_round_trips() -> None:
    dl = DeadLetter.read("1709331100250-0", GOLDEN_DEAD_LETTER_V1)
    assert (dl.entry, dl.nid, dl.ch, dl.nch, dl.attempts, dl.ts, dl.error, dl.outbox_entry) == (
        "1709331100250-0",
        "p4:1:1",
        0,
        2,
        5,
        1709331100.25,
        "HTTP 500",
        "1709331005000-0",
    )
    assert dl.channel == {"webhook": "http://127.0.0.1:9/hook"}
    fields = dl.fields()
    assert fields[VERSION_FIELD] == "1"
    assert {k: v for k, v in fields.items() if k != VERSION_FIELD} == GOLDEN_DEAD_LETTER_V1
    with pytest.raises(ValueError, match="dead letter version 2 was written by a newer ENS"):
        DeadLetter.read("1-0", {**fields, VERSION_FIELD: "2"})


def test_golden_entries_in_redis_are_read_retried_and_delivered_by_todays_code(
    tmp_path: Path,
) -> None:
    """Entries of the previous layout in a real Redis: listed, retried (back to the outbox with
    a version), and the outbox entry is read by the delivery worker's reader."""
    with redis_server(tmp_path) as r:
        r.xadd(store.DEADLETTER, {**GOLDEN_DEAD_LETTER_V1, "ch": "-1"})
        (dl,) = store.list_dead_letters(r)
        assert dl.nid == "p4:1:1" and dl.ch == -1
        assert store.retry_dead_letters(r) == 1
        ((_, fields),) = r.xrange(store.OUTBOX)
        assert fields[VERSION_FIELD] == "1"
        assert OutboxRecord.read(fields).notification == dl.notification
        eid = store.enqueue(r, notification("n2"))
        assert OutboxRecord.read(dict(r.xrange(store.OUTBOX, eid, eid)[0][1])).id == "n2"
