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

from adapters.service import late
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.archive_feed import FEED
from adapters.service.engine_state import EngineState
from adapters.service.records import Advanced, JournalEntry, LateSent, ProfileChanged
from filters.notification import Notification
from notifiers import store
from notifiers.records import outbox_notification

log = logging.getLogger("ens.service.worker")


class Journal(EngineState):
    """The journal part of `EngineWorker`: commits, and their replay at a start."""

    def _input(self, op: list[Any]) -> None:
        self.inputs.append(op)
        self.since_snapshot += 1
        if not self.since_snapshot & 63:
            self._keepalive()

    def _pending_entries(self) -> list[tuple[str, Any]]:
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

    def _replay(self, pel: list[tuple[str, Any]]) -> set[str]:
        """Re-apply the journal to the restored engine; returns the event keys it fed."""
        by_key = {
            key: (gw, obj, rs.entry_normalized(fields))
            for eid, fields in pel
            for key, gw, obj in self._decode(eid, fields)
        }
        held = {h.item.entry: h for h in self.buffer}
        fed: set[str] = set()
        lost = 0  # committed notifications the replay did not give again
        entries: Any = self.r.xrange(rs.JOURNAL)
        self.journal_len = len(entries)
        for _jid, f in entries:
            entry = JournalEntry.read(f)
            for op in entry.operations():
                if isinstance(op, ProfileChanged):
                    self._set_def(op.id, op.expr, op.subscriber, alarm=op.alarm)
                elif isinstance(op, Advanced):
                    self._engine_advance(op.t)
                elif isinstance(op, LateSent):  # its record was committed with this entry
                    gw = by_key.get(op.key, ("?", None, False))[0]
                    self.totals["late"] += 1
                    self.late_by_gateway[gw] = self.late_by_gateway.get(gw, 0) + 1
                    fed.add(op.key)
                else:
                    key = op.key
                    h = held.pop(key, None)
                    if h is not None:
                        ev, gw = h.item.event, h.source
                    else:
                        gw, obj, normalized = by_key.get(key, ("?", None, False))
                        ev = self._parse(key, gw, obj, normalized)
                    if ev is not None:
                        self._process(ev, gw, replay=True)
                    fed.add(key)
                    if not len(fed) & 255:
                        self._keepalive()
            redone = self.engine.take_notifications()
            self._alarm_replay(entry.alarm, redone)
            lost += max(entry.notifications - len(redone), 0)
            if len(redone) != entry.notifications and not self.lost_state:
                log.error(
                    "journal replay gave %d notifications where %s were committed: "
                    "the engine is not deterministic",
                    len(redone),
                    entry.notifications,
                )
            self.totals["notifications"] += len(redone)
            self.control_id = entry.control_id
        if fed:
            self.wm.discard(lambda h: h.item.entry in fed)
        if entries:
            self.changed = True
            log.info(
                "replayed %d journal entries (%d events) after the snapshot", len(entries), len(fed)
            )
            if self.lost_state:  # onto a new engine state: it need not give what was published
                log.warning(
                    "the journal was replayed onto a new engine state (the checkpoint was set "
                    "aside): its notifications were published already and are not written "
                    "again (%d of them did not recur on the new state)",
                    lost,
                )
        return fed

    def record(self, n: Notification) -> dict[str, Any]:
        """The outbox record of a notification (`notifiers.store.enqueue`'s contract)."""
        return outbox_notification(n, self.epoch)

    def commit(self) -> None:
        """Journal the inputs since the last commit together with the notifications they made
        and the events they sent to the late output."""
        t0 = time.perf_counter()
        self.pending.extend(self.engine.take_notifications())
        plain, alarm_notes = self._alarm_split(self.pending)
        records = [self.record(n) for n in plain]
        alarm = self._alarm_step(alarm_notes)  # alarm profiles: their messages, not themselves
        late_out = self.late_out
        entry = JournalEntry(
            self.inputs,
            len(self.pending),
            self.control_id,
            bool(late_out),
            self._alarm_entry(alarm),
        ).fields()
        archived = self._archive_entry()

        def write(p: Any) -> None:
            p.xadd(rs.JOURNAL, entry)
            for rec in records:
                store.enqueue(p, rec)
            if archived is not None:  # the events these inputs fed, exactly once
                p.xadd(FEED, archived)
            late.add(p, late_out, self.cfg.late_max)  # with the OP_LATE inputs that sent them
            if alarm:  # with the notifications and commands that made them
                self._alarm_write(p, alarm, self.cfg.alarm_history_retention)

        self._transaction(write)
        self._alarm_published(alarm)
        self._published(records)
        self.inputs.clear()
        self.archive_rows.clear()
        self.journal_len += 1
        self.changed = True  # the journal holds something a snapshot would compact
        self.last_commit = time.monotonic()
        m.COMMITS.observe(time.perf_counter() - t0)

    def _archive_entry(self) -> dict[str, str] | None:
        """The ``ens:archive:feed`` entry of the events fed since the last commit, if any."""
        return self.archive_rows.fields() if len(self.archive_rows) else None

    def _published(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            m.count_notification(rec["profile"], rec.get("subscriber"))
        self.totals["notifications"] += len(records)
        self._interval["notifications"] += len(records)
        self.pending.clear()
        self.late_out.clear()

    @staticmethod
    def _decode(eid: str, fields: Any) -> list[tuple[str, str, Any]]:
        """`rs.decode_entry`, with an unreadable entry logged and read as no events."""
        try:
            return rs.decode_entry(eid, fields) if fields else []
        except (TypeError, ValueError) as exc:
            log.error("unreadable ingest entry %s skipped: %s", eid, exc)
            return []
