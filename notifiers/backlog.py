"""How far delivery is behind, with what digests hold told apart (the /metrics gauges).

A notification parked for an e-mail digest waits on purpose: with a 15-minute digest its
outbox entry stays unacknowledged for up to 15 minutes, and counted in the delivery lag it
made a healthy service read ``ens_delivery_lag_seconds 73`` as if delivery were stuck. So the
lag leaves out outbox entries whose only open deliveries are parked in digests, and the
digests' own age is reported apart.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from notifiers.store import (
    DIGESTS,
    GROUP,
    OUTBOX,
    STATE,
    delivery_backlog,
    delivery_key,
    digest_key,
    entry_order,
    split_delivery_key,
    text,
)

CAP = 10_000  # parked deliveries looked at per scrape: a bound on its cost


@dataclass(frozen=True)
class DeliveryStatus:
    backlog: int  # outbox notifications not done (digest-held ones included)
    lag: float  # s: the oldest of them that no digest holds
    dead_letters: int
    digest_held: int  # deliveries parked in digests
    digest_age: float  # s: the oldest parked delivery's time in its digest


def _held_entries(r: redis.Redis, now: float) -> tuple[set[str], int, float]:
    """(outbox entries whose open deliveries are all parked, parked deliveries, oldest age)."""
    parked: dict[str, float] = {}
    for address in r.zrange(DIGESTS, 0, -1):
        rows: Any = r.zrange(digest_key(text(address)), 0, CAP, withscores=True)
        parked.update((text(k), float(ts)) for k, ts in rows)
        if len(parked) >= CAP:
            break
    if not parked:
        return set(), 0, 0.0
    age = max(now - min(parked.values()), 0.0)
    keys = list(parked)
    states: Any = r.hmget(STATE, keys)
    entries: dict[str, list[str]] = {}  # outbox entry -> its other deliveries
    for key, raw in zip(keys, states, strict=True):
        if raw is None:
            continue
        st = json.loads(text(raw))
        nid, ch = split_delivery_key(key)
        others = [delivery_key(nid, i) for i in range(int(st.get("nch", 0))) if i != ch]
        entries.setdefault(str(st.get("entry")), []).extend(o for o in others if o not in parked)
    held = set()
    for entry, others in entries.items():
        if not others or not any(r.hmget(STATE, others)):
            held.add(entry)
    return held, len(parked), age


def delivery_status(r: redis.Redis) -> DeliveryStatus:
    """`store.delivery_backlog` with the lag of what no digest holds, and the digests' age."""
    now = time.time()
    backlog, lag, dead = delivery_backlog(r)
    held, parked, digest_age = _held_entries(r, now)
    if held:
        lag = _oldest_not_held(r, held, now)
    return DeliveryStatus(backlog, lag, dead, parked, digest_age)


def _oldest_not_held(r: redis.Redis, held: set[str], now: float) -> float:
    """The age of the oldest outbox entry not done and not held by a digest (0: none)."""
    oldest: list[str] = []
    try:
        groups = {text(g["name"]): g for g in r.xinfo_groups(OUTBOX)}
    except redis.ResponseError:
        return 0.0
    g = groups.get(GROUP)
    start = f"({text(g['last-delivered-id'])}" if g else "-"
    unread: Any = r.xrange(OUTBOX, min=start, count=1)
    if unread:
        oldest.append(text(unread[0][0]))
    if g:  # pending entries oldest first: the first one not held (at most len(held) skipped)
        rows: Any = r.xpending_range(OUTBOX, GROUP, min="-", max="+", count=len(held) + 1)
        for row in rows:
            eid = text(row["message_id"])
            if eid not in held:
                oldest.append(eid)
                break
    ages = [now - entry_order(e)[0] / 1000 for e in oldest]
    return max(max(ages, default=0.0), 0.0)
