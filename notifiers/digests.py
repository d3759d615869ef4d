"""Digests of the delivery worker: an e-mail delivery with a digest window is parked in
``ens:digest:<addr>`` (by `Sending`, through `notifiers.store.park_digest`); when the oldest
parked one is ``window`` seconds old the whole batch goes out as one mail (`Digests.flush`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from notifiers import status
from notifiers.attempt import Attempt
from notifiers.delivery_state import Counts
from notifiers.email import build_message, compose
from notifiers.metrics import (
    ABANDONED,
    ATTEMPT_SECONDS,
    DEFERRED,
    DELIVERIES,
    count_delivery,
    count_profile,
)
from notifiers.sending import Sending
from notifiers.store import (
    DIGEST_ATTEMPTS,
    DIGEST_WINDOW,
    DIGESTS,
    STATE,
    dead_key,
    delivered_key,
    digest_key,
    entry_order,
    split_delivery_key,
    text,
)
from notifiers.templates import email_digest, email_message, email_parts

log = logging.getLogger("ens.notifiers")

# KEYS: DIGESTS, digest buffer, DIGEST_WINDOW, DIGEST_ATTEMPTS; ARGV: address, members done.
# Drops the done members; re-schedules the address for what arrived meanwhile, or forgets it.
DIGEST_DONE = """
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


class Digests:
    """The digest part of `DeliveryWorker`: one digest mail through the relay's slot at the
    worker's gate, its outcome recorded as `sending`'s (`Sending.release`, `delivered`)."""

    def __init__(self, sending: Sending) -> None:
        self.sending = sending  # its Redis, configuration, leases, intake and senders
        self.r = sending.r
        self.config = sending.config
        self.leases = sending.leases
        self.intake = sending.intake
        self.senders = sending.senders
        self._digest_done = self.r.register_script(DIGEST_DONE)

    def flush(self, address: str) -> Counts:
        counts = Counts()
        try:
            self._flush_digest_one(address, counts)
        except Exception:
            log.exception("digest for %s failed unexpectedly; it will be retried", address)
        finally:
            self.leases.done(DIGESTS, address)
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
        with self.r.pipeline(transaction=True) as p:
            self._dead_letter_parked(p, address, bad, 0)
            p.execute()
        for dkey, _, why in bad:
            log.warning("dead-lettered %s (digest of %s): %s", dkey, address, why)
        self._count_dead([st for _, st, _ in bad], counts)
        return good

    def _dead_letter_parked(
        self,
        pipe: Any,
        address: str,
        parked: list[tuple[str, dict[str, Any], str]],
        attempts: int,
    ) -> None:
        """Queue on ``pipe`` the dead letters of parked notifications (delivery key, state,
        why): each marked dead for ``delivered_ttl`` and its state dropped."""
        ttl = self.config.worker.delivered_ttl
        for dkey, st, why in parked:
            nid, ch = split_delivery_key(dkey)
            status.dead_letter(
                pipe,
                st["n"],
                {"email": address},
                ch,
                st.get("nch", 0),
                st.get("entry", ""),
                why,
                attempts,
            )
            pipe.set(dead_key(nid, ch), "1", ex=ttl)
            pipe.hdel(STATE, dkey)

    def _count_dead(self, states: list[dict[str, Any]], counts: Counts) -> None:
        for st in states:
            count_delivery("email", "dead", st["n"])
            counts.dead += 1
            self.intake.maybe_ack(st, counts)

    def _templates_of(self, ns: list[dict[str, Any]]) -> dict[str, Any]:
        """Subscriber id -> its templates (None: the defaults), for the notifications of a
        digest (one address may serve several subscribers)."""
        out: dict[str, Any] = {}
        for sid in {str(n.get("subscriber")) for n in ns}:
            sub, _ = self.intake.subscriber(sid)
            out[sid] = sub.templates if sub is not None else None
        return out

    def _undelivered(self, members: list[str]) -> list[tuple[str, dict[str, Any]]]:
        """(delivery key, state) of the parked deliveries not yet delivered or dead."""
        states: list[tuple[str, dict[str, Any]]] = []
        for dkey, raw in zip(members, self.r.hmget(STATE, members) if members else [], strict=True):
            nid, ch = split_delivery_key(dkey)
            if raw is not None and not self.r.exists(delivered_key(nid, ch), dead_key(nid, ch)):
                states.append((dkey, json.loads(text(raw))))
        return states

    def _digest_message(
        self, address: str, states: list[tuple[str, dict[str, Any]]], sender: str
    ) -> Any:
        """One notification's own mail, or the digest of several, each with its templates."""
        ns = [st["n"] for _, st in states]
        templates = self._templates_of(ns)
        if len(ns) == 1:
            sid = str(ns[0].get("subscriber"))
            return email_message(sid, templates.get(sid), ns[0], sender, address, states[0][0])

        def sections(n: Any) -> tuple[str, str, str]:
            sid = str(n.get("subscriber"))
            return email_parts(sid, templates.get(sid), n)

        return email_digest(sections, ns, sender, address)

    def _flush_digest_one(self, address: str, counts: Counts) -> None:
        buf = digest_key(address)
        members = [text(m) for m in self.r.zrange(buf, 0, self.config.worker.digest_max - 1)]
        states = self._undelivered(members)
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
        msg = self._digest_message(address, states, sender)
        grant = self.senders.gate.acquire(self.senders.smtp_dest, time.time())
        if not grant.ok:  # the relay is busy or its circuit open: the digest comes back then
            self.r.zadd(DIGESTS, {address: grant.retry_at})
            DEFERRED.labels("email", grant.reason).inc()
            counts.deferred += 1
            return
        started = time.monotonic()
        result = Attempt.fatal("not sent")
        try:
            result = self.senders.smtp.send(msg)
        finally:
            self.sending.release(self.senders.smtp_dest, grant, time.monotonic() - started, result)
        elapsed = time.monotonic() - started
        if result.abandoned:  # the worker stops: its lease on the digest brings it back
            log.info("abandoned digest to %s after %.1fs: %s", address, elapsed, result.error)
            ABANDONED.labels("email").inc()
            counts.abandoned += 1
            return
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
                self.sending.delivered("email", st, counts)
        elif result.retryable and attempts < self.config.retry.max_attempts:
            delay = self.config.retry.delay(attempts, result.retry_after, self.senders.rng)
            with self.r.pipeline(transaction=False) as p:
                p.zadd(DIGESTS, {address: time.time() + delay})
                for _, st in states:
                    status.note(p, str(st["n"].get("subscriber")), "retried", result.error)
                p.execute()
            log.info("retry digest to %s in %.2fs: %s", address, delay, result.error)
            DELIVERIES.labels("email", "retry").inc()  # one mail: one retry
            for _, st in states:
                count_profile("retry", st["n"])
            counts.retried += 1
        else:
            why = result.error if not result.retryable else f"gave up: {result.error}"
            with self.r.pipeline(transaction=True) as p:
                self._dead_letter_parked(p, address, [(k, st, why) for k, st in states], attempts)
                self._digest_done(keys=keys, args=args, client=p)
                p.execute()
            log.warning("dead-lettered digest of %d to %s: %s", len(states), address, why)
            self._count_dead([st for _, st in states], counts)
