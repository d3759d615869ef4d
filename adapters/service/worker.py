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
than the engine time is *late*: it is fed at once, in arrival order, counted per gateway and
logged, never dropped. With ``clock="wall"`` timers (windows, trailing negations, ``absent``,
``clock``) fire by wall clock: every tick in which the worker has caught up with the ingest
stream, held events up to ``now - L`` are fed and the engine advances to ``now - L``, where
``L`` is the largest lateness of the active gateways, at least ``reorder_seconds`` (while a
backlog is being worked off, only event time moves, so a slow worker does not turn the
backlog late).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.records import (
    OP_EVENT,
    Advanced,
    CheckpointMeta,
    HeldRow,
    JournalEntry,
    ProfileChanged,
    op_advance,
    op_profile,
)
from adapters.service.settings import DEFAULTS, ServiceSettings
from adapters.service.watermarks import Held, Watermarks
from filters.engine import Engine
from filters.notification import Notification
from notifiers import store
from profiles.ast import Profile
from profiles.errors import LockLost as LockLost  # raised here; one hierarchy there
from profiles.errors import ProfileError
from profiles.events import Event, event_from_normalized, event_from_obj

log = logging.getLogger("ens.service.worker")

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_STEAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1
end
return 0
"""


@dataclass
class WorkerConfig:
    """The engine worker's view of `ServiceSettings` (`from_settings`); the fields without a
    setting are internal tunables (tests shorten them)."""

    reorder_seconds: float = DEFAULTS.default_lateness  # gateways without their own lateness
    reorder_max_events: int = DEFAULTS.reorder_max_events
    idle_timeout: float = DEFAULTS.idle_timeout  # a gateway silent this long holds nothing back
    clock: str = DEFAULTS.clock  # "wall": timers fire by wall clock; "event": only by event time
    tz: str = DEFAULTS.tz
    name: str = field(default_factory=socket.gethostname)
    batch: int = 1000  # most ingest entries read per step
    step_events: int = 20_000  # ... and about this many events: a step stays short (lock lease)
    block: float = 0.1  # longest XREADGROUP wait (s): the tick of the wall clock
    commit_min_interval: float = 0.01  # group notifications of steps this close together
    snapshot_interval: float = DEFAULTS.snapshot_interval  # snapshot this often when changed ...
    snapshot_inputs: int = 200_000  # ... or after this many inputs (bounds recovery work)
    snapshot_journal: int = 2_000  # ... or when the journal holds this many commits
    lock_ttl: float = 15.0  # renewed every third of it while the worker works
    max_skew: float = DEFAULTS.max_skew  # an event this far ahead of the wall clock waits for it
    heartbeat_interval: float = 1.0
    status_interval: float = DEFAULTS.status_interval  # the "worker: N events, ..." log line
    index: str | None = None  # an `ens spark index` snapshot: its profiles are used unparsed
    # reads ``index`` (`ens serve` passes adapters.spark.index.load_index; the service does not
    # import the Spark adapter itself)
    load_index: Callable[[str], list[Profile]] | None = None
    plan: str = DEFAULTS.plan  # plan of a fresh engine (docs/plans.md; a snapshot keeps its own)
    rates: Any = None  # filters.plans.Rates from --stats, for plan "auto"
    replan_every: int = DEFAULTS.replan_every  # plan "auto": re-plan every N events (0: never)
    drift: float = DEFAULTS.drift  # ... when a component's rate moved by this factor

    @classmethod
    def from_settings(
        cls,
        s: ServiceSettings,
        rates: Any = None,
        load_index: Callable[[str], list[Profile]] | None = None,
    ) -> WorkerConfig:
        cfg = cls(
            reorder_seconds=s.default_lateness,
            reorder_max_events=s.reorder_max_events,
            clock=s.clock,
            idle_timeout=s.idle_timeout,
            max_skew=s.max_skew,
            tz=s.tz,
            snapshot_interval=s.snapshot_interval,
            status_interval=s.status_interval,
            plan=s.plan,
            rates=rates,
            replan_every=s.replan_every,
            drift=float(s.drift),
        )
        if s.worker_name:
            cfg.name = s.worker_name
        if s.index is not None:
            cfg.index = str(s.index)
            cfg.load_index = load_index
        return cfg


class _Item(NamedTuple):
    """What the watermark buffer holds for the worker: the ingest entry and its event."""

    entry: str
    event: Event


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _id_le(a: str, b: str) -> bool:
    return rs.parse_id(a) <= rs.parse_id(b)


def _gateway(fields: Any) -> str:
    """The gateway name of an ingest entry ("?" if it has none)."""
    return rs.text(fields.get(rs.INGEST_GATEWAY.encode(), b"?")) if fields else "?"


class EngineWorker:
    """One engine over the whole ingest stream; at most one runs at a time (``ens:engine:lock``)."""

    def __init__(self, r: redis.Redis, config: WorkerConfig | None = None) -> None:
        if r.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the engine worker needs a client without decode_responses")
        self.r = r
        self.cfg = config or WorkerConfig()
        self.host = socket.gethostname()
        self.holder = f"{self.cfg.name}|{self.host}|{os.getpid()}|{secrets.token_hex(4)}"
        self._renew = r.register_script(_RENEW)
        self._release = r.register_script(_RELEASE)
        self._steal = r.register_script(_STEAL)
        self.started = False
        self._reset_state()
        self._interval = {"events": 0, "late": 0, "notifications": 0}
        self.snapshot_bytes = 0  # of the last snapshot (in the heartbeat, for /metrics)

    # ------------------------------------------------------------------ state
    def _reset_state(self) -> None:
        self._preparsed: dict[str, Any] | None = {}  # index profiles by id, during start only
        cfg = self.cfg
        self.engine = Engine(
            tz=cfg.tz,
            plan=cfg.plan,
            rates=cfg.rates,
            replan_every=cfg.replan_every,
            drift=cfg.drift,
        )
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
        self.unacked: list[str] = []  # read, to be XACKed by the next snapshot
        self.inputs: list[list[Any]] = []  # the input log since the last commit
        self.pending: list[Notification] = []  # detected, not committed
        self.since_snapshot = 0  # inputs since the last snapshot
        self.journal_len = 0  # commits in ens:engine:journal (since the last snapshot)
        self.last_renew = time.monotonic()  # of the engine lock
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

    @property
    def buffer(self) -> list[Held]:
        """The held events (a heap; ``h.item`` is an `_Item`)."""
        return self.wm.heap

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
            stored = self.r.hgetall(rs.CHECKPOINT_PROFILES)
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
            held.append(Held(ev.ts, row.seq, row.gateway, row.wall, _Item(row.entry, ev)))
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

    # ------------------------------------------------------------------ lock
    def _acquire(self, stop: threading.Event | None) -> None:
        ttl = int(self.cfg.lock_ttl * 1000)
        waiting = False
        while stop is None or not stop.is_set():
            self.last_renew = time.monotonic()
            if self.r.set(rs.ENGINE_LOCK, self.holder, nx=True, px=ttl):
                return
            cur = rs.text(self.r.get(rs.ENGINE_LOCK))
            if cur == self.holder:  # ours already (restart after a Redis error)
                self.r.pexpire(rs.ENGINE_LOCK, ttl)
                return
            if (
                cur
                and self._stale(cur)
                and self._steal(keys=[rs.ENGINE_LOCK], args=[cur, self.holder, ttl])
            ):
                log.warning("took over the engine lock from dead worker %s", cur)
                return
            if not waiting:
                log.warning("waiting for the engine lock held by %s", cur)
                waiting = True
            time.sleep(0.2) if stop is None else stop.wait(0.2)
        raise LockLost("stopped while waiting for the engine lock")

    def _keepalive(self) -> None:
        """Renew the lock lease while working (a long replay or step): every third of its TTL.

        The lease is renewed by the worker's own progress, never by a side thread, so a
        worker that hangs loses it and a standby takes over.
        """
        now = time.monotonic()
        if now - self.last_renew < self.cfg.lock_ttl / 3:
            return
        if not self._renew(
            keys=[rs.ENGINE_LOCK], args=[self.holder, int(self.cfg.lock_ttl * 1000)]
        ):
            raise LockLost("the engine lock expired or was taken over")
        self.last_renew = now

    def _stale(self, holder: str) -> bool:
        """A holder on this host whose process is gone (``kill -9``): no need to wait the TTL."""
        try:
            _name, host, pid, _tok = holder.split("|")
            return host == self.host and int(pid) != os.getpid() and not _pid_alive(int(pid))
        except ValueError:
            return False

    # ------------------------------------------------------------------ start
    def start(self, stop: threading.Event | None = None) -> None:
        """Take the lock, load the snapshot, replay the journal, re-read pending ingest entries."""
        gc.unfreeze()  # a restart: the previous engine must be collectable
        self._acquire(stop)
        fresh = self._load()
        self._gateways()
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
        gc.collect()  # the loaded engine lives on: keep the collector from rescanning it
        gc.freeze()
        self.started = True
        self._heartbeat(force=True)

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
            resp = self.r.xreadgroup(
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
        entries = self.r.xrange(rs.JOURNAL)
        self.journal_len = len(entries)
        for _jid, f in entries:
            entry = JournalEntry.read(f)
            for op in entry.operations():
                if isinstance(op, ProfileChanged):
                    self._set_def(op.id, op.expr, op.subscriber)
                elif isinstance(op, Advanced):
                    self.engine.advance(op.t)
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
            if len(redone) != entry.notifications:
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
        return fed

    def _reconcile(self) -> bool:
        """Make the engine's profiles those of ``ens:profiles`` (changes made while down).

        Returns True when many profiles changed (a first start on a large set).
        """
        last = self.r.xrevrange(rs.CONTROL, count=1)
        ctl = rs.text(last[0][0]) if last else "0-0"
        stored = rs.list_profiles(self.r)
        want = {p["id"]: p for p in stored}
        quiet = len(stored) > 100  # one summary line instead of a line per profile
        changed = 0
        for pid in list(self.defs):
            if pid not in want:
                self._apply(pid, None, quiet)
                changed += 1
        for p in stored:
            changed += self._apply(p["id"], p, quiet)
        if changed:
            log.info(
                "profiles: %d active after %d change(s) made while the engine was down",
                len(self.defs),
                changed,
            )
        if rs.parse_id(ctl) > rs.parse_id(self.control_id):
            self.control_id = ctl
        return changed > 100

    def _import_index(self) -> dict[str, Any] | None:
        """Import the index snapshot's profiles missing from ``ens:profiles``, once per snapshot.

        Returns its profiles by id, or None when this very snapshot (same manifest) was
        imported by an earlier start: it is then loaded only if a profile needs it.
        """
        fp = rs.index_fingerprint(self.cfg.index)  # type: ignore[arg-type]
        if self.r.hexists(rs.INDEX_IMPORTED, fp):
            log.info(
                "index %s: imported by an earlier start (manifest %s); not loaded again unless "
                "a profile needs it",
                self.cfg.index,
                fp[:12],
            )
            return None
        profiles = self._load_index()
        imported, kept = rs.import_profiles(self.r, list(profiles.values()))
        self.r.hset(
            rs.INDEX_IMPORTED,
            fp,
            json.dumps(
                {
                    "path": str(self.cfg.index),
                    "profiles": len(profiles),
                    "imported": imported,
                    "at": time.time(),
                }
            ),
        )
        log.info(
            "index %s: %d imported into ens:profiles, %d already there",
            self.cfg.index,
            imported,
            kept,
        )
        return profiles

    def _load_index(self) -> dict[str, Any]:
        if self.cfg.load_index is None:
            raise ValueError("WorkerConfig.index needs WorkerConfig.load_index (its reader)")
        t = time.perf_counter()
        profiles = self.cfg.load_index(self.cfg.index)  # type: ignore[arg-type]
        log.info(
            "index %s: %d profiles loaded in %.1f s",
            self.cfg.index,
            len(profiles),
            time.perf_counter() - t,
        )
        return {p.id: p for p in profiles}

    # ------------------------------------------------------------------ profiles
    def _apply(self, pid: str, rec: dict[str, Any] | None, quiet: bool = False) -> bool:
        """Apply the stored definition of one profile (None: deleted), logging the input."""
        expr = rec["expr"] if rec else None
        sub = rec.get("subscriber") if rec else None
        self._keepalive()  # a start on many profiles parses for a while
        if self._set_def(pid, expr, sub, quiet):
            self._input(op_profile(pid, expr, sub))
            self.changed = True
            return True
        return False

    def _set_def(self, pid: str, expr: str | None, sub: str | None, quiet: bool = False) -> bool:
        """Make `pid` the stored definition; `quiet` logs it at DEBUG (bulk starts)."""
        level = logging.DEBUG if quiet else logging.INFO
        have = self.defs.get(pid)
        if expr is None:
            if have is None:
                return False
            self._remove(pid)
            del self.defs[pid]
            self.dirty.add(pid)
            log.log(level, "profile %s removed", pid)
            return True
        if have is not None and have.source == expr and have.subscriber == sub:
            return False
        if self._preparsed is None:  # an index imported earlier: needed after all
            self._preparsed = self._load_index()
        profile = self._preparsed.pop(pid, None)
        if profile is None or profile.source != expr or profile.subscriber != sub:
            try:  # not from the index (or changed since): parse
                profile = rs.validate_profile(None, pid, expr, sub)
            except ProfileError as exc:  # the API validates; this is a hand-edited hash
                log.error("ignoring invalid stored profile %s: %s", pid, exc)
                return False
        if have is not None:
            self._remove(pid)
        self.engine.add_profile(profile)
        self.defs[pid] = profile
        self.dirty.add(pid)
        log.log(level, "profile %s %s: %s", pid, "replaced" if have else "added", expr.strip())
        return True

    def _remove(self, pid: str) -> None:
        try:
            self.engine.remove_profile(pid)
        except KeyError:  # a `once` profile that fired has removed itself
            pass

    def _gateways(self, name: str | None = None) -> None:
        """Take the gateways' own latenesses from ``ens:gateways`` (one, or all)."""
        for gw, lateness in rs.gateway_lateness(self.r, name).items():
            src = self.wm.sources.get(gw)
            if (src.lateness if src is not None else None) != lateness:
                log.info(
                    "gateway %s: lateness %s",
                    gw,
                    "default" if lateness is None else f"{lateness:g} s",
                )
            self.wm.set_lateness(gw, lateness)

    def _control(self) -> None:
        resp = self.r.xread({rs.CONTROL: self.control_id}, count=100)
        for eid, fields in resp[0][1] if resp else []:
            pid = rs.text(fields.get(b"id", b""))
            if pid:
                self._apply(pid, rs.get_profile(self.r, pid))
            gw = rs.text(fields.get(b"gw", b""))
            if gw:  # a gateway's lateness changed: only release decisions (journalled) change
                self._gateways(gw)
            self.control_id = rs.text(eid)
            self.changed = True

    # ------------------------------------------------------------------ the loop
    def run_forever(self, stop: threading.Event) -> None:
        """Step until ``stop``; on a Redis error restart from Redis; finally snapshot.

        After an error it is unknown whether the last transaction committed, so the in-memory
        state is dropped and rebuilt from Redis rather than retried (which could duplicate).
        """
        while not stop.is_set():
            try:
                if not self.started:
                    self.start(stop)
                self.step()
            except LockLost as exc:
                if stop.is_set():
                    break
                # its state may be ahead of what it committed: drop it, wait for the lock again
                # (a standby now, or the engine again if nobody else took over)
                log.error("%s; restarting from the snapshot once the lock is free", exc)
                self.started = False
                stop.wait(1.0)
            except redis.RedisError as exc:
                log.error("redis error (%s); restarting from the snapshot in 1 s", exc)
                self.started = False
                stop.wait(1.0)
        if self.started:
            try:
                self.snapshot()
                self._release(keys=[rs.ENGINE_LOCK], args=[self.holder])
                log.info("engine worker stopped: %s", self.totals)
            except (redis.RedisError, LockLost) as exc:
                log.error("final snapshot failed (%s); the next start redoes the work", exc)

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
            resp = self.r.xreadgroup(
                rs.ENGINE_GROUP,
                self.cfg.name,
                {rs.INGEST: ">"},
                count=self.cfg.batch,
                block=max(int(block * 1000), 1) if block > 0 else None,
            )
            self.queued = list(reversed(resp[0][1])) if resp else []
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
        mono = time.monotonic()
        if self.changed and (
            mono - self.last_snapshot >= self.cfg.snapshot_interval
            or self.since_snapshot >= self.cfg.snapshot_inputs
            or self.journal_len >= self.cfg.snapshot_journal
        ):
            self.snapshot()
        elif self.pending and mono - self.last_commit >= self.cfg.commit_min_interval:
            self.commit()
        self._heartbeat()
        self._status()
        return entries

    def _input(self, op: list[Any]) -> None:
        self.inputs.append(op)
        self.since_snapshot += 1
        if not self.since_snapshot & 63:
            self._keepalive()

    @staticmethod
    def _decode(eid: str, fields: Any) -> list[tuple[str, str, Any]]:
        """`rs.decode_entry`, with an unreadable entry logged and read as no events."""
        try:
            return rs.decode_entry(eid, fields) if fields else []
        except (TypeError, ValueError) as exc:
            log.error("unreadable ingest entry %s skipped: %s", eid, exc)
            return []

    def _parse(self, key: str, gw: str, obj: Any, normalized: bool = False) -> Event | None:
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

    def _take(
        self, eid: str, fields: Any, now: float, skip: set[str] | frozenset[str] = frozenset()
    ) -> int:
        """Read one ingest entry into the buffer (events in ``skip`` were fed already).

        Returns how many events were taken.
        """
        self.unacked.append(eid)
        self.changed = True
        if not fields or _id_le(eid, self.last_id):
            return 0  # covered by the snapshot already (or trimmed)
        self.last_id = eid
        decoded = self._decode(eid, fields)
        if not decoded:
            m.EVENTS_INVALID.labels(gateway=_gateway(fields)).inc()
            self.totals["invalid"] += 1
        self.totals["read"] += len(decoded)
        normalized = rs.entry_normalized(fields)
        taken = 0
        for key, gw, obj in decoded:
            if key in skip:
                continue
            taken += 1
            if not taken & 255:
                self._keepalive()
            ev = self._parse(key, gw, obj, normalized)
            if ev is None:
                m.EVENTS_INVALID.labels(gateway=gw).inc()
                self.totals["invalid"] += 1
                continue
            self.wm.observe(gw, ev.ts, now)
            if self.engine.now is not None and ev.ts < self.engine.now:
                self._feed(ev, key, gw)  # late: nothing can be reordered around it any more
                continue
            self.wm.hold(gw, ev.ts, now, _Item(key, ev))
        return taken

    def _release_due(self, now: float, caught_up: bool = True) -> None:
        wall = self.cfg.clock == "wall" and caught_up
        target = now - self.wm.max_active_lateness(now) if wall else float("-inf")
        for h in self.wm.release(now, target):
            self._feed(h.item.event, h.item.entry, h.source)
        if wall and (self.engine.now is None or target > self.engine.now):
            self._input(op_advance(target))
            self.engine.advance(target)

    def _feed(self, ev: Event, key: str, gw: str) -> None:
        self._input(
            [OP_EVENT, key]
        )  # records.op_event, inline (per event); the key: decode_entry's
        self._process(ev, gw)

    def _process(self, ev: Event, gw: str, replay: bool = False) -> None:
        late = self.engine.now is not None and ev.ts < self.engine.now
        if late:
            self.totals["late"] += 1
            self.late_by_gateway[gw] = self.late_by_gateway.get(gw, 0) + 1
            if not replay:
                self._interval["late"] += 1
                if self._interval["late"] <= 10:  # the rest only in the periodic summary
                    log.warning(
                        "late event %s from gateway %s: ts %.3f is %.3f s behind engine time; "
                        "processed in arrival order",
                        ev.id,
                        gw,
                        ev.ts,
                        self.engine.now - ev.ts,  # type: ignore[operator]
                    )
        try:
            self.engine.process(ev)
        except Exception:  # a poison event must not stop the service
            log.exception("engine failed on event %s; skipped", ev.id)
            if not replay:
                m.ENGINE_ERRORS.inc()
        self.totals["events"] += 1
        if not replay:
            m.EVENTS_PROCESSED.inc()
            self._interval["events"] += 1

    # ------------------------------------------------------------------ transactions
    def record(self, n: Notification) -> dict[str, Any]:
        """The outbox record of a notification (`notifiers.store.enqueue`'s contract)."""
        return {
            "id": f"{n.profile}:{self.epoch}:{n.seq}",
            **n.to_detail(),
            "subscriber": n.subscriber,
        }

    def _transaction(self, write: Any) -> None:
        """Run ``write(pipe)`` in MULTI/EXEC, only if this worker still holds the lock."""
        with self.r.pipeline(transaction=True) as p:
            try:
                p.watch(rs.ENGINE_LOCK)
                if rs.text(p.get(rs.ENGINE_LOCK)) != self.holder:
                    raise LockLost("the engine lock is held by another worker")
                p.multi()
                write(p)
                p.pexpire(rs.ENGINE_LOCK, int(self.cfg.lock_ttl * 1000))
                p.execute()
            except redis.WatchError:
                # redis-py also reports a connection lost under WATCH as a WatchError: whether
                # the transaction ran is unknown, and the lock may well still be ours. A Redis
                # error (here, or from the check) makes run_forever restart from Redis.
                if rs.text(self.r.get(rs.ENGINE_LOCK)) == self.holder:
                    raise redis.ConnectionError(
                        "connection lost during a transaction (outcome unknown)"
                    ) from None
                raise LockLost("the engine lock changed during a transaction") from None
        self.last_renew = time.monotonic()

    def commit(self) -> None:
        """Journal the inputs since the last commit together with the notifications they made."""
        t0 = time.perf_counter()
        self.pending.extend(self.engine.take_notifications())
        records = [self.record(n) for n in self.pending]
        entry = JournalEntry(self.inputs, len(records), self.control_id).fields()

        def write(p: Any) -> None:
            p.xadd(rs.JOURNAL, entry)
            for rec in records:
                store.enqueue(p, rec)

        self._transaction(write)
        self._published(records)
        self.inputs.clear()
        self.journal_len += 1
        self.changed = True  # the journal holds something a snapshot would compact
        self.last_commit = time.monotonic()
        m.COMMITS.observe(time.perf_counter() - t0)

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

    def _published(self, records: list[dict[str, Any]]) -> None:
        m.NOTIFICATIONS.inc(len(records))
        self.totals["notifications"] += len(records)
        self._interval["notifications"] += len(records)
        self.pending.clear()

    # ------------------------------------------------------------------ liveness
    def stats(self) -> dict[str, Any]:
        now = time.time()
        return {
            **self.engine.stats(),
            "buffered": len(self.buffer),
            "oldest_buffered_age": max((now - h.wall for h in self.buffer), default=0.0),
            "late_by_gateway": dict(self.late_by_gateway),
            "pending_notifications": len(self.pending),
            "engine_time": self.engine.now,
            "last_id": self.last_id,
            "epoch": self.epoch,
            "snapshot_bytes": self.snapshot_bytes,
            "skewed_gateways": self.wm.skewed(now),
            **{f"total_{k}": v for k, v in self.totals.items()},
        }

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_heartbeat < self.cfg.heartbeat_interval:
            return
        if not self._renew(
            keys=[rs.ENGINE_LOCK], args=[self.holder, int(self.cfg.lock_ttl * 1000)]
        ):
            raise LockLost("the engine lock expired or was taken over")
        stats = self.stats()
        skewed = stats["skewed_gateways"]
        for gw in set(skewed) - set(self.skewed):
            log.warning(
                "gateway %s sends events stamped more than %g s ahead of this clock: "
                "they wait for the wall clock (check its clock)",
                gw,
                self.cfg.max_skew,
            )
        self.skewed = skewed
        # `read` and `buffered` apart: the ingest script reads them for --max-backlog
        self.r.hset(
            rs.ENGINE_STATUS,
            mapping={
                "ts": repr(time.time()),
                "holder": self.holder,
                "stats": rs.dumps(stats),
                "read": self.totals["read"],
                "buffered": len(self.buffer),
            },
        )
        self.last_heartbeat = self.last_renew = now

    def lag(self) -> float:
        """Age (s) of the oldest event not yet fed: unread ingest entries or the buffer."""
        now = time.time()
        ages = [now - h.wall for h in self.buffer]
        nxt = self.r.xrange(rs.INGEST, min=f"({self.last_id}", count=1)
        if nxt:
            ages.append(now - rs.stream_ms(rs.text(nxt[0][0])))
        return max(max(ages, default=0.0), 0.0)

    def _status(self) -> None:
        now = time.monotonic()
        if now - self.last_status < self.cfg.status_interval:
            return
        iv = self._interval
        if iv["events"] or iv["notifications"] or self.buffer:
            st = self.engine.stats()
            log.info(
                "worker: %d events (%d late), %d notifications, lag %.1f s, "
                "%d partial matches, %d buffered",
                iv["events"],
                iv["late"],
                iv["notifications"],
                self.lag(),
                st["partial_matches"],
                len(self.buffer),
            )
        self._interval = {"events": 0, "late": 0, "notifications": 0}
        self.last_status = now
