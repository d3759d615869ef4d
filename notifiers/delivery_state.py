"""What the parts of the delivery worker share: its counts and its state.

`DeliveryWorker` (`notifiers.worker`) is assembled from parts that each keep one concern in
a module of its own: `outbox_intake` (outbox entries taken into the schedule, acknowledged
when done), `leases` (deliveries leased from the schedules, leases renewed while a send
runs), `sending` (one delivery: webhook or e-mail, retry, dead letter) and `digests` (e-mails
parked and sent as one). They work on one state, declared here (`DeliveryState`), so that
each part can be read, and type-checked, alone.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import redis

from notifiers.config import NotifierConfig
from notifiers.destinations import DestinationGate
from notifiers.email import SmtpSender

if TYPE_CHECKING:
    from notifiers.leases import Leases
    from notifiers.outbox_intake import OutboxIntake
    from notifiers.sending import Sending


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
    abandoned: int = 0  # cut short by a shutdown; their leases bring them back

    def add(self, outcome: str, k: int = 1) -> None:
        setattr(self, outcome, getattr(self, outcome) + k)

    def merge(self, other: Counts) -> None:
        for key, value in asdict(other).items():
            self.add(key, value)

    def busy(self) -> bool:
        return any(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def entry_age(entry: str | None) -> float | None:
    """Seconds since an outbox entry was written: a stream id starts with its ms timestamp."""
    try:
        return max(time.time() - int(str(entry).split("-")[0]) / 1000, 0.0)
    except ValueError:
        return None


class DeliveryState:
    """The delivery worker's state; `DeliveryWorker.__init__` sets it.

    The methods below are the ones a part calls on another; each is defined by its part.
    """

    r: redis.Redis
    config: NotifierConfig
    _rng: random.Random
    _smtp: SmtpSender
    _gate: DestinationGate
    _smtp_dest: str  # the relay, gated as a webhook origin is
    leases: Leases
    intake: OutboxIntake
    sending: Sending
    _digest_done: Any
