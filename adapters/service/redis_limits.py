"""Redis' memory limits as the service sees them: the eviction policy and ``maxmemory``.

ENS keeps its whole state in Redis (gateway keys, profiles, the ingest stream and its consumer
group, the journal), so a Redis that *evicts* keys under memory pressure loses accepted events
and the keys without a word (issue 41.4): the service refuses such a Redis unless told
otherwise (``--allow-evicting-redis``), and `/healthz` reports it. A Redis over ``maxmemory``
with ``noeviction`` refuses writes with an ``OOM`` error instead (issue 41.3): the API answers
503 and the engine worker waits until memory frees; `/healthz` reports that too.

The policy comes from ``CONFIG GET maxmemory-policy``; where ``CONFIG`` is disabled or renamed
(managed Redis services do that), from ``INFO memory``'s ``maxmemory_policy`` field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from adapters.errors import EvictingRedis

SAFE_POLICY = "noeviction"
FIX = (
    "run `CONFIG SET maxmemory-policy noeviction` on it (and `CONFIG REWRITE`, or put "
    "`maxmemory-policy noeviction` in its redis.conf), or start ENS with "
    "--allow-evicting-redis (ENS_ALLOW_EVICTING_REDIS=1) to run anyway and be reported unhealthy"
)


@dataclass(frozen=True)
class MemoryState:
    """What ``INFO memory`` says about the limit (bytes; ``maxmemory`` 0: no limit)."""

    used: int
    maxmemory: int
    policy: str
    not_counted: int = 0  # replication/AOF buffers Redis leaves out of the limit (7.0)

    @property
    def over(self) -> bool:
        """Redis refuses writes now (with noeviction) or evicts (with another policy)."""
        return self.maxmemory > 0 and self.used - self.not_counted > self.maxmemory

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> MemoryState:
        """From ``INFO memory`` as redis-py parses it."""
        return cls(
            used=int(info.get("used_memory", 0)),
            maxmemory=int(info.get("maxmemory", 0)),
            policy=str(info.get("maxmemory_policy", "")),
            not_counted=int(info.get("mem_not_counted_for_evict", 0)),
        )

    def describe(self) -> str:
        mb = 1024 * 1024
        return f"used {self.used / mb:.1f} MB of maxmemory {self.maxmemory / mb:.1f} MB"


def memory_state(r: redis.Redis) -> MemoryState:
    """``INFO memory``'s limit fields (a client of either kind)."""
    return MemoryState.from_info(r.info("memory"))


def eviction_policy(r: redis.Redis) -> tuple[str, str | None]:
    """(``maxmemory-policy``, a note when ``CONFIG GET`` could not be used)."""
    try:
        got: dict[Any, Any] = r.config_get("maxmemory-policy")
        value = got.get("maxmemory-policy") or got.get(b"maxmemory-policy")  # either client
        if value:
            return _text(value), None
        note = "CONFIG GET maxmemory-policy returned nothing"
    except redis.ResponseError as exc:  # renamed, disabled, or not allowed for this user
        note = f"CONFIG GET is not available ({exc})"
    policy = memory_state(r).policy
    return policy, f"{note}; read maxmemory_policy from INFO memory instead"


def evicting_message(policy: str) -> str:
    return (
        f"Redis' maxmemory-policy is {policy}: under memory pressure it deletes keys, "
        "and ENS would lose accepted events, gateway keys, profiles and its consumer group"
    )


def check_policy(r: redis.Redis, allow: bool) -> tuple[str, str | None]:
    """The policy, and a warning when it evicts but ``allow`` says run anyway.

    Raises `EvictingRedis` (whose text names the policy and the fix) when it evicts and
    ``allow`` is false. A note about ``CONFIG GET`` comes back as the warning too.
    """
    policy, note = eviction_policy(r)
    if policy == SAFE_POLICY:
        return policy, note
    if not allow:
        raise EvictingRedis(f"{evicting_message(policy)}; {FIX}")
    warning = (
        f"{evicting_message(policy)}; running anyway (--allow-evicting-redis), "
        "reported unhealthy in /healthz and by ens_redis_evicting"
    )
    return policy, f"{warning} ({note})" if note else warning


def is_oom(exc: BaseException) -> bool:
    """A write refused because Redis is over ``maxmemory`` (also inside a script or MULTI)."""
    # redis-py strips the "OOM" code of a plain reply (OutOfMemoryError); a script's error
    # (Redis 6.2) keeps it inside its own text
    text = str(exc)
    return (
        isinstance(exc, redis.exceptions.OutOfMemoryError)
        or "OOM command not allowed" in text
        or "command not allowed when used memory" in text
    )


def store_problem(exc: BaseException, what: str = "ingest store") -> str:
    """What a 503 says about a Redis failure, without the server's internals."""
    text = str(exc)
    if is_oom(exc):
        return f"{what} is full (Redis is over its maxmemory limit); retry later"
    if "MISCONF" in text or "No space left" in text:
        return f"{what} cannot write to its disk (Redis persistence failing); retry later"
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return f"{what} is read-only (a Redis replica); retry later"
    return f"{what} unavailable; retry later"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
