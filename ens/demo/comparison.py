"""The outbox against an offline `ens.replay` of the same events, and the injected incidents
the notifications found."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from profiles.events import Event


def _key(profile: str, ts: float, events: dict[str, str], partition: Any) -> tuple[Any, ...]:
    return (
        profile,
        round(ts, 6),
        tuple(sorted(events.items())),
        json.dumps(partition, sort_keys=True),
    )


def compare_with_replay(
    profiles: list[Any], events: list[Event], outbox: list[dict[str, Any]]
) -> tuple[int, bool]:
    """(notifications of an offline replay, whether the outbox holds exactly those)."""
    from ens.replay import replay

    want = Counter(
        _key(n.profile, n.ts, {k: e.id for k, e in n.events.items()}, n.partition)
        for n in replay(profiles, events)
    )
    got = Counter(
        _key(
            n["profile"], n["ts"], {k: e["id"] for k, e in n["events"].items()}, n.get("partition")
        )
        for n in outbox
    )
    return sum(want.values()), want == got


def _fits(truth: dict[str, Any], n: dict[str, Any]) -> bool:
    return (
        n["profile"] == truth["profile"]
        and (n.get("partition") or None) == (truth.get("partition") or None)
        and truth["ts_min"] <= n["ts"] <= truth["ts_max"]
        and all(n["events"].get(c, {}).get("id") in ids for c, ids in truth["events"].items())
    )


def count_incidents(truth: list[dict[str, Any]], outbox: list[dict[str, Any]]) -> int:
    """How many injected incidents a notification reports as the generator predicted."""
    return sum(any(_fits(t, n) for n in outbox) for t in truth)
