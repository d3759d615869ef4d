"""The archive feed: what the engine processed, in its order, for the archiver role.

The engine worker appends the events it fed (key, gateway, late flag, the event) to the stream
``ens:archive:feed`` in the same MULTI/EXEC as the journal entry (or snapshot) that records
those inputs: a crash of the worker neither loses nor duplicates one (inputs after the last
commit are decided again and written by a later commit). The archiver
(`adapters.service.archiver`) reads the stream from the position it committed, writes Parquet
files and trims what it wrote. So the engine never waits for the archive: a slow or stopped
archiver only lengthens the stream (its lag, ``ens_archive_lag_*``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from notifiers.records import VERSION_FIELD, check_version, dumps, encode, text
from notifiers.records import field as entry_field
from profiles.events import Event

FEED = "ens:archive:feed"  # stream: one entry per commit, `b` = its rows
POSITION = "ens:archive:position"  # hash: id (feed entry archived last), seq, flushing
VERSION = 1

Row = tuple[str, str, bool, Event]  # ingest key, gateway, late, event


@dataclass
class ArchiverConfig:
    """The archiver's view of `ServiceSettings` (`adapters.service.server`)."""

    uri: str
    flush: float = 10.0  # s: write a file at least this often while events come
    max_rows: int = 100_000  # ... or once this many wait
    retention: float | None = None  # s of event time; None: kept for ever
    max_bytes: int = 0  # the archive's size bound (0: none)
    prune_every: float = 60.0  # s
    block: float = 0.5  # s: longest wait for the feed
    poll: float = 0.5  # s: while events wait for a flush, read the feed this often


class FeedBuffer:
    """The events fed since the last commit, as the feed entry's columns: each event's JSON
    text is made when it is fed, so the buffer holds strings and numbers in a few lists, not
    the events themselves (they are freed at once; no object per event for the collector)."""

    __slots__ = ("texts", "keys", "gateways", "lates", "ids", "ts")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.texts: list[str] = []
        self.keys: list[str] = []
        self.gateways: list[str] = []
        self.lates: list[int] = []
        self.ids: list[str] = []
        self.ts: list[float] = []

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: str, gateway: str, late: bool, ev: Event) -> None:
        self.texts.append(encode(ev.to_json())[0])
        self.keys.append(key)
        self.gateways.append(gateway)
        self.lates.append(1 if late else 0)
        self.ids.append(ev.id)
        self.ts.append(ev.ts)

    def fields(self) -> dict[str, str]:
        """One feed entry: ``ev`` = the events' JSON texts, one a line (as `ens replay` reads
        them; a JSON text holds no raw line break), stored by the archiver as they are; ``m``
        = JSON columns ``{"k": keys, "g": gateways, "l": late flags (0/1), "i": ids, "t":
        ts}``. Lines and columns, not one JSON document of rows: reading them takes a split
        and a short parse, not a second unescaping of every event."""
        meta = {"k": self.keys, "g": self.gateways, "l": self.lates, "i": self.ids, "t": self.ts}
        return {"ev": "\n".join(self.texts), "m": dumps(meta), VERSION_FIELD: str(VERSION)}


def feed_fields(rows: list[Row]) -> dict[str, str]:
    """The feed entry of ``rows`` (`FeedBuffer.fields`)."""
    buf = FeedBuffer()
    for key, gw, late, ev in rows:
        buf.add(key, gw, late, ev)
    return buf.fields()


def read_feed_entry(fields: Mapping[Any, Any]) -> dict[str, list[Any]]:
    """The columns of a feed entry: ``key``, ``gateway``, ``late``, ``id``, ``ts``, ``event``
    (`adapters.archive.layout.SCHEMA`'s names; ``late`` as 0/1)."""
    check_version(fields, "archive feed entry", VERSION)
    meta = orjson.loads(entry_field(fields, "m"))
    raw = entry_field(fields, "ev")
    events = text(raw).split("\n") if raw else []
    return {
        "key": meta["k"],
        "gateway": meta["g"],
        "late": meta["l"],
        "id": meta["i"],
        "ts": meta["t"],
        "event": events,
    }


def lag(r: redis.Redis) -> tuple[int, float]:
    """(feed entries not archived yet, age in s of the oldest of them)."""
    pos: Any = r.hget(POSITION, "id")
    start = "(" + text(pos) if pos else "-"
    n = int(r.xlen(FEED))  # type: ignore[arg-type]
    first: Any = r.xrange(FEED, min=start, count=1)
    if not first:
        return 0, 0.0
    ms = int(text(first[0][0]).split("-", 1)[0])
    return n, max(time.time() - ms / 1000, 0.0)
