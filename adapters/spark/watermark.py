"""Event time of `ens spark stream`: the gateways' watermark, computed by the driver.

The source's tasks report each gateway's progress (newest ts, wall time of its last entry);
the status sink merges it into ``ens:spark:gateways`` and the driver computes the next batch's
watermark from it in `latestOffset`, carried in the offset (checkpointed: re-executions agree).
"""

from __future__ import annotations

import math

GATEWAYS = "ens:spark:gateways"  # gateway -> [newest ts, wall time of its last entry] (JSON)


def gateway_watermark(
    progress: dict[str, tuple[float, float]],
    lateness: dict[str, float | None],
    default: float,
    idle: float,
    now: float | None,
) -> tuple[float | None, float]:
    """The service's watermark (`adapters.service.watermarks.Watermarks`) over gateway progress.

    The smallest ``newest - lateness`` of the gateways whose last entry is within `idle` s of
    `now` (their own lateness, else `default`); when every gateway is idle, the newest ts of
    all (the worker then releases everything it holds and its engine time is that ts). Also
    the largest lateness of the active gateways, at least `default` (the wall clock's lag).
    Returns (None, default) before any event.
    """
    if not progress:
        return None, default
    lim = -math.inf if now is None else now - idle
    active = [g for g, (_ts, wall) in progress.items() if wall > lim]
    if not active:
        return max(ts for ts, _wall in progress.values()), default
    lat = {g: default if lateness.get(g) is None else float(lateness[g]) for g in active}  # type: ignore[arg-type]
    return min(progress[g][0] - lat[g] for g in active), max(default, *lat.values())


def whole_ms(wm: float | None, newest: float | None) -> float | None:
    """The watermark as a whole millisecond, the unit of Spark's own watermark, through which
    a route invoked by its timeout alone gets it: rounded down, or up when it is the newest
    ``ts`` of all (every gateway idle: everything is released, and an event stamped with
    sub-ms digits must not stay held for the lack of a fraction of a ms)."""
    if wm is None or not math.isfinite(wm):
        return wm
    ms = round(wm * 1000, 3)  # float noise of a value already whole
    up = newest is not None and wm >= newest
    return (math.ceil(ms) if up else math.floor(ms)) / 1000


def merge_progress(
    old: dict[str, list[float]], new: dict[str, list[float]]
) -> dict[str, list[float]]:
    """Gateway progress of two sets of entries together (a max per field: re-merging the same
    batch changes nothing, so a re-executed batch may write it again)."""
    out = dict(old)
    for g, (ts, wall) in new.items():
        o = out.get(g)
        out[g] = [ts, wall] if o is None else [max(o[0], ts), max(o[1], wall)]
    return out
