"""The records the engine side keeps in Redis, typed and versioned: ingest entries, journal
entries and their operations, checkpoint metadata.

They cross processes (the API writes ingest entries the engine worker reads; `ens spark
stream` reads them too) and restarts (the journal and the checkpoint are what a restarted
worker resumes from), so each has one model here used by the writer and the reader. Stream
entries carry ``ver`` (`notifiers.records.VERSION_FIELD`); an entry without it was written
before versions existed and has the layout of version 1. Readers refuse newer versions by name.

The hot paths stay cheap: an ingest entry is decoded once per request, journal operations
are written as short JSON lists (``["e", key]``) and typed only when a restart replays them.
The engine's own snapshot bytes are `filters.engine`'s format, not defined here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import orjson

from notifiers.records import VERSION_FIELD, Fields, check_version, dumps, text
from notifiers.records import field as entry_field

# ----------------------------------------------------------------------------- ingest

INGEST_EVENT = "e"  # oldest layout: one event per entry
INGEST_BATCH = "b"  # a JSON array: the validated events of one request
INGEST_GATEWAY = "g"
# v: how the events of a batch entry are written. "n": normalized by the API (validated, ts in
# epoch seconds, no nulls) and safe for orjson; "x": normalized, but with an integer beyond 64
# bits (read with the standard library, which keeps it exact). Absent: as received (older
# entries), validated again by the reader.
INGEST_FORMAT = "v"
INGEST_NORMALIZED = "n"
INGEST_EXACT = "x"
INGEST_VERSION = 1
# The attribute every event of an entry carries: the entry's gateway, i.e. the one whose API key
# wrote it. Stamped by `decode_ingest` over whatever the body said, so a profile on
# ``gateway = "gwB"`` matches gwB's events only (the API refuses an event that sets another).
GATEWAY_ATTR = "gateway"


# One event of an ingest entry: (key, gateway, decoded JSON object, not validated here). The
# key is its identity in the journal (and its id when it has none). A plain tuple: one is made
# per event, and a NamedTuple costs ~10x as much to build.
IngestEvent = tuple[str, str, Any]


def ingest_fields(gateway: str, batch_json: str, exact: bool) -> Fields:
    """The entry the API writes for one request (`INGEST_SCRIPT` writes the same fields)."""
    return {
        INGEST_BATCH: batch_json,
        INGEST_GATEWAY: gateway,
        INGEST_FORMAT: INGEST_EXACT if exact else INGEST_NORMALIZED,
        VERSION_FIELD: str(INGEST_VERSION),
    }


def decode_ingest(entry_id: str, fields: Mapping[Any, Any]) -> list[IngestEvent]:
    """The events of one ``ens:ingest`` entry.

    ``f"{entry_id}.{i}"`` keys event ``i`` of a batch entry (``b``), ``entry_id`` the event of
    a one-event entry (``e``). ``fields`` may have bytes or str keys (any redis client).
    Each event object gets the entry's gateway as `GATEWAY_ATTR` (not in an entry without one,
    which no version of the API writes). Raises ValueError when the entry is unreadable (or of
    a newer version).
    """
    check_version(fields, "ingest entry", INGEST_VERSION)
    gw = text(entry_field(fields, INGEST_GATEWAY) or "?")
    batch = entry_field(fields, INGEST_BATCH)
    if batch is not None:
        fmt = entry_field(fields, INGEST_FORMAT)
        # orjson is ~2.5x faster but reads an integer beyond 64 bits as a float: only for
        # batches the API wrote without one
        plain = fmt is not None and text(fmt) == INGEST_NORMALIZED
        events = orjson.loads(batch) if plain else json.loads(batch)
        if not isinstance(events, list):
            raise ValueError(f"field {INGEST_BATCH!r} must be a JSON array")
        if gw != "?":
            for ev in events:
                if type(ev) is dict:
                    ev[GATEWAY_ATTR] = gw
        return [(f"{entry_id}.{i}", gw, ev) for i, ev in enumerate(events)]
    raw = entry_field(fields, INGEST_EVENT)
    if raw is None:
        raise ValueError(f"entry has neither {INGEST_BATCH!r} nor {INGEST_EVENT!r}")
    ev = json.loads(raw)
    if gw != "?" and type(ev) is dict:
        ev[GATEWAY_ATTR] = gw
    return [(entry_id, gw, ev)]


def ingest_normalized(fields: Mapping[Any, Any]) -> bool:
    """Whether an entry's events were validated and normalized by the API
    (`profiles.events.event_from_normalized` reads them)."""
    fmt = entry_field(fields, INGEST_FORMAT)
    return fmt is not None and text(fmt) in (INGEST_NORMALIZED, INGEST_EXACT)


# ----------------------------------------------------------------------------- journal

OP_EVENT = "e"  # ["e", event key]: an ingest event fed to the engine
OP_ADVANCE = "a"  # ["a", t]: engine time advanced to t
# ["c", id, expr | None, subscriber | None(, alarm)]: a profile set or removed; the optional
# fifth element is its `alarm:` (docs/alarms.md), which older readers ignore
OP_PROFILE = "c"
OP_LATE = "l"  # ["l", event key]: an ingest event sent to the late output (`adapters.service.late`)


class EventFed(NamedTuple):
    key: str


class Advanced(NamedTuple):
    t: float


class LateSent(NamedTuple):
    key: str


class ProfileChanged(NamedTuple):
    id: str
    expr: str | None
    subscriber: str | None
    alarm: dict[str, Any] | None = None


JournalOp = EventFed | Advanced | ProfileChanged | LateSent


def op_event(key: str) -> list[Any]:
    """The wire form of `EventFed` (a plain list, no object: the worker writes one per event,
    inline as ``[OP_EVENT, key]``)."""
    return [OP_EVENT, key]


def op_advance(t: float) -> list[Any]:
    return [OP_ADVANCE, t]


def op_profile(
    pid: str, expr: str | None, subscriber: str | None, alarm: dict[str, Any] | None = None
) -> list[Any]:
    if alarm is None:
        return [OP_PROFILE, pid, expr, subscriber]
    return [OP_PROFILE, pid, expr, subscriber, alarm]


def _op(raw: Any) -> JournalOp:
    kind = raw[0]
    if kind == OP_EVENT:
        return EventFed(raw[1])
    if kind == OP_ADVANCE:
        return Advanced(raw[1])
    if kind == OP_PROFILE:
        return ProfileChanged(raw[1], raw[2], raw[3], raw[4] if len(raw) > 4 else None)
    if kind == OP_LATE:
        return LateSent(raw[1])
    raise ValueError(f"journal operation {kind!r} is unknown")


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~2x (one per commit, notification)
class JournalEntry:
    """One ``ens:engine:journal`` entry: the engine inputs of one commit (in order), how many
    notifications they made (replay checks it) and the control stream id applied so far.

    Version 2 may hold ``OP_LATE`` operations, version 3 an alarm step (``al``), version 4
    several alarm steps (``{"steps": [...]}``: a commit refused over maxmemory, whose step is
    kept, and its retry's); an entry without either is written as version 1, so an older
    worker still reads the journal unless a late event was sent or alarms moved (it would
    refuse by name rather than lose them)."""

    VERSION: ClassVar[int] = 4
    ops: list[list[Any]]  # wire form (`op_event` ...); `operations()` types them
    notifications: int
    control_id: str
    late: bool = False  # holds an OP_LATE (written as version 2)
    # the alarm step of this commit (`adapters.service.alarm_worker`): {"ops", "t", "ctl"},
    # or {"steps": [{"n", "ops", "t", "ctl"}, ...]} (n: alarm notifications each one fed)
    alarm: dict[str, Any] | None = None

    def fields(self) -> Fields:
        out: Fields = {
            "ops": dumps(self.ops),
            "n": self.notifications,
            "ctl": self.control_id,
            VERSION_FIELD: self._version(),
        }
        if self.alarm is not None:
            out["al"] = dumps(self.alarm)
        return out

    def _version(self) -> str:
        if self.alarm is not None:
            return "4" if "steps" in self.alarm else "3"
        return "2" if self.late else "1"

    @classmethod
    def read(cls, fields: Mapping[Any, Any]) -> JournalEntry:
        check_version(fields, "journal entry", cls.VERSION)
        return cls(
            json.loads(entry_field(fields, "ops")),
            int(entry_field(fields, "n")),
            text(entry_field(fields, "ctl")),
            alarm=json.loads(al) if (al := entry_field(fields, "al")) is not None else None,
        )

    def operations(self) -> Iterator[JournalOp]:
        return map(_op, self.ops)


# ----------------------------------------------------------------------------- checkpoint


class HeldRow(NamedTuple):
    """A reorder-buffer event in the checkpoint: ingest key, arrival seq, wall time, event JSON
    and gateway ("?" in version 3 and older, which did not keep it)."""

    entry: str
    seq: int
    wall: float
    event: dict[str, Any]
    gateway: str


@dataclass(slots=True)
class CheckpointMeta:
    """``ens:checkpoint`` ``meta``: where the engine snapshot stands.

    Versions: 2 had the profile definitions inside (``profiles``: id -> [expr, subscriber]);
    3 keeps them in ``ens:checkpoint:profiles``; 4 keeps watermarks and the gateway of each
    held event. Older versions are read with the defaults their writers implied.
    """

    VERSION: ClassVar[int] = 4
    epoch: str
    last_id: str
    control_id: str
    buffer: list[HeldRow]
    watermarks: dict[str, Any]
    totals: dict[str, int]
    late_by_gateway: dict[str, int]
    written_at: float = 0.0
    version: int = 4
    profiles: dict[str, list[Any]] | None = None  # version 2 only
    counted_reads: bool = True  # False: written before totals["read"] existed

    def to_json(self) -> str:
        return dumps(
            {
                "version": self.VERSION,  # 3: profiles in ens:checkpoint:profiles; 4: watermarks per gateway
                "epoch": self.epoch,
                "last_id": self.last_id,
                "control_id": self.control_id,
                "buffer": [list(row) for row in self.buffer],
                "watermarks": self.watermarks,
                "totals": self.totals,
                "late_by_gateway": self.late_by_gateway,
                "written_at": self.written_at,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> CheckpointMeta:
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> CheckpointMeta:
        version = meta.get("version", 2)
        if version > cls.VERSION:
            raise ValueError(
                f"checkpoint version {version} was written by a newer ENS (this one "
                f"reads up to {cls.VERSION})"
            )
        totals = meta.get("totals", {})
        return cls(
            epoch=meta["epoch"],
            last_id=meta["last_id"],
            control_id=meta["control_id"],
            buffer=[
                HeldRow(r[0], r[1], r[2], r[3], r[4] if len(r) > 4 else "?") for r in meta["buffer"]
            ],
            watermarks=meta.get("watermarks", {"seq": meta.get("arrival", 0)}),
            totals=dict(totals),
            late_by_gateway=dict(meta.get("late_by_gateway", {})),
            written_at=meta.get("written_at", 0.0),
            version=version,
            profiles=meta.get("profiles") if version < 3 else None,
            counted_reads="read" in totals,
        )
