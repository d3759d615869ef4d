"""Time values shared by schedules, routes and escalation: zones, durations, local times.

Zones and weekly windows are notifiers.alarms' (one implementation for silences and routes);
this only turns their errors into `RoutingError` with the field's path.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from notifiers.alarms.intervals import WeeklyWindow, zone
from notifiers.errors import SilenceError
from notifiers.routing.errors import Loc, RoutingError
from profiles.parser import parse_duration

_WEEKS = re.compile(r"\s*(\d+)\s*w\s*")


def message_of(e: SilenceError) -> str:
    """A silence error's message without its "silence FIELD: " (the caller names the field)."""
    prefix = f"silence {e.field}: "
    text = str(e)
    return text[len(prefix) :] if text.startswith(prefix) else text


def tz(name: Any, loc: Loc) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise RoutingError(f"{name!r}: expected a time zone name (e.g. Europe/Berlin, UTC)", loc)
    try:
        return zone(name.strip())
    except SilenceError as e:
        raise RoutingError(message_of(e), loc) from None


def duration(value: Any, loc: Loc) -> float:
    """Seconds from ``30s``, ``10m``, ``12h``, ``1d``, ``2w`` (or a bare number of seconds)."""
    if isinstance(value, bool):
        raise RoutingError(f"{value!r}: expected a duration (30s, 10m, 12h, 1d, 1w)", loc)
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    m = _WEEKS.fullmatch(text)
    if m is not None:
        return int(m.group(1)) * 7 * 86400.0
    try:
        return parse_duration(text)
    except ValueError as e:
        raise RoutingError(f"{e} (or 1w for a week)", loc) from None


def windows(value: Any, tzname: str, loc: Loc) -> tuple[WeeklyWindow, ...]:
    """Weekly windows (``Mon-Fri 07:00-19:00``), one string or a list, in zone ``tzname``."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise RoutingError("expected a weekly window or a list (e.g. 'Mon-Fri 07:00-19:00')", loc)
    out = []
    for i, w in enumerate(items):
        try:
            out.append(WeeklyWindow.parse(str(w), tzname, "window"))
        except SilenceError as e:
            raise RoutingError(message_of(e), (*loc, i) if len(items) > 1 else loc) from None
    return tuple(out)


def nonexistent(naive: datetime, z: ZoneInfo) -> bool:
    """A local time that the zone skips (the hour a DST change jumps over)."""
    back = naive.replace(tzinfo=z).astimezone(UTC).astimezone(z).replace(tzinfo=None)
    return back != naive


def local_time(value: Any, z: ZoneInfo, loc: Loc) -> float:
    """Epoch seconds from a time with an offset, or a local one (a date: its midnight) in ``z``."""
    if isinstance(value, bool):
        raise RoutingError(f"{value!r}: expected a time (2026-11-30T18:00, RFC 3339)", loc)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day)
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise RoutingError(
                f"{value!r}: expected a time (2026-11-30T18:00, RFC 3339 or a date)", loc
            ) from None
    if dt.tzinfo is not None:
        return dt.timestamp()
    if nonexistent(dt, z):
        raise RoutingError(f"{dt:%Y-%m-%d %H:%M} does not exist in {z.key} (a DST gap)", loc)
    return dt.replace(tzinfo=z).timestamp()


def names(value: Any, loc: Loc, what: str = "receivers") -> tuple[str, ...]:
    """A non-empty list of non-empty names (one string is a list of one)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise RoutingError(f"give at least one of the {what} (a name or a list of names)", loc)
    out = []
    for i, n in enumerate(items):
        if not isinstance(n, (str, int)) or isinstance(n, bool) or str(n).strip() == "":
            raise RoutingError(f"{n!r}: expected a name", (*loc, i))
        out.append(str(n).strip())
    return tuple(out)


def mapping(value: Any, loc: Loc, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RoutingError(f"expected a mapping (keys: {', '.join(allowed)})", loc)
    for key in value:
        if key not in allowed:
            raise RoutingError(f"unknown key (allowed: {', '.join(allowed)})", (*loc, str(key)))
    return value
