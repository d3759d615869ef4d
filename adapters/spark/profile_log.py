"""The driver's profile log (``ens:spark:plog``): the profile set as a log of changes.

The driver appends the changes announced on ``ens:control`` (`ProfileLog.sync`); a
micro-batch's offset names a log entry, so every task of that batch, and any re-execution of
it, sees the same profiles (`adapters.spark.versions.Versions.at` reads them back).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from adapters.service import redis_store as rs

log = logging.getLogger("ens.spark.stream")

PLOG = "ens:spark:plog"  # profile log: {"ctl": control id covered, "d": {pid: [expr, sub] | null}}


class ProfileLog:
    """The driver's side: fold ``ens:control`` into ``ens:spark:plog``; returns the head id."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.reconciled = False

    def defs(self, upto: str = "+") -> dict[str, list[Any]]:
        """The profile definitions (pid -> [expr, sub]) as of log entry `upto`."""
        out: dict[str, list[Any]] = {}
        for _eid, f in self.r.xrange(PLOG, max=upto):
            for pid, d in json.loads(f[b"d"]).items():
                if d is None:
                    out.pop(pid, None)
                else:
                    out[pid] = d
        return out

    def sync(self) -> str:
        """Append what changed since the log's last entry; the first call reconciles in full
        (changes made while no query ran, or trimmed from ``ens:control``)."""
        last = self.r.xrevrange(PLOG, count=1)
        ctl = rs.text(last[0][1][b"ctl"]) if last else "0-0"
        if not self.reconciled:
            head = self.r.xrevrange(rs.CONTROL, count=1)
            top = rs.text(head[0][0]) if head else "0-0"
            have = self.defs() if last else {}
            want = {p["id"]: [p["expr"], p.get("subscriber")] for p in rs.list_profiles(self.r)}
            diff: dict[str, Any] = {pid: d for pid, d in want.items() if have.get(pid) != d}
            diff.update({pid: None for pid in have if pid not in want})
            if diff or not last or rs.parse_id(top) > rs.parse_id(ctl):
                self.r.xadd(
                    PLOG,
                    {
                        "ctl": top if rs.parse_id(top) > rs.parse_id(ctl) else ctl,
                        "d": json.dumps(diff),
                    },
                )
                if diff:
                    log.info(
                        "profiles: %d change(s) since the last run (%d active)",
                        len(diff),
                        len(want),
                    )
            self.reconciled = True
        else:
            entries = self.r.xrange(rs.CONTROL, min=f"({ctl}")
            if entries:
                diff = {}
                for _eid, f in entries:
                    pid = rs.text(f.get(b"id", b""))
                    if pid:
                        rec = rs.get_profile(self.r, pid)
                        diff[pid] = [rec["expr"], rec.get("subscriber")] if rec else None
                self.r.xadd(PLOG, {"ctl": rs.text(entries[-1][0]), "d": json.dumps(diff)})
                for pid, d in diff.items():
                    log.info("profile %s %s", pid, "removed" if d is None else "set")
        last = self.r.xrevrange(PLOG, count=1)
        return rs.text(last[0][0])
