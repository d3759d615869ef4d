"""Liveness of the engine worker: its heartbeat in ``ens:engine:status`` (which renews the
lease, and which `/healthz`, `/metrics` and the ingest backlog bound read), its stats and the
periodic summary line of the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from adapters.service import redis_store as rs
from adapters.service.engine_state import EngineState

log = logging.getLogger("ens.service.worker")


class Liveness(EngineState):
    """The heartbeat and status part of `EngineWorker`."""

    def stats(self) -> dict[str, Any]:
        now = time.time()
        return {
            **self.engine.stats(),
            "buffered": len(self.buffer),
            "oldest_buffered_age": max((now - h.wall for h in self.buffer), default=0.0),
            "late_by_gateway": dict(self.late_by_gateway),
            "capped_by_profile": {pid: list(n) for pid, n in self.capped.items()},
            "pending_notifications": len(self.pending),
            "engine_time": self.engine.now,
            "last_id": self.last_id,
            "epoch": self.epoch,
            "snapshot_bytes": self.snapshot_bytes,
            "skewed_gateways": self.wm.skewed(now),
            "alarms": self._alarm_gauges(),  # "severity|state" -> alarms
            "escalations": len(self.router.escalator.pending) if self.router else 0,
            **{f"total_{k}": v for k, v in self.totals.items()},
        }

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_heartbeat < self.cfg.heartbeat_interval:
            return
        self.lease.renew()
        stats = self.stats()
        skewed = stats["skewed_gateways"]
        for gw in set(skewed) - set(self.skewed):
            log.warning(
                "gateway %s sends events stamped more than %g s ahead of this clock: "
                "they wait for the wall clock (check its clock)",
                gw,
                self.cfg.max_skew,
            )
        self.skewed = skewed
        # `read` and `buffered` apart: the ingest script reads them for --max-backlog
        self.r.hset(
            rs.ENGINE_STATUS,
            mapping={
                "ts": repr(time.time()),
                "holder": self.holder,
                "stats": rs.dumps(stats),
                "read": self.totals["read"],
                "buffered": len(self.buffer),
            },
        )
        self.last_heartbeat = self.lease.last_renew = now

    def lag(self) -> float:
        """Age (s) of the oldest event not yet fed: unread ingest entries or the buffer."""
        now = time.time()
        ages = [now - h.wall for h in self.buffer]
        nxt = self.r.xrange(rs.INGEST, min=f"({self.last_id}", count=1)
        if nxt:
            ages.append(now - rs.stream_ms(rs.text(nxt[0][0])))
        return max(max(ages, default=0.0), 0.0)

    def _status(self) -> None:
        now = time.monotonic()
        if now - self.last_status < self.cfg.status_interval:
            return
        iv = self._interval
        if iv["events"] or iv["notifications"] or self.buffer:
            st = self.engine.stats()
            log.info(
                "worker: %d events (%d late), %d notifications, lag %.1f s, "
                "%d partial matches, %d buffered",
                iv["events"],
                iv["late"],
                iv["notifications"],
                self.lag(),
                st["partial_matches"],
                len(self.buffer),
            )
        self._interval = {"events": 0, "late": 0, "notifications": 0}
        self.last_status = now
