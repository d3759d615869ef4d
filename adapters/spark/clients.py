"""The Redis client of a Spark Python worker: one per URL and process."""

from __future__ import annotations

from typing import Any

_clients: dict[str, Any] = {}


def client(url: str) -> Any:
    """One binary Redis client per URL and process (tasks of a Python worker share it)."""
    import redis

    r = _clients.get(url)
    if r is None:
        r = _clients[url] = redis.Redis.from_url(url)
    return r
