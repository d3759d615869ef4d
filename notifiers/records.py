"""The records the delivery side keeps in Redis, typed and versioned: outbox and dead letters.

They cross processes (the engine worker writes the outbox, the delivery workers and
`ens notifications` read it) and restarts (a dead letter waits for `retry`), so each has one
model here that both the writer and the reader use. Each stream entry carries ``ver`` (the
record's version); an entry without it was written before versions existed and has the
layout of version 1. A reader refuses a version newer than it knows, naming both.

The notification itself stays a plain JSON object: it is what webhooks and e-mails carry, so
the version is a field of the stream entry, never a key of the notification.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

if TYPE_CHECKING:
    from filters.notification import Notification

VERSION_FIELD = "ver"
OUTBOX_FIELD = "n"

# A stream entry's fields as written (str -> str; Any so redis-py's XADD signature takes them)
Fields = dict[Any, Any]


def text(value: Any) -> Any:
    """Decode bytes from a client made without ``decode_responses`` (the service may pass one)."""
    return value.decode() if isinstance(value, bytes) else value


def owned(b: bytes) -> bytes:
    """An exact-size copy of orjson's output, for output kept by the thousands (a commit's
    alarm messages, history entries, index records). orjson writes into a 1 KB buffer it then
    shrinks in place: kept, each leaves the rest of its 1 KB unused, so such a commit grows the
    heap by ~1 KB per entry, which is given back and faulted in again at every commit; on a
    VM whose freed pages go back to the host (a Firecracker guest with free page reporting,
    where this was measured) that was ~5 µs per entry, 3-4 times the serialising. The copy
    lets orjson's buffer go at once, to be reused by the next entry."""
    return bytes(memoryview(b))


def dumps(obj: Any) -> str:
    """Compact JSON, the one encoding used for every value this contract stores."""
    return encode(obj)[0]


def encode(obj: Any) -> tuple[str, bool]:
    """`dumps`, and whether orjson wrote it (then orjson also reads it back exactly).

    orjson writes the same compact UTF-8 JSON ~5x faster (the engine worker encodes every
    notification, the API every event); the standard library takes what orjson refuses
    (integers beyond 64 bits, non-string keys).
    """
    try:
        return orjson.dumps(obj).decode(), True
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False), False


def field(fields: Mapping[Any, Any], name: str) -> Any:
    """A stream entry's field, whether the client decoded the keys (str) or not (bytes)."""
    v = fields.get(name)
    return fields.get(name.encode()) if v is None else v


def check_version(fields: Mapping[Any, Any], what: str, current: int) -> int:
    """The ``ver`` of an entry (1 when absent: written before versions); ValueError if newer."""
    raw = field(fields, VERSION_FIELD)
    if raw is None:
        return 1
    try:
        ver = int(text(raw))
    except ValueError:
        raise ValueError(f"{what} version {text(raw)!r} is not a number") from None
    if ver > current:
        raise ValueError(
            f"{what} version {ver} was written by a newer ENS (this one reads up to {current})"
        )
    return ver


def outbox_notification(n: Notification, epoch: str, seq: object = None) -> dict[str, Any]:
    """The notification an engine's detection puts in the outbox (`OutboxRecord`), written by
    the service's worker and by `ens spark stream` alike.

    Its id ``f"{profile}:{epoch}:{seq}"`` is unique and the same when the detection is made
    again (a journal replay, a re-executed micro-batch), so a rewrite is recognised: ``epoch``
    names the engine's run (the service's checkpoint epoch; Spark's query epoch and route),
    ``seq`` is the engine's detection counter, or what the caller gives (Spark's bare
    filters: the event key).
    """
    return {
        "id": f"{n.profile}:{epoch}:{n.seq if seq is None else seq}",
        **n.to_detail(),
        "subscriber": n.subscriber,
    }


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~2x (one per commit, notification)
class OutboxRecord:
    """One ``ens:outbox`` entry: a notification to deliver (``n``) and the entry's version.

    ``notification`` = {"id": str (unique), "profile": str, "subscriber": str | None,
    "ts": float, "events": {name: {"id", "ts", ...attributes}}, "partition": {...} (optional)}
    — e.g. ``{"id": nid, **Notification.to_detail()}``.
    """

    VERSION: ClassVar[int] = 1
    notification: Mapping[str, Any]

    @property
    def id(self) -> str:
        return str(self.notification["id"])

    @property
    def subscriber(self) -> str | None:
        return self.notification.get("subscriber")

    def check(self) -> None:
        """What a writer must guarantee (ValueError naming the first key that is wrong)."""
        n = self.notification
        nid = n.get("id")
        if not isinstance(nid, str) or not nid:
            raise ValueError("a notification needs a non-empty string 'id'")
        if not isinstance(n.get("profile"), str):
            raise ValueError("a notification needs a string 'profile'")
        if not isinstance(n.get("ts"), (int, float)) or isinstance(n.get("ts"), bool):
            raise ValueError("a notification needs a numeric 'ts' (epoch seconds)")
        if not isinstance(n.get("events"), Mapping):
            raise ValueError("a notification needs an 'events' object")
        sub = n.get("subscriber")
        if sub is not None and not isinstance(sub, str):
            raise ValueError("'subscriber' must be a string or null")

    def fields(self, checked: bool = True) -> Fields:
        """The stream entry, checked first: nothing malformed enters the outbox (``checked=False``
        only to put back what was read from it, e.g. a dead letter retried as it was)."""
        if checked:
            self.check()
        return {OUTBOX_FIELD: dumps(dict(self.notification)), VERSION_FIELD: str(self.VERSION)}

    def blob(self) -> bytes | str:
        """The checked entry's ``n`` field as `fields` writes it, as UTF-8 bytes when orjson
        writes it (the same bytes Redis stores: no dict copy, no str to decode and encode
        again, ~5 µs of a 1 KB alarm message)."""
        self.check()
        n = self.notification
        if n.__class__ is dict:
            try:
                return owned(orjson.dumps(n))  # kept until the commit: `owned`
            except TypeError:  # beyond orjson (a huge integer, a non-string key)
                pass
        return dumps(dict(n))

    @classmethod
    def read(cls, fields: Mapping[Any, Any]) -> OutboxRecord:
        """The record of a stream entry; ValueError when it cannot be delivered.

        A reader asks only for what delivery needs (an object with a string id), so entries
        written by an older writer with fewer checks are still delivered.
        """
        check_version(fields, "outbox entry", cls.VERSION)
        raw = text(field(fields, OUTBOX_FIELD))
        n = json.loads(raw) if raw else None
        if not isinstance(n, dict) or not isinstance(n.get("id"), str):
            raise ValueError("not a notification object with a string id")
        return cls(n)


@dataclass(slots=True)
class DeadLetter:
    """One ``ens:deadletter`` entry. ``ch`` is -1 when no channel could be resolved.

    ``entry`` is the dead letter's own stream id (empty before it is written); ``channel`` has
    no secret (`notifiers.store.redact`).
    """

    VERSION: ClassVar[int] = 1
    entry: str
    notification: dict[str, Any]
    channel: dict[str, Any]
    ch: int
    nch: int
    outbox_entry: str
    error: str
    attempts: int
    ts: float

    @property
    def nid(self) -> str:
        return str(self.notification.get("id", ""))

    def fields(self) -> Fields:
        return {
            "n": dumps(dict(self.notification)),
            "channel": dumps(dict(self.channel)),
            "error": self.error,
            "attempts": str(self.attempts),
            "ts": repr(self.ts),
            "ch": str(self.ch),
            "nch": str(self.nch),
            "entry": self.outbox_entry,
            VERSION_FIELD: str(self.VERSION),
        }

    @classmethod
    def new(
        cls,
        n: Mapping[str, Any],
        channel: Mapping[str, Any],
        ch: int,
        nch: int,
        outbox_entry: str,
        error: str,
        attempts: int,
    ) -> DeadLetter:
        """A dead letter about to be written (now)."""
        return cls("", dict(n), dict(channel), ch, nch, outbox_entry, error, attempts, time.time())

    @classmethod
    def read(cls, entry: str, raw: Mapping[Any, Any]) -> DeadLetter:
        f = {text(k): text(v) for k, v in raw.items()}
        check_version(f, "dead letter", cls.VERSION)
        return cls(
            entry=entry,
            notification=json.loads(f.get("n", "{}")),
            channel=json.loads(f.get("channel", "{}")),
            ch=int(f.get("ch", -1)),
            nch=int(f.get("nch", 0)),
            outbox_entry=f.get("entry", ""),
            error=f.get("error", ""),
            attempts=int(f.get("attempts", 0)),
            ts=float(f.get("ts", 0)),
        )
