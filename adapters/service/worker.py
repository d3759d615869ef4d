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

The parts: `adapters.service.lease` (the engine lock), `checkpointer` (snapshots),
`journal` (commits and replay), `control` (profile and gateway changes), `alarm_worker`
(alarm profiles' notifications and operator commands through the alarm rules, written by the
same commits), `intake` (ingest entries -> reorder buffer -> engine), `liveness` (heartbeat,
stats), and here the loop that drives them: start and recovery, read, feed, commit or
snapshot.
"""

from __future__ import annotations

import gc
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from adapters.errors import EvictingRedis
from adapters.errors import LockLost as LockLost  # its old import path
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmPart
from adapters.service.archive_feed import FeedBuffer
from adapters.service.checkpointer import Checkpointer
from adapters.service.control import Control
from adapters.service.engine_state import WorkerConfig as WorkerConfig  # its view of the settings
from adapters.service.intake import Intake
from adapters.service.journal import Journal
from adapters.service.known_attrs import Sketch
from adapters.service.late import LateRecord
from adapters.service.lease import EngineLease
from adapters.service.liveness import Liveness
from adapters.service.pressure import Pressure
from adapters.service.redis_limits import is_oom
from adapters.service.watermarks import Watermarks
from filters.engine import Engine
from filters.notification import Notification
from notifiers.stream_wait import read_by
from profiles.ast import Profile

log = logging.getLogger("ens.service.worker")


class EngineWorker(Intake, Control, AlarmPart, Journal, Checkpointer, Liveness, Pressure):
    """One engine over the whole ingest stream; at most one runs at a time (``ens:engine:lock``)."""

    def __init__(self, r: redis.Redis, config: WorkerConfig | None = None) -> None:
        if r.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the engine worker needs a client without decode_responses")
        self.r = r
        self.cfg = config or WorkerConfig()
        self.lease = EngineLease(r, self.cfg.name, self.cfg.lock_ttl)
        self.holder = self.lease.holder
        self._release = self.lease._release  # the script (tests release a lock by hand)
        self.started = False
        self._reset_state()
        self._interval = {"events": 0, "late": 0, "notifications": 0}
        self.unpublished = 0
        self.known = Sketch()  # outlives a restart from the snapshot: it is advisory
        self.last_known = float("-inf")  # the first events are written at once
        self.snapshot_bytes = 0  # of the last snapshot (in the heartbeat, for /metrics)

    def _reset_state(self) -> None:
        self._preparsed: dict[str, Any] | None = {}  # index profiles by id, during start only
        self.engine = self._new_engine()
        self.lost_state = False  # the checkpoint could not be restored (`_set_aside`)
        self.epoch = secrets.token_hex(4)
        # id -> the profile as applied (its `source` and `subscriber` are the stored definition);
        # kept after a `once` profile fired, so that it is not activated again
        self.defs: dict[str, Profile] = {}
        self.dirty: set[str] = set()  # ids whose definition changed since the last snapshot
        self.last_id = "0-0"  # last ingest entry read into engine or buffer
        self.control_id = "0-0"
        cfg = self.cfg
        self.wm = Watermarks(
            cfg.reorder_seconds, cfg.idle_timeout, cfg.reorder_max_events, cfg.max_skew
        )
        self.skewed: list[str] = []  # gateways whose clocks run ahead (logged when they start)
        self.late_by_gateway: dict[str, int] = {}
        self.late_out: list[LateRecord] = []  # sent to the late output, not committed yet
        self.unacked: list[str] = []  # read, to be XACKed by the next snapshot
        self.inputs: list[list[Any]] = []  # the input log since the last commit
        self.pending: list[Notification] = []  # detected, not committed
        self.archive_rows = FeedBuffer()  # fed, for ens:archive:feed with the next commit
        self.since_snapshot = 0  # inputs since the last snapshot
        self.journal_len = 0  # commits in ens:engine:journal (since the last snapshot)
        self.lease.last_renew = time.monotonic()
        # entries read from ens:ingest but not taken yet (a step takes about step_events
        # events); still pending in the group, so a recovery reads them again
        self.queued: list[tuple[Any, Any]] = []
        self.read_full = False  # the last read was a full batch: more is waiting
        # read: events taken from ens:ingest (the API's ens:ingest:in minus it is the backlog)
        self.totals = {"events": 0, "late": 0, "notifications": 0, "invalid": 0, "read": 0}
        self.changed = False  # anything to snapshot
        self.last_commit = 0.0
        self.last_snapshot = time.monotonic()
        self.last_heartbeat = 0.0
        self.last_status = time.monotonic()
        # profile id -> [partial matches dropped, notifications dropped] by the caps, since
        # this worker started (heartbeat stats; the Prometheus counters count in this process)
        self.capped: dict[str, list[int]] = {}
        self.cap_warned: dict[str, tuple[float, int, int]] = {}  # id -> (when, pms, notes) logged
        self._alarm_reset()

    def _cap_hits(self, mono: float) -> None:
        """Count what the engine's caps took (`filters.caps`) per profile, and log a WARNING
        naming the profile, at most once per profile per `cap_warn_interval`."""
        caps = self.cfg.caps
        for pid, hits in self.engine.take_cap_hits().items():
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

    def _new_engine(self) -> Engine:
        cfg = self.cfg
        return Engine(
            tz=cfg.tz,
            plan=cfg.plan,
            rates=cfg.rates,
            replan_every=cfg.replan_every,
            drift=cfg.drift,
            caps=cfg.caps,
        )

    def _keepalive(self) -> None:
        """Renew the lock lease while working (a long replay or step): `EngineLease.keepalive`."""
        self.lease.keepalive()

    def _transaction(self, write: Callable[[Any], None]) -> None:
        """Run ``write(pipe)`` in MULTI/EXEC, only if this worker still holds the lock."""
        self.lease.transaction(write)

    def start(self, stop: threading.Event | None = None) -> None:
        """Take the lock, load the snapshot, replay the journal, re-read pending ingest entries."""
        gc.unfreeze()  # a restart: the previous engine must be collectable
        self.check_policy()  # again at every reconnect: Redis may have restarted reconfigured
        self.lease.acquire(stop)
        fresh = self._load()
        self._gateways()
        self._schedules()  # --routing: the stored schedules, before the journal's replay
        if fresh and not self.r.exists(rs.JOURNAL):
            self.snapshot()  # fixes the epoch: every later state descends from this one
        try:
            self.r.xgroup_create(
                rs.INGEST,
                rs.ENGINE_GROUP,
                id=self.last_id if self.last_id != "0-0" else "0",
                mkstream=True,
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        pel = self._pending_entries()
        # None: the index is loaded when a profile needs it (an index imported before, whose
        # profiles the checkpoint usually holds already, costs nothing at a restart)
        self._preparsed = self._import_index() if self.cfg.index else {}
        fed = self._replay(pel)  # journalled profile changes use the index too
        bulk = self._reconcile()
        self._preparsed = {}
        now = time.time()
        reread = 0
        for eid, fields in pel:  # a batch entry may be fed in part: the rest is taken again
            reread += self._take(eid, fields, now, skip=fed)
            self._keepalive()
        if reread:
            log.info("re-read %d pending ingest events after the journal", reread)
        if bulk or self.journal_len or reread:
            # many profiles changed, or a recovery: snapshot now, so that an engine restarted
            # more often than --snapshot-interval does not replay an ever longer journal
            self.snapshot()
        self.engine.take_cap_hits()  # a replay redoes work whose hits were counted before
        gc.collect()  # the loaded engine lives on: keep the collector from rescanning it
        gc.freeze()
        self.started = True
        self._heartbeat(force=True)

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
                self.memory_ok()
            except EvictingRedis as exc:
                self.started = False
                self.refused_policy(exc, stop)
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
                    self.out_of_memory(exc, stop)
                    continue
                log.error("redis error (%s); restarting from the snapshot in 1 s", exc)
                self.started = False
                stop.wait(1.0)
        if self.started:
            try:
                self.snapshot()
                self.lease.release()
                log.info("engine worker stopped: %s", self.totals)
            except (redis.RedisError, LockLost) as exc:
                log.error("final snapshot failed (%s); the next start redoes the work", exc)

    def _archive_due(self, mono: float) -> bool:
        """Fed events wait for the archive: commit them although nothing matched (the
        archive's lag stays about ``archive_commit`` behind the engine)."""
        rows = len(self.archive_rows)
        return bool(rows) and (
            rows >= self.cfg.archive_rows or mono - self.last_commit >= self.cfg.archive_commit
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
        if block is None:
            block = self.cfg.block
            if self.pending:
                wait = self.cfg.commit_min_interval - (time.monotonic() - self.last_commit)
                block = min(block, max(wait, 0.0))
            if self.wm.heap:  # wake when the oldest held event falls due, not a tick later
                t = time.time()
                lag = self.wm.max_active_lateness(t) if self.cfg.clock == "wall" else None
                due = self.wm.next_due(t, lag)
                if due is not None:
                    block = min(block, max(due - t, 0.001))
        if not self.queued:
            self.queued = self._read(block)
            self.read_full = len(self.queued) >= self.cfg.batch
        now = time.time() if now is None else now
        self._control()  # first: a profile added before an event was posted sees that event
        # a step takes about step_events events (an entry holds one request's), so that it
        # ends, commits and renews the lock lease soon whatever the backlog
        entries = taken = 0
        while self.queued and taken < self.cfg.step_events:
            eid, fields = self.queued.pop()
            taken += self._take(rs.text(eid), fields, now)
            entries += 1
        # More waiting (a full batch, or entries not taken yet): the wall clock must not
        # overtake events that were accepted but not read yet (they would all turn late), so
        # only event time moves.
        self._release_due(now, caught_up=not (self.read_full or self.queued))
        self.pending.extend(self.engine.take_notifications())
        if self.engine.cap_hits:
            self._cap_hits(mono=time.monotonic())
        if self.unpublished:
            m.EVENTS_PROCESSED.inc(self.unpublished)
            self.unpublished = 0
        mono = time.monotonic()
        if self.changed and (
            mono - self.last_snapshot >= self.cfg.snapshot_interval
            or self.since_snapshot >= self.cfg.snapshot_inputs
            or self.journal_len >= self.cfg.snapshot_journal
        ):
            self.snapshot()
        elif mono - self.last_commit >= self.cfg.commit_min_interval and (
            self.pending or self.late_out or self._archive_due(mono) or self._alarm_wants_commit()
        ):
            self.commit()
        self._write_known()
        self._heartbeat()
        self._status()
        return entries
