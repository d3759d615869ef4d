"""The attributes events have carried, kept apart from the ingest stream.

A new profile's attributes are checked against them (`profiles.lint`: ``knd = "window"``
draws "no event seen so far has attribute 'knd' (did you mean 'kind'?)"). The ingest stream
cannot answer that for long: each snapshot trims it (every ``--snapshot-interval``), so a typo
was caught right after an event and not half a minute later. The engine worker therefore
keeps ``ens:attrs``, a Redis hash: attribute name -> JSON ``{"seen": wall time last seen,
"count": events that carried it, "values": up to `SAMPLES` recent distinct values, "types":
the JSON types seen}``. Bounded: at most ``limit`` names; past it, those seen longest ago are
dropped.

Cheap on the per-event path: `Sketch.observe` only counts each distinct set of attribute
names (one tuple and one dict update per event, ~0.3 µs of the worker's ~14 µs;
`bench/known_attrs.py`); the names, counts and sample values are worked out and written by
`write`, at most once a second (two round trips).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from profiles.timeofday import MARK

log = logging.getLogger("ens.service.worker")

KEY = "ens:attrs"
LIMIT = 1000  # attribute names kept (the ones seen longest ago are dropped first)
SAMPLES = 5  # distinct recent values kept per attribute
_SHAPES = 4096  # distinct attribute-name sets kept between flushes before they are folded
_TEXT = 60  # characters of a sample string kept


def _type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else type(v).__name__


def _sample(v: Any) -> Any:
    return v[:_TEXT] if isinstance(v, str) else v


class Sketch:
    """What the events read since the last flush carried: per set of attribute names, how
    many events and the last one's attributes (for sample values)."""

    def __init__(self) -> None:
        self.shapes: dict[tuple[str, ...], list[Any]] = {}  # names -> [events, last attrs]
        self.folded: dict[str, dict[str, Any]] = {}  # per name, when shapes overflowed

    def __bool__(self) -> bool:
        return bool(self.shapes or self.folded)

    def observe(self, attrs: dict[str, Any]) -> None:
        """Count one event's attributes (the per-event part: keep it this small)."""
        names = tuple(attrs)
        shape = self.shapes.get(names)
        if shape is not None:
            shape[0] += 1
            shape[1] = attrs
            return
        if len(self.shapes) >= _SHAPES:  # events of ever new shapes: keep memory bounded
            self._fold()
        self.shapes[names] = [1, attrs]

    def _fold(self) -> None:
        for names, (count, attrs) in self.shapes.items():
            for name in names:
                if name.startswith(MARK):  # the engine's own (localtime, weekday), not the event's
                    continue
                rec = self.folded.setdefault(name, {"count": 0, "values": [], "types": []})
                rec["count"] += count
                v = attrs.get(name)
                if v is None:
                    continue
                if (t := _type(v)) not in rec["types"]:
                    rec["types"].append(t)
                s = _sample(v)
                if s not in rec["values"] and len(rec["values"]) < SAMPLES:
                    rec["values"].append(s)
        self.shapes.clear()

    def take(self) -> dict[str, dict[str, Any]]:
        """Per attribute name what was seen since the last take; empties the sketch."""
        self._fold()
        out, self.folded = self.folded, {}
        return out


def merge(old: dict[str, Any] | None, new: dict[str, Any], now: float) -> dict[str, Any]:
    """A stored record updated with what a flush saw (newest sample values first)."""
    old = old or {}
    values = list(new["values"])
    for v in old.get("values", ()):
        if v not in values and len(values) < SAMPLES:
            values.append(v)
    types = list(old.get("types", ()))
    types += [t for t in new["types"] if t not in types]
    return {
        "seen": now,
        "count": int(old.get("count", 0)) + new["count"],
        "values": values,
        "types": types,
    }


def _load(raw: Any) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write(r: redis.Redis, seen: dict[str, dict[str, Any]], now: float, limit: int = LIMIT) -> int:
    """Merge ``seen`` (`Sketch.take`) into ``ens:attrs`` and keep at most ``limit`` names.

    Returns how many names it holds. One writer at a time (the engine worker holding the
    lock), so the read-merge-write needs no transaction.
    """
    if not seen:
        return int(r.hlen(KEY))
    names = sorted(seen)
    old = r.hmget(KEY, names)
    mapping: dict[Any, Any] = {
        n: json.dumps(merge(_load(o), seen[n], now), ensure_ascii=False, separators=(",", ":"))
        for n, o in zip(names, old, strict=True)
    }
    pipe = r.pipeline(transaction=False)
    pipe.hset(KEY, mapping=mapping)
    pipe.hlen(KEY)
    size = int(pipe.execute()[1])
    if size > limit:  # drop those seen longest ago, down to 90% so that this stays rare
        keep = limit - limit // 10
        recs = known(r)
        oldest = sorted(recs, key=lambda n: (recs[n].get("seen", 0.0), n))[: len(recs) - keep]
        if oldest:
            r.hdel(KEY, *oldest)
            log.info("known attributes: %d kept, %d seen longest ago dropped", keep, len(oldest))
        size = len(recs) - len(oldest)
    return size


def known(r: redis.Redis) -> dict[str, dict[str, Any]]:
    """``ens:attrs``: attribute name -> its record (`merge`); a record that does not read
    (written by hand) counts as seen, with nothing known about it."""
    out: dict[str, dict[str, Any]] = {}
    for name, raw in r.hgetall(KEY).items():
        key = name.decode() if isinstance(name, bytes) else str(name)
        out[key] = _load(raw) or {}
    return out
