"""Profile and gateway changes for the engine worker: ``ens:profiles`` reconciled at a start
(changes made while it was down, an `ens spark index` snapshot imported once), and the
control stream followed while it runs. Each change is an input of the journal, so a replay
applies it at the same point.

The stored schedules (``ens:schedules``, `ens schedule add|rm`) are read at a start and again
at each ``schedules`` entry of the stream, for ``--routing``: they are configuration like the
routing file, not journalled (a replay after a crash resolves with those stored then).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.alarm_worker import AlarmPart
from adapters.service.engine_state import InputLog, LiveEngine, Progress, WorkerConfig
from adapters.service.intake import Intake
from adapters.service.records import op_profile
from notifiers import schedule_store
from notifiers.routing import RoutingError
from profiles.alarm import CLEAR_SUFFIX
from profiles.errors import ProfileError

log = logging.getLogger("ens.service.worker")


class Control:
    """The control part of `EngineWorker`: what the engine matches (`reconcile` at a start,
    `poll` each step, `set_def` in a replay), and the gateways' lateness (`gateways`)."""

    def __init__(
        self,
        r: redis.Redis,
        cfg: WorkerConfig,
        live: LiveEngine,
        inputs: InputLog,
        progress: Progress,
        intake: Intake,
        alarms: AlarmPart,
        keepalive: Callable[[], None],
    ) -> None:
        self.r = r
        self.cfg = cfg
        self.live = live
        self.inputs = inputs
        self.progress = progress
        self.intake = intake  # its reorder buffer takes the gateways' lateness
        self.alarms = alarms
        self._keepalive = keepalive
        self.reset()

    def reset(self) -> None:
        self.control_id = "0-0"  # the last entry of ens:control applied
        self._preparsed: dict[str, Any] | None = {}  # index profiles by id, during start only

    def use_index(self) -> None:
        """During a start: the index's profiles are used unparsed (`WorkerConfig.index`);
        None: the index was imported before and is loaded only if a profile needs it."""
        self._preparsed = self._import_index() if self.cfg.index else {}

    def forget_index(self) -> None:
        self._preparsed = {}

    def reconcile(self, why: str = "made while the engine was down", move: bool = True) -> bool:
        """Make the engine's profiles those of ``ens:profiles`` (changes made while down, or
        an asset registry change: its generated profiles, `asset_store`).

        Returns True when many profiles changed (a first start on a large set).
        """
        last = self.r.xrevrange(rs.CONTROL, count=1)
        ctl = rs.text(last[0][0]) if last else "0-0"
        stored = rs.list_profiles(self.r)
        want = {p["id"]: p for p in stored}
        quiet = len(stored) > 100  # one summary line instead of a line per profile
        changed = 0
        for pid in list(self.live.defs):
            if pid not in want and CLEAR_SUFFIX not in pid:  # a companion goes with its profile
                self._apply(pid, None, quiet)
                changed += 1
        for p in stored:
            changed += self._apply(p["id"], p, quiet)
        if changed:
            log.info(
                "profiles: %d active after %d change(s) %s",
                len(self.live.defs),
                changed,
                why,
            )
        if move and rs.parse_id(ctl) > rs.parse_id(self.control_id):
            self.control_id = ctl
        return changed > 100

    def _import_index(self) -> dict[str, Any] | None:
        """Import the index snapshot's profiles missing from ``ens:profiles``, once per snapshot.

        Returns its profiles by id, or None when this very snapshot (same manifest) was
        imported by an earlier start: it is then loaded only if a profile needs it.
        """
        fp = rs.index_fingerprint(self.cfg.index)  # type: ignore[arg-type]
        if self.r.hexists(rs.INDEX_IMPORTED, fp):
            log.info(
                "index %s: imported by an earlier start (manifest %s); not loaded again unless "
                "a profile needs it",
                self.cfg.index,
                fp[:12],
            )
            return None
        profiles = self._load_index()
        imported, kept = rs.import_profiles(self.r, list(profiles.values()))
        self.r.hset(
            rs.INDEX_IMPORTED,
            fp,
            json.dumps(
                {
                    "path": str(self.cfg.index),
                    "profiles": len(profiles),
                    "imported": imported,
                    "at": time.time(),
                }
            ),
        )
        log.info(
            "index %s: %d imported into ens:profiles, %d already there",
            self.cfg.index,
            imported,
            kept,
        )
        return profiles

    def _load_index(self) -> dict[str, Any]:
        if self.cfg.load_index is None:
            raise ValueError("WorkerConfig.index needs WorkerConfig.load_index (its reader)")
        t = time.perf_counter()
        profiles = self.cfg.load_index(self.cfg.index)  # type: ignore[arg-type]
        log.info(
            "index %s: %d profiles loaded in %.1f s",
            self.cfg.index,
            len(profiles),
            time.perf_counter() - t,
        )
        return {p.id: p for p in profiles}

    def _apply(self, pid: str, rec: dict[str, Any] | None, quiet: bool = False) -> bool:
        """Apply the stored definition of one profile (None: deleted), logging the input."""
        expr = rec["expr"] if rec else None
        sub = rec.get("subscriber") if rec else None
        alarm = rec.get("alarm") if rec else None
        self._keepalive()  # a start on many profiles parses for a while
        if self.set_def(pid, expr, sub, quiet, alarm):
            self.inputs.add(op_profile(pid, expr, sub, alarm))
            self.progress.changed = True
            return True
        return False

    def set_def(
        self,
        pid: str,
        expr: str | None,
        sub: str | None,
        quiet: bool = False,
        alarm: dict[str, Any] | None = None,
    ) -> bool:
        """Make `pid` the stored definition (with its `alarm:`); `quiet` logs it at DEBUG
        (bulk starts)."""
        level = logging.DEBUG if quiet else logging.INFO
        live = self.live
        have = live.defs.get(pid)
        if expr is None:
            if have is None:
                return False
            live.remove(pid)
            self.alarms.set_alarm(pid, None, None)
            del live.defs[pid]
            live.dirty.add(pid)
            log.log(level, "profile %s removed", pid)
            return True
        same_alarm = self.alarms.alarm_specs.get(pid) == alarm
        if have is not None and have.source == expr and have.subscriber == sub and same_alarm:
            return False
        if self._preparsed is None:  # an index imported earlier: needed after all
            self._preparsed = self._load_index()
        profile = self._preparsed.pop(pid, None)
        if profile is None or profile.source != expr or profile.subscriber != sub:
            try:  # not from the index (or changed since): parse
                profile = rs.validate_profile(None, pid, expr, sub)
            except ProfileError as exc:  # the API validates; this is a hand-edited hash
                log.error("ignoring invalid stored profile %s: %s", pid, exc)
                return False
        if have is not None:
            live.remove(pid)
        live.engine.add_profile(profile)
        live.defs[pid] = profile
        live.dirty.add(pid)
        self.alarms.set_alarm(pid, profile, alarm)
        log.log(level, "profile %s %s: %s", pid, "replaced" if have else "added", expr.strip())
        return True

    def gateways(self, name: str | None = None) -> None:
        """Take the gateways' own latenesses from ``ens:gateways`` (one, or all)."""
        for gw, lateness in rs.gateway_lateness(self.r, name).items():
            src = self.intake.wm.sources.get(gw)
            if (src.lateness if src is not None else None) != lateness:
                log.info(
                    "gateway %s: lateness %s",
                    gw,
                    "default" if lateness is None else f"{lateness:g} s",
                )
            self.intake.wm.set_lateness(gw, lateness)

    def schedules(self) -> None:
        """Give the router (``--routing``) the stored schedules as they are now; one that
        cannot be read is left out (logged), the others apply."""
        router = self.alarms.router
        if router is None:
            return
        stored = {}
        raw: Any = self.r.hgetall(schedule_store.SCHEDULES)
        for k in sorted(raw):
            sid = rs.text(k)
            try:
                stored[sid] = schedule_store.decode(sid, raw[k])
            except RoutingError as exc:
                log.error("ignoring a stored schedule: %s", exc)
        shadowed = router.use_schedules(stored)
        in_use = [s for s in stored if s not in shadowed]
        log.info(
            "routing: %d stored schedule(s) in use%s",
            len(in_use),
            f" ({', '.join(in_use)})" if in_use else "",
        )
        if shadowed:
            log.warning(
                "routing: the routing file's schedules %s win over the stored ones of the same id",
                ", ".join(shadowed),
            )
        m.ROUTING_SCHEDULE_LOADS.inc()

    def poll(self) -> None:
        """Apply the control stream's changes since the last step; read operator commands."""
        resp: Any = self.r.xread({rs.CONTROL: self.control_id}, count=100)
        for eid, fields in resp[0][1] if resp else []:
            if fields.get(b"op") == b"assets":  # the registry's fault profiles: all at once
                self.control_id = rs.text(eid)
                self.reconcile("by an asset registry change", move=False)
                self.progress.changed = True
                continue
            pid = rs.text(fields.get(b"id", b""))
            if pid:
                self._apply(pid, rs.get_profile(self.r, pid))
            gw = rs.text(fields.get(b"gw", b""))
            if gw:  # a gateway's lateness changed: only release decisions (journalled) change
                self.gateways(gw)
            if fields.get(b"op") == b"schedules":
                self.schedules()
            self.control_id = rs.text(eid)
            self.progress.changed = True
        self.alarms.read_commands()
