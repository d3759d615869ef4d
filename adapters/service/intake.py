"""Intake of the engine worker: ingest entries read into the reorder buffer (per-gateway
watermarks, `adapters.service.watermarks`), released in ``ts`` order and fed to the engine,
each feed an input of the journal.

An event is **late** when its ``ts`` is older than the engine's time when the worker reads it:
the engine has taken a later event or advanced past it (timers fired), so it can no longer be
fed in ``ts`` order. The wall clock moves engine time only when a timer falls due (and once at
the start), so an idle engine does not make events late that nothing has been decided past. (Held events are never late: the watermarks release them in ``ts`` order
before the engine advances past them; an event that breaks its gateway's lateness promise but
is not behind the engine is still held and fed in order.) A late event goes to the late side
output (`adapters.service.late`), an ``OP_LATE`` input of the journal, committed with it; with
``late_events="feed"`` it is fed at once, in arrival order, as before. Either way it is counted
per gateway and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from adapters.service import known_attrs
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmPart
from adapters.service.archive_feed import FeedBuffer
from adapters.service.engine_state import InputLog, Item, LiveEngine, Progress, WorkerConfig
from adapters.service.feeding import feed, is_late, log_late
from adapters.service.known_attrs import Sketch
from adapters.service.late import LateRecord
from adapters.service.records import OP_EVENT, OP_LATE, HeldRow, op_advance
from adapters.service.watermarks import Held, Watermarks
from profiles.events import Event, event_from_normalized, event_from_obj

log = logging.getLogger("ens.service.worker")


def _id_le(a: str, b: str) -> bool:
    return rs.parse_id(a) <= rs.parse_id(b)


def _gateway(fields: Any) -> str:
    """The gateway name of an ingest entry ("?" if it has none)."""
    return rs.text(fields.get(rs.INGEST_GATEWAY.encode(), b"?")) if fields else "?"


def decode(eid: str, fields: Any) -> list[tuple[str, str, Any]]:
    """`rs.decode_entry`, with an unreadable entry logged and read as no events."""
    try:
        return rs.decode_entry(eid, fields) if fields else []
    except (TypeError, ValueError) as exc:
        log.error("unreadable ingest entry %s skipped: %s", eid, exc)
        return []


class Intake:
    """The intake part of `EngineWorker`: ingest entries -> buffer -> engine (`take`,
    `release_due`), and what the next commit writes of them (`late_out`, `archive_rows`,
    `committed`) and the next snapshot acknowledges (`unacked`)."""

    def __init__(
        self,
        r: redis.Redis,
        cfg: WorkerConfig,
        live: LiveEngine,
        inputs: InputLog,
        progress: Progress,
        alarms: AlarmPart,
        keepalive: Callable[[], None],
    ) -> None:
        self.r = r
        self.cfg = cfg
        self.live = live
        self.inputs = inputs
        self.progress = progress
        self.alarms = alarms  # their deadlines move engine time too
        self._keepalive = keepalive
        self.known = Sketch()  # outlives a restart from the snapshot: it is advisory
        self.last_known = float("-inf")  # monotonic; the first events are written at once
        self.reset()

    def reset(self) -> None:
        cfg = self.cfg
        self.wm = Watermarks(
            cfg.reorder_seconds, cfg.idle_timeout, cfg.reorder_max_events, cfg.max_skew
        )
        self.last_id = "0-0"  # last ingest entry read into engine or buffer
        self.unacked: list[str] = []  # read, to be XACKed by the next snapshot
        self.late_out: list[LateRecord] = []  # sent to the late output, not committed yet
        self.archive_rows = FeedBuffer()  # fed, for ens:archive:feed with the next commit

    @property
    def buffer(self) -> list[Held]:
        """The held events (a heap; ``h.item`` is an `Item`)."""
        return self.wm.heap

    def restore(self, last_id: str, rows: list[HeldRow], watermarks: Any) -> None:
        """The position of a checkpoint: its last ingest id, reorder buffer and watermarks
        (rows of version < 4 have gateway "?": their events wait for the others)."""
        self.last_id = last_id
        held = []
        for row in rows:
            ev = event_from_obj(row.event, row.event["id"])
            held.append(Held(ev.ts, row.seq, row.gateway, row.wall, Item(row.entry, ev)))
        self.wm.restore(watermarks, held)

    def archive_entry(self) -> dict[str, str] | None:
        """The ``ens:archive:feed`` entry of the events fed since the last commit, if any."""
        return self.archive_rows.fields() if len(self.archive_rows) else None

    def committed(self) -> None:
        """The late records and archive rows are written (a commit or a snapshot)."""
        self.late_out.clear()
        self.archive_rows.clear()

    def acknowledged(self) -> None:
        """A snapshot acknowledged (XACK) the entries read."""
        self.unacked.clear()

    def parse(self, key: str, gw: str, obj: Any, normalized: bool = False) -> Event | None:
        if normalized:  # validated by the API already; anything odd gets the full check
            try:
                return event_from_normalized(obj, key)
            except (TypeError, KeyError):
                pass
        try:
            return event_from_obj(obj, key)
        except (TypeError, ValueError) as exc:
            log.error("unreadable ingest event %s from %s skipped: %s", key, gw, exc)
            return None

    def take(
        self, eid: str, fields: Any, now: float, skip: set[str] | frozenset[str] = frozenset()
    ) -> int:
        """Read one ingest entry into the buffer (events in ``skip`` were fed already).

        Returns how many events were taken.
        """
        self.unacked.append(eid)
        self.progress.changed = True
        if not fields or _id_le(eid, self.last_id):
            return 0  # covered by the snapshot already (or trimmed)
        self.last_id = eid
        decoded = decode(eid, fields)
        if not decoded:
            m.EVENTS_INVALID.labels(gateway=_gateway(fields)).inc()
            self.progress.totals["invalid"] += 1
        self.progress.totals["read"] += len(decoded)
        normalized = rs.entry_normalized(fields)
        taken = 0
        for key, gw, obj in decoded:
            if key in skip:
                continue
            taken += 1
            if not taken & 255:
                self._keepalive()
            ev = self.parse(key, gw, obj, normalized)
            if ev is None:
                m.EVENTS_INVALID.labels(gateway=gw).inc()
                self.progress.totals["invalid"] += 1
                continue
            self.known.observe(ev.attrs)
            self.wm.observe(gw, ev.ts, now)
            if self.live.engine.now is not None and ev.ts < self.live.engine.now:
                # late: nothing can be reordered around it any more
                if self.cfg.late_events == "feed":
                    self._feed(ev, key, gw)
                else:
                    self._send_late(ev, key, gw)
                continue
            self.wm.hold(gw, ev.ts, now, Item(key, ev))
        return taken

    def write_known(self, force: bool = False) -> None:
        """The attribute names read since the last time into ``ens:attrs`` (at most once per
        ``known_attrs_interval``): what `ens profile add` checks a new profile against."""
        mono = time.monotonic()
        if not self.known or (not force and mono - self.last_known < self.cfg.known_attrs_interval):
            return
        self.last_known = mono
        seen = self.known.take()
        try:
            known_attrs.write(self.r, seen, time.time(), self.cfg.known_attrs_max)
        except redis.RedisError as exc:  # advisory: never worth a restart of the engine
            log.warning("could not record the attributes of recent events: %s", exc)

    def release_due(self, now: float, caught_up: bool = True) -> None:
        wall = self.cfg.clock == "wall" and caught_up
        target = now - self.wm.max_active_lateness(now) if wall else float("-inf")
        for h in self.wm.release(now, target):
            self._feed(h.item.event, h.item.entry, h.source)
        if wall and (self.live.engine.now is None or target > self.live.engine.now):
            # Move engine time only when a timer falls due: an idle engine keeps the time of its
            # last effect, so an event that arrives a few ms after its ts (lateness 0) is not
            # late while nothing has been decided past it (nothing fired, nothing newer fed).
            # (the alarm rules' deadlines too: a group's wait, a digest, an escalation step)
            due = self.live.engine.timers.next_time()
            alarm_due = self.alarms.rules.due()
            if alarm_due is not None and (due is None or alarm_due < due):
                due = alarm_due
            if self.live.engine.now is None or (due is not None and due < target):
                self.inputs.add(op_advance(target))
                self.live.advance(target)

    def _feed(self, ev: Event, key: str, gw: str) -> None:
        if self.cfg.archive:  # written to ens:archive:feed with the commit of this input
            late = self.live.engine.now is not None and ev.ts < self.live.engine.now
            self.archive_rows.add(key, gw, late, ev)
        self.inputs.add([OP_EVENT, key])  # records.op_event, inline (per event)
        self.process(ev, gw)

    def _send_late(self, ev: Event, key: str, gw: str) -> None:
        """Journal that the event went to the late output; the next commit writes it there."""
        self.inputs.add([OP_LATE, key])
        now: float = self.live.engine.now  # type: ignore[assignment]  # late: the engine has a time
        self.late_out.append(LateRecord.of(ev, key, gw, now))
        if self.cfg.archive:  # accepted, not matched: archived too, flagged (docs/archive.md)
            self.archive_rows.add(key, gw, True, ev)
        self._count_late(ev, gw, "sent to the late output (not matched)")

    def _count_late(self, ev: Event, gw: str, what: str | None) -> None:
        """Count a late event for its gateway; log it unless ``what`` is None (a replay)."""
        self.progress.count_late(gw)
        if what is None:
            return
        self.progress.interval["late"] += 1
        if self.progress.interval["late"] <= 10:  # the rest only in the periodic summary
            log_late(log, self.live.engine.now, ev, gw, what)  # type: ignore[arg-type]

    def process(self, ev: Event, gw: str, replay: bool = False) -> None:
        if is_late(self.live.engine.now, ev.ts):  # --late-events feed
            self._count_late(ev, gw, None if replay else "processed in arrival order")
        if not feed(self.live.process, ev, gw, log) and not replay:
            m.ENGINE_ERRORS.inc()
        self.progress.totals["events"] += 1
        if not replay:
            self.progress.unpublished += 1  # the metric takes a lock per call: the step adds them
            self.progress.interval["events"] += 1
