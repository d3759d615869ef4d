"""What a restore leaves out: the state of profiles that no longer exist.

A snapshot whose profiles are stored apart (the service, Spark) refers to them by id. A profile
removed between the snapshot and the restore is not supplied: its references load as
`filters.state.Unresolved`, and its runtime, with its partial matches, partitions and timers,
is left out here, before the engine rebuilds its primitive pool from the rest. So are the timers
of runtimes no longer active (removed, replaced or `once` and reported before the snapshot):
snapshots written before they were left out of snapshots (`filters.temporal.inert`) hold such
no-op timers, and they may refer to a removed profile, or to an id since given to another
profile. Skipping both is always right: neither can produce a notification.

The core is pure: what was left out is returned (`Skipped`); the caller logs and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from filters.temporal import TIMER, Handle
from profiles.ast import Profile


@dataclass
class Skipped:
    """State a restore left out.

    `removed`: profile id (not supplied) -> what of it was left out ("partial_matches",
    "partitions", "timers"); `inactive`: profile id -> no-op timers of runtimes no longer
    active (snapshots written before those were left out).
    """

    removed: dict[str, dict[str, int]] = field(default_factory=dict)
    inactive: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.removed or self.inactive)

    def describe(self) -> str:
        """One line for a log: what was left out, by profile."""
        parts = []
        for pid, counts in sorted(self.removed.items()):
            what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items() if n)
            parts.append(f"removed profile {pid!r} ({what or 'no state'})")
        for pid, n in sorted(self.inactive.items()):
            parts.append(f"{n} no-op timer(s) of a former runtime of {pid!r}")
        return "; ".join(parts)


def leave_out_gone(state: dict[str, Any]) -> Skipped:
    """Drop from an engine's stored state (`Engine.__setstate__`, before the pool is rebuilt)
    the runtimes whose profile was not supplied and every timer not owned by a kept runtime."""
    skipped = Skipped()
    rts: dict[int, Any] = state["_rts"]
    for idx, rt in list(rts.items()):
        if not isinstance(rt.profile, Profile):  # an `Unresolved`: removed since
            pms, parts = rt.live()
            skipped.removed[rt.profile.id] = {
                "partial_matches": pms,
                "partitions": parts,
                "timers": 0,
            }
            del rts[idx]
    fresh = state.get("_fresh", ())
    kept_fresh = [(idx, p) for idx, p in fresh if isinstance(p, Profile)]
    for _, p in fresh:
        if not isinstance(p, Profile):
            skipped.removed.setdefault(p.id, {"partial_matches": 0, "partitions": 0, "timers": 0})
    if len(kept_fresh) != len(fresh):
        state["_fresh"] = kept_fresh
    owners = {id(rt) for rt in rts.values()}

    def gone(h: Handle) -> bool:
        return h[1] == TIMER and id(h[3][0]) not in owners

    for h in state["timers"].drop_where(gone):
        rt = h[3][0]
        pid = rt.profile.id
        if isinstance(rt.profile, Profile):
            skipped.inactive[pid] = skipped.inactive.get(pid, 0) + 1
        else:
            counts = skipped.removed.setdefault(
                pid, {"partial_matches": 0, "partitions": 0, "timers": 0}
            )
            counts["timers"] += 1
    if skipped.removed:
        _forget_runtimes(state, {idx for idx in _indices(state) if idx not in rts}, skipped)
    return skipped


def _indices(state: dict[str, Any]) -> set[int]:
    """Every runtime index the per-runtime tables of the state mention."""
    out: set[int] = set(state.get("_counted", {}))
    out.update(k[0] for k in state.get("_counts", {}))
    for users in state.get("_clock_users", {}).values():
        out.update(users)
    return out


def _forget_runtimes(state: dict[str, Any], dropped: set[int], skipped: Skipped) -> None:
    """The left-out runtimes' entries in the clock, re-planning and counting tables."""
    fresh = {idx for idx, _ in state.get("_fresh", ())}
    dropped -= fresh
    clocks = state.get("_clocks", {})
    for clock, users in list(state.get("_clock_users", {}).items()):
        for idx in dropped & set(users):
            del users[idx]
        if not users:
            del state["_clock_users"][clock]
            state["timers"].discard(clocks.pop(clock, None))
    counts = state.get("_counts")
    if counts:
        for key in [k for k in counts if k[0] in dropped]:
            del counts[key]
    counted = state.get("_counted")
    if counted:
        for idx in dropped:
            counted.pop(idx, None)
    online = state.get("_online")
    if online:
        for pid in skipped.removed:
            online.pop(pid, None)
