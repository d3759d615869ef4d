"""Prometheus metrics of delivery, in a registry of their own.

A separate `REGISTRY` keeps the worker importable many times in one process (tests, service)
without "duplicated timeseries" errors; the service exposes it with
``prometheus_client.generate_latest(REGISTRY)`` or ``make_asgi_app(REGISTRY)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from notifiers.label_limit import NONE, TopCounter

REGISTRY = CollectorRegistry()

#: outcome: delivered | retry | dead | digested | skipped
DELIVERIES = Counter(
    "ens_deliveries",
    "Delivery outcomes per channel kind (email, webhook).",
    ["channel", "outcome"],
    registry=REGISTRY,
)

LATENCY = Histogram(
    "ens_delivery_latency_seconds",
    "Time from the outbox write to the successful delivery, retries included.",
    ["channel"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600),
    registry=REGISTRY,
)

ATTEMPT_SECONDS = Histogram(
    "ens_delivery_attempt_seconds",
    "Duration of one delivery attempt (HTTP request or SMTP session).",
    ["channel"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)

#: reason: busy (the destination has ``per_destination`` requests in flight) | open (its circuit)
DEFERRED = Counter(
    "ens_delivery_deferred",
    "Deliveries put back on the schedule without an attempt, per channel and reason.",
    ["channel", "reason"],
    registry=REGISTRY,
)

CIRCUITS_OPEN = Gauge(
    "ens_delivery_circuits_open",
    "Webhook destinations whose circuit breaker is open or half-open (this process).",
    registry=REGISTRY,
)

CIRCUIT_TRIPS = Counter(
    "ens_delivery_circuit_trips",
    "Times a webhook destination's circuit opened (a failed half-open probe included).",
    registry=REGISTRY,
)

DEADLINES = Counter(
    "ens_delivery_deadline_exceeded",
    "Delivery attempts cut off by their total deadline (a receiver or relay too slow), per "
    "channel (webhook, email) and phase (webhook: request; email: connect, greeting, "
    "starttls, login, data, quit).",
    ["channel", "phase"],
    registry=REGISTRY,
)

ABANDONED = Counter(
    "ens_delivery_abandoned",
    "Sends cut short because the worker stopped; their lease brings them back.",
    ["channel"],
    registry=REGISTRY,
)

UNSUBSCRIBED = Counter(
    "ens_notifications_unsubscribed",
    "Notifications of profiles without a subscriber: kept in the outbox, not delivered.",
    registry=REGISTRY,
)

#: template: email_subject | email_text | email_html | webhook | slack | teams
TEMPLATE_ERRORS = Counter(
    "ens_template_errors",
    "Subscriber templates that failed to render at send time (a missing attribute, a runtime "
    "error, a webhook body that is not JSON): the default template was sent instead.",
    ["template"],
    registry=REGISTRY,
)

PROFILE_DELIVERIES = TopCounter(
    "ens_profile_deliveries",
    "Delivery outcomes per profile and subscriber: the most counted label sets (at most "
    "--metrics-label-limit) have a series of their own, the others count as `_other`.",
    bounded=("profile", "subscriber"),
    fixed=("outcome",),
    registry=REGISTRY,
)


def count_profile(outcome: str, n: Mapping[str, Any]) -> None:
    """One delivery outcome of notification ``n`` by its profile and subscriber."""
    sub = n.get("subscriber")
    key = (str(n.get("profile") or NONE), NONE if sub is None else str(sub))
    PROFILE_DELIVERIES.inc(key, (outcome,))


def count_delivery(kind: str, outcome: str, n: Mapping[str, Any]) -> None:
    """One delivery outcome of notification ``n``: by channel kind and by its profile."""
    DELIVERIES.labels(kind, outcome).inc()
    count_profile(outcome, n)
