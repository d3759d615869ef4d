"""Reading ``ens:ingest`` in the source: an entry's events, each parsed; what is unreadable is
logged and recorded in ``ens:spark:invalid`` (the status counts it), never a failed task."""

from __future__ import annotations

import logging
from typing import Any

from adapters.service import redis_store as rs
from profiles.events import Event, event_from_obj

log = logging.getLogger("ens.spark.stream")

INVALID = "ens:spark:invalid"  # event key -> why it was skipped


def decode(eid: str, fields: Any, r: Any | None = None) -> list[tuple[str, str, Any]]:
    """`rs.decode_entry`, with an unreadable entry recorded in ``ens:spark:invalid``."""
    try:
        return rs.decode_entry(eid, fields) if fields else []
    except (TypeError, ValueError) as exc:
        log.error("unreadable ingest entry %s skipped: %s", eid, exc)
        if r is not None:
            r.hset(INVALID, eid, str(exc))
        return []


def parse(key: str, gw: str, obj: Any, r: Any | None = None) -> Event | None:
    """The event of one ingest item, or None (logged, recorded in ``ens:spark:invalid``)."""
    try:
        return event_from_obj(obj, key)
    except (TypeError, ValueError) as exc:
        log.error("unreadable ingest event %s from %s skipped: %s", key, gw, exc)
        if r is not None:
            r.hset(INVALID, key, str(exc))
        return None
