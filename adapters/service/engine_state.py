"""What the parts of the engine worker share: its configuration view (`WorkerConfig`), the
engine as it runs (`LiveEngine`), the journal's input log (`InputLog`) and the counts
(`Progress`).

`EngineWorker` (`adapters.service.worker`) composes parts that each keep one concern, with
its own fields, in a module of its own: `lease` (the engine lock), `checkpointer` (snapshots
and their migrations), `journal` (commits and their replay after a crash), `control`
(profile and gateway changes), `intake` (ingest -> reorder buffer -> engine), `alarm_worker`
(the alarm rules), `liveness` (heartbeat and the status line), `pressure` (Redis' limits)
and the loop in `worker`. Each part is given the objects here and the parts it calls as
arguments, and calls only their public methods and fields.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from adapters.service.settings import DEFAULTS, ServiceSettings
from filters.caps import Caps
from filters.engine import Engine
from filters.partitions import PartitionedEngine
from notifiers.alarms import GroupPolicy
from notifiers.routing import Routing
from profiles.ast import Profile
from profiles.events import Event


@dataclass
class WorkerConfig:
    """The engine worker's view of `ServiceSettings` (`from_settings`); the fields without a
    setting are internal tunables (tests shorten them)."""

    reorder_seconds: float = DEFAULTS.default_lateness  # gateways without their own lateness
    reorder_max_events: int = DEFAULTS.reorder_max_events
    idle_timeout: float = DEFAULTS.idle_timeout  # a gateway silent this long holds nothing back
    clock: str = DEFAULTS.clock  # "wall": timers fire by wall clock; "event": only by event time
    tz: str = DEFAULTS.tz
    # "output": an event older than the engine time goes to the late output, not the engine;
    # "feed": it is fed at once, in arrival order
    late_events: str = DEFAULTS.late_events
    late_max: int = DEFAULTS.late_max  # ens:late keeps about this many
    alarm_history_retention: float = DEFAULTS.alarm_history_retention  # s
    alarm_closed_retention: float | None = DEFAULTS.alarm_closed_retention  # s; None: forever
    # grouping and cap of alarm messages, for every subscriber (configuration, not state)
    alarm_policy: GroupPolicy = field(default_factory=GroupPolicy)
    # `ens serve --routing FILE` (docs/routing.md): who hears of an alarm, escalation, and
    # grouping per subscriber; None: the profile's subscriber, with ``alarm_policy``
    routing: Routing | None = None
    known_attrs_max: int = 1000  # ens:attrs keeps this many attribute names (known_attrs)
    known_attrs_interval: float = 1.0  # s: ens:attrs is written at most this often
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
    allow_evicting_redis: bool = DEFAULTS.allow_evicting_redis  # else refuse such a Redis
    oom_backoff_max: float = 5.0  # s: longest wait between attempts while Redis is full
    oom_log_every: float = 30.0  # s: one log line per this while Redis stays full
    archive: bool = False  # write what the engine fed to ens:archive:feed (the archiver's input)
    archive_commit: float = 1.0  # s: commit fed events this often also without notifications
    archive_rows: int = 20_000  # ... or once this many wait
    caps: Caps = field(  # partial matches and notifications per event (`filters.caps`)
        default_factory=lambda: Caps(
            DEFAULTS.max_partial_matches,
            DEFAULTS.max_profile_partial_matches,
            DEFAULTS.max_notifications_per_event,
        )
    )
    cap_warn_interval: float = 60.0  # at most one cap WARNING per profile this often (s)

    @classmethod
    def from_settings(
        cls,
        s: ServiceSettings,
        rates: Any = None,
        load_index: Callable[[str], list[Profile]] | None = None,
        routing: Routing | None = None,
    ) -> WorkerConfig:
        cfg = cls(
            reorder_seconds=s.default_lateness,
            reorder_max_events=s.reorder_max_events,
            clock=s.clock,
            idle_timeout=s.idle_timeout,
            max_skew=s.max_skew,
            tz=s.tz,
            late_events=s.late_events,
            late_max=s.late_max,
            alarm_history_retention=s.alarm_history_retention,
            alarm_closed_retention=s.alarm_closed_retention,
            alarm_policy=GroupPolicy(
                tuple(x.strip() for x in s.alarm_group_by.split(",") if x.strip()) or None,
                s.alarm_group_wait,
                s.alarm_group_interval,
                s.alarm_cap or None,
            ),
            snapshot_interval=s.snapshot_interval,
            status_interval=s.status_interval,
            plan=s.plan,
            rates=rates,
            replan_every=s.replan_every,
            drift=float(s.drift),
            allow_evicting_redis=s.allow_evicting_redis,
            caps=Caps(
                s.max_partial_matches,
                s.max_profile_partial_matches,
                s.max_notifications_per_event,
            ),
            archive=s.archive != "off",
            routing=routing,
        )
        if s.worker_name:
            cfg.name = s.worker_name
        if s.index is not None:
            cfg.index = str(s.index)
            cfg.load_index = load_index
        return cfg


class Item(NamedTuple):
    """What the watermark buffer holds for the worker: the ingest entry and its event."""

    entry: str
    event: Event


class Progress:
    """What the parts count for the loop, the heartbeat and the checkpoint.

    ``totals`` and ``late_by_gateway`` belong to the engine state (in the checkpoint) and
    ``changed`` says that something awaits a snapshot: `reset` clears them with the state. The
    status line's ``interval`` and the events not yet added to ``ens_events_processed``
    (``unpublished``) outlive a restart from the snapshot.
    """

    def __init__(self) -> None:
        self.interval = {"events": 0, "late": 0, "notifications": 0}
        self.unpublished = 0  # events fed since the step last added them to the metric
        self.reset()

    def reset(self) -> None:
        # read: events taken from ens:ingest (the API's ens:ingest:in minus it is the backlog)
        self.totals = {"events": 0, "late": 0, "notifications": 0, "invalid": 0, "read": 0}
        self.late_by_gateway: dict[str, int] = {}
        self.changed = False  # anything to snapshot

    def count_late(self, gw: str) -> None:
        self.totals["late"] += 1
        self.late_by_gateway[gw] = self.late_by_gateway.get(gw, 0) + 1


class InputLog:
    """The journal's input log: what was fed since the last commit (events, ``advance(t)``,
    profile changes), which the next commit journals; and how many since the last snapshot."""

    def __init__(self, keepalive: Callable[[], None]) -> None:
        self._keepalive = keepalive  # the lease's: a long replay or start renews it
        self.reset()

    def reset(self) -> None:
        self.ops: list[list[Any]] = []
        self.since_snapshot = 0

    def snapshotted(self) -> None:
        self.since_snapshot = 0

    def add(self, op: list[Any]) -> None:
        self.ops.append(op)
        self.since_snapshot += 1
        if not self.since_snapshot & 63:
            self._keepalive()


class LiveEngine:
    """The engine as it runs, and what identifies its state: the ``epoch`` of notification ids
    (drawn when a state is first created), the profiles as applied and which of them changed
    since the last snapshot. The parts feed it through `process` and `advance`, which mark the
    partitions a step changes (`filters.partitions`) for the incremental checkpoint."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.reset()

    def reset(self) -> None:
        """A new engine state."""
        self.engine = self.new_engine()
        self._tracked: PartitionedEngine | None = None
        self.epoch = secrets.token_hex(4)
        # id -> the profile as applied (its `source` and `subscriber` are the stored definition);
        # kept after a `once` profile fired, so that it is not activated again
        self.defs: dict[str, Profile] = {}
        self.dirty: set[str] = set()  # ids whose definition changed since the last snapshot

    def new_engine(self) -> Engine:
        cfg = self.cfg
        return Engine(
            tz=cfg.tz,
            plan=cfg.plan,
            rates=cfg.rates,
            replan_every=cfg.replan_every,
            drift=cfg.drift,
            caps=cfg.caps,
        )

    def tracker(self) -> PartitionedEngine | None:
        """The engine's partition tracker (None: it re-plans online, snapshots are whole)."""
        t = self._tracked
        if t is None or t.engine is not self.engine:
            if self.engine.replan_every:
                return None
            t = self._tracked = PartitionedEngine(self.engine)
        return t

    def process(self, ev: Event) -> None:
        t = self.tracker()
        if t is None:
            self.engine.process(ev)
        else:
            t.process(ev)

    def advance(self, at: float) -> None:
        t = self.tracker()
        if t is None:
            self.engine.advance(at)
        else:
            t.advance(at)

    def remove(self, pid: str) -> None:
        try:
            self.engine.remove_profile(pid)
        except KeyError:  # a `once` profile that fired has removed itself
            pass
