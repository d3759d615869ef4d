"""Snapshots of the engine worker: the engine, the reorder buffer and ``last_id`` in
``ens:checkpoint`` (one MULTI/EXEC that also writes the pending notifications, empties the
journal, acknowledges and trims the ingest entries it covers), and their loading, with the
migrations of older checkpoint versions (`adapters.service.records.CheckpointMeta`).
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import Any

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.engine_state import EngineState, Item
from adapters.service.records import CheckpointMeta, HeldRow
from adapters.service.watermarks import Held
from filters.engine import Engine
from notifiers import store
from profiles.events import event_from_obj

log = logging.getLogger("ens.service.worker")


class Checkpointer(EngineState):
    """The snapshot part of `EngineWorker`."""

    def _meta(self) -> CheckpointMeta:
        return CheckpointMeta(
            epoch=self.epoch,
            last_id=self.last_id,
            control_id=self.control_id,
            buffer=[
                HeldRow(h.item.entry, h.seq, h.wall, h.item.event.to_json(), h.source)
                for h in self.buffer
            ],
            watermarks=self.wm.state(),
            totals=dict(self.totals),
            late_by_gateway=dict(self.late_by_gateway),
            written_at=time.time(),
        )

    def _load(self) -> bool:
        """Restore the snapshot; True if there was none (a new engine)."""
        cp = rs.load_checkpoint(self.r)
        self._reset_state()
        if cp is None:
            log.info("no snapshot: starting a new engine (epoch %s)", self.epoch)
            return True
        snap, meta = cp[0], CheckpointMeta.from_dict(cp[1])
        if meta.profiles is None:  # version 3 on
            stored: Any = self.r.hgetall(rs.CHECKPOINT_PROFILES)
            self.defs = {rs.text(k): pickle.loads(v) for k, v in stored.items()}  # noqa: S301
            self.engine = Engine.restore(snap, self.defs)
        else:  # a checkpoint with the profiles inside: the next snapshot moves them out
            self.engine = Engine.restore(snap)
            active = {p.id: p for p in self.engine.profiles}
            for pid, (expr, sub) in meta.profiles.items():
                self.defs[pid] = active.get(pid) or rs.validate_profile(None, pid, expr, sub)
            self.dirty = set(self.defs)
        cfg = self.cfg  # this run's plan options apply to the restored state (same output)
        self.engine.configure_plans(cfg.plan, cfg.rates, cfg.replan_every, cfg.drift)
        self.engine.set_caps(cfg.caps)  # configuration, not state (`filters.caps`)
        self.epoch = meta.epoch
        self.last_id = meta.last_id
        self.control_id = meta.control_id
        self.totals.update(meta.totals)
        self.late_by_gateway.update(meta.late_by_gateway)
        if not meta.counted_reads:  # a checkpoint from before the count existed
            self.totals["read"] = int(self.r.get(rs.INGEST_IN) or 0)
        held = []
        for row in meta.buffer:  # version < 4: gateway "?" (its events wait for the others)
            ev = event_from_obj(row.event, row.event["id"])
            held.append(Held(ev.ts, row.seq, row.gateway, row.wall, Item(row.entry, ev)))
        self.wm.restore(meta.watermarks, held)
        log.info(
            "restored snapshot: epoch %s, last ingest id %s, %d profiles, %d buffered, %s",
            self.epoch,
            self.last_id,
            len(self.defs),
            len(self.buffer),
            self.engine.stats(),
        )
        return False

    def snapshot(self) -> None:
        """Engine + buffer + pending notifications; empties the journal, acks and trims ingest."""
        t0 = time.perf_counter()
        self.pending.extend(self.engine.take_notifications())
        records = [self.record(n) for n in self.pending]
        snap = self.engine.snapshot(profiles_apart=True)
        changed = {pid: self.defs.get(pid) for pid in self.dirty}
        meta_obj = self._meta()
        meta_obj.totals["notifications"] += len(records)  # written by this transaction
        meta = meta_obj.to_json()
        unacked = list(self.unacked)

        def write(p: Any) -> None:
            for rec in records:
                store.enqueue(p, rec)
            for pid, prof in changed.items():  # only what changed: 10^6 profiles are not rewritten
                if prof is None:
                    p.hdel(rs.CHECKPOINT_PROFILES, pid)
                else:
                    p.hset(rs.CHECKPOINT_PROFILES, pid, pickle.dumps(prof, pickle.HIGHEST_PROTOCOL))
            p.hset(rs.CHECKPOINT, mapping={"engine": snap, "meta": meta})
            p.delete(rs.JOURNAL)
            for i in range(0, len(unacked), 10_000):
                p.xack(rs.INGEST, rs.ENGINE_GROUP, *unacked[i : i + 10_000])
            if self.last_id != "0-0":
                p.xtrim(rs.INGEST, minid=rs.next_id(self.last_id), approximate=False)

        self._transaction(write)
        self._published(records)
        self.inputs.clear()
        self.unacked.clear()
        self.dirty.clear()
        self.since_snapshot = 0
        self.journal_len = 0
        self.changed = False
        self.last_commit = self.last_snapshot = time.monotonic()
        m.SNAPSHOTS.observe(time.perf_counter() - t0)
        m.SNAPSHOT_BYTES.set(len(snap))
        self.snapshot_bytes = len(snap)
