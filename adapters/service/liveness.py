"""Liveness of the engine worker: its heartbeat in ``ens:engine:status`` (which renews the
lease, and which `/healthz`, `/metrics` and the ingest backlog bound read), with the worker's
stats, and the periodic summary line of the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from adapters.service import redis_store as rs
from adapters.service.engine_state import LiveEngine, Progress, WorkerConfig
from adapters.service.intake import Intake
from adapters.service.lease import EngineLease

log = logging.getLogger("ens.service.worker")


class Liveness:
    """The heartbeat and status part of `EngineWorker`: `heartbeat` and `status` each step,
    `lag`. ``stats`` is the worker's (`EngineWorker.stats`): what every part reports."""

    def __init__(
        self,
        r: redis.Redis,
        cfg: WorkerConfig,
        lease: EngineLease,
        live: LiveEngine,
        intake: Intake,
        progress: Progress,
        stats: Callable[[], dict[str, Any]],
    ) -> None:
        self.r = r
        self.cfg = cfg
        self.lease = lease
        self.live = live
        self.intake = intake
        self.progress = progress
        self.stats = stats
        self.reset()

    def reset(self) -> None:
        self.skewed: list[str] = []  # gateways whose clocks run ahead (logged when they start)
        self.last_heartbeat = 0.0
        self.last_status = time.monotonic()

    def heartbeat(self, force: bool = False) -> None:
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
                "holder": self.lease.holder,
                "stats": rs.dumps(stats),
                "read": self.progress.totals["read"],
                "buffered": len(self.intake.buffer),
            },
        )
        self.last_heartbeat = self.lease.last_renew = now

    def lag(self) -> float:
        """Age (s) of the oldest event not yet fed: unread ingest entries or the buffer."""
        now = time.time()
        ages = [now - h.wall for h in self.intake.buffer]
        nxt = self.r.xrange(rs.INGEST, min=f"({self.intake.last_id}", count=1)
        if nxt:
            ages.append(now - rs.stream_ms(rs.text(nxt[0][0])))
        return max(max(ages, default=0.0), 0.0)

    def status(self) -> None:
        now = time.monotonic()
        if now - self.last_status < self.cfg.status_interval:
            return
        iv = self.progress.interval
        buffered = len(self.intake.buffer)
        if iv["events"] or iv["notifications"] or buffered:
            st = self.live.engine.stats()
            log.info(
                "worker: %d events (%d late), %d notifications, lag %.1f s, "
                "%d partial matches, %d buffered",
                iv["events"],
                iv["late"],
                iv["notifications"],
                self.lag(),
                st["partial_matches"],
                buffered,
            )
        self.progress.interval = {"events": 0, "late": 0, "notifications": 0}
        self.last_status = now
