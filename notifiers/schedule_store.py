"""On-call schedules kept in Redis, so that the service (and `ens schedule who`) can use them.

``ens:schedules`` is a hash: schedule id -> its definition as JSON
(`notifiers.routing.schedules.schedule_to_json`), validated before it is stored and read back
with the same rules. Each change also appends ``{"op": "schedules"}`` to the engine worker's
control stream in the same transaction, so a running `ens serve --routing` resolves receivers
with the new definitions without a restart (as profile changes reach it). Nothing here
touches the alarm state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal, cast

import redis

from notifiers.routing import RoutingError, Schedule, parse_schedule
from notifiers.routing.schedules import schedule_to_json

SCHEDULES = "ens:schedules"
# the engine worker's control stream (adapters.service.redis_store.CONTROL, CONTROL_MAXLEN)
CONTROL = "ens:control"
CONTROL_MAXLEN = 10_000
Change = Literal["added", "replaced", "unchanged"]
# the command's client decodes replies; a bytes client works too


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode(sid: str, raw: bytes | str) -> Schedule:
    try:
        return parse_schedule(json.loads(_text(raw)))
    except (ValueError, RoutingError) as e:  # written by another version, or by hand
        raise RoutingError(f"stored schedule {sid!r} cannot be read: {e}") from None


def put_schedules(
    r: redis.Redis, items: Iterable[Schedule], replace: bool = False
) -> list[tuple[str, Change]]:
    """Store the schedules, all or none: one that exists with another definition needs
    ``replace`` (else `RoutingError`, nothing stored)."""
    wanted = {s.id: json.dumps(schedule_to_json(s), sort_keys=True) for s in items}
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(SCHEDULES)
                current = {k: pipe.hget(SCHEDULES, k) for k in wanted}
                changes: list[tuple[str, Change]] = []
                for sid, text in wanted.items():
                    old = current[sid]
                    if old is None:
                        changes.append((sid, "added"))
                    elif _text(old) == text:
                        changes.append((sid, "unchanged"))
                    elif not replace:
                        raise RoutingError(
                            f"schedule {sid!r} exists with another definition "
                            "(--replace to replace it; nothing was stored)"
                        )
                    else:
                        changes.append((sid, "replaced"))
                pipe.multi()
                if wanted:
                    pipe.hset(SCHEDULES, mapping=cast(dict[Any, Any], wanted))
                if any(change != "unchanged" for _, change in changes):
                    _announce(pipe)
                pipe.execute()
                return changes
            except redis.WatchError:
                continue


def _announce(pipe: Any) -> None:
    pipe.xadd(CONTROL, {"op": "schedules"}, maxlen=CONTROL_MAXLEN, approximate=True)


def schedule_ids(r: redis.Redis) -> list[str]:
    """The ids of the stored schedules (what `ens serve --routing` may name as receivers)."""
    return sorted(_text(k) for k in r.hkeys(SCHEDULES))


def get_schedule(r: redis.Redis, sid: str) -> Schedule | None:
    raw = r.hget(SCHEDULES, sid)
    return None if raw is None else decode(sid, raw)


def all_schedules(r: redis.Redis) -> dict[str, Schedule]:
    raw = {_text(k): v for k, v in r.hgetall(SCHEDULES).items()}
    return {sid: decode(sid, raw[sid]) for sid in sorted(raw)}


def schedule_definition(r: redis.Redis, sid: str) -> dict[str, Any] | None:
    raw = r.hget(SCHEDULES, sid)
    return None if raw is None else dict(json.loads(_text(raw)))


def remove_schedule(r: redis.Redis, sid: str) -> bool:
    with r.pipeline(transaction=True) as p:
        p.hdel(SCHEDULES, sid)
        _announce(p)
        removed, _ = p.execute()
    return bool(removed)
