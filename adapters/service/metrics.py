"""Prometheus metrics of the service, in a registry of their own (like `notifiers.metrics`).

`/metrics` serves this registry followed by the notifiers' one. Counters are per process;
the ingest gauges are read from Redis at scrape time, so they are right whichever process
(API or worker) is scraped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

REGISTRY = CollectorRegistry(auto_describe=True)

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
REQUESTS = Counter(
    "ens_ingest_requests",
    "POST /v1/events requests by HTTP status.",
    ["status"],
    registry=REGISTRY,
)
EVENTS_PROCESSED = Counter(
    "ens_events_processed", "Events fed to the engine.", registry=REGISTRY
)


class _LateCollector:
    """``ens_events_late_total{gateway}`` from the worker's heartbeat (its totals survive
    restarts, and the worker need not run in the process that serves /metrics)."""

    def __init__(self) -> None:
        self.by_gateway: dict[str, int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily(
            "ens_events_late",
            "Events older than the engine time when fed (processed anyway, in arrival order), "
            "by gateway.",
            labels=["gateway"],
        )
        for gw, n in sorted(self.by_gateway.items()):
            fam.add_metric([gw], n)
        yield fam


EVENTS_LATE = _LateCollector()
REGISTRY.register(EVENTS_LATE)  # type: ignore[arg-type]
ENGINE_ERRORS = Counter(
    "ens_engine_errors", "Events the engine raised on (logged and skipped).", registry=REGISTRY
)
NOTIFICATIONS = Counter(
    "ens_notifications", "Notifications written to the outbox.", registry=REGISTRY
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
SNAPSHOT_BYTES = Gauge(
    "ens_snapshot_bytes", "Size of the last engine snapshot.", registry=REGISTRY
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
    "Age of the oldest outbox notification not yet delivered or dead-lettered.",
    registry=REGISTRY,
)
DEAD_LETTERS = Gauge(
    "ens_dead_letters", "Entries in the dead-letter stream (ens:deadletter).", registry=REGISTRY
)
HEARTBEAT_AGE = Gauge(
    "ens_worker_heartbeat_age_seconds",
    "Seconds since the engine worker's last heartbeat (-1: never seen).",
    registry=REGISTRY,
)


def set_engine_stats(stats: dict[str, Any], buffered: int) -> None:
    EVENTS_LATE.by_gateway = dict(stats.get("late_by_gateway") or {})
    PARTIAL_MATCHES.set(stats.get("partial_matches", 0))
    PARTITIONS.set(stats.get("partitions", 0))
    POOL_FILTERS.set(stats.get("pool_filters", 0))
    TIMERS.set(stats.get("timers", 0))
    PROFILES.set(stats.get("profiles", 0))
    REORDER_BUFFER.set(buffered)
