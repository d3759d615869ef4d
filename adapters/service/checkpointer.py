"""Snapshots of the engine worker: the engine, the reorder buffer and ``last_id`` in
``ens:checkpoint`` (one MULTI/EXEC that also writes the pending notifications, empties the
journal, acknowledges and trims the ingest entries it covers), and their loading, with the
migrations of older checkpoint versions (`adapters.service.records.CheckpointMeta`).

The engine is checkpointed incrementally (issue 38.2): ``ens:checkpoint``'s ``engine`` field
holds the engine's header record and ``ens:checkpoint:parts`` one record per profile partition
(`filters.partitions`); a snapshot writes the header and only the partitions the steps since
the last one may have changed, and deletes those that hold nothing any more, in the same
transaction. A checkpoint whose ``engine`` is a whole-engine snapshot (older releases, or an
engine that re-plans online: `--replan-every`) is restored as before, and the next snapshot
writes every partition.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from adapters.service import late
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmPart
from adapters.service.archive_feed import FEED
from adapters.service.control import Control
from adapters.service.engine_state import InputLog, LiveEngine, Progress, WorkerConfig
from adapters.service.intake import Intake
from adapters.service.journal import Journal
from adapters.service.lease import EngineLease
from adapters.service.records import CheckpointMeta, HeldRow
from filters import state as state_format
from filters.engine import Engine
from filters.partitions import (
    PartId,
    PartitionedEngine,
    Record,
    decode_id,
    encode_id,
    part_counts,
)
from filters.restore import Skipped
from notifiers import store

log = logging.getLogger("ens.service.worker")

CHECKPOINT_PARTS = "ens:checkpoint:parts"  # partition id (`encode_id`) -> its record
_CHUNK = 10_000  # fields per HSET/HDEL of a snapshot


class Checkpointer:
    """The snapshot part of `EngineWorker`: `load` at a start, `snapshot` when due. It keeps
    which partitions ``ens:checkpoint:parts`` holds (`stored`), and whether the engine state
    is a new one because the checkpoint could not be restored (`lost_state`).

    ``reset`` is the worker's (`EngineWorker.reset_state`): every part starts again.
    """

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
        journal: Journal,
        alarms: AlarmPart,
        reset: Callable[[], None],
    ) -> None:
        self.r = r
        self.cfg = cfg
        self.lease = lease
        self.live = live
        self.inputs = inputs
        self.progress = progress
        self.intake = intake
        self.control = control
        self.journal = journal
        self.alarms = alarms
        self._reset_all = reset
        self.snapshot_bytes = 0  # of the last snapshot (in the heartbeat, for /metrics)
        self.reset()

    def reset(self) -> None:
        # incremental checkpoints: profile id -> its partitions' keys in ens:checkpoint:parts,
        # and whether the next snapshot rewrites them all (the hash does not hold this
        # engine's state: a new engine, a whole-engine snapshot restored, plans converted)
        self.stored: dict[str, set[str]] = {}
        self.parts_full = True
        self.lost_state = False  # the checkpoint could not be restored (`_set_aside`)
        self.last_snapshot = time.monotonic()

    def _meta(self) -> CheckpointMeta:
        intake = self.intake
        return CheckpointMeta(
            epoch=self.live.epoch,
            last_id=intake.last_id,
            control_id=self.control.control_id,
            buffer=[
                HeldRow(h.item.entry, h.seq, h.wall, h.item.event.to_json(), h.source)
                for h in intake.buffer
            ],
            watermarks=intake.wm.state(),
            totals=dict(self.progress.totals),
            late_by_gateway=dict(self.progress.late_by_gateway),
            written_at=time.time(),
        )

    def load(self) -> bool:
        """Restore the snapshot; True if there was none (a new engine), or it could not be
        restored: it is then kept aside and the engine starts from what can be recovered
        (`_set_aside`), so that no checkpoint can keep the service from starting."""
        self._reset_all()
        try:
            cp = rs.load_checkpoint(self.r)
            if cp is None:
                log.info("no snapshot: starting a new engine (epoch %s)", self.live.epoch)
                return True
            self._restore(cp[0], CheckpointMeta.from_dict(cp[1]))
            self.alarms.load()
            return False
        except (redis.RedisError, MemoryError):
            # Redis away (`run_forever` starts again from Redis), or short of memory: not
            # the checkpoint's fault
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the reason, the start must go on
            self._set_aside(exc)
            return True

    def _restore(self, snap: bytes, meta: CheckpointMeta) -> None:
        live = self.live
        if meta.profiles is None and state_format.header(snap).get("record") == "header":
            stored: Any = self.r.hgetall(rs.CHECKPOINT_PROFILES)
            live.defs = {rs.text(k): pickle.loads(v) for k, v in stored.items()}  # noqa: S301
            self._restore_parts(snap)
        elif meta.profiles is None:  # version 3 on: a whole-engine snapshot
            stored = self.r.hgetall(rs.CHECKPOINT_PROFILES)
            live.defs = {rs.text(k): pickle.loads(v) for k, v in stored.items()}  # noqa: S301
            live.engine, skipped = Engine.restore_reporting(snap, live.defs)
            if skipped:
                # state of profiles removed before the snapshot (written by releases that
                # kept it, issue 41.1): it can produce nothing, so it is left out
                log.warning(
                    "restore left out engine state of profiles that no longer exist: %s",
                    skipped.describe(),
                )
                m.RESTORE_SKIPPED.labels("removed_profile").inc(len(skipped.removed))
                m.RESTORE_SKIPPED.labels("inactive_runtime").inc(len(skipped.inactive))
        else:  # a checkpoint with the profiles inside: the next snapshot moves them out
            live.engine = Engine.restore(snap)
            active = {p.id: p for p in live.engine.profiles}
            for pid, (expr, sub) in meta.profiles.items():
                live.defs[pid] = active.get(pid) or rs.validate_profile(None, pid, expr, sub)
            live.dirty = set(live.defs)
        cfg = self.cfg  # this run's plan options apply to the restored state (same output)
        if live.engine.configure_plans(cfg.plan, cfg.rates, cfg.replan_every, cfg.drift):
            self.parts_full = True  # converted partitions: their records change kind
        live.engine.set_caps(cfg.caps)  # configuration, not state (`filters.caps`)
        live.epoch = meta.epoch
        self._restore_position(meta)
        log.info(
            "restored snapshot: epoch %s, last ingest id %s, %d profiles, %d buffered, %s",
            live.epoch,
            self.intake.last_id,
            len(live.defs),
            len(self.intake.buffer),
            live.engine.stats(),
        )

    def _restore_parts(self, header: bytes) -> None:
        """The engine from its header and partition records (an incremental checkpoint): built
        from the profiles in the header's order (the order of one event's notifications), each
        record loaded; records of profiles no longer active are left out (and deleted by the
        next snapshot)."""
        live = self.live
        eng = live.new_engine()
        for pid in PartitionedEngine.profile_order(header):
            prof = live.defs.get(pid)
            if prof is not None:
                eng.add_profile(prof)
        live.engine = eng
        t = live.tracker()
        if t is None:
            raise state_format.StateError(
                "this checkpoint holds the engine by partition, which an engine that re-plans "
                "online (--replan-every) cannot load: start once without --replan-every"
            )
        t.begin(header)
        stored: dict[str, set[str]] = {}

        def records() -> Iterator[tuple[PartId, bytes]]:
            for n, (k, data) in enumerate(self.r.hscan_iter(CHECKPOINT_PARTS, count=1000), 1):
                key = rs.text(k)
                part = decode_id(key)
                stored.setdefault(part[0], set()).add(key)
                yield part, data
                if not n & 1023:
                    self.lease.keepalive()

        skipped = Skipped()
        for part in t.load_all(records()):  # of profiles gone: deleted by the next snapshot
            counts = skipped.removed.setdefault(
                part[0], {"partial_matches": 0, "partitions": 0, "timers": 0}
            )
            data: Any = self.r.hget(CHECKPOINT_PARTS, encode_id(part))
            for what, c in part_counts(data).items() if data is not None else ():
                counts[what] += c
        t.changed()  # nothing to write: the hash holds what was loaded
        self.stored = stored
        self.parts_full = False
        if skipped:
            log.warning(
                "restore left out engine state of profiles that no longer exist: %s",
                skipped.describe(),
            )
            m.RESTORE_SKIPPED.labels("removed_profile").inc(len(skipped.removed))

    def _restore_position(self, meta: CheckpointMeta) -> None:
        """Where the checkpoint stands in the streams: ingest and control ids, totals, the
        reorder buffer and watermarks."""
        self.control.control_id = meta.control_id
        totals = self.progress.totals
        totals.update(meta.totals)
        self.progress.late_by_gateway.update(meta.late_by_gateway)
        if not meta.counted_reads:  # a checkpoint from before the count existed
            totals["read"] = int(self.r.get(rs.INGEST_IN) or 0)
        self.intake.restore(meta.last_id, meta.buffer, meta.watermarks)

    def _set_aside(self, exc: Exception) -> None:
        """The checkpoint cannot be restored: rename it (and its profiles) aside, and start a
        new engine state (a new epoch) from what can still be read, so the journal replays
        onto it: the checkpoint's position (ingest and control ids, reorder buffer,
        watermarks, totals) if its ``meta`` reads, and its profiles (else those of
        ``ens:profiles``). Lost: partial matches and timers (and `once` profiles that fired
        are active again); the reorder buffer too if ``meta`` does not read. docs/service.md,
        "Crash recovery".
        """
        reason = f"{type(exc).__name__}: {exc}"
        live = self.live
        self._reset_all()
        self.lost_state = True
        kept = []
        meta: CheckpointMeta | None = None
        try:
            raw: Any = self.r.hget(rs.CHECKPOINT, "meta")
            if raw is not None:
                meta = CheckpointMeta.from_json(raw)
                self._restore_position(meta)
                kept.append("its ingest position, reorder buffer and watermarks")
        except redis.RedisError:
            raise
        except Exception as meta_exc:  # noqa: BLE001 - any unreadable meta is left behind
            log.error("the checkpoint's meta cannot be read either: %s", meta_exc)
            self._reset_all()
            self.lost_state = True
            meta = None
        for source in ("the checkpoint", "ens:profiles"):
            try:
                live.defs = self._profiles_of(source, meta)
                for prof in live.defs.values():
                    live.engine.add_profile(prof)
                kept.append(f"{len(live.defs)} profiles of {source}")
                break
            except redis.RedisError:
                raise
            except Exception as prof_exc:  # noqa: BLE001 - then the next source
                log.error("the profiles of %s cannot be read either: %s", source, prof_exc)
                live.defs = {}
                live.engine = live.new_engine()
        live.dirty = set(live.defs)  # its profiles hash goes aside: the next snapshot rewrites it
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{secrets.token_hex(2)}"
        aside = f"{rs.CHECKPOINT_ASIDE}{stamp}"
        has_profiles = bool(self.r.exists(rs.CHECKPOINT_PROFILES))
        has_parts = bool(self.r.exists(CHECKPOINT_PARTS))

        def write(p: Any) -> None:
            p.rename(rs.CHECKPOINT, aside)
            if has_profiles:
                p.rename(rs.CHECKPOINT_PROFILES, aside + ":profiles")
            if has_parts:
                p.rename(CHECKPOINT_PARTS, aside + ":parts")

        self.lease.transaction(write)
        m.CHECKPOINTS_SET_ASIDE.inc()
        log.error(
            "the engine checkpoint cannot be restored (%s); kept aside as %s%s; starting a new "
            "engine state (epoch %s) with %s: the checkpoint's partial matches and timers are "
            "lost",
            reason,
            aside,
            (f" and {aside}:profiles" if has_profiles else "")
            + (f" and {aside}:parts" if has_parts else ""),
            live.epoch,
            " and ".join(kept) or "nothing of it",
        )

    def _profiles_of(self, source: str, meta: CheckpointMeta | None) -> dict[str, Any]:
        """The profiles of the checkpoint (its meta's, version 2, or its hash) or of
        ``ens:profiles`` (the truth, when the checkpoint's cannot be read): id -> profile."""
        if source == "ens:profiles":
            return {
                p["id"]: rs.validate_profile(None, p["id"], p["expr"], p.get("subscriber"))
                for p in rs.list_profiles(self.r)
            }
        if meta is not None and meta.profiles is not None:
            return {
                pid: rs.validate_profile(None, pid, expr, sub)
                for pid, (expr, sub) in meta.profiles.items()
            }
        stored: Any = self.r.hgetall(rs.CHECKPOINT_PROFILES)
        return {rs.text(k): pickle.loads(v) for k, v in stored.items()}  # noqa: S301

    def snapshot(self) -> None:
        """Engine + buffer + pending notifications and late events; empties the journal, acks
        and trims ingest."""
        t0 = time.perf_counter()
        live, intake, journal, alarms = self.live, self.intake, self.journal, self.alarms
        records, alarm = journal.outputs()
        alarm_state = alarms.state()  # after the step: what the journal no longer holds
        snap, parts_write, parts_delete, full = self._engine_records()
        changed = {pid: live.defs.get(pid) for pid in live.dirty}
        meta_obj = self._meta()
        meta_obj.totals["notifications"] += len(records)  # written by this transaction
        meta = meta_obj.to_json()
        unacked = list(intake.unacked)
        last_id = intake.last_id
        archived = intake.archive_entry()
        late_out = intake.late_out

        def write(p: Any) -> None:
            for rec in records:
                store.enqueue(p, rec)
            if archived is not None:  # fed since the last commit (`Journal.commit`)
                p.xadd(FEED, archived)
            late.add(p, late_out, self.cfg.late_max)  # sent since the last commit
            if alarm:
                alarms.write(p, alarm, self.cfg.alarm_history_retention)
            for pid, prof in changed.items():  # only what changed: 10^6 profiles are not rewritten
                if prof is None:
                    p.hdel(rs.CHECKPOINT_PROFILES, pid)
                else:
                    p.hset(rs.CHECKPOINT_PROFILES, pid, pickle.dumps(prof, pickle.HIGHEST_PROTOCOL))
            if full:
                p.delete(CHECKPOINT_PARTS)
            for i in range(0, len(parts_delete), _CHUNK):
                p.hdel(CHECKPOINT_PARTS, *parts_delete[i : i + _CHUNK])
            items = list(parts_write.items())
            for i in range(0, len(items), _CHUNK):
                p.hset(CHECKPOINT_PARTS, mapping=dict(items[i : i + _CHUNK]))
            p.hset(rs.CHECKPOINT, mapping={"engine": snap, "meta": meta, "alarms": alarm_state})
            p.delete(rs.JOURNAL)
            for i in range(0, len(unacked), 10_000):
                p.xack(rs.INGEST, rs.ENGINE_GROUP, *unacked[i : i + 10_000])
            if last_id != "0-0":
                p.xtrim(rs.INGEST, minid=rs.next_id(last_id), approximate=False)

        self.lease.transaction(write)
        self._parts_written(parts_write, parts_delete, full)
        alarms.published(alarm)
        journal.published(records)
        intake.acknowledged()
        live.dirty.clear()
        self.inputs.snapshotted()
        self.last_snapshot = time.monotonic()
        journal.compacted(self.last_snapshot)
        self.progress.changed = False
        m.SNAPSHOTS.observe(time.perf_counter() - t0)
        size = len(snap) + sum(map(len, parts_write.values()))
        m.SNAPSHOT_BYTES.set(size)
        self.snapshot_bytes = size

    def _engine_records(self) -> tuple[bytes, dict[str, bytes], list[str], bool]:
        """What a snapshot writes of the engine: the ``engine`` field, the partition records to
        write and the keys to delete, and whether the hash is rewritten whole."""
        t = self.live.tracker()
        if t is None:  # re-plans online: the whole engine, and no partitions
            self.parts_full = True
            return self.live.engine.snapshot(profiles_apart=True), {}, [], True
        eng = self.live.engine
        full = self.parts_full
        if full:
            t.changed()
            recs = {
                p: (Record(*got) if got is not None else None)
                for p, got in eng.store_parts(eng.part_ids()).items()
            }
        else:
            recs = t.changed()
        write: dict[str, bytes] = {}
        held: dict[str, set[str]] = {} if full else self.stored
        delete: list[str] = []
        for part, rec in recs.items():
            key = encode_id(part)
            if rec is not None:
                write[key] = rec.data
            elif key in held.get(part[0], ()):
                delete.append(key)
        if not full:  # partitions of profiles removed, replaced or retired (`once`) since
            active = {p.id for p in eng.profiles}
            for pid, keys in held.items():
                if pid not in active or pid in self.live.dirty:
                    delete += [k for k in keys if k not in write]
        return t.header(), write, delete, full

    def _parts_written(self, write: dict[str, bytes], delete: list[str], full: bool) -> None:
        """Keep `stored` as the hash now is (after the transaction)."""
        if full:
            self.stored = {}
        stored = self.stored
        for key in delete:
            pid = decode_id(key)[0]
            keys = stored.get(pid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del stored[pid]
        for key in write:
            stored.setdefault(decode_id(key)[0], set()).add(key)
        self.parts_full = self.live.tracker() is None
        if write:
            m.CHECKPOINT_PARTITIONS.labels("written").inc(len(write))
        if delete:
            m.CHECKPOINT_PARTITIONS.labels("deleted").inc(len(delete))
