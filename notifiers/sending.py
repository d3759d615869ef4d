"""One delivery of the delivery worker: a webhook request or an e-mail, through its
destination's gate (in-flight limit, circuit breaker); a failure is re-scheduled with backoff,
the last one (or a permanent one) dead-lettered.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from notifiers import status, store
from notifiers.attempt import Attempt
from notifiers.config import NotifierConfig
from notifiers.delivery_state import Counts, entry_age
from notifiers.destinations import CLOSED, OPENED, DestinationGate, Grant
from notifiers.email import SmtpSender, compose
from notifiers.leases import Leases
from notifiers.metrics import (
    ABANDONED,
    ATTEMPT_SECONDS,
    CIRCUIT_TRIPS,
    CIRCUITS_OPEN,
    DEFERRED,
    LATENCY,
    count_delivery,
)
from notifiers.store import (
    RETRY,
    STATE,
    EmailChannel,
    Subscriber,
    WebhookChannel,
    dead_key,
    delivered_key,
    describe_channel,
    dumps,
    split_delivery_key,
    text,
)
from notifiers.templates import email_message, webhook_body
from notifiers.webhook import WebhookSender, destination

if TYPE_CHECKING:
    from notifiers.outbox_intake import OutboxIntake

log = logging.getLogger("ens.notifiers")


@dataclass(frozen=True, slots=True)
class Senders:
    """What a send goes through, shared by `Sending` and `Digests`: the webhook and SMTP
    senders, the destination gate (in-flight limit, circuit breaker) where the relay is one
    destination (``smtp_dest``), gated as a webhook origin is, and the backoff's jitter."""

    webhook: WebhookSender
    smtp: SmtpSender
    gate: DestinationGate
    smtp_dest: str
    rng: random.Random


class Sending:
    """The sending part of `DeliveryWorker`: one delivery through the worker's senders and
    destination gate; `intake` reads subscribers and acks what is done, `leases` is told when
    a send is over. `release` and `delivered` are what a digest's send shares with it."""

    def __init__(
        self,
        r: redis.Redis,
        config: NotifierConfig,
        leases: Leases,
        intake: OutboxIntake,
        senders: Senders,
    ) -> None:
        self.r = r
        self.config = config
        self.leases = leases
        self.intake = intake
        self.senders = senders

    def deliver(self, dkey: str) -> Counts:
        counts = Counts()
        try:
            self._deliver_one(dkey, counts)
        except Exception:  # a bug or a Redis hiccup: the lease brings the delivery back later
            log.exception("delivery %s failed unexpectedly; it will be retried", dkey)
        finally:
            self.leases.done(RETRY, dkey)
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
                p.zrem(RETRY, dkey)
                p.hdel(STATE, dkey)
                p.execute()
            counts.skipped += 1
            self.intake.maybe_ack(st, counts)
            return
        sub, error = self.intake.subscriber(str(n.get("subscriber")))
        if sub is not None and ch >= len(sub.channels):
            error = f"subscriber {sub.id!r} has no channel #{ch} any more"
        if sub is None or error:
            self._finish_dead(dkey, st, {}, "none", error, counts)
            return
        channel = sub.channels[ch]
        kind = "webhook" if isinstance(channel, WebhookChannel) else "email"
        chan = channel.model_dump(exclude_none=True)
        if isinstance(channel, EmailChannel) and self._parked(dkey, sub, channel, n, counts):
            return

        dest = (
            destination(channel.webhook)
            if isinstance(channel, WebhookChannel)
            else self.senders.smtp_dest
        )
        grant = self.senders.gate.acquire(dest, time.time())
        if not grant.ok:
            self._defer(dkey, dest, grant, kind, counts)
            return
        st["attempts"] = int(st.get("attempts", 0)) + 1
        started = time.monotonic()
        result = Attempt.fatal("no signing secret for this webhook")
        try:
            result = self._send(sub, channel, n, dkey)
        finally:  # the slot is given back whatever happened
            self.release(dest, grant, time.monotonic() - started, result)
        elapsed = time.monotonic() - started
        ATTEMPT_SECONDS.labels(kind).observe(elapsed)

        where = f"nid={nid} ch={ch} {describe_channel(chan)} attempt={st['attempts']}"
        if result.abandoned:  # the worker stops: no attempt counted, the lease brings it back
            log.info("abandoned %s after %.1fs: %s", where, elapsed, result.error)
            ABANDONED.labels(kind).inc()
            counts.abandoned += 1
        elif result.ok:
            with self.r.pipeline(transaction=True) as p:
                p.set(delivered_key(nid, ch), "1", ex=self.config.worker.delivered_ttl)
                p.zrem(RETRY, dkey)
                p.hdel(STATE, dkey)
                p.execute()
            log.info("delivered %s (%s, %.3fs)", where, result.detail, elapsed)
            self.delivered(kind, st, counts)
        elif result.retryable and st["attempts"] < self.config.retry.max_attempts:
            delay = self.config.retry.delay(st["attempts"], result.retry_after, self.senders.rng)
            st["error"] = result.error
            with self.r.pipeline(transaction=True) as p:
                p.hset(STATE, dkey, dumps(st))
                p.zadd(RETRY, {dkey: time.time() + delay})
                status.note(p, str(n.get("subscriber")), "retried", result.error)
                p.execute()
            log.info("retry %s in %.2fs: %s", where, delay, result.error)
            count_delivery(kind, "retry", n)
            counts.retried += 1
        else:
            why = result.error if not result.retryable else f"gave up: {result.error}"
            self._finish_dead(dkey, st, chan, kind, why, counts)

    def _parked(
        self, dkey: str, sub: Subscriber, channel: EmailChannel, n: dict[str, Any], counts: Counts
    ) -> bool:
        """Parked for the address's digest when a digest window applies (channel, subscriber,
        then the config's)."""
        window = next(w for w in (channel.digest, sub.digest, self.config.digest) if w is not None)
        if window <= 0:
            return False
        store.park_digest(self.r, dkey, channel.email, window)
        nid, ch = split_delivery_key(dkey)
        log.info("parked nid=%s ch=%d for the digest of %s", nid, ch, channel.email)
        count_delivery("email", "digested", n)
        counts.digested += 1
        return True

    def _send(self, sub: Subscriber, channel: Any, n: dict[str, Any], dkey: str) -> Attempt:
        """One attempt on one channel: the signed webhook POST or the e-mail."""
        if isinstance(channel, WebhookChannel):
            secret = sub.webhook_secret(channel)
            if not secret:
                return Attempt.fatal("no signing secret for this webhook")
            body = webhook_body(sub.id, channel, sub.templates, n)
            return self.senders.webhook.send(channel.webhook, secret, n, body)
        sender, to = self.config.smtp.sender, channel.email
        msg = compose(email_message, sub.id, sub.templates, n, sender, to, key=dkey)
        return msg if isinstance(msg, Attempt) else self.senders.smtp.send(msg)

    def _defer(self, dkey: str, dest: str, grant: Grant, kind: str, counts: Counts) -> None:
        """Put a delivery back on the schedule at the gate's time, without an attempt."""
        self.r.zadd(RETRY, {dkey: grant.retry_at}, xx=True)  # xx: not if finished meanwhile
        log.debug(
            "deferred %s to %s by %.2fs: %s", dkey, dest, grant.retry_at - time.time(), grant.reason
        )
        DEFERRED.labels(kind, grant.reason).inc()
        counts.deferred += 1

    def release(self, dest: str, grant: Grant, elapsed: float, result: Attempt) -> None:
        # an answered 4xx shows the server alive; an abandoned send says nothing about it
        failed = not result.ok and result.retryable and not result.abandoned
        change = self.senders.gate.release(dest, grant, time.time(), elapsed, failed)
        if change is not None:
            try:
                opened = change == OPENED
                until = time.time() + self.senders.gate.cooldown
                status.note_breaker(self.r, dest, opened, until, result.error)
            except redis.RedisError as exc:  # the status only; the breaker itself is in memory
                log.warning("could not record the circuit of %s: %s", dest, exc)
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
                    self.senders.gate.cooldown,
                )
        elif change == CLOSED:
            CIRCUITS_OPEN.dec()
            log.info("circuit closed for %s: it answers again", dest)

    def delivered(self, kind: str, st: Mapping[str, Any], counts: Counts) -> None:
        try:
            status.note(self.r, str(st["n"].get("subscriber")), "delivered")
        except redis.RedisError as exc:  # the status only: the delivery is recorded
            log.warning("could not record a delivery in the subscriber status: %s", exc)
        count_delivery(kind, "delivered", st["n"])
        age = entry_age(st.get("entry"))
        if age is not None:
            LATENCY.labels(kind).observe(age)
        counts.delivered += 1
        self.intake.maybe_ack(st, counts)

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
            status.dead_letter(
                p, st["n"], chan, ch, st.get("nch", 0), st.get("entry", ""), error, attempts
            )
            p.set(dead_key(nid, ch), "1", ex=self.config.worker.delivered_ttl)
            p.zrem(RETRY, dkey)
            p.hdel(STATE, dkey)
            p.execute()
        log.warning(
            "dead-lettered nid=%s ch=%d %s after %d attempt(s): %s",
            nid,
            ch,
            describe_channel(chan),
            attempts,
            error,
        )
        count_delivery(kind, "dead", st["n"])
        counts.dead += 1
        self.intake.maybe_ack(st, counts)
