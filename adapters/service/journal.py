"""The engine worker's journal: the inputs fed since the last snapshot, committed with the
notifications they produced in one MULTI/EXEC (``ens:engine:journal`` and ``ens:outbox``), and
replayed after a crash onto the restored snapshot (the notifications this reproduces were
published with their entry and are dropped). Module docstring of `adapters.service.worker`:
why this gives exactly-once notifications.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from adapters.service import late
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmBatch, AlarmPart
from adapters.service.archive_feed import FEED
from adapters.service.control import Control
from adapters.service.engine_state import InputLog, LiveEngine, Progress, WorkerConfig
from adapters.service.intake import Intake, decode
from adapters.service.lease import EngineLease
from adapters.service.records import Advanced, JournalEntry, LateSent, ProfileChanged
from filters.notification import Notification
from notifiers import store
from notifiers.records import outbox_notification

log = logging.getLogger("ens.service.worker")


class Journal:
    """The journal part of `EngineWorker`: `commit`, and `replay` at a start. It holds the
    notifications detected and not committed yet (`pending`)."""

    def __init__(
        self,
        r: redis.Redis,
        cfg: WorkerConfig,
        lease: EngineLease,
        live: LiveEngine,
        inputs: InputLog,
        progress: Progress,
        intake: Intake,
        control: Control,
        alarms: AlarmPart,
    ) -> None:
        self.r = r
        self.cfg = cfg
        self.lease = lease
        self.live = live
        self.inputs = inputs
        self.progress = progress
        self.intake = intake
        self.control = control
        self.alarms = alarms
        self.reset()

    def reset(self) -> None:
        self.pending: list[Notification] = []  # detected, not committed
        self.journal_len = 0  # commits in ens:engine:journal (since the last snapshot)
        self.last_commit = 0.0  # monotonic

    def pending_entries(self) -> list[tuple[str, Any]]:
        """Every ingest entry read by the engine group and not yet acknowledged, in order."""
        start = "0-0"
        while True:  # entries another consumer name had pending (renamed worker)
            res = self.r.xautoclaim(  # not JUSTID: redis-py then drops the cursor
                rs.INGEST, rs.ENGINE_GROUP, self.cfg.name, 0, start_id=start, count=1000
            )
            start = rs.text(res[0])
            if start == "0-0":
                break
        out: list[tuple[str, Any]] = []
        cursor = "0-0"
        while True:
            resp: Any = self.r.xreadgroup(  # redis-py types replies as a union
                rs.ENGINE_GROUP, self.cfg.name, {rs.INGEST: cursor}, count=self.cfg.batch
            )
            entries = resp[0][1] if resp else []
            if not entries:
                return out
            out.extend((rs.text(eid), fields) for eid, fields in entries)
            cursor = out[-1][0]

    def replay(self, pel: list[tuple[str, Any]], lost_state: bool) -> set[str]:
        """Re-apply the journal to the restored engine (``lost_state``: a new engine state,
        `Checkpointer.lost_state`); returns the event keys it fed."""
        by_key = {
            key: (gw, obj, rs.entry_normalized(fields))
            for eid, fields in pel
            for key, gw, obj in decode(eid, fields)
        }
        intake, live = self.intake, self.live
        held = {h.item.entry: h for h in intake.buffer}
        fed: set[str] = set()
        lost = 0  # committed notifications the replay did not give again
        entries: Any = self.r.xrange(rs.JOURNAL)
        self.journal_len = len(entries)
        for _jid, f in entries:
            entry = JournalEntry.read(f)
            for op in entry.operations():
                if isinstance(op, ProfileChanged):
                    self.control.set_def(op.id, op.expr, op.subscriber, alarm=op.alarm)
                elif isinstance(op, Advanced):
                    live.advance(op.t)
                elif isinstance(op, LateSent):  # its record was committed with this entry
                    gw = by_key.get(op.key, ("?", None, False))[0]
                    self.progress.count_late(gw)
                    fed.add(op.key)
                else:
                    key = op.key
                    h = held.pop(key, None)
                    if h is not None:
                        ev, gw = h.item.event, h.source
                    else:
                        gw, obj, normalized = by_key.get(key, ("?", None, False))
                        ev = intake.parse(key, gw, obj, normalized)
                    if ev is not None:
                        intake.process(ev, gw, replay=True)
                    fed.add(key)
                    if not len(fed) & 255:
                        self.lease.keepalive()
            redone = live.engine.take_notifications()
            self.alarms.replay(entry.alarm, redone)
            lost += max(entry.notifications - len(redone), 0)
            if len(redone) != entry.notifications and not lost_state:
                log.error(
                    "journal replay gave %d notifications where %s were committed: "
                    "the engine is not deterministic",
                    len(redone),
                    entry.notifications,
                )
            self.progress.totals["notifications"] += len(redone)
            self.control.control_id = entry.control_id
        if fed:
            intake.wm.discard(lambda h: h.item.entry in fed)
        if entries:
            self.progress.changed = True
            log.info(
                "replayed %d journal entries (%d events) after the snapshot", len(entries), len(fed)
            )
            if lost_state:  # onto a new engine state: it need not give what was published
                log.warning(
                    "the journal was replayed onto a new engine state (the checkpoint was set "
                    "aside): its notifications were published already and are not written "
                    "again (%d of them did not recur on the new state)",
                    lost,
                )
        return fed

    def record(self, n: Notification) -> dict[str, Any]:
        """The outbox record of a notification (`notifiers.store.enqueue`'s contract)."""
        return outbox_notification(n, self.live.epoch)

    def collect(self) -> None:
        """Take what the engine detected: pending until a commit or snapshot writes it."""
        self.pending.extend(self.live.engine.take_notifications())

    def outputs(self) -> tuple[list[dict[str, Any]], list[AlarmBatch]]:
        """What the pending notifications write: the outbox records of the plain ones, and
        the alarm steps (alarm profiles: their messages, not themselves)."""
        self.collect()
        plain, alarm_notes = self.alarms.split(self.pending)
        return [self.record(n) for n in plain], self.alarms.step(alarm_notes)

    def commit(self) -> None:
        """Journal the inputs since the last commit together with the notifications they made
        and the events they sent to the late output."""
        t0 = time.perf_counter()
        alarms = self.alarms
        records, alarm = self.outputs()
        late_out = self.intake.late_out
        entry = JournalEntry(
            self.inputs.ops,
            len(self.pending),
            self.control.control_id,
            bool(late_out),
            alarms.entry(alarm),
        ).fields()
        archived = self.intake.archive_entry()

        def write(p: Any) -> None:
            p.xadd(rs.JOURNAL, entry)
            for rec in records:
                store.enqueue(p, rec)
            if archived is not None:  # the events these inputs fed, exactly once
                p.xadd(FEED, archived)
            late.add(p, late_out, self.cfg.late_max)  # with the OP_LATE inputs that sent them
            if alarm:  # with the notifications and commands that made them
                alarms.write(p, alarm, self.cfg.alarm_history_retention)

        self.lease.transaction(write)
        alarms.published(alarm)
        self.published(records)
        self.journal_len += 1
        self.progress.changed = True  # the journal holds something a snapshot would compact
        self.last_commit = time.monotonic()
        m.COMMITS.observe(time.perf_counter() - t0)

    def published(self, records: list[dict[str, Any]]) -> None:
        """A commit or snapshot wrote ``records`` and the inputs, late records and archive
        rows since the last one: count them, and start the next."""
        for rec in records:
            m.count_notification(rec["profile"], rec.get("subscriber"))
        self.progress.totals["notifications"] += len(records)
        self.progress.interval["notifications"] += len(records)
        self.pending.clear()
        self.intake.committed()
        self.inputs.ops.clear()

    def compacted(self, mono: float) -> None:
        """A snapshot emptied ``ens:engine:journal`` at monotonic time ``mono``."""
        self.journal_len = 0
        self.last_commit = mono
