"""The engine worker: ingest stream -> reorder buffer -> engine -> outbox, exactly once.

Exactly once. The engine is deterministic: from the same state, the same inputs in the same
order (events, `advance(t)` calls, profile changes) give the same notifications with the same
detection numbers. The worker's non-deterministic decisions (when the reorder buffer releases
an event, where the wall clock is, when a profile change lands) are therefore written down:
the inputs fed since the last commit form an *input log*, and a **commit** is one MULTI/EXEC
that appends that log to ``ens:engine:journal`` *and* XADDs the notifications those inputs
produced to ``ens:outbox``. Either both are in Redis or neither. A **snapshot** (periodic) is
one MULTI/EXEC that stores the engine, the reorder buffer and ``last_id`` (the last ingest
entry read) in ``ens:checkpoint``, writes pending notifications, empties the journal, XACKs the
ingest entries it covers and trims them from ``ens:ingest``.

Recovery after ``kill -9``: load the snapshot, replay the journal (events are found in the
snapshot's buffer or, not yet acknowledged, in ``ens:ingest``) and discard the notifications
this reproduces (they were committed with their journal entry), then re-read the rest of the
pending ingest entries into the buffer. Inputs after the last commit were never published, so
they are simply decided again. Commits are small (ids and a few notifications), so a
notification reaches the outbox one step after it is detected whatever the engine's size;
only snapshots cost in proportion to the state, and they are rare. Every transaction WATCHes
``ens:engine:lock``, so a worker that lost the lock (paused, partitioned) never commits over
its successor.

Notification ids are ``f"{profile}:{epoch}:{seq}"``: ``epoch`` is drawn when an engine state
is first created, ``seq`` is the engine's detection counter, which is part of the snapshot.

Ordering. Events are fed to the engine in ``ts`` order behind per-gateway watermarks
(`adapters.service.watermarks`): a gateway's watermark is its newest ``ts`` minus its allowed
lateness (``ens gateway add/set --lateness``; ``reorder_seconds`` for gateways without one),
and an event is fed once every *active* gateway's watermark has passed it (or the buffer is
full). A gateway silent for ``idle_timeout`` of wall time holds nobody back. An event older
than the engine time when it is read is *late*: it can no longer be fed in ``ts`` order, so it
goes to the late side output ``ens:late`` (`adapters.service.late`; a journal input, written by
the commit that journals it, so exactly once like a notification), counted per gateway and
logged, never dropped (``late_events="feed"``: fed at once, in arrival order). With
``clock="wall"`` timers (windows, trailing negations, ``absent``, ``clock``) fire by wall clock: every tick in which the worker has caught up with the ingest
stream, held events up to ``now - L`` are fed and the engine advances to ``now - L``, where
``L`` is the largest lateness of the active gateways, at least ``reorder_seconds`` (while a
backlog is being worked off, only event time moves, so a slow worker does not turn the
backlog late).

The parts, each an object with its own fields that `EngineWorker` builds and gives what it
needs: `adapters.service.lease` (the engine lock), `checkpointer` (snapshots), `journal`
(commits and replay), `control` (profile and gateway changes), `alarm_worker` (alarm
profiles' notifications and operator commands through the alarm rules, written by the same
commits), `intake` (ingest entries -> reorder buffer -> engine), `liveness` (heartbeat, the
status line), `pressure` (Redis' limits); what they share is in `engine_state` (the engine as
it runs, the input log, the counts). Here is the loop that drives them: start and recovery,
read, feed, commit or snapshot.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

import redis

from adapters.errors import EvictingRedis
from adapters.errors import LockLost as LockLost  # its old import path
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmPart
from adapters.service.checkpointer import Checkpointer
from adapters.service.control import Control
from adapters.service.engine_state import InputLog, LiveEngine, Progress
from adapters.service.engine_state import WorkerConfig as WorkerConfig  # its view of the settings
from adapters.service.intake import Intake
from adapters.service.journal import Journal
from adapters.service.lease import EngineLease
from adapters.service.liveness import Liveness
from adapters.service.pressure import Pressure
from adapters.service.redis_limits import is_oom
from adapters.service.watermarks import Held
from filters.engine import Engine
from filters.notification import Notification
from notifiers.stream_wait import read_by
from profiles.ast import Profile

log = logging.getLogger("ens.service.worker")


class EngineWorker:
    """One engine over the whole ingest stream; at most one runs at a time (``ens:engine:lock``)."""

    def __init__(self, r: redis.Redis, config: WorkerConfig | None = None) -> None:
        if r.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the engine worker needs a client without decode_responses")
        self.r = r
        self.cfg = cfg = config or WorkerConfig()
        self.lease = lease = EngineLease(r, cfg.name, cfg.lock_ttl)
        self.holder = lease.holder
        self._release = lease._release  # the script (tests release a lock by hand)
        self.started = False
        keepalive = lease.keepalive  # a long replay or step renews the lock lease
        self.live = live = LiveEngine(cfg)
        self.progress = progress = Progress()
        self.inputs = inputs = InputLog(keepalive)
        self.pressure = Pressure(r, cfg)
        self.alarms = alarms = AlarmPart(r, cfg, live)
        self.intake = intake = Intake(r, cfg, live, inputs, progress, alarms, keepalive)
        self.control = control = Control(r, cfg, live, inputs, progress, intake, alarms, keepalive)
        self.journal = journal = Journal(
            r, cfg, lease, live, inputs, progress, intake, control, alarms
        )
        self.checkpointer = Checkpointer(
            r,
            cfg,
            lease,
            live,
            inputs,
            progress,
            intake,
            control,
            journal,
            alarms,
            reset=self.reset_state,
        )
        self.liveness = Liveness(r, cfg, lease, live, intake, progress, self.stats)
        self.reset_state()

    def reset_state(self) -> None:
        """A new engine state: every part starts again (then `Checkpointer.load` restores)."""
        self.control.reset()
        self.live.reset()
        self.checkpointer.reset()
        self.intake.reset()
        self.liveness.reset()
        self.inputs.reset()
        self.journal.reset()
        self.lease.last_renew = time.monotonic()
        # entries read from ens:ingest but not taken yet (a step takes about step_events
        # events); still pending in the group, so a recovery reads them again
        self.queued: list[tuple[Any, Any]] = []
        self.read_full = False  # the last read was a full batch: more is waiting
        self.progress.reset()
        # profile id -> [partial matches dropped, notifications dropped] by the caps, since
        # this worker started (heartbeat stats; the Prometheus counters count in this process)
        self.capped: dict[str, list[int]] = {}
        self.cap_warned: dict[str, tuple[float, int, int]] = {}  # id -> (when, pms, notes) logged
        self.alarms.reset()

    # ------------------------------------------------------------------ what tests and benches read
    @property
    def engine(self) -> Engine:
        return self.live.engine

    @property
    def epoch(self) -> str:
        return self.live.epoch

    @property
    def defs(self) -> dict[str, Profile]:
        return self.live.defs

    @property
    def totals(self) -> dict[str, int]:
        return self.progress.totals

    @property
    def late_by_gateway(self) -> dict[str, int]:
        return self.progress.late_by_gateway

    @property
    def last_id(self) -> str:
        return self.intake.last_id

    @property
    def buffer(self) -> list[Held]:
        """The held events (a heap; ``h.item`` is an `Item`)."""
        return self.intake.buffer

    @property
    def pending(self) -> list[Notification]:
        return self.journal.pending

    def stats(self) -> dict[str, Any]:
        """What the heartbeat publishes (`/healthz`, `/metrics`): every part's figures."""
        now = time.time()
        engine, buffer, router = self.live.engine, self.intake.buffer, self.alarms.router
        return {
            **engine.stats(),
            "buffered": len(buffer),
            "oldest_buffered_age": max((now - h.wall for h in buffer), default=0.0),
            "late_by_gateway": dict(self.progress.late_by_gateway),
            "capped_by_profile": {pid: list(n) for pid, n in self.capped.items()},
            "pending_notifications": len(self.journal.pending),
            "engine_time": engine.now,
            "last_id": self.intake.last_id,
            "epoch": self.live.epoch,
            "snapshot_bytes": self.checkpointer.snapshot_bytes,
            "skewed_gateways": self.intake.wm.skewed(now),
            "alarms": self.alarms.gauges(),  # "severity|state" -> alarms
            "escalations": len(router.escalator.pending) if router else 0,
            **{f"total_{k}": v for k, v in self.progress.totals.items()},
        }

    def commit(self) -> None:
        """`Journal.commit`: the inputs since the last commit with what they produced."""
        self.journal.commit()

    def snapshot(self) -> None:
        """`Checkpointer.snapshot`."""
        self.checkpointer.snapshot()

    def _cap_hits(self, mono: float) -> None:
        """Count what the engine's caps took (`filters.caps`) per profile, and log a WARNING
        naming the profile, at most once per profile per `cap_warn_interval`."""
        caps = self.cfg.caps
        for pid, hits in self.live.engine.take_cap_hits().items():
            total = self.capped.setdefault(pid, [0, 0])
            total[0] += hits.partial_matches
            total[1] += hits.notifications
            if hits.partial_matches:
                m.PARTIAL_MATCHES_DROPPED.labels(profile=pid).inc(hits.partial_matches)
            if hits.notifications:
                m.NOTIFICATIONS_CAPPED.labels(profile=pid).inc(hits.notifications)
            when, pms, notes = self.cap_warned.get(pid, (-1e18, 0, 0))
            if mono - when < self.cfg.cap_warn_interval:
                continue
            self.cap_warned[pid] = (mono, total[0], total[1])
            log.warning(
                "profile %r hit its caps: %d partial matches dropped (at most %d per "
                "partition, %d per profile), %d notifications dropped (at most %d per event) "
                "since the last warning; `ens explain --profile %s` shows where "
                "(--max-partial-matches, --max-notifications-per-event)",
                pid,
                total[0] - pms,
                caps.partition,
                caps.profile,
                total[1] - notes,
                caps.notifications,
                pid,
            )

    def start(self, stop: threading.Event | None = None) -> None:
        """Take the lock, load the snapshot, replay the journal, re-read pending ingest entries."""
        gc.unfreeze()  # a restart: the previous engine must be collectable
        self.pressure.check_policy()  # at every reconnect: Redis may have restarted reconfigured
        self.lease.acquire(stop)
        fresh = self.checkpointer.load()
        control, intake = self.control, self.intake
        control.gateways()
        control.schedules()  # --routing: the stored schedules, before the journal's replay
        if fresh and not self.r.exists(rs.JOURNAL):
            self.snapshot()  # fixes the epoch: every later state descends from this one
        try:
            self.r.xgroup_create(
                rs.INGEST,
                rs.ENGINE_GROUP,
                id=intake.last_id if intake.last_id != "0-0" else "0",
                mkstream=True,
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        pel = self.journal.pending_entries()
        # the index is loaded when a profile needs it (an index imported before, whose
        # profiles the checkpoint usually holds already, costs nothing at a restart)
        control.use_index()
        # journalled profile changes use the index too
        fed = self.journal.replay(pel, self.checkpointer.lost_state)
        bulk = control.reconcile()
        control.forget_index()
        now = time.time()
        reread = 0
        for eid, fields in pel:  # a batch entry may be fed in part: the rest is taken again
            reread += intake.take(eid, fields, now, skip=fed)
            self.lease.keepalive()
        if reread:
            log.info("re-read %d pending ingest events after the journal", reread)
        if bulk or self.journal.journal_len or reread:
            # many profiles changed, or a recovery: snapshot now, so that an engine restarted
            # more often than --snapshot-interval does not replay an ever longer journal
            self.snapshot()
        self.live.engine.take_cap_hits()  # a replay redoes work whose hits were counted before
        gc.collect()  # the loaded engine lives on: keep the collector from rescanning it
        gc.freeze()
        self.started = True
        self.liveness.heartbeat(force=True)

    def run_forever(self, stop: threading.Event) -> None:
        """Step until ``stop``; on a Redis error restart from Redis; finally snapshot.

        After an error it is unknown whether the last transaction committed, so the in-memory
        state is dropped and rebuilt from Redis rather than retried (which could duplicate);
        except after an OOM refusal, which Redis gives before running anything: the worker
        keeps its state and tries again later (`adapters.service.pressure`).
        """
        while not stop.is_set():
            try:
                if not self.started:
                    self.start(stop)
                self.step()
                self.pressure.memory_ok()
            except EvictingRedis as exc:
                self.started = False
                self.pressure.refused_policy(exc, stop)
            except LockLost as exc:
                if stop.is_set():
                    break
                # its state may be ahead of what it committed: drop it, wait for the lock again
                # (a standby now, or the engine again if nobody else took over)
                log.error("%s; restarting from the snapshot once the lock is free", exc)
                self.started = False
                stop.wait(1.0)
            except redis.RedisError as exc:
                if is_oom(exc):  # refused before it ran: a started worker keeps its state
                    self.pressure.out_of_memory(exc, stop)
                    continue
                log.error("redis error (%s); restarting from the snapshot in 1 s", exc)
                self.started = False
                stop.wait(1.0)
        if self.started:
            try:
                self.snapshot()
                self.lease.release()
                log.info("engine worker stopped: %s", self.progress.totals)
            except (redis.RedisError, LockLost) as exc:
                log.error("final snapshot failed (%s); the next start redoes the work", exc)

    def _archive_due(self, mono: float) -> bool:
        """Fed events wait for the archive: commit them although nothing matched (the
        archive's lag stays about ``archive_commit`` behind the engine)."""
        rows = len(self.intake.archive_rows)
        return bool(rows) and (
            rows >= self.cfg.archive_rows
            or mono - self.journal.last_commit >= self.cfg.archive_commit
        )

    def _read(self, block: float) -> list[tuple[Any, Any]]:
        """The next ingest entries (last first), waiting at most about ``block`` seconds and
        not a Redis timer tick longer (`notifiers.stream_wait`): a held event is released
        within a few ms of its time."""
        resp = read_by(self._xread, block)
        return list(reversed(resp[0][1])) if resp else []

    def _xread(self, block_ms: int | None) -> Any:
        return self.r.xreadgroup(
            rs.ENGINE_GROUP,
            self.cfg.name,
            {rs.INGEST: ">"},
            count=self.cfg.batch,
            block=block_ms,
        )

    def step(self, block: float | None = None, now: float | None = None) -> int:
        """Read a batch, apply profile changes, release due events, commit/snapshot when due.

        ``now`` is the wall clock (tests pass their own). Returns how many entries were read.
        """
        journal, intake, wm = self.journal, self.intake, self.intake.wm
        if block is None:
            block = self.cfg.block
            if journal.pending:
                wait = self.cfg.commit_min_interval - (time.monotonic() - journal.last_commit)
                block = min(block, max(wait, 0.0))
            if wm.heap:  # wake when the oldest held event falls due, not a tick later
                t = time.time()
                lag = wm.max_active_lateness(t) if self.cfg.clock == "wall" else None
                due = wm.next_due(t, lag)
                if due is not None:
                    block = min(block, max(due - t, 0.001))
        if not self.queued:
            self.queued = self._read(block)
            self.read_full = len(self.queued) >= self.cfg.batch
        now = time.time() if now is None else now
        self.control.poll()  # first: a profile added before an event was posted sees that event
        # a step takes about step_events events (an entry holds one request's), so that it
        # ends, commits and renews the lock lease soon whatever the backlog
        entries = taken = 0
        while self.queued and taken < self.cfg.step_events:
            eid, fields = self.queued.pop()
            taken += intake.take(rs.text(eid), fields, now)
            entries += 1
        # More waiting (a full batch, or entries not taken yet): the wall clock must not
        # overtake events that were accepted but not read yet (they would all turn late), so
        # only event time moves.
        intake.release_due(now, caught_up=not (self.read_full or self.queued))
        journal.collect()
        if self.live.engine.cap_hits:
            self._cap_hits(mono=time.monotonic())
        progress = self.progress
        if progress.unpublished:
            m.EVENTS_PROCESSED.inc(progress.unpublished)
            progress.unpublished = 0
        mono = time.monotonic()
        if progress.changed and (
            mono - self.checkpointer.last_snapshot >= self.cfg.snapshot_interval
            or self.inputs.since_snapshot >= self.cfg.snapshot_inputs
            or journal.journal_len >= self.cfg.snapshot_journal
        ):
            self.snapshot()
        elif mono - journal.last_commit >= self.cfg.commit_min_interval and (
            journal.pending
            or intake.late_out
            or self._archive_due(mono)
            or self.alarms.wants_commit()
        ):
            self.commit()
        intake.write_known()
        self.liveness.heartbeat()
        self.liveness.status()
        return entries
