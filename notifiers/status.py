"""Delivery status per subscriber: what an operator asks first when a receiver complains.

The delivery worker keeps, per subscriber, counters of its outcomes and the last success and
error (``ens:substat:<id>``, a hash written with each outcome), and per destination the state
of its circuit breaker (``ens:breakers``, written on each open/close; a breaker lives in a
worker's memory). `subscriber_status` adds what the schedules hold now: deliveries waiting
for their first attempt or a retry, and dead letters not yet retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from notifiers.store import DEADLETTER, STATE, Subscriber, dead_letter_fields, dumps, text
from notifiers.webhook import destination

SUBSTAT_PREFIX = "ens:substat:"
BREAKERS = "ens:breakers"
OUTCOMES = ("delivered", "retried", "dead")


def substat_key(sid: str) -> str:
    return f"{SUBSTAT_PREFIX}{sid}"


def note(target: Any, sid: str, outcome: str, error: str = "", now: float | None = None) -> None:
    """Count one outcome (`OUTCOMES`) of ``sid``'s deliveries on ``target`` (client or pipe)."""
    key, now = substat_key(sid), time.time() if now is None else now
    target.hincrby(key, outcome, 1)
    if outcome == "delivered":
        target.hset(key, "last_success", repr(now))
    else:
        target.hset(key, mapping={"last_error": error[:500], "last_error_at": repr(now)})


def dead_letter(
    client: Any,
    n: Mapping[str, Any],
    chan: Mapping[str, Any],
    ch: int,
    nch: int,
    entry: str,
    error: str,
    attempts: int,
) -> None:
    """Write a dead letter and the subscriber's status through ``client`` (Redis or a
    pipeline)."""
    fields: Any = dead_letter_fields(n, chan, ch, nch, entry, error, attempts)
    client.xadd(DEADLETTER, fields)
    note(client, str(n.get("subscriber")), "dead", error)


def note_breaker(
    r: redis.Redis, dest: str, opened: bool, until: float = 0.0, error: str = ""
) -> None:
    """Record a destination's circuit opening (until when, why) or closing."""
    if opened:
        r.hset(BREAKERS, dest, dumps({"until": until, "error": error[:500], "at": time.time()}))
    else:
        r.hdel(BREAKERS, dest)


def breaker_state(raw: str | None, now: float) -> dict[str, Any]:
    if raw is None:
        return {"state": "closed"}
    info = json.loads(raw)
    state = "open" if now < float(info.get("until", 0)) else "half-open"
    return {"state": state, **info}


def _destinations(sub: Subscriber, breakers: Iterable[str]) -> list[str]:
    """Its webhooks' origins, and the SMTP relay(s) with a breaker record if it has e-mail."""
    out = []
    for ch in sub.channels:
        url = getattr(ch, "webhook", None)
        if url:
            out.append(destination(url))
        elif getattr(ch, "email", None):
            out += [d for d in breakers if d.startswith("smtp://")]
    return list(dict.fromkeys(out))


def _pending(r: redis.Redis, sids: set[str]) -> dict[str, dict[str, Any]]:
    """Per subscriber: deliveries on the schedule now (never tried / retrying), oldest error."""
    out: dict[str, dict[str, Any]] = {s: {"pending": 0, "retrying": 0} for s in sids}
    for _, raw in r.hscan_iter(STATE, count=1000):
        st = json.loads(text(raw))
        sid = str((st.get("n") or {}).get("subscriber"))
        if sid in out:
            out[sid]["retrying" if int(st.get("attempts", 0)) else "pending"] += 1
    return out


def _dead_letters(r: redis.Redis, sids: set[str]) -> dict[str, int]:
    out = dict.fromkeys(sids, 0)
    last = "-"
    while True:
        page: Any = r.xrange(DEADLETTER, min=last, count=1000)
        for _, fields in page:
            sid = str(json.loads(text(fields.get("n", "{}"))).get("subscriber"))
            if sid in out:
                out[sid] += 1
        if len(page) < 1000:
            return out
        last = f"({text(page[-1][0])}"


def subscriber_status(
    r: redis.Redis, subs: Iterable[Subscriber], now: float | None = None
) -> list[dict[str, Any]]:
    """One dict per subscriber: counters, what is pending/retrying/dead-lettered now, the last
    success and error, and the breaker state of each of its webhook destinations."""
    subs = list(subs)
    now = time.time() if now is None else now
    sids = {s.id for s in subs}
    pending, dead = _pending(r, sids), _dead_letters(r, sids)
    breakers = {text(k): text(v) for k, v in r.hgetall(BREAKERS).items()}  # type: ignore[union-attr]
    out = []
    for s in subs:
        stat: Mapping[str, Any] = r.hgetall(substat_key(s.id))  # type: ignore[assignment]
        dests = _destinations(s, breakers)
        out.append(
            {
                "id": s.id,
                **{k: int(stat.get(k, 0)) for k in OUTCOMES},
                **pending[s.id],
                "dead_letters": dead[s.id],
                "last_success": _float(stat.get("last_success")),
                "last_error": stat.get("last_error") or None,
                "last_error_at": _float(stat.get("last_error_at")),
                "breakers": {d: breaker_state(breakers.get(d), now) for d in dests},
            }
        )
    return out


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
