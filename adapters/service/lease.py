"""The engine lease: ``ens:engine:lock``, so that at most one engine worker runs.

The holder (``name|host|pid|token``) takes the lock with a TTL and renews it by its own
progress (`keepalive`, every third of the TTL), never from a side thread, so a worker that
hangs loses it and a standby takes over. A holder on this host whose process is gone is
replaced at once. Every transaction of the worker WATCHes the lock (`transaction`), so a
worker that lost it never commits over its successor.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from adapters.errors import LockLost
from adapters.service import redis_store as rs

log = logging.getLogger("ens.service.worker")

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_STEAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1
end
return 0
"""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EngineLease:
    """The lock of one engine worker ``name``, with a ``ttl`` (s) renewed while it works."""

    def __init__(self, r: redis.Redis, name: str, ttl: float) -> None:
        self.r = r
        self.ttl = ttl
        self.host = socket.gethostname()
        self.holder = f"{name}|{self.host}|{os.getpid()}|{secrets.token_hex(4)}"
        self._renew = r.register_script(_RENEW)
        self._release = r.register_script(_RELEASE)
        self._steal = r.register_script(_STEAL)
        self.last_renew = time.monotonic()

    def acquire(self, stop: threading.Event | None) -> None:
        ttl = int(self.ttl * 1000)
        waiting = False
        while stop is None or not stop.is_set():
            self.last_renew = time.monotonic()
            if self.r.set(rs.ENGINE_LOCK, self.holder, nx=True, px=ttl):
                return
            cur = rs.text(self.r.get(rs.ENGINE_LOCK))
            if cur == self.holder:  # ours already (restart after a Redis error)
                self.r.pexpire(rs.ENGINE_LOCK, ttl)
                return
            if (
                cur
                and self.stale(cur)
                and self._steal(keys=[rs.ENGINE_LOCK], args=[cur, self.holder, ttl])
            ):
                log.warning("took over the engine lock from dead worker %s", cur)
                return
            if not waiting:
                log.warning("waiting for the engine lock held by %s", cur)
                waiting = True
            time.sleep(0.2) if stop is None else stop.wait(0.2)
        raise LockLost("stopped while waiting for the engine lock")

    def keepalive(self) -> None:
        """Renew the lock lease while working (a long replay or step): every third of its TTL.

        The lease is renewed by the worker's own progress, never by a side thread, so a
        worker that hangs loses it and a standby takes over.
        """
        now = time.monotonic()
        if now - self.last_renew < self.ttl / 3:
            return
        self.renew(now)

    def renew(self, now: float | None = None) -> None:
        """Renew the lease now; LockLost if it expired or another worker holds it."""
        if not self._renew(keys=[rs.ENGINE_LOCK], args=[self.holder, int(self.ttl * 1000)]):
            raise LockLost("the engine lock expired or was taken over")
        self.last_renew = time.monotonic() if now is None else now

    def stale(self, holder: str) -> bool:
        """A holder on this host whose process is gone (``kill -9``): no need to wait the TTL."""
        try:
            _name, host, pid, _tok = holder.split("|")
            return host == self.host and int(pid) != os.getpid() and not _pid_alive(int(pid))
        except ValueError:
            return False

    def release(self) -> None:
        """Give the lock up (only if it is still ours): a standby takes over at once."""
        self._release(keys=[rs.ENGINE_LOCK], args=[self.holder])

    def transaction(self, write: Callable[[Any], None]) -> None:
        """Run ``write(pipe)`` in MULTI/EXEC, only if this worker still holds the lock."""
        with self.r.pipeline(transaction=True) as p:
            try:
                p.watch(rs.ENGINE_LOCK)
                if rs.text(p.get(rs.ENGINE_LOCK)) != self.holder:
                    raise LockLost("the engine lock is held by another worker")
                p.multi()
                write(p)
                p.pexpire(rs.ENGINE_LOCK, int(self.ttl * 1000))
                p.execute()
            except redis.WatchError:
                # redis-py also reports a connection lost under WATCH as a WatchError: whether
                # the transaction ran is unknown, and the lock may well still be ours. A Redis
                # error (here, or from the check) makes run_forever restart from Redis.
                if rs.text(self.r.get(rs.ENGINE_LOCK)) == self.holder:
                    raise redis.ConnectionError(
                        "connection lost during a transaction (outcome unknown)"
                    ) from None
                raise LockLost("the engine lock changed during a transaction") from None
        self.last_renew = time.monotonic()
