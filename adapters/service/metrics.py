"""Prometheus metrics of the service, in a registry of their own (like `notifiers.metrics`).

`/metrics` serves this registry followed by the notifiers' one. Counters and histograms are
counted per process and summed over all the service's processes at scrape time (`render`);
gauges are read from Redis or the worker's heartbeat at scrape time. Either way the figures
are right whichever process (an API process, the engine's) answers the scrape.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric

from notifiers import metrics as notifier_metrics
from notifiers.alarms.model import STATES
from notifiers.label_limit import NONE, TopCounter
from profiles.alarm import SEVERITIES

log = logging.getLogger("ens.service.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)

# The process that answers the scrape: prometheus_client's standard process_* and python_*
# collectors (they live in its default registry, which /metrics does not serve) and the build.
# Not summed over the service's processes, since memory, CPU and file descriptors are each
# process's own.
RUNTIME = CollectorRegistry()
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    RUNTIME.register(_collector)
BUILD = Info("ens_build", "The running ENS: its version and Python's.", registry=RUNTIME)


def package_version() -> str:
    """The installed ENS version (the API document and `ens_build` show it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ens")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


BUILD.info({"version": package_version(), "python": platform.python_version()})

EVENTS_IN = Counter(
    "ens_events_received",
    "Valid events accepted over HTTP and appended to the ingest stream.",
    ["gateway"],
    registry=REGISTRY,
)
EVENTS_INVALID = Counter(
    "ens_events_invalid",
    "Events rejected by validation (HTTP 422) or found unreadable by the worker.",
    ["gateway"],
    registry=REGISTRY,
)
EVENTS_REJECTED_TS = Counter(
    "ens_events_rejected_ts",
    "Events rejected (422, also counted as invalid) for a ts outside --max-future/--max-past.",
    ["gateway", "bound"],
    registry=REGISTRY,
)
EVENTS_REJECTED_GATEWAY = Counter(
    "ens_events_rejected_gateway",
    "Events rejected (422, also counted as invalid) for naming another gateway than the one "
    "of their API key in the reserved attribute `gateway`.",
    ["gateway"],
    registry=REGISTRY,
)
EVENTS_DUPLICATE = Counter(
    "ens_events_duplicate",
    "Events answered as accepted but not stored again: their id was sent by the same gateway "
    "within --dedup-window (a retried POST).",
    ["gateway"],
    registry=REGISTRY,
)
EVENTS_ENRICHED = Counter(
    "ens_events_enriched",
    "Events given attributes from the asset registry (their sensor or gateway is registered).",
    registry=REGISTRY,
)
ASSET_CONFLICTS = Counter(
    "ens_asset_conflicts",
    "Events whose own attribute differs from their asset's registry entry (the event's value "
    "is kept), by attribute (point, room, floor, building, tz).",
    ["attribute"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "ens_ingest_requests",
    "POST /v1/events requests by HTTP status.",
    ["status"],
    registry=REGISTRY,
)
EVENTS_PROCESSED = Counter("ens_events_processed", "Events fed to the engine.", registry=REGISTRY)


class _LateCollector:
    """``ens_events_late_total{gateway}`` from the worker's heartbeat (its totals survive
    restarts, and the worker need not run in the process that serves /metrics)."""

    def __init__(self) -> None:
        self.by_gateway: dict[str, int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily(
            "ens_events_late",
            "Events older than the engine time when read, by gateway: sent to the late output "
            "(with --late-events feed: fed anyway, in arrival order).",
            labels=["gateway"],
        )
        for gw, n in sorted(self.by_gateway.items()):
            fam.add_metric([gw], n)
        yield fam


EVENTS_LATE = _LateCollector()
REGISTRY.register(EVENTS_LATE)  # type: ignore[arg-type]
PARTIAL_MATCHES_DROPPED = Counter(
    "ens_partial_matches_dropped",
    "Partial matches dropped or not kept by the caps (--max-partial-matches, "
    "--max-profile-partial-matches), by profile.",
    ["profile"],
    registry=REGISTRY,
)
NOTIFICATIONS_CAPPED = Counter(
    "ens_notifications_capped",
    "Notifications dropped by --max-notifications-per-event (one event completing more "
    "matches of one profile), by profile.",
    ["profile"],
    registry=REGISTRY,
)
ALARM_TRANSITIONS = Counter(
    "ens_alarm_transitions",
    "Alarm transitions written to the history, by kind (raise, repeat, ack, clear).",
    ["kind"],
    registry=REGISTRY,
)
ALARM_SILENCED = Counter(
    "ens_alarm_silenced_deliveries",
    "Alarm transitions a silence held back (recorded, not delivered).",
    registry=REGISTRY,
)
ALARM_MESSAGES = Counter(
    "ens_alarm_messages",
    "Alarm messages put in the outbox, by kind (single, group: grouped, digest: the cap's).",
    ["kind"],
    registry=REGISTRY,
)
ALARMS_PRUNED = Counter(
    "ens_alarms_pruned",
    "Closed alarms (cleared and acknowledged) removed from ens:alarms after "
    "--alarm-closed-retention (their history stays).",
    registry=REGISTRY,
)
ALARM_OVERFLOW = Counter(
    "ens_alarm_cap_overflow",
    "Alarm notices the per-subscriber cap held back into a digest (never dropped).",
    registry=REGISTRY,
)
CONSOLE_LOGINS = Counter(
    "ens_console_logins",
    "Console login attempts by result: ok, refused (unknown token), limited (too many failed "
    "attempts from that address).",
    ["result"],
    registry=REGISTRY,
)
ALARMS_OPEN = Gauge(
    "ens_alarms",
    "Alarms by severity and state (the current occurrence of each alarm key).",
    ["severity", "state"],
    registry=REGISTRY,
)
ESCALATION_STEPS = Counter(
    "ens_escalation_steps",
    "Escalation steps fired (--routing): a level of a policy reached while unacknowledged.",
    registry=REGISTRY,
)
ESCALATIONS_PENDING = Gauge(
    "ens_escalations_pending",
    "Alarm occurrences with an escalation step pending (ens:escalation:due).",
    registry=REGISTRY,
)
ROUTING_HELD = Counter(
    "ens_routing_held_back",
    "Deliveries the routing held back (quiet hours below their minimum severity, a schedule "
    "with nobody on call, a route without receivers).",
    registry=REGISTRY,
)
ROUTING_SCHEDULE_LOADS = Counter(
    "ens_routing_schedule_loads",
    "Times the engine worker (--routing) read the stored schedules: at its start and at each "
    "`ens schedule add|rm`.",
    registry=REGISTRY,
)
SUBSCRIBER_TESTS = Counter(
    "ens_subscriber_tests",
    "Test messages sent (ens subscriber test, POST /v1/subscribers/{id}/test), by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
ENGINE_ERRORS = Counter(
    "ens_engine_errors", "Events the engine raised on (logged and skipped).", registry=REGISTRY
)
NOTIFICATIONS = TopCounter(
    "ens_notifications",
    "Notifications written to the outbox, by profile and subscriber (empty: none): the most "
    "counted label sets (at most --metrics-label-limit) have a series of their own, the others "
    "count as `_other`.",
    bounded=("profile", "subscriber"),
    registry=REGISTRY,
)


def count_notification(profile: str, subscriber: str | None) -> None:
    NOTIFICATIONS.inc((profile, NONE if subscriber is None else subscriber))


def set_label_limit(limit: int) -> None:
    """--metrics-label-limit: the series per profile/subscriber of each such family."""
    for family in (NOTIFICATIONS, notifier_metrics.PROFILE_DELIVERIES):
        family.set_limit(limit)


HTTP_SECONDS = Histogram(
    "ens_http_request_duration_seconds",
    "HTTP API requests by method, route template (`/v1/profiles/{pid}`; `unmatched` for paths "
    "no route serves) and status: time from the request to the end of the answer.",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
COMMITS = Histogram(
    "ens_commit_seconds",
    "Duration of one commit (journal entry + its notifications, one transaction).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
    registry=REGISTRY,
)
SNAPSHOTS = Histogram(
    "ens_snapshot_seconds",
    "Duration of one engine snapshot (pickle + transaction); the worker is paused meanwhile.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RESTORE_SKIPPED = Counter(
    "ens_restore_skipped_state",
    "Profiles whose engine state a restore left out because they no longer exist: "
    "removed_profile (the checkpoint held state of a profile removed since), inactive_runtime "
    "(no-op timers of a profile removed or replaced, in checkpoints written before such timers "
    "were left out).",
    ["reason"],
    registry=REGISTRY,
)
for _reason in ("removed_profile", "inactive_runtime"):
    RESTORE_SKIPPED.labels(_reason)
CHECKPOINTS_SET_ASIDE = Counter(
    "ens_checkpoints_set_aside",
    "Engine checkpoints that could not be restored: renamed to "
    "ens:checkpoint:unrestorable:<time> and replaced by a new engine state (the ERROR log line "
    "says why and what was kept).",
    registry=REGISTRY,
)
SNAPSHOT_BYTES = Gauge(
    "ens_snapshot_bytes",
    "Bytes the last engine snapshot wrote (incremental: its header and changed partitions).",
    registry=REGISTRY,
)
CHECKPOINT_PARTITIONS = Counter(
    "ens_checkpoint_partitions_total",
    "Partition records the engine's snapshots wrote or deleted (incremental checkpoints).",
    ["op"],
    registry=REGISTRY,
)
PARTIAL_MATCHES = Gauge(
    "ens_partial_matches", "Live partial matches in the engine.", registry=REGISTRY
)
PARTITIONS = Gauge("ens_partitions", "Live partitions in the engine.", registry=REGISTRY)
POOL_FILTERS = Gauge(
    "ens_pool_filters", "Filters in the primitive pool (incl. auxiliary ones).", registry=REGISTRY
)
TIMERS = Gauge("ens_engine_timers", "Timers in the temporal pool.", registry=REGISTRY)
PROFILES = Gauge("ens_profiles", "Active profiles in the engine.", registry=REGISTRY)
REORDER_BUFFER = Gauge(
    "ens_reorder_buffer_events", "Events waiting in the reorder buffer.", registry=REGISTRY
)
INGEST_BACKLOG = Gauge(
    "ens_ingest_backlog",
    "Events accepted but not yet fed to the engine: unread ingest entries + reorder buffer.",
    registry=REGISTRY,
)
INGEST_BACKLOG_MAX = Gauge(
    "ens_ingest_backlog_max",
    "Back-pressure bound: POST /v1/events answers 429 while the backlog is over it (0: none).",
    registry=REGISTRY,
)
INGEST_LAG = Gauge(
    "ens_ingest_lag_seconds",
    "Age of the oldest event accepted but not yet fed to the engine.",
    registry=REGISTRY,
)
DELIVERY_BACKLOG = Gauge(
    "ens_delivery_backlog",
    "Outbox notifications not yet delivered or dead-lettered: unread + in delivery/retry/digest.",
    registry=REGISTRY,
)
DELIVERY_LAG = Gauge(
    "ens_delivery_lag_seconds",
    "Age of the oldest outbox notification not yet delivered or dead-lettered, leaving out "
    "those whose open deliveries all wait in e-mail digests (ens_digest_oldest_seconds).",
    registry=REGISTRY,
)
DIGEST_HELD = Gauge(
    "ens_digest_held",
    "Deliveries parked in e-mail digests, waiting for their digest window to end.",
    registry=REGISTRY,
)
DIGEST_AGE = Gauge(
    "ens_digest_oldest_seconds",
    "How long the oldest delivery parked in an e-mail digest has waited (0: none parked); "
    "about the digest window at most while delivery keeps up.",
    registry=REGISTRY,
)
ARCHIVE_EVENTS = Counter(
    "ens_archive_events", "Events written to the event archive.", registry=REGISTRY
)
ARCHIVE_FILES = Counter(
    "ens_archive_files", "Parquet files written to the event archive.", registry=REGISTRY
)
ARCHIVE_BYTES = Counter(
    "ens_archive_bytes", "Bytes of the Parquet files written to the archive.", registry=REGISTRY
)
ARCHIVE_PRUNED = Counter(
    "ens_archive_partitions_pruned",
    "Hour partitions the archive's retention (--archive-retention, --archive-max-bytes) removed.",
    registry=REGISTRY,
)
ARCHIVE_ERRORS = Counter(
    "ens_archive_errors",
    "Archiver failures (Redis or file system); it starts again from its committed position.",
    registry=REGISTRY,
)
ARCHIVE_BACKLOG = Gauge(
    "ens_archive_backlog_entries",
    "Commits of the engine (ens:archive:feed entries) not archived yet.",
    registry=REGISTRY,
)
ARCHIVE_LAG = Gauge(
    "ens_archive_lag_seconds",
    "Age of the oldest processed event not archived yet (0: none waits).",
    registry=REGISTRY,
)
DEAD_LETTERS = Gauge(
    "ens_dead_letters", "Entries in the dead-letter stream (ens:deadletter).", registry=REGISTRY
)
LATE_EVENTS = Gauge(
    "ens_late_events",
    "Entries in the late output (ens:late): events too late to be matched in ts order.",
    registry=REGISTRY,
)
KNOWN_ATTRIBUTES = Gauge(
    "ens_known_attributes",
    "Attribute names recent events carried, kept in ens:attrs (bounded) for the unknown-attribute "
    "warning of new profiles.",
    registry=REGISTRY,
)
GATEWAYS_SKEWED = Gauge(
    "ens_gateways_skewed",
    "Gateways that sent events stamped more than --max-skew ahead of the engine's wall clock "
    "in the last minute (held until the wall clock reaches them).",
    registry=REGISTRY,
)
HEARTBEAT_AGE = Gauge(
    "ens_worker_heartbeat_age_seconds",
    "Seconds since the engine worker's last heartbeat (-1: never seen).",
    registry=REGISTRY,
)
REDIS_OOM = Counter(
    "ens_redis_oom_refusals",
    "Writes Redis refused because it is over its maxmemory (part: api = ingest requests "
    "answered 503, engine = commits or snapshots retried later).",
    ["part"],
    registry=REGISTRY,
)
REDIS_EVICTING = Gauge(
    "ens_redis_evicting",
    "1 while Redis' maxmemory-policy is not noeviction (it may delete ENS' keys: "
    "--allow-evicting-redis), else 0.",
    registry=REGISTRY,
)
REDIS_OVER_MAXMEMORY = Gauge(
    "ens_redis_over_maxmemory",
    "1 while Redis uses more memory than its maxmemory (writes are refused), else 0.",
    registry=REGISTRY,
)


def set_engine_stats(stats: dict[str, Any], buffered: int) -> None:
    EVENTS_LATE.by_gateway = dict(stats.get("late_by_gateway") or {})
    PARTIAL_MATCHES.set(stats.get("partial_matches", 0))
    PARTITIONS.set(stats.get("partitions", 0))
    POOL_FILTERS.set(stats.get("pool_filters", 0))
    TIMERS.set(stats.get("timers", 0))
    PROFILES.set(stats.get("profiles", 0))
    GATEWAYS_SKEWED.set(len(stats.get("skewed_gateways") or ()))
    if "snapshot_bytes" in stats:
        SNAPSHOT_BYTES.set(stats["snapshot_bytes"])
    REORDER_BUFFER.set(buffered)
    ESCALATIONS_PENDING.set(stats.get("escalations", 0))
    alarms = stats.get("alarms") or {}
    for sev in SEVERITIES:
        for state in STATES:
            ALARMS_OPEN.labels(severity=sev, state=state).set(alarms.get(f"{sev}|{state}", 0))


# ----------------------------------------------------------------------------- all processes
# Counters and histograms live in the process that counts (an API process, the engine worker,
# the delivery worker), but /metrics must show the service's totals whichever process answers
# the scrape: with --api-workers N a scrape lands on any of N processes, and with --role the
# engine and delivery may run on other hosts. Every process therefore publishes its samples to
# Redis (`SHARED`, one field per process, every `PUBLISH_INTERVAL`), and /metrics sums them.
# Gauges are not summed: they are read at scrape time (from Redis or the worker's heartbeat).

SHARED = "ens:metrics"
PUBLISH_INTERVAL = 1.0  # s
FORGET_AFTER = 30.0  # s: a process silent this long is gone; its counts go with it (a reset)
_SUMMED = ("counter", "histogram", "summary")


def _registries() -> list[CollectorRegistry]:
    return [REGISTRY, notifier_metrics.REGISTRY]


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def local_samples() -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """This process's counter and histogram samples by family (``_created`` left out)."""
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for reg in _registries():
        for fam in reg.collect():
            if fam.type in _SUMMED:
                out[fam.name] = [
                    (s.name, s.labels, s.value)
                    for s in fam.samples
                    if not s.name.endswith("_created")
                ]
    return out


def unpublish(r: Any) -> None:
    """Remove this process's samples (it stops: its counts go, as at any restart)."""
    r.hdel(SHARED, process_id())


def publish(r: Any) -> None:
    """Write this process's samples to `SHARED` (any Redis client)."""
    r.hset(SHARED, process_id(), json.dumps({"ts": time.time(), "s": local_samples()}))


class Publisher(threading.Thread):
    """Publishes this process's samples every `PUBLISH_INTERVAL` until the process ends."""

    _started: dict[int, Publisher] = {}  # pid -> the one publisher of that process

    def __init__(self, redis_url: str) -> None:
        super().__init__(name="metrics-publisher", daemon=True)
        self.redis_url = redis_url

    @classmethod
    def ensure(cls, redis_url: str) -> None:
        """Start this process's publisher unless it runs already (forked children start their
        own: threads do not survive a fork)."""
        if os.getpid() not in cls._started:
            cls._started[os.getpid()] = p = cls(redis_url)
            p.start()

    def run(self) -> None:
        import redis

        r = redis.Redis.from_url(self.redis_url)
        while True:
            try:
                publish(r)
            except redis.RedisError as exc:  # Redis away: the next round tries again
                log.debug("metrics publish failed: %s", exc)
            time.sleep(PUBLISH_INTERVAL)


class _Merged:
    """A registry view whose counters and histograms are summed over every live process."""

    def __init__(self, registry: CollectorRegistry, others: list[dict[str, Any]]) -> None:
        self.registry = registry
        self.others = others

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            if fam.type not in _SUMMED:
                yield fam
                continue
            sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            rows = [
                (s.name, s.labels, s.value) for s in fam.samples if not s.name.endswith("_created")
            ]
            for other in self.others:
                rows.extend(other.get(fam.name, ()))
            for name, labels, value in rows:
                key = (name, tuple(sorted(labels.items())))
                sums[key] = sums.get(key, 0.0) + value
            out = Metric(fam.name, fam.documentation, fam.type)
            for (name, label_items), value in sums.items():
                out.add_sample(name, dict(label_items), value)
            yield out


def render(r: Any) -> bytes:
    """The Prometheus text of the whole service: this process's samples plus those the other
    processes published (Redis unreadable: this process's alone)."""
    others: list[dict[str, Any]] = []
    try:
        me, now = process_id(), time.time()
        for field_, raw in r.hgetall(SHARED).items():
            proc = field_.decode() if isinstance(field_, bytes) else field_
            if proc == me:
                continue  # this process's live values are fresher
            rec = json.loads(raw)
            if now - rec.get("ts", 0) > FORGET_AFTER:
                r.hdel(SHARED, proc)
                continue
            others.append(rec["s"])
    except Exception as exc:  # noqa: BLE001 - a scrape never fails for want of the others
        log.warning("metrics of the other processes unavailable: %s", exc)
    merged = b"".join(generate_latest(_Merged(reg, others)) for reg in _registries())
    return merged + generate_latest(RUNTIME)
