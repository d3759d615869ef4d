"""Event time of `ens spark stream`: the service's per-gateway watermark, computed by the driver.

The source's tasks report each gateway's progress (newest ts, wall time of its last entry:
`adapters.service.watermarks.Watermarks.progress`); the status sink merges it into
``ens:spark:gateways`` (`merge_progress`) and the driver computes the next batch's watermark
from it in `latestOffset` (`offset_watermark`), carried in the offset (checkpointed, so
re-executions agree). The rule is the service's, `Watermarks.bound`, in whole milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from adapters.service.watermarks import Watermarks, whole

GATEWAYS = "ens:spark:gateways"  # gateway -> [newest ts, wall time of its last entry] (JSON)
PER_SECOND = 1000  # Spark's watermark is in whole ms


def _at(now: float | None) -> float:
    return -math.inf if now is None else now  # None: every gateway is active


def offset_watermark(
    progress: Mapping[str, Sequence[float]],
    lateness: Mapping[str, float | None],
    default: float,
    idle: float,
    now: float | None,
    wall_now: float | None = None,
) -> float | None:
    """A micro-batch's watermark: the service's (`Watermarks.bound`) over the gateways'
    progress as of `now` (None: every gateway active), in whole ms; with ``--clock wall``
    (`wall_now`), at least the wall clock minus the largest active lateness. None before any
    event (and no wall clock)."""
    w = Watermarks.from_progress(progress, lateness, default, idle)
    floor = -math.inf if wall_now is None else wall_now - w.max_active_lateness(_at(now))
    wm = w.bound(_at(now), floor, PER_SECOND)
    return None if wm == -math.inf else wm


def gateway_watermark(
    progress: Mapping[str, Sequence[float]],
    lateness: Mapping[str, float | None],
    default: float,
    idle: float,
    now: float | None,
) -> tuple[float | None, float]:
    """The service's watermark (`Watermarks.watermark`) over gateway progress, and the largest
    lateness of the active gateways, at least `default` (the wall clock's lag); when every
    gateway is idle, the newest ts of all instead of +inf. (None, default) before any event."""
    if not progress:
        return None, default
    w = Watermarks.from_progress(progress, lateness, default, idle)
    wm = w.watermark(_at(now))
    if wm == math.inf:
        wm = max(ts for ts, _wall in progress.values())
    return wm, w.max_active_lateness(_at(now))


def whole_ms(wm: float | None, newest: float | None) -> float | None:
    """The watermark as a whole millisecond (`adapters.service.watermarks.whole`): rounded
    down, or up when it is the newest ``ts`` of all."""
    if wm is None:
        return None
    return whole(wm, -math.inf if newest is None else newest, PER_SECOND)


def merge_progress(
    old: Mapping[str, Sequence[float]], new: Mapping[str, Sequence[float]]
) -> dict[str, list[float]]:
    """Gateway progress of two sets of entries together (`Watermarks.observe`: a max per field,
    so re-merging the same batch changes nothing and a re-executed batch may write it again)."""
    w = Watermarks.from_progress(old, {}, 0.0, 0.0)
    for g, (ts, wall) in new.items():
        w.observe(g, ts, wall)
    return w.progress()
