"""What the parts of the delivery worker share: the counts of a round.

`DeliveryWorker` (`notifiers.worker`) builds its parts, each an object with its own fields in
a module of its own, and gives each the others it calls: `leases.Leases` (deliveries leased
from the schedules, leases renewed while a send runs), `outbox_intake.OutboxIntake` (outbox
entries taken into the schedule, acknowledged when done), `sending.Sending` (one delivery:
webhook or e-mail, retry, dead letter) and `digests.Digests` (e-mails parked and sent as one).
Each part adds what it did to a `Counts`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass


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
