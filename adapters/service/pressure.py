"""Redis' limits as the engine worker meets them (`adapters.service.redis_limits`).

Over ``maxmemory`` Redis refuses every MULTI/EXEC and every memory-growing command with an
``OOM`` error, before running any of it: a refused commit or snapshot did not happen, so the
worker keeps its state (no restart from the snapshot, which would redo the same work and fail
the same way), waits with a growing backoff and tries again; it logs the condition once, then
once per `WorkerConfig.oom_log_every`, and once more when Redis takes writes again. /healthz
reads Redis' memory itself, since the worker cannot write its heartbeat meanwhile.

At each (re)start the worker checks Redis' ``maxmemory-policy`` again: a Redis restarted with
another configuration is found at the reconnect. An evicting one stops the worker (retried
every few seconds, logged once per ``oom_log_every``) unless ``--allow-evicting-redis``.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from adapters.errors import EvictingRedis
from adapters.service import metrics as m
from adapters.service.engine_state import WorkerConfig
from adapters.service.redis_limits import check_policy, memory_state

log = logging.getLogger("ens.service.worker")

POLICY_RETRY = 5.0  # s between checks of a Redis refused for its eviction policy


class Pressure:
    """The Redis-limits part of `EngineWorker`: `check_policy` at each (re)start, then
    `refused_policy`, `out_of_memory` and `memory_ok` from the loop."""

    def __init__(self, r: redis.Redis, cfg: WorkerConfig) -> None:
        self.r = r
        self.cfg = cfg
        self.oom_since: float | None = None  # monotonic time of the episode's first refusal
        self.oom_refused = 0  # refusals in this episode
        self.oom_logged = 0.0
        self.oom_delay = 0.0
        self.policy_seen: str | None = None  # the last policy checked (logged when it changes)
        self.policy_logged = 0.0

    def check_policy(self) -> None:
        """Redis' eviction policy, at every (re)start: `EvictingRedis` if it evicts and that
        is not allowed; a warning when it changed to an evicting one that is allowed."""
        try:
            policy, warning = check_policy(self.r, self.cfg.allow_evicting_redis)
        except EvictingRedis:
            m.REDIS_EVICTING.set(1)
            raise
        m.REDIS_EVICTING.set(0 if policy == "noeviction" else 1)
        if warning and policy != self.policy_seen:
            log.warning("%s", warning)
        self.policy_seen = policy

    def refused_policy(self, exc: EvictingRedis, stop: threading.Event) -> None:
        """The worker does nothing on an evicting Redis: wait, say why (not every time)."""
        now = time.monotonic()
        if now - self.policy_logged >= self.cfg.oom_log_every:
            log.error("engine worker paused: %s; checking again every %g s", exc, POLICY_RETRY)
            self.policy_logged = now
        self.policy_seen = None
        stop.wait(POLICY_RETRY)

    def out_of_memory(self, exc: redis.RedisError, stop: threading.Event) -> None:
        """A write refused because Redis is over maxmemory: log (throttled), back off."""
        now = time.monotonic()
        m.REDIS_OOM.labels(part="engine").inc()
        self.oom_refused += 1
        first = self.oom_since is None
        if first:
            self.oom_since = now
            self.oom_delay = 0.25
        else:
            self.oom_delay = min(self.oom_delay * 2, self.cfg.oom_backoff_max)
        if first or now - self.oom_logged >= self.cfg.oom_log_every:
            self.oom_logged = now
            try:
                state = f" ({memory_state(self.r).describe()})"
            except redis.RedisError:
                state = ""
            log.error(
                "Redis is over its maxmemory%s: the engine cannot commit%s; %d attempt%s "
                "refused in %.0f s, trying again every %g s at most; raise maxmemory or "
                "free memory (%s)",
                state,
                "" if first else " yet",
                self.oom_refused,
                "" if self.oom_refused == 1 else "s",
                now - (self.oom_since or now),
                self.cfg.oom_backoff_max,
                exc,
            )
        stop.wait(self.oom_delay)

    def memory_ok(self) -> None:
        """A step went through: end an out-of-memory episode (and say so)."""
        if self.oom_since is None:
            return
        log.warning(
            "Redis accepts writes again: the engine resumed after %.1f s over maxmemory "
            "(%d attempts refused)",
            time.monotonic() - self.oom_since,
            self.oom_refused,
        )
        self.oom_since = None
        self.oom_refused = 0
