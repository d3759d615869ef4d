"""Enrichment: the API adds an event's asset attributes (point, room, floor, building, tz)
before the event is stored, so the engine, silences and routes see them for sensors that
send only their id (docs/assets.md).

Each API process keeps the registry in memory (`AssetCache`) and reads ``ens:assets:version``
at most every `REFRESH` seconds; when it moved, it reloads ``ens:assets`` (one HGETALL). A
registry change therefore reaches every running API process within about a second, with one
GET per second per process on the ingest path and nothing per event.

Precedence: the event's own attribute, then its sensor's entry (the ``sensor`` attribute),
then its gateway's (the API key's). An event attribute that differs from the registry is a
conflict: counted (``ens_asset_conflicts_total{attribute}``) and logged once per sensor and
process.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from adapters.service import asset_store as ast
from adapters.service import metrics as m
from adapters.service.assets import Asset

log = logging.getLogger("ens.service.api")

REFRESH = 1.0  # s between two reads of the registry's version (per process)
_LOGGED_MAX = 100_000  # sensors whose conflict was logged, remembered per process


class AssetCache:
    """One API process's copy of the registry: per sensor and per gateway, what events gain."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.checked = float("-inf")
        self.sensors: dict[str, dict[str, str]] = {}
        self.gateways: dict[str, dict[str, str]] = {}
        self.logged: set[str] = set()
        self.enriched = 0  # events enriched since the last `count` (one Prometheus call each)

    def load(self, version: int, raw: dict[Any, Any]) -> None:
        """Take the registry ``raw`` (``ens:assets``' fields and values) as of ``version``."""
        sensors: dict[str, dict[str, str]] = {}
        gateways: dict[str, dict[str, str]] = {}
        for value in raw.values():
            rec = json.loads(value)
            attrs = Asset.from_json(rec).attributes()
            if attrs:
                (gateways if rec.get("kind") == "gateway" else sensors)[rec["id"]] = attrs
        self.sensors, self.gateways, self.version = sensors, gateways, version
        log.info(
            "asset registry version %d: %d sensors, %d gateways with attributes",
            version,
            len(sensors),
            len(gateways),
        )

    async def refresh(self, ar: Any) -> None:
        """Reload from Redis (async client ``ar``) if the version moved; at most every REFRESH s."""
        now = time.monotonic()
        if now - self.checked < REFRESH:
            return
        self.checked = now
        v = int(await ar.get(ast.VERSION) or 0)
        if v != self.version:
            # not MULTI: over maxmemory Redis refuses every command queued in a MULTI, reads
            # too, and ingest must answer its own 503. The version read on both sides of the
            # registry (an import bumps it in the transaction that writes it) tells a torn
            # read, which the next refresh reads again.
            async with ar.pipeline(transaction=False) as p:
                p.get(ast.VERSION)
                p.hgetall(ast.ASSETS)
                p.get(ast.VERSION)
                before, raw, after = await p.execute()
            if before == after:
                self.load(int(before or 0), raw)
            else:
                self.checked = float("-inf")

    def __bool__(self) -> bool:
        return bool(self.sensors or self.gateways)

    def enrich(self, attrs: dict[str, Any], gateway: str) -> dict[str, Any]:
        """``attrs`` with its asset's attributes added (the event's own win); ``attrs`` itself
        when no asset applies."""
        sid = attrs.get(ast.SENSOR_ATTR)
        add = (
            self.sensors.get(sid if isinstance(sid, str) else str(sid)) if sid is not None else None
        )
        gw = self.gateways.get(gateway)
        if gw is not None:
            add = gw if add is None else {**gw, **add}
        if add is None:
            return attrs
        self.enriched += 1
        for k, v in add.items():
            own = attrs.get(k)
            if own is not None and own != v:
                self._conflict(str(sid) if sid is not None else f"gateway {gateway}", k, own, v)
        return {**add, **attrs}

    def count(self) -> None:
        """Add the events enriched since the last call to ``ens_events_enriched_total`` (once
        per request: a Prometheus increment costs as much as an enrichment)."""
        if self.enriched:
            m.EVENTS_ENRICHED.inc(self.enriched)
            self.enriched = 0

    def _conflict(self, who: str, attr: str, own: Any, registered: str) -> None:
        m.ASSET_CONFLICTS.labels(attribute=attr).inc()
        if who in self.logged or len(self.logged) >= _LOGGED_MAX:
            return
        self.logged.add(who)
        log.warning(
            "asset %s: event attribute %s=%r differs from the registry's %r (the event's value "
            "is kept; counted in ens_asset_conflicts_total, logged once per sensor)",
            who,
            attr,
            own,
            registered,
        )
