"""Warnings about a profile being added to the service, from what the service has seen.

`profiles.lint` checks a profile against facts given to it; here the facts come from the
recent ingest stream and `ens:attrs` (`known_attrs`): the attributes events carried (typos) and how often the events of
a `select each` profile's starting components arrive (issue 41: one partial match per such
event for the whole window). Used by `ens profile add` and `POST /v1/profiles`.
"""

from __future__ import annotations

from typing import Any

import redis

from adapters.service import known_attrs
from adapters.service import redis_store as rs
from filters.caps import DEFAULT_NOTIFICATIONS, DEFAULT_PARTITION
from filters.compile import evaluate
from profiles.ast import Profile
from profiles.lint import start_components, unbounded_matches, warnings

MIN_EVENTS = 20  # fewer recent events (or all at one time): no rate is estimated


def rates_from(
    events: list[dict[str, Any]], components: list[tuple[str, Any]]
) -> dict[str, float | None]:
    """Events per hour of each (name, filter) over the span of ``events`` (None: too few)."""
    stamps = [ev["ts"] for ev in events if isinstance(ev.get("ts"), (int, float))]
    span = max(stamps) - min(stamps) if len(stamps) >= MIN_EVENTS else 0.0
    if span <= 0:
        return {name: None for name, _ in components}
    return {
        name: sum(1 for ev in events if evaluate(f, ev)) * 3600.0 / span for name, f in components
    }


def profile_warnings(
    r: redis.Redis, profile: Profile, events: list[dict[str, Any]] | None = None
) -> list[str]:
    """`profiles.lint.warnings` against the attributes seen, and `unbounded_matches` against
    the rates of the recent events (``events``: read once for many profiles; with the
    service's default caps)."""
    if events is None:
        events = rs.recent_events(r)
    seen: set[str] = set(known_attrs.known(r))  # kept by the worker: outlives the trimmed stream
    for ev in events:
        seen.update(ev)
    out = warnings(profile, seen or None)
    starts = start_components(profile)
    if starts and events:
        rates = rates_from(events, starts)
        out += unbounded_matches(profile, rates, DEFAULT_PARTITION, DEFAULT_NOTIFICATIONS)
    return out
