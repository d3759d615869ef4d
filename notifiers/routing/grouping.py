"""Grouping per subscriber in the routing file: issue 35's `group_by`, `group_wait`,
`group_interval` and cap, one entry per subscriber (``subscriber: "*"``: everyone without one).

```yaml
grouping:
  - subscriber: night-crew
    group_by: [building]      # [] : all of its notices in one group; omitted: each alone
    group_wait: 30s
    group_interval: 5m
    cap_per_hour: 20          # omitted: no cap
```
"""

from __future__ import annotations

from typing import Any

import notifiers.routing.times as times
from notifiers.alarms.grouping import GroupPolicy
from notifiers.routing.errors import RoutingError

GROUPING_KEYS = ("subscriber", "group_by", "group_wait", "group_interval", "cap_per_hour")
DEFAULT = GroupPolicy()


def parse_grouping(data: Any) -> tuple[str, GroupPolicy]:
    """(subscriber, its policy) of one entry; RoutingError names the key."""
    d = times.mapping(data, (), GROUPING_KEYS)
    if "subscriber" not in d:
        raise RoutingError("give the subscriber (or '*' for everyone else)", ())
    who = times.names(d["subscriber"], ("subscriber",), "subscriber")
    if len(who) != 1:
        raise RoutingError("one subscriber per entry", ("subscriber",))
    group_by: tuple[str, ...] | None = None
    if d.get("group_by") is not None:
        raw = d["group_by"]
        raw = [raw] if isinstance(raw, str) else raw
        if not isinstance(raw, list):
            raise RoutingError("expected a list of labels (e.g. [building])", ("group_by",))
        group_by = times.names(raw, ("group_by",), "labels") if raw else ()
    wait = times.duration(d.get("group_wait", DEFAULT.group_wait), ("group_wait",))
    interval = times.duration(d.get("group_interval", DEFAULT.group_interval), ("group_interval",))
    for key, v in (("group_wait", wait), ("group_interval", interval)):
        if v < 0:
            raise RoutingError("a duration is not negative", (key,))
    cap = d.get("cap_per_hour")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise RoutingError(f"{cap!r}: expected a whole number >= 1", ("cap_per_hour",))
    return who[0], GroupPolicy(group_by, wait, interval, cap)
