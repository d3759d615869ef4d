"""Leases of the delivery worker: due deliveries and digests are taken from their schedule
(``ens:retry``, ``ens:digests``) by pushing their due time ``lease`` seconds ahead, atomically,
so two workers never take the same one; a side thread renews the leases of the sends in
progress every third of the lease, so a dead worker's deliveries come back within one lease.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from notifiers.config import NotifierConfig
from notifiers.store import (
    DIGESTS,
    RETRY,
    text,
)

log = logging.getLogger("ens.notifiers")

# Take the due members of a schedule zset and push their score to the lease end, atomically,
# so two workers never take the same delivery and a crashed taker's work comes back by itself.
LEASE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], m) end
return due
"""

# Extend leases still held: each member whose score is still the lease end this worker set
# (not re-scheduled or finished meanwhile) gets the new end. ARGV: new end, (member, old end)...
RENEW = """
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


class Leases:
    """The lease part of `DeliveryWorker`: it owns the lease scripts, the leases this worker
    holds and the thread that renews them."""

    def __init__(self, r: redis.Redis, config: NotifierConfig) -> None:
        self.r = r
        self.config = config
        self._lease = r.register_script(LEASE)
        self._renew = r.register_script(RENEW)
        # (schedule, member) -> the lease end this worker set, while its send runs
        self._held: dict[tuple[str, str], float] = {}
        self._held_lock = threading.Lock()
        self._closed = threading.Event()
        self._renewer: threading.Thread | None = None

    def close(self) -> None:
        """Stop renewing: the leases still held run out (`DeliveryWorker.close`)."""
        self._closed.set()

    def lease_due(self, schedule: str, limit: int) -> list[str]:
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

    def done(self, schedule: str, member: str) -> None:
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

    def idle_wait(self) -> float:
        wait = min(self.config.worker.poll, self.next_due() - time.time())
        return max(wait, 0.0)

    def next_due(self) -> float:
        """The earliest due time over the retry and digest schedules (inf if both are empty)."""
        due = float("inf")
        for key in (RETRY, DIGESTS):
            first: Any = self.r.zrange(key, 0, 0, withscores=True)
            if first:
                due = min(due, first[0][1])
        return due
