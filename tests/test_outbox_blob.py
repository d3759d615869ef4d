"""`OutboxRecord.blob` (what `store.enqueue_many` writes for alarm messages) is the entry's
``n`` field exactly as `OutboxRecord.fields` writes it, checked the same way."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from notifiers.records import OUTBOX_FIELD, OutboxRecord

pytestmark = pytest.mark.fast

REC: dict[str, Any] = {
    "id": "window-open:room=r1.1.1",
    "profile": "window-open",
    "subscriber": None,
    "ts": 1_700_000_000.25,
    "events": {},
    "alarm": {"labels": {"room": "r1", "name": "Fenster ü"}, "count": 1, "notices": [{"a": 1}]},
}


def _as_bytes(v: bytes | str) -> bytes:
    return v if isinstance(v, bytes) else v.encode()


@pytest.mark.parametrize(
    "rec",
    [
        REC,
        {**REC, "events": {"e": {"id": "e1", "ts": 1.0, "n": 2**70}}},  # beyond orjson
        {**REC, "partition": {1: "x"}},  # a non-string key: the standard library writes it
        OrderedDict(REC),  # a Mapping that is not a dict
    ],
)
def test_blob_is_the_field_fields_writes(rec: Any) -> None:
    r = OutboxRecord(rec)
    assert _as_bytes(r.blob()) == _as_bytes(r.fields()[OUTBOX_FIELD])


def test_blob_checks_the_record_first() -> None:
    with pytest.raises(ValueError, match="'id'"):
        OutboxRecord({**REC, "id": ""}).blob()
