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
from typing import Any

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.engine_state import EngineState
from adapters.service.records import op_profile
from notifiers import schedule_store
from notifiers.routing import RoutingError
from profiles.alarm import CLEAR_SUFFIX
from profiles.errors import ProfileError

log = logging.getLogger("ens.service.worker")


class Control(EngineState):
    """The control part of `EngineWorker`: what the engine matches, and the gateways' lateness."""

    def _reconcile(self, why: str = "made while the engine was down", move: bool = True) -> bool:
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
        for pid in list(self.defs):
            if pid not in want and CLEAR_SUFFIX not in pid:  # a companion goes with its profile
                self._apply(pid, None, quiet)
                changed += 1
        for p in stored:
            changed += self._apply(p["id"], p, quiet)
        if changed:
            log.info(
                "profiles: %d active after %d change(s) %s",
                len(self.defs),
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
        if self._set_def(pid, expr, sub, quiet, alarm):
            self._input(op_profile(pid, expr, sub, alarm))
            self.changed = True
            return True
        return False

    def _set_def(
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
        have = self.defs.get(pid)
        if expr is None:
            if have is None:
                return False
            self._remove(pid)
            self._set_alarm(pid, None, None)
            del self.defs[pid]
            self.dirty.add(pid)
            log.log(level, "profile %s removed", pid)
            return True
        same_alarm = self.alarm_specs.get(pid) == alarm
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
            self._remove(pid)
        self.engine.add_profile(profile)
        self.defs[pid] = profile
        self.dirty.add(pid)
        self._set_alarm(pid, profile, alarm)
        log.log(level, "profile %s %s: %s", pid, "replaced" if have else "added", expr.strip())
        return True

    def _remove(self, pid: str) -> None:
        try:
            self.engine.remove_profile(pid)
        except KeyError:  # a `once` profile that fired has removed itself
            pass

    def _gateways(self, name: str | None = None) -> None:
        """Take the gateways' own latenesses from ``ens:gateways`` (one, or all)."""
        for gw, lateness in rs.gateway_lateness(self.r, name).items():
            src = self.wm.sources.get(gw)
            if (src.lateness if src is not None else None) != lateness:
                log.info(
                    "gateway %s: lateness %s",
                    gw,
                    "default" if lateness is None else f"{lateness:g} s",
                )
            self.wm.set_lateness(gw, lateness)

    def _schedules(self) -> None:
        """Give the router (``--routing``) the stored schedules as they are now; one that
        cannot be read is left out (logged), the others apply."""
        if self.router is None:
            return
        stored = {}
        raw: Any = self.r.hgetall(schedule_store.SCHEDULES)
        for k in sorted(raw):
            sid = rs.text(k)
            try:
                stored[sid] = schedule_store.decode(sid, raw[k])
            except RoutingError as exc:
                log.error("ignoring a stored schedule: %s", exc)
        shadowed = self.router.use_schedules(stored)
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

    def _control(self) -> None:
        resp: Any = self.r.xread({rs.CONTROL: self.control_id}, count=100)
        for eid, fields in resp[0][1] if resp else []:
            if fields.get(b"op") == b"assets":  # the registry's fault profiles: all at once
                self.control_id = rs.text(eid)
                self._reconcile("by an asset registry change", move=False)
                self.changed = True
                continue
            pid = rs.text(fields.get(b"id", b""))
            if pid:
                self._apply(pid, rs.get_profile(self.r, pid))
            gw = rs.text(fields.get(b"gw", b""))
            if gw:  # a gateway's lateness changed: only release decisions (journalled) change
                self._gateways(gw)
            if fields.get(b"op") == b"schedules":
                self._schedules()
            self.control_id = rs.text(eid)
            self.changed = True
        self._alarm_control()
