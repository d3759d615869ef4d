"""The late side output: events the engine worker could no longer feed in ``ts`` order.

An event whose ``ts`` is older than the engine's time when the worker reads it would be
matched against state that already holds later events (and timers that already fired): a
``b`` an hour old completing ``seq(a, b)`` after a fresh ``a``, a ``close`` an hour old
suppressing a "door left open" alarm. As in Flink and Beam, such an event is not fed: the
worker writes it to the bounded stream ``ens:late`` (this module's record) in the same
MULTI/EXEC as the journal entry that records the decision, so a crash neither loses nor
duplicates one. ``ens notifications late list|export`` and ``GET /v1/late-events`` read it; the
export is JSON lines that ``ens replay`` reads (each event as the engine would have had it: its
``id``, ``ts``, attributes and ``gateway`` stamp), so it can be matched offline in its place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import redis

from notifiers.records import VERSION_FIELD, Fields, check_version, dumps, text
from notifiers.records import field as entry_field
from profiles.events import Event

LATE = "ens:late"  # stream; one entry per late event (`LateRecord`), MAXLEN ~ --late-max


@dataclass(slots=True)
class LateRecord:
    """One ``ens:late`` entry: the event (as `ens replay` reads it), its gateway, its ingest
    key (its identity in the journal) and how far behind the engine's time it was."""

    VERSION: ClassVar[int] = 1
    event: dict[str, Any]  # {"id", "ts", **attrs}: `Event.to_json`
    gateway: str
    key: str
    behind: float  # engine time minus the event's ts when it was read (s)
    entry: str = ""  # the stream entry id (set when read back)

    @classmethod
    def of(cls, ev: Event, key: str, gateway: str, engine_now: float) -> LateRecord:
        return cls(ev.to_json(), gateway, key, round(engine_now - ev.ts, 6))

    def fields(self) -> Fields:
        return {
            "ev": dumps(self.event),
            "g": self.gateway,
            "k": self.key,
            "behind": repr(self.behind),
            VERSION_FIELD: str(self.VERSION),
        }

    @classmethod
    def read(cls, entry: str, fields: Mapping[Any, Any]) -> LateRecord:
        check_version(fields, "late event record", cls.VERSION)
        return cls(
            json.loads(entry_field(fields, "ev")),  # the standard library: big integers stay exact
            text(entry_field(fields, "g")),
            text(entry_field(fields, "k")),
            float(text(entry_field(fields, "behind"))),
            entry,
        )

    @property
    def written(self) -> float:
        """When the worker committed it (epoch seconds, from the stream entry id)."""
        return int(self.entry.split("-", 1)[0]) / 1000 if self.entry else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "gateway": self.gateway,
            "key": self.key,
            "behind": self.behind,
            "written": self.written,
            "event": self.event,
        }


def add(pipe: Any, records: list[LateRecord], maxlen: int) -> None:
    """XADD ``records`` to ``ens:late`` in the caller's transaction, trimmed to about
    ``maxlen`` entries (approximate trimming: whole radix-tree nodes, cheap)."""
    for rec in records:
        pipe.xadd(LATE, rec.fields(), maxlen=maxlen, approximate=True)


def list_late(
    r: redis.Redis, gateway: str | None = None, limit: int | None = None
) -> tuple[list[LateRecord], bool]:
    """The newest ``limit`` late events (of ``gateway`` if given), oldest first, and whether
    more matched than were returned."""
    out: list[LateRecord] = []
    more = False
    last = "+"
    while True:
        entries: Any = r.xrevrange(LATE, max=last, count=1000)
        if not entries:
            break
        for eid, fields in entries:
            rec = LateRecord.read(text(eid), fields)
            if gateway is not None and rec.gateway != gateway:
                continue
            if limit is not None and len(out) >= limit:
                more = True
                break
            out.append(rec)
        if more or len(entries) < 1000:
            break
        last = "(" + text(entries[-1][0])
    out.reverse()
    return out, more
