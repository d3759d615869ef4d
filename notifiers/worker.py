"""The delivery worker: outbox stream -> retry schedule -> webhooks / SMTP (or a digest).

Flow. An outbox entry is read through the consumer group and *taken*: every channel of its
subscriber that is neither delivered nor dead-lettered gets a delivery state and a slot in the
``ens:retry`` schedule, due now. Deliveries are then leased from the schedule (the lease pushes
their due time ``lease`` seconds ahead, and is renewed every third of it while the send runs, so
a worker dying mid-send delays them by at most ``lease``) and run in a thread pool; a failure re-schedules with backoff instead of sleeping, so one slow or broken
receiver never holds back others. A webhook request also needs a slot at its destination
(`notifiers.destinations`): at most ``per_destination`` in flight, none while its circuit is
open; a delivery refused a slot is re-scheduled without an attempt. The stream entry is XACKed
only when none of its deliveries is left in the state hash, i.e. each was delivered or
dead-lettered; until then it stays in the pending list, and a restarted (or another) worker
re-takes it — harmlessly, since taking is idempotent and delivered channels are remembered in
``ens:delivered:<nid>:<ch>``.

Digest: an e-mail delivery with a digest window is *parked* in ``ens:digest:<addr>``; when the
oldest parked one is ``window`` seconds old the whole batch goes out as one mail.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import redis

from notifiers import store
from notifiers.attempt import Attempt
from notifiers.config import NotifierConfig
from notifiers.destinations import CLOSED, OPENED, DestinationGate, Grant
from notifiers.email import SmtpSender, build_digest, build_message, compose
from notifiers.metrics import (
    ATTEMPT_SECONDS,
    CIRCUIT_TRIPS,
    CIRCUITS_OPEN,
    DEFERRED,
    DELIVERIES,
    LATENCY,
)
from notifiers.records import OutboxRecord
from notifiers.store import (
    DEADLETTER,
    DIGEST_ATTEMPTS,
    DIGEST_WINDOW,
    DIGESTS,
    GROUP,
    OUTBOX,
    OUTBOX_FIELD,
    RETRY,
    STATE,
    SUBSCRIBERS,
    EmailChannel,
    Subscriber,
    WebhookChannel,
    dead_key,
    delivered_key,
    delivery_key,
    describe_channel,
    digest_key,
    dumps,
    entry_order,
    split_delivery_key,
    text,
)
from notifiers.webhook import WebhookSender, destination

log = logging.getLogger("ens.notifiers")

# Take the due members of a schedule zset and push their score to the lease end, atomically,
# so two workers never take the same delivery and a crashed taker's work comes back by itself.
_LEASE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], m) end
return due
"""

# Extend leases still held: each member whose score is still the lease end this worker set
# (not re-scheduled or finished meanwhile) gets the new end. ARGV: new end, (member, old end)...
_RENEW = """
local n = 0
for i = 2, #ARGV, 2 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if cur and tonumber(cur) == tonumber(ARGV[i + 1]) then
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

# KEYS: STATE, RETRY, then (delivered key, dead key) per channel; ARGV: now, then
# (delivery key, state JSON) per channel. Returns how many deliveries are still open.
_TAKE = """
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

# KEYS: DIGESTS, digest buffer, DIGEST_WINDOW, DIGEST_ATTEMPTS; ARGV: address, members done.
# Drops the done members; re-schedules the address for what arrived meanwhile, or forgets it.
_DIGEST_DONE = """
for i = 2, #ARGV do redis.call('ZREM', KEYS[2], ARGV[i]) end
redis.call('HDEL', KEYS[4], ARGV[1])
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 0
end
local window = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
redis.call('ZADD', KEYS[1], tonumber(first[2]) + window, ARGV[1])
return 1
"""


@dataclass(slots=True)
class Counts:
    """What one `DeliveryWorker.run_once` did."""

    read: int = 0  # outbox entries taken in (new, re-claimed or taken over)
    delivered: int = 0  # deliveries that succeeded (a digest counts each notification in it)
    retried: int = 0  # failed attempts re-scheduled
    dead: int = 0  # deliveries dead-lettered
    digested: int = 0  # e-mail deliveries parked for a digest
    skipped: int = 0  # nothing to do: already delivered, no subscriber, stale schedule entry
    acked: int = 0  # outbox entries acknowledged
    deferred: int = 0  # re-scheduled without an attempt: destination busy or circuit open

    def add(self, outcome: str, k: int = 1) -> None:
        setattr(self, outcome, getattr(self, outcome) + k)

    def merge(self, other: Counts) -> None:
        for key, value in asdict(other).items():
            self.add(key, value)

    def busy(self) -> bool:
        return any(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _entry_age(entry: str | None) -> float | None:
    """Seconds since an outbox entry was written: a stream id starts with its ms timestamp."""
    try:
        return max(time.time() - int(str(entry).split("-")[0]) / 1000, 0.0)
    except ValueError:
        return None


class DeliveryWorker:
    """Delivers the outbox. Several workers (threads or processes) may share one Redis."""

    def __init__(
        self,
        redis_client: redis.Redis,
        config: NotifierConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.r = redis_client
        self.config = config or NotifierConfig.load()
        self.consumer = self.config.worker.consumer
        self._rng = rng or random.Random()
        self._webhook = WebhookSender(self.config.webhook)
        self._smtp = SmtpSender(self.config.smtp)
        self._pool = ThreadPoolExecutor(
            self.config.worker.concurrency, thread_name_prefix="ens-delivery"
        )
        hook = self.config.webhook
        self._gate = DestinationGate(
            hook.per_destination or max(self.config.worker.concurrency // 2, 1),
            hook.breaker_failures,
            hook.breaker_cooldown,
            rng=self._rng,
        )
        smtp = self.config.smtp  # the relay is one destination, gated as a webhook origin is
        self._smtp_dest = f"smtp://{smtp.host.lower()}:{smtp.effective_port}"
        self._lease = self.r.register_script(_LEASE)
        self._renew = self.r.register_script(_RENEW)
        # (schedule, member) -> the lease end this worker set, while its send runs
        self._held: dict[tuple[str, str], float] = {}
        self._held_lock = threading.Lock()
        self._closed = threading.Event()
        self._renewer: threading.Thread | None = None
        self._take_script = self.r.register_script(_TAKE)
        self._digest_done = self.r.register_script(_DIGEST_DONE)
        self._started = False
        self._last_claim = self._last_trim = float("-inf")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._closed.set()
        self._webhook.close()
        CIRCUITS_OPEN.dec(self._gate.open_count())  # the gauge sums the live workers' circuits

    def __enter__(self) -> DeliveryWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop -------------------------------------------------------------------------

    def run_once(self, block: float = 0.0) -> Counts:
        """Take new outbox entries, then run every due delivery and digest; return the counts.

        ``block`` > 0 waits up to that many seconds for new entries when nothing is due.
        Returns when this round's deliveries are finished (`run_forever` does not wait so).
        """
        counts = Counts()
        self._intake(counts, block)
        batch = self.config.worker.batch
        for outcome in self._pool.map(self._deliver, self._lease_due(RETRY, batch)):
            counts.merge(outcome)
        for outcome in self._pool.map(self._flush_digest, self._lease_due(DIGESTS, batch)):
            counts.merge(outcome)
        return counts

    def run_forever(self, stop: threading.Event) -> Counts:
        """Deliver until ``stop`` is set, then finish what is in flight; returns the summed counts.

        Unlike a loop of `run_once`, a slow delivery does not hold back the next round: new
        work is leased whenever a pool slot is free.
        """
        w = self.config.worker
        total = Counts()
        inflight: set[Future[Counts]] = set()
        while not stop.is_set():
            try:
                self._harvest(inflight, total)
                free = w.concurrency - len(inflight)
                if free <= 0:
                    futures.wait(inflight, timeout=w.poll, return_when=futures.FIRST_COMPLETED)
                    continue
                block = self._idle_wait()
                self._intake(total, min(block, 0.05) if inflight else block)
                for key in self._lease_due(RETRY, min(free, w.batch)):
                    inflight.add(self._pool.submit(self._deliver, key))
                free = w.concurrency - len(inflight)
                for address in self._lease_due(DIGESTS, min(free, w.batch)) if free > 0 else []:
                    inflight.add(self._pool.submit(self._flush_digest, address))
            except redis.RedisError as exc:  # keep the worker alive through a Redis restart
                log.error("redis error (%s); retrying in %.1fs", exc, w.poll)
                stop.wait(w.poll)
        futures.wait(inflight)
        self._harvest(inflight, total)
        return total

    @staticmethod
    def _harvest(inflight: set[Future[Counts]], total: Counts) -> None:
        done = {f for f in inflight if f.done()}
        for f in done:
            total.merge(f.result())  # _deliver/_flush_digest never raise
        inflight -= done

    def _intake(self, counts: Counts, block: float) -> None:
        """Re-claim, take over, trim, and take new outbox entries into the schedule."""
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
        if block > 0 and self._next_due() > now:
            entries = self._read(max(int(block * 1000), 1))  # BLOCK 0 would wait for ever
        else:
            entries = self._read(None)
        for eid, fields in entries:
            self._take(eid, fields, counts)

    def _lease_due(self, schedule: str, limit: int) -> list[str]:
        now = time.time()
        lease_end = now + self.config.worker.lease
        taken = [text(m) for m in self._lease(keys=[schedule], args=[now, lease_end, limit])]
        if taken:
            with self._held_lock:
                for member in taken:
                    self._held[schedule, member] = lease_end
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_leases, daemon=True, name="ens-delivery-lease"
                )
                self._renewer.start()
        return taken

    def _done(self, schedule: str, member: str) -> None:
        """The send of ``member`` is over (whatever its outcome): stop renewing its lease."""
        with self._held_lock:
            self._held.pop((schedule, member), None)

    def _renew_leases(self) -> None:
        """Push the leases of the sends in progress ahead, every third of the lease: a slow
        send keeps its delivery, a dead worker's deliveries come back within one lease."""
        lease = self.config.worker.lease
        while not self._closed.wait(lease / 3):
            with self._held_lock:
                held = dict(self._held)
            end = time.time() + lease
            for schedule in {s for s, _ in held}:
                args: list[Any] = [end]
                for (s, member), old in held.items():
                    if s == schedule:
                        args += [member, old]
                try:
                    self._renew(keys=[schedule], args=args)
                except redis.RedisError as exc:  # Redis away: the leases run out, as for a crash
                    log.warning("could not renew delivery leases: %s", exc)
                    continue
                with self._held_lock:
                    for (s, member), old in held.items():
                        if s == schedule and self._held.get((s, member)) == old:
                            self._held[s, member] = end

    def _idle_wait(self) -> float:
        wait = min(self.config.worker.poll, self._next_due() - time.time())
        return max(wait, 0.0)

    def _next_due(self) -> float:
        """The earliest due time over the retry and digest schedules (inf if both are empty)."""
        due = float("inf")
        for key in (RETRY, DIGESTS):
            first = self.r.zrange(key, 0, 0, withscores=True)
            if first:
                due = min(due, first[0][1])
        return due

    # --- reading the outbox ---------------------------------------------------------------

    def _read(self, block_ms: int | None) -> list[tuple[str, dict[str, str]]]:
        try:
            resp = self.r.xreadgroup(
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
            resp = self.r.xreadgroup(
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
            self._dead_letter({"raw": raw}, {}, -1, 0, eid, f"malformed outbox entry: {exc}", 0)
            DELIVERIES.labels("none", "dead").inc()
            counts.dead += 1
            self._ack(eid, counts)
            return
        nid, sid = n["id"], n.get("subscriber")
        if sid is None:
            log.info("notification %s (%s) has no subscriber; nothing to deliver", nid, eid)
            DELIVERIES.labels("none", "skipped").inc()
            counts.skipped += 1
            self._ack(eid, counts)
            return
        sub, error = self._subscriber(sid)
        if sub is None or not sub.channels:
            error = error or f"subscriber {sid!r} has no channels"
            log.warning("notification %s: %s; dead-lettered", nid, error)
            self._dead_letter(n, {}, -1, 0, eid, error, 0)
            DELIVERIES.labels("none", "dead").inc()
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

    def _ack(self, eid: str | None, counts: Counts | None = None) -> None:
        if eid and self.r.xack(OUTBOX, GROUP, eid) and counts is not None:
            counts.acked += 1

    def _maybe_ack(self, st: Mapping[str, Any], counts: Counts) -> None:
        """Ack the outbox entry once no delivery of its notification is left open.

        Each finisher deletes its own state *before* looking, so of two deliveries finishing
        at once at least the later one sees none left.
        """
        nid, nch = st["n"]["id"], int(st.get("nch", 0))
        if nch and not any(self.r.hmget(STATE, [delivery_key(nid, i) for i in range(nch)])):
            self._ack(st.get("entry"), counts)

    def _subscriber(self, sid: str) -> tuple[Subscriber | None, str]:
        raw = self.r.hget(SUBSCRIBERS, sid)
        if raw is None:
            return None, f"unknown subscriber {sid!r}"
        try:
            return Subscriber.model_validate_json(text(raw)), ""
        except ValueError as exc:
            return None, f"invalid subscriber record {sid!r}: {exc}"

    # --- one delivery ---------------------------------------------------------------------

    def _deliver(self, dkey: str) -> Counts:
        counts = Counts()
        try:
            self._deliver_one(dkey, counts)
        except Exception:  # a bug or a Redis hiccup: the lease brings the delivery back later
            log.exception("delivery %s failed unexpectedly; it will be retried", dkey)
        finally:
            self._done(RETRY, dkey)
        return counts

    def _deliver_one(self, dkey: str, counts: Counts) -> None:
        raw = self.r.hget(STATE, dkey)
        if raw is None:  # finished elsewhere; drop the stale schedule slot
            self.r.zrem(RETRY, dkey)
            counts.skipped += 1
            return
        st = json.loads(text(raw))
        n, nid, ch = st["n"], *split_delivery_key(dkey)
        if self.r.exists(delivered_key(nid, ch), dead_key(nid, ch)):
            with self.r.pipeline(transaction=True) as p:
                p.zrem(RETRY, dkey).hdel(STATE, dkey).execute()
            counts.skipped += 1
            self._maybe_ack(st, counts)
            return
        sub, error = self._subscriber(str(n.get("subscriber")))
        if sub is not None and ch >= len(sub.channels):
            error = f"subscriber {sub.id!r} has no channel #{ch} any more"
        if sub is None or error:
            self._finish_dead(dkey, st, {}, "none", error, counts)
            return
        channel = sub.channels[ch]
        kind = "webhook" if isinstance(channel, WebhookChannel) else "email"
        chan = channel.model_dump(exclude_none=True)
        if isinstance(channel, EmailChannel):
            window = next(
                w for w in (channel.digest, sub.digest, self.config.digest) if w is not None
            )
            if window > 0:
                self._park(dkey, channel.email, window)
                log.info("parked nid=%s ch=%d for the digest of %s", nid, ch, channel.email)
                DELIVERIES.labels(kind, "digested").inc()
                counts.digested += 1
                return

        dest = (
            destination(channel.webhook) if isinstance(channel, WebhookChannel) else self._smtp_dest
        )
        grant = self._gate.acquire(dest, time.time())
        if not grant.ok:
            self._defer(dkey, dest, grant, kind, counts)
            return
        st["attempts"] = int(st.get("attempts", 0)) + 1
        started = time.monotonic()
        result = Attempt.fatal("no signing secret for this webhook")
        try:
            if isinstance(channel, WebhookChannel):
                secret = sub.webhook_secret(channel)
                if secret:
                    result = self._webhook.send(channel.webhook, secret, n)
            else:
                msg = compose(build_message, n, self.config.smtp.sender, channel.email, key=dkey)
                result = msg if isinstance(msg, Attempt) else self._smtp.send(msg)
        finally:  # the slot is given back whatever happened
            self._release(dest, grant, time.monotonic() - started, result)
        elapsed = time.monotonic() - started
        ATTEMPT_SECONDS.labels(kind).observe(elapsed)

        where = f"nid={nid} ch={ch} {describe_channel(chan)} attempt={st['attempts']}"
        if result.ok:
            with self.r.pipeline(transaction=True) as p:
                p.set(delivered_key(nid, ch), "1", ex=self.config.worker.delivered_ttl)
                p.zrem(RETRY, dkey).hdel(STATE, dkey).execute()
            log.info("delivered %s (%s, %.3fs)", where, result.detail, elapsed)
            self._delivered(kind, st, counts)
        elif result.retryable and st["attempts"] < self.config.retry.max_attempts:
            delay = self.config.retry.delay(st["attempts"], result.retry_after, self._rng)
            st["error"] = result.error
            with self.r.pipeline(transaction=True) as p:
                p.hset(STATE, dkey, dumps(st)).zadd(RETRY, {dkey: time.time() + delay}).execute()
            log.info("retry %s in %.2fs: %s", where, delay, result.error)
            DELIVERIES.labels(kind, "retry").inc()
            counts.retried += 1
        else:
            why = result.error if not result.retryable else f"gave up: {result.error}"
            self._finish_dead(dkey, st, chan, kind, why, counts)

    def _defer(self, dkey: str, dest: str, grant: Grant, kind: str, counts: Counts) -> None:
        """Put a delivery back on the schedule at the gate's time, without an attempt."""
        self.r.zadd(RETRY, {dkey: grant.retry_at}, xx=True)  # xx: not if finished meanwhile
        log.debug(
            "deferred %s to %s by %.2fs: %s", dkey, dest, grant.retry_at - time.time(), grant.reason
        )
        DEFERRED.labels(kind, grant.reason).inc()
        counts.deferred += 1

    def _release(self, dest: str, grant: Grant, elapsed: float, result: Attempt) -> None:
        failed = not result.ok and result.retryable  # an answered 4xx shows the server alive
        change = self._gate.release(dest, grant, time.time(), elapsed, failed)
        if change == OPENED:
            CIRCUIT_TRIPS.inc()
            if grant.probe:  # already counted open; one line per outage, not per probe
                log.info("circuit still open for %s: the probe failed (%s)", dest, result.error)
            else:
                CIRCUITS_OPEN.inc()
                log.warning(
                    "circuit open for %s (%s): nothing is sent there for %gs",
                    dest,
                    result.error,
                    self._gate.cooldown,
                )
        elif change == CLOSED:
            CIRCUITS_OPEN.dec()
            log.info("circuit closed for %s: it answers again", dest)

    def _delivered(self, kind: str, st: Mapping[str, Any], counts: Counts) -> None:
        DELIVERIES.labels(kind, "delivered").inc()
        age = _entry_age(st.get("entry"))
        if age is not None:
            LATENCY.labels(kind).observe(age)
        counts.delivered += 1
        self._maybe_ack(st, counts)

    def _dead_letter(
        self,
        n: Mapping[str, Any],
        chan: Mapping[str, Any],
        ch: int,
        nch: int,
        entry: str,
        error: str,
        attempts: int,
        pipe: Any = None,
    ) -> None:
        fields = store.dead_letter_fields(n, chan, ch, nch, entry, error, attempts)
        (pipe or self.r).xadd(DEADLETTER, fields)

    def _finish_dead(
        self,
        dkey: str,
        st: dict[str, Any],
        chan: Mapping[str, Any],
        kind: str,
        error: str,
        counts: Counts,
    ) -> None:
        nid, ch = split_delivery_key(dkey)
        attempts = int(st.get("attempts", 0))
        with self.r.pipeline(transaction=True) as p:
            self._dead_letter(
                st["n"], chan, ch, st.get("nch", 0), st.get("entry", ""), error, attempts, pipe=p
            )
            p.set(dead_key(nid, ch), "1", ex=self.config.worker.delivered_ttl)
            p.zrem(RETRY, dkey).hdel(STATE, dkey).execute()
        log.warning(
            "dead-lettered nid=%s ch=%d %s after %d attempt(s): %s",
            nid,
            ch,
            describe_channel(chan),
            attempts,
            error,
        )
        DELIVERIES.labels(kind, "dead").inc()
        counts.dead += 1
        self._maybe_ack(st, counts)

    # --- digests --------------------------------------------------------------------------

    def _park(self, dkey: str, address: str, window: float) -> None:
        now = time.time()
        with self.r.pipeline(transaction=True) as p:
            p.zadd(digest_key(address), {dkey: now}, nx=True)
            p.zadd(DIGESTS, {address: now + window}, nx=True)
            p.hset(DIGEST_WINDOW, address, repr(window))
            p.zrem(RETRY, dkey)
            p.execute()

    def _flush_digest(self, address: str) -> Counts:
        counts = Counts()
        try:
            self._flush_digest_one(address, counts)
        except Exception:
            log.exception("digest for %s failed unexpectedly; it will be retried", address)
        finally:
            self._done(DIGESTS, address)
        return counts

    def _drop_unbuildable(
        self, address: str, states: list[tuple[str, dict[str, Any]]], counts: Counts
    ) -> list[tuple[str, dict[str, Any]]]:
        """Dead-letter the parked notifications whose mail cannot be rendered (a permanent
        error: retrying the digest would fail forever); returns the others."""
        good: list[tuple[str, dict[str, Any]]] = []
        bad: list[tuple[str, dict[str, Any], str]] = []
        for dkey, st in states:
            built = compose(build_message, st["n"], self.config.smtp.sender, address, key=dkey)
            if isinstance(built, Attempt):
                bad.append((dkey, st, built.error))
            else:
                good.append((dkey, st))
        if not bad:
            return good
        ttl = self.config.worker.delivered_ttl
        with self.r.pipeline(transaction=True) as p:
            for dkey, st, why in bad:
                nid, ch = split_delivery_key(dkey)
                self._dead_letter(
                    st["n"],
                    {"email": address},
                    ch,
                    st.get("nch", 0),
                    st.get("entry", ""),
                    why,
                    0,
                    pipe=p,
                )
                p.set(dead_key(nid, ch), "1", ex=ttl)
                p.hdel(STATE, dkey)
            p.execute()
        for dkey, st, why in bad:
            log.warning("dead-lettered %s (digest of %s): %s", dkey, address, why)
            DELIVERIES.labels("email", "dead").inc()
            counts.dead += 1
            self._maybe_ack(st, counts)
        return good

    def _flush_digest_one(self, address: str, counts: Counts) -> None:
        buf = digest_key(address)
        members = [text(m) for m in self.r.zrange(buf, 0, self.config.worker.digest_max - 1)]
        states: list[tuple[str, dict[str, Any]]] = []
        for dkey, raw in zip(members, self.r.hmget(STATE, members) if members else [], strict=True):
            nid, ch = split_delivery_key(dkey)
            if raw is not None and not self.r.exists(delivered_key(nid, ch), dead_key(nid, ch)):
                states.append((dkey, json.loads(text(raw))))
        args = [address, *members]
        keys = [DIGESTS, buf, DIGEST_WINDOW, DIGEST_ATTEMPTS]
        if not states:
            self._digest_done(keys=keys, args=args)
            return
        # in the order the engine emitted them (the outbox), not the order they were parked:
        # deliveries are parked by concurrent threads
        states.sort(key=lambda s: entry_order(s[1].get("entry") or "0"))
        sender = self.config.smtp.sender
        states = self._drop_unbuildable(address, states, counts)
        if not states:
            self._digest_done(keys=keys, args=args)
            return
        ns = [st["n"] for _, st in states]
        if len(ns) == 1:
            msg = build_message(ns[0], sender, address, key=states[0][0])
        else:
            msg = build_digest(ns, sender, address)
        grant = self._gate.acquire(self._smtp_dest, time.time())
        if not grant.ok:  # the relay is busy or its circuit open: the digest comes back then
            self.r.zadd(DIGESTS, {address: grant.retry_at})
            DEFERRED.labels("email", grant.reason).inc()
            counts.deferred += 1
            return
        started = time.monotonic()
        result = Attempt.fatal("not sent")
        try:
            result = self._smtp.send(msg)
        finally:
            self._release(self._smtp_dest, grant, time.monotonic() - started, result)
        elapsed = time.monotonic() - started
        ATTEMPT_SECONDS.labels("email").observe(elapsed)
        attempts = int(self.r.hincrby(DIGEST_ATTEMPTS, address, 1))
        if result.ok:
            ttl = self.config.worker.delivered_ttl
            with self.r.pipeline(transaction=True) as p:
                for dkey, _ in states:
                    p.set(delivered_key(*split_delivery_key(dkey)), "1", ex=ttl)
                    p.hdel(STATE, dkey)
                self._digest_done(keys=keys, args=args, client=p)
                p.execute()
            log.info(
                "delivered digest of %d notification(s) to %s attempt=%d (%s, %.3fs)",
                len(states),
                address,
                attempts,
                result.detail,
                elapsed,
            )
            for _, st in states:
                self._delivered("email", st, counts)
        elif result.retryable and attempts < self.config.retry.max_attempts:
            delay = self.config.retry.delay(attempts, result.retry_after, self._rng)
            self.r.zadd(DIGESTS, {address: time.time() + delay})
            log.info("retry digest to %s in %.2fs: %s", address, delay, result.error)
            DELIVERIES.labels("email", "retry").inc()
            counts.retried += 1
        else:
            why = result.error if not result.retryable else f"gave up: {result.error}"
            ttl = self.config.worker.delivered_ttl
            with self.r.pipeline(transaction=True) as p:
                for dkey, st in states:
                    nid, ch = split_delivery_key(dkey)
                    self._dead_letter(
                        st["n"],
                        {"email": address},
                        ch,
                        st.get("nch", 0),
                        st.get("entry", ""),
                        why,
                        attempts,
                        pipe=p,
                    )
                    p.set(dead_key(nid, ch), "1", ex=ttl)
                    p.hdel(STATE, dkey)
                self._digest_done(keys=keys, args=args, client=p)
                p.execute()
            log.warning("dead-lettered digest of %d to %s: %s", len(states), address, why)
            for _, st in states:
                DELIVERIES.labels("email", "dead").inc()
                counts.dead += 1
                self._maybe_ack(st, counts)
