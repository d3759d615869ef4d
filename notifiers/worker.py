"""The delivery worker: outbox stream -> retry schedule -> webhooks / SMTP (or a digest).

Flow. An outbox entry is read through the consumer group and *taken*: every channel of its
subscriber that is neither delivered nor dead-lettered gets a delivery state and a slot in the
``ens:retry`` schedule, due now. Deliveries are then leased from the schedule (the lease pushes
their due time ``lease`` seconds ahead, and is renewed every third of it while the send runs, so
a worker dying mid-send delays them by at most ``lease``) and run in a thread pool; a failure re-schedules with backoff instead of sleeping, so one slow or broken
receiver never holds back others. A webhook request also needs a slot at its destination
(`notifiers.destinations`): at most ``per_destination`` in flight (default a quarter of the
threads, so two hung hosts leave half of them to the others), none while its circuit is
open; a delivery refused a slot is re-scheduled without an attempt. Every send ends by its
total deadline (``webhook.timeout``, the SMTP session's ``smtp.deadline``); at shutdown the
sends still in flight after ``worker.shutdown_grace`` are abandoned to their leases. The stream entry is XACKed
only when none of its deliveries is left in the state hash, i.e. each was delivered or
dead-lettered; until then it stays in the pending list, and a restarted (or another) worker
re-takes it — harmlessly, since taking is idempotent and delivered channels are remembered in
``ens:delivered:<nid>:<ch>``.

Digest: an e-mail delivery with a digest window is *parked* in ``ens:digest:<addr>``; when the
oldest parked one is ``window`` seconds old the whole batch goes out as one mail.

The parts, each an object with its own fields that `DeliveryWorker` builds and gives what it
needs: `notifiers.leases` (`Leases`: the scripts, the leases held and their renewer),
`outbox_intake` (`OutboxIntake`: the consumer's reads, takes and acks; the subscribers),
`sending` (`Sending`: one delivery through the senders and the destination gate, which the
worker owns and passes in) and `digests` (`Digests`: one digest mail, its outcome recorded
through `Sending`); `notifiers.delivery_state` has the `Counts` they fill. Here is the loop
that drives them.
"""

from __future__ import annotations

import logging
import random
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import redis

from notifiers.config import NotifierConfig
from notifiers.delivery_state import Counts as Counts  # what a round did
from notifiers.destinations import DestinationGate
from notifiers.digests import Digests
from notifiers.email import SmtpSender
from notifiers.leases import Leases
from notifiers.metrics import CIRCUITS_OPEN
from notifiers.outbox_intake import OutboxIntake
from notifiers.sending import Senders, Sending
from notifiers.store import (
    DIGESTS,
    RETRY,
)
from notifiers.webhook import WebhookSender

log = logging.getLogger("ens.notifiers")


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
        rng = rng or random.Random()
        self._pool = ThreadPoolExecutor(
            self.config.worker.concurrency, thread_name_prefix="ens-delivery"
        )
        hook, smtp = self.config.webhook, self.config.smtp
        self.senders = Senders(
            WebhookSender(hook),
            SmtpSender(smtp),
            DestinationGate(
                hook.per_destination or max(self.config.worker.concurrency // 4, 1),
                hook.breaker_failures,
                hook.breaker_cooldown,
                rng=rng,
            ),
            f"smtp://{smtp.host.lower()}:{smtp.effective_port}",
            rng,
        )
        self.leases = Leases(self.r, self.config)
        self.intake = OutboxIntake(self.r, self.config, self.leases)
        self.sending = Sending(self.r, self.config, self.leases, self.intake, self.senders)
        self.digests = Digests(self.sending)

    def close(self) -> None:
        self.abandon()  # run_forever left nothing in flight; run_once's callers may have
        self._pool.shutdown(wait=True)
        self.leases.close()
        self.senders.webhook.close()
        CIRCUITS_OPEN.dec(
            self.senders.gate.open_count()
        )  # the gauge sums the live workers' circuits

    def __enter__(self) -> DeliveryWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_once(self, block: float = 0.0) -> Counts:
        """Take new outbox entries, then run every due delivery and digest; return the counts.

        ``block`` > 0 waits up to that many seconds for new entries when nothing is due.
        Returns when this round's deliveries are finished (`run_forever` does not wait so).
        """
        counts = Counts()
        self.intake.poll(counts, block)
        batch = self.config.worker.batch
        for outcome in self._pool.map(self.sending.deliver, self.leases.lease_due(RETRY, batch)):
            counts.merge(outcome)
        for outcome in self._pool.map(self.digests.flush, self.leases.lease_due(DIGESTS, batch)):
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
                block = self.leases.idle_wait()
                if inflight:  # a finished send ends the pause at once: its slot is free
                    self.intake.poll(total, min(block, 0.05), partial(_first_done, inflight))
                else:
                    self.intake.poll(total, block)
                for key in self.leases.lease_due(RETRY, min(free, w.batch)):
                    inflight.add(self._pool.submit(self.sending.deliver, key))
                free = w.concurrency - len(inflight)
                for address in (
                    self.leases.lease_due(DIGESTS, min(free, w.batch)) if free > 0 else []
                ):
                    inflight.add(self._pool.submit(self.digests.flush, address))
            except redis.RedisError as exc:  # keep the worker alive through a Redis restart
                log.error("redis error (%s); retrying in %.1fs", exc, w.poll)
                stop.wait(w.poll)
        self._wind_down(inflight, total)
        return total

    def _wind_down(self, inflight: set[Future[Counts]], total: Counts) -> None:
        """Let the sends in flight finish for ``shutdown_grace`` seconds, then abandon the rest:
        their connections are shut, no attempt is counted, and since their leases are no longer
        renewed they are due again (for any worker, or this one restarted) within ``lease``."""
        grace = self.config.worker.shutdown_grace
        _, pending = futures.wait(inflight, timeout=grace)
        if pending:
            log.warning(
                "stopping: abandoning %d send(s) still in flight after %gs; "
                "they are delivered again within %gs of their lease",
                len(pending),
                grace,
                self.config.worker.lease,
            )
            self.abandon()
            futures.wait(pending, timeout=max(self.config.webhook.connect_timeout, 1.0))
        self._harvest(inflight, total)

    def abandon(self) -> None:
        """Cut every send in flight short (webhook connections and SMTP sessions are shut)."""
        self.senders.webhook.abort()
        self.senders.smtp.abort()

    @staticmethod
    def _harvest(inflight: set[Future[Counts]], total: Counts) -> None:
        done = {f for f in inflight if f.done()}
        for f in done:
            total.merge(f.result())  # deliver/flush never raise
        inflight -= done


def _first_done(inflight: set[Future[Counts]], timeout: float) -> None:
    futures.wait(inflight, timeout=timeout, return_when=futures.FIRST_COMPLETED)
