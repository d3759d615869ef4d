"""Outbox intake of the delivery worker: entries read through the consumer group (new ones,
this consumer's pending ones after a restart, other consumers' idle ones) are *taken*: every
open channel of the subscriber gets a delivery state and a slot in the retry schedule. An
entry is acknowledged once none of its deliveries is left open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from notifiers import status, store
from notifiers.config import NotifierConfig
from notifiers.delivery_state import Counts
from notifiers.leases import Leases
from notifiers.metrics import UNSUBSCRIBED, count_delivery
from notifiers.records import OutboxRecord
from notifiers.store import (
    GROUP,
    OUTBOX,
    OUTBOX_FIELD,
    RETRY,
    STATE,
    SUBSCRIBERS,
    Subscriber,
    dead_key,
    delivered_key,
    delivery_key,
    dumps,
    text,
)
from notifiers.stream_wait import read_by

log = logging.getLogger("ens.notifiers")

_UNSUBSCRIBED_MAX = 10_000  # profiles remembered as logged (`OutboxIntake._unsubscribed_seen`)

# KEYS: STATE, RETRY, then (delivered key, dead key) per channel; ARGV: now, then
# (delivery key, state JSON) per channel. Returns how many deliveries are still open.
TAKE = """
local open = 0
for i = 0, (#ARGV - 1) / 2 - 1 do
  local dkey, st = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if redis.call('EXISTS', KEYS[3 + 2 * i]) == 1 or redis.call('EXISTS', KEYS[4 + 2 * i]) == 1 then
    redis.call('HDEL', KEYS[1], dkey)
  else
    open = open + 1
    if redis.call('HSETNX', KEYS[1], dkey, st) == 1 then
      redis.call('ZADD', KEYS[2], 'NX', ARGV[1], dkey)
    end
  end
end
return open
"""


class OutboxIntake:
    """The outbox intake part of `DeliveryWorker`: it reads the outbox as ``consumer`` of the
    group, takes entries into the schedule and acks them; `leases` tells when a delivery is due
    (a read blocks only until then)."""

    def __init__(self, r: redis.Redis, config: NotifierConfig, leases: Leases) -> None:
        self.r = r
        self.config = config
        self.consumer = config.worker.consumer
        self.leases = leases
        self._take_script = r.register_script(TAKE)
        self._started = False
        self._unsubscribed: set[str] = set()  # profiles whose missing subscriber was logged
        self._last_claim = self._last_trim = float("-inf")

    def poll(
        self, counts: Counts, block: float, nap: Callable[[float], object] = time.sleep
    ) -> None:
        """Re-claim, take over, trim, and take new outbox entries into the schedule, waiting
        at most about ``block`` seconds for them (`read_by`; `nap` may end a poll's pause
        early, e.g. when a send in flight finishes)."""
        w = self.config.worker
        if not self._started:
            store.ensure_group(self.r)
            self._reclaim_own(counts)
            self._started = True
        now = time.time()
        if now - self._last_claim >= w.claim_idle / 2:
            self._last_claim = now
            self._take_over(counts)
        if w.outbox_retention and now - self._last_trim >= 60:
            self._last_trim = now
            store.trim_outbox(self.r, w.outbox_retention)
        if block > 0 and self.leases.next_due() > now:
            entries = read_by(self._read, block, nap)
        else:
            entries = self._read(None)
        for eid, fields in entries:
            self._take(eid, fields, counts)

    def _read(self, block_ms: int | None) -> list[tuple[str, dict[str, str]]]:
        try:
            resp: Any = self.r.xreadgroup(  # redis-py types replies as a union
                GROUP, self.consumer, {OUTBOX: ">"}, count=self.config.worker.batch, block=block_ms
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            store.ensure_group(self.r)  # the stream was deleted under us
            return []
        return [(text(eid), f or {}) for _, entries in resp or [] for eid, f in entries]

    def _reclaim_own(self, counts: Counts) -> None:
        """Re-take this consumer's pending entries: what a previous run read but never acked."""
        last = "0"
        while True:
            resp: Any = self.r.xreadgroup(
                GROUP, self.consumer, {OUTBOX: last}, count=self.config.worker.batch
            )
            entries = [(text(e), f) for _, es in resp or [] for e, f in es]
            if not entries:
                return
            for eid, fields in entries:
                self._take(eid, fields or {}, counts)
            last = entries[-1][0]

    def _take_over(self, counts: Counts) -> None:
        """XAUTOCLAIM entries other consumers left pending longer than ``claim_idle``."""
        start = "0-0"
        idle_ms = int(self.config.worker.claim_idle * 1000)
        for _ in range(1000):  # bounded: a huge backlog is finished on the next rounds
            resp = self.r.xautoclaim(
                OUTBOX, GROUP, self.consumer, idle_ms, start, count=self.config.worker.batch
            )
            start, entries = text(resp[0]), resp[1]
            for entry in entries:
                if entry is None:  # Redis 6.2 reports deleted entries as nil
                    continue
                eid, fields = entry
                self._take(text(eid), fields or {}, counts)
            if start == "0-0":
                return

    def _take(self, eid: str, fields: Mapping[Any, Any], counts: Counts) -> None:
        """Schedule every open channel of one outbox entry; ack it if none is open."""
        counts.read += 1
        try:
            n = dict(OutboxRecord.read(fields).notification)
        except ValueError as exc:
            raw = text(fields.get(OUTBOX_FIELD) or fields.get(OUTBOX_FIELD.encode()))
            log.error("outbox entry %s is malformed (%s); dead-lettered", eid, exc)
            status.dead_letter(
                self.r, {"raw": raw}, {}, -1, 0, eid, f"malformed outbox entry: {exc}", 0
            )
            count_delivery("none", "dead", {})
            counts.dead += 1
            self._ack(eid, counts)
            return
        nid, sid = n["id"], n.get("subscriber")
        if sid is None:
            self._unsubscribed_seen(str(n.get("profile")), nid)
            UNSUBSCRIBED.inc()
            count_delivery("none", "skipped", n)
            counts.skipped += 1
            self._ack(eid, counts)
            return
        sub, error = self.subscriber(sid)
        if sub is None or not sub.channels:
            error = error or f"subscriber {sid!r} has no channels"
            log.warning("notification %s: %s; dead-lettered", nid, error)
            status.dead_letter(self.r, n, {}, -1, 0, eid, error, 0)
            count_delivery("none", "dead", n)
            counts.dead += 1
            self._ack(eid, counts)
            return
        nch = len(sub.channels)
        keys: list[str] = [STATE, RETRY]
        args: list[Any] = [time.time()]
        for ch in range(nch):
            keys += [delivered_key(nid, ch), dead_key(nid, ch)]
            state = {"n": n, "ch": ch, "nch": nch, "entry": eid, "attempts": 0}
            args += [delivery_key(nid, ch), dumps(state)]
        if int(self._take_script(keys=keys, args=args)) == 0:
            self._ack(eid, counts)

    def _unsubscribed_seen(self, profile: str, nid: str) -> None:
        """Log a profile without a subscriber once (per worker), not each of its notifications:
        a frequent one wrote an INFO line per event. `UNSUBSCRIBED` counts them all."""
        if profile in self._unsubscribed:
            return
        if len(self._unsubscribed) >= _UNSUBSCRIBED_MAX:  # a bound on a flood of profile ids
            self._unsubscribed.clear()
        self._unsubscribed.add(profile)
        log.info(
            "profile %r has no subscriber: its notifications (first: %s) stay in the outbox, "
            "undelivered; logged once per profile, counted in ens_notifications_unsubscribed_total",
            profile,
            nid,
        )

    def _ack(self, eid: str | None, counts: Counts | None = None) -> None:
        if eid and self.r.xack(OUTBOX, GROUP, eid) and counts is not None:
            counts.acked += 1

    def maybe_ack(self, st: Mapping[str, Any], counts: Counts) -> None:
        """Ack the outbox entry once no delivery of its notification is left open.

        Each finisher deletes its own state *before* looking, so of two deliveries finishing
        at once at least the later one sees none left.
        """
        nid, nch = st["n"]["id"], int(st.get("nch", 0))
        if nch and not any(self.r.hmget(STATE, [delivery_key(nid, i) for i in range(nch)])):
            self._ack(st.get("entry"), counts)

    def subscriber(self, sid: str) -> tuple[Subscriber | None, str]:
        raw = self.r.hget(SUBSCRIBERS, sid)
        if raw is None:
            return None, f"unknown subscriber {sid!r}"
        try:
            return Subscriber.model_validate_json(text(raw)), ""
        except ValueError as exc:
            return None, f"invalid subscriber record {sid!r}: {exc}"
