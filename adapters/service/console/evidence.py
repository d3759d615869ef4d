"""An alarm's evidence for its detail page: the events of its matches, read from the event
archive (the service keeps only their ids), and `ens explain`'s trace over them.

`ens explain` lives in the `ens` layer, above this one: `ens serve` hands its function over
by setting `EXPLAIN` (as `backtests.RUNNER`). Without the archive (``--archive``) or without
it, the page shows the ids and says how to get the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from profiles.errors import ENSError

log = logging.getLogger("ens.service.console")
LOOKBACK = 3600.0  # s before a transition its match's events are looked for in the archive
MAX_EVENTS = 200  # events of matches shown (the newest transitions' first)

# (profiles, events, profile id, until, echo=...) -> notifications: `ens.explain.explain`
EXPLAIN: Callable[..., int] | None = None


def match_events(uri: str | None, timeline: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Event id -> the archived event (JSON object) for the events the transitions name."""
    wanted = {ev for t in timeline for ev in t.get("events", {}).values()}
    if not uri or not wanted:
        return {}
    from adapters.archive.layout import open_archive
    from adapters.archive.reader import rows, scan

    times = [t["ts"] for t in timeline if t.get("events")]
    start, end = min(times) - LOOKBACK, max(times) + 1.0
    found: dict[str, dict[str, Any]] = {}
    try:
        arc = open_archive(uri)
        sc = scan(arc, start, end)
        for row in rows(arc, sc, start, end, log.warning):
            if row["id"] in wanted and len(found) < MAX_EVENTS:
                found[row["id"]] = {"_row": row, **json.loads(row["event"])}
    except (ENSError, OSError, ValueError) as exc:  # no archive there yet, unreadable
        log.info("console: events of the matches not read from the archive: %s", exc)
    return found


def explain(rec: dict[str, Any], events: list[dict[str, Any]], until: float) -> list[str]:
    """`ens explain`'s lines for the alarm's profile over the events of its matches."""
    if EXPLAIN is None or not events:
        return []
    from adapters.archive.reader import to_event
    from adapters.service import redis_store as rs

    lines: list[str] = []
    try:
        profile = rs.validate_profile(None, rec["id"], rec["expr"], rec.get("subscriber"))
        evs = [to_event(e["_row"]) for e in sorted(events, key=lambda e: e["_row"]["seq"])]
        EXPLAIN([profile], evs, rec["id"], until, echo=lines.append)
    except ENSError as exc:
        lines.append(f"explain: {exc}")
    return lines
