"""What the parts of the engine worker share: its configuration view and its state.

`EngineWorker` (`adapters.service.worker`) is assembled from parts that each keep one concern
in a module of its own: `lease` (the engine lock), `checkpointer` (snapshots and their
migrations), `journal` (commits and their replay after a crash), `control` (profile and
gateway changes), `intake` (ingest -> reorder buffer -> engine), `liveness` (heartbeat and
stats) and the loop in `worker`. They work on one state, declared here
(`EngineState`) so that each part can be read, and type-checked, alone.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis

from adapters.service.archive_feed import FeedBuffer
from adapters.service.known_attrs import Sketch
from adapters.service.late import LateRecord
from adapters.service.lease import EngineLease
from adapters.service.settings import DEFAULTS, ServiceSettings
from adapters.service.watermarks import Held, Watermarks
from filters.caps import Caps
from filters.engine import Engine
from filters.notification import Notification
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
    rates: Any = None  # filters.plans.choose.Rates from --stats, for plan "auto"
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


class EngineState:
    """The engine worker's state; `EngineWorker.__init__` and `_reset_state` set it.

    The methods below are the ones a part calls on another; each is defined by its part.
    """

    r: redis.Redis
    cfg: WorkerConfig
    lease: EngineLease
    engine: Engine
    epoch: str
    # id -> the profile as applied (its `source` and `subscriber` are the stored definition);
    # kept after a `once` profile fired, so that it is not activated again
    defs: dict[str, Profile]
    dirty: set[str]  # ids whose definition changed since the last snapshot
    last_id: str  # last ingest entry read into engine or buffer
    control_id: str
    wm: Watermarks
    late_by_gateway: dict[str, int]
    late_out: list[LateRecord]  # sent to the late output, not committed yet
    capped: dict[str, list[int]]  # profile id -> [partial matches, notifications] the caps took
    unacked: list[str]  # read, to be XACKed by the next snapshot
    inputs: list[list[Any]]  # the input log since the last commit
    pending: list[Notification]  # detected, not committed
    archive_rows: FeedBuffer  # fed, for ens:archive:feed with the next commit (cfg.archive)
    since_snapshot: int  # inputs since the last snapshot
    journal_len: int  # commits in ens:engine:journal (since the last snapshot)
    totals: dict[str, int]
    changed: bool  # anything to snapshot
    last_commit: float
    last_snapshot: float
    snapshot_bytes: int
    holder: str  # the lease's holder name (``name|host|pid|token``)
    skewed: list[str]  # gateways whose clocks run ahead (logged when they start)
    last_heartbeat: float
    last_status: float
    _preparsed: dict[str, Any] | None  # index profiles by id, during start only
    _interval: dict[str, int]
    known: Sketch  # attribute names of the events read since ens:attrs was last written
    last_known: float  # monotonic time ens:attrs was last written
    unpublished: int  # events fed since the step last added them to ens_events_processed
    lost_state: bool  # the checkpoint could not be restored: a new engine state (`_set_aside`)
    # incremental checkpoints (`checkpointer`): profile id -> its partitions' keys in
    # ens:checkpoint:parts, and whether the next snapshot rewrites them all (the hash does not
    # hold this engine's state: a new engine, a whole-engine snapshot restored, plans converted)
    stored: dict[str, set[str]]
    parts_full: bool

    @property
    def buffer(self) -> list[Held]:
        """The held events (a heap; ``h.item`` is an `Item`)."""
        return self.wm.heap

    def _reset_state(self) -> None:
        raise NotImplementedError

    def _new_engine(self) -> Engine:
        raise NotImplementedError

    # the engine fed through the checkpointer, which marks the partitions a step changes
    def _engine_process(self, ev: Event) -> None:
        raise NotImplementedError

    def _engine_advance(self, t: float) -> None:
        raise NotImplementedError

    def _reset_parts(self) -> None:
        raise NotImplementedError

    def _keepalive(self) -> None:
        raise NotImplementedError

    def _transaction(self, write: Callable[[Any], None]) -> None:
        raise NotImplementedError

    def _input(self, op: list[Any]) -> None:
        raise NotImplementedError

    def _set_def(
        self,
        pid: str,
        expr: str | None,
        sub: str | None,
        quiet: bool = False,
        alarm: dict[str, Any] | None = None,
    ) -> bool:
        raise NotImplementedError

    # the alarm part (`adapters.service.alarm_worker`)
    alarm_specs: dict[str, dict[str, Any]]
    router: Any  # notifiers.routing.router.Router | None
    rules: Any  # notifiers.alarms.AlarmRules
    alarm_counts: dict[str, int]

    def _alarm_gauges(self, force: bool = False) -> dict[str, int]:
        raise NotImplementedError

    def _set_alarm(self, pid: str, profile: Profile | None, alarm: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _alarm_control(self) -> None:
        raise NotImplementedError

    def _alarm_reset(self) -> None:
        raise NotImplementedError

    def _alarm_load(self) -> None:
        raise NotImplementedError

    def _alarm_state(self) -> str:
        raise NotImplementedError

    def _alarm_split(self, notes: list[Notification]) -> tuple[list[Notification], list[Any]]:
        raise NotImplementedError

    def _alarm_step(self, notes: list[Notification]) -> list[Any]:
        raise NotImplementedError

    @staticmethod
    def _alarm_entry(batches: list[Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def _alarm_replay(self, entry: dict[str, Any] | None, redone: list[Notification]) -> None:
        raise NotImplementedError

    def _alarm_write(self, p: Any, batches: list[Any], retention: float) -> None:
        raise NotImplementedError

    def _alarm_published(self, batches: list[Any]) -> None:
        raise NotImplementedError

    @staticmethod
    def _decode(eid: str, fields: Any) -> list[tuple[str, str, Any]]:
        raise NotImplementedError

    def _parse(self, key: str, gw: str, obj: Any, normalized: bool = False) -> Event | None:
        raise NotImplementedError

    def _process(self, ev: Event, gw: str, replay: bool = False) -> None:
        raise NotImplementedError

    def record(self, n: Notification) -> dict[str, Any]:
        raise NotImplementedError

    def _published(self, records: list[dict[str, Any]]) -> None:
        raise NotImplementedError
