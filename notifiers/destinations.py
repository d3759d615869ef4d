"""Per-destination admission of deliveries: an in-flight limit and a circuit breaker.

Why: the delivery threads are shared by every subscriber. A receiver that hangs keeps a thread
for a whole read timeout per request, so a backlog for one host used to take every thread while
healthy receivers waited behind it. The gate says, before a request is made, whether its
destination (a webhook's ``scheme://host:port``, or the SMTP relay's ``smtp://host:port``:
all mail goes through it) may take one more. When it may not, the worker puts the
delivery back on the schedule at the time the gate names, counts no attempt, and the thread
is free at once.

- **Limit**: at most ``limit`` requests in flight per destination. A refused delivery is due
  again at its *turn*: refusals are spaced ``duration / limit`` apart (the destination's recent
  attempt duration), so a large backlog is not re-read over and over while it waits.
- **Breaker**: ``failures`` consecutive failed attempts (timeouts, network errors, 408/429/5xx)
  open the circuit for ``cooldown`` seconds, during which nothing is sent there. Then one probe
  goes out (half-open): a success closes the circuit, a failure opens it again.

Pure: the caller passes the clock (``now``); state is per worker process, guarded by a lock.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

BUSY, OPEN = "busy", "open"
OPENED, CLOSED = "opened", "closed"

_FIRST_GUESS = 0.25  # seconds one attempt takes, until one has finished


@dataclass(frozen=True, slots=True)
class Grant:
    """The gate's answer: go (``ok``; ``probe`` when it is the half-open probe), or come back
    at ``retry_at`` because the destination is ``busy`` or its circuit is ``open``."""

    ok: bool
    reason: str = ""
    retry_at: float = 0.0
    probe: bool = False


@dataclass(slots=True)
class _Destination:
    inflight: int = 0
    failures: int = 0  # consecutive failed attempts
    open_until: float = 0.0  # > 0: the circuit is open until then, half-open after
    probing: bool = False
    duration: float | None = None  # moving average of attempt durations
    next_turn: float = 0.0  # when the last refused delivery was told to come back

    def idle(self, now: float) -> bool:
        return not (self.inflight or self.failures or self.open_until or self.next_turn > now)


class DestinationGate:
    """Admission per destination; ``failures`` = 0 turns the breaker off."""

    def __init__(
        self,
        limit: int,
        failures: int = 5,
        cooldown: float = 30.0,
        *,
        max_defer: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.limit = max(limit, 1)
        self.failures = failures
        self.cooldown = cooldown
        self.max_defer = max_defer
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._dests: dict[str, _Destination] = {}

    def acquire(self, dest: str, now: float) -> Grant:
        """May one more request go to ``dest`` now? A granted request must be `release`d."""
        with self._lock:
            d = self._dests.setdefault(dest, _Destination())
            if d.open_until:
                if now < d.open_until:  # spread the comeback so the probe is not a stampede
                    jitter = self._rng.uniform(0, 0.1 * self.cooldown)
                    return Grant(False, OPEN, d.open_until + jitter)
                if d.probing:
                    return Grant(False, OPEN, self._turn(d, now, 1))
                d.probing = True
                d.inflight += 1
                return Grant(True, probe=True)
            if d.inflight >= self.limit:
                return Grant(False, BUSY, self._turn(d, now, self.limit))
            d.inflight += 1
            return Grant(True)

    def release(
        self, dest: str, grant: Grant, now: float, elapsed: float, failed: bool
    ) -> str | None:
        """Record how a granted request went; returns `OPENED` or `CLOSED` on a transition."""
        with self._lock:
            d = self._dests.setdefault(dest, _Destination())
            d.inflight = max(d.inflight - 1, 0)
            d.duration = elapsed if d.duration is None else 0.7 * d.duration + 0.3 * elapsed
            change = None
            if failed:
                d.failures += 1
                if grant.probe or (
                    self.failures and not d.open_until and d.failures >= self.failures
                ):
                    d.open_until = now + self.cooldown
                    d.probing = False
                    change = OPENED
            else:
                d.failures = 0
                if d.open_until:  # any answer proves the destination alive again
                    d.open_until, d.probing = 0.0, False
                    change = CLOSED
            if d.idle(now):
                del self._dests[dest]  # keep the map to the destinations that need it
            return change

    def open_count(self) -> int:
        """Destinations whose circuit is open or half-open."""
        with self._lock:
            return sum(1 for d in self._dests.values() if d.open_until)

    def _turn(self, d: _Destination, now: float, slots: int) -> float:
        """The next free turn: refusals are spaced by the time one of ``slots`` frees up."""
        gap = max(d.duration or _FIRST_GUESS, 0.01) / slots
        d.next_turn = min(max(now, d.next_turn) + gap, now + self.max_defer)
        return d.next_turn
