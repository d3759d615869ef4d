"""`localtime` and `weekday` (docs/language.md §2.1): the names, their literals and their keys.

They are not event attributes: the engine derives them from each event's `ts` in a time zone
and puts them into the attributes it matches under a reserved key, so the primitive pool
indexes `localtime between "22:00" and "06:00"` like any other predicate (an interval of
seconds of the local day). The parser turns the names into those keys: `KEY_LOCALTIME` and
`KEY_WEEKDAY` for the engine's zone (the service's or replay's ``--tz``), or the same keys
followed by a zone name when the profile file says ``tz:``. A key starts with NUL, which no
attribute name of the language has, so an event attribute called `localtime` is shadowed
(never read by a profile) rather than overwritten, and the keys can be left out of what a
notification shows (`visible`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

LOCALTIME = "localtime"
WEEKDAY = "weekday"
NAMES = frozenset({LOCALTIME, WEEKDAY})
DAYS: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # date.weekday() order

MARK = "\x00"  # first character of every derived key
KEY_LOCALTIME = MARK + LOCALTIME
KEY_WEEKDAY = MARK + WEEKDAY

LOCALTIME_OPS = frozenset({"=", "!=", "<", "<=", ">", ">="})
WEEKDAY_OPS = frozenset({"=", "!="})

_TIME = re.compile(r"([01]\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")


def key(name: str, tz: str | None) -> str:
    """The reserved attribute key of `name` (localtime or weekday) in zone `tz` (None: the
    engine's zone)."""
    return MARK + name if tz is None else f"{MARK}{name}{MARK}{tz}"


def split_key(attr: str) -> tuple[str, str | None] | None:
    """(name, zone or None) of a derived key; None for an ordinary attribute."""
    if not attr.startswith(MARK):
        return None
    name, _, tz = attr[1:].partition(MARK)
    return name, (tz or None)


def shown(attr: str) -> str:
    """How a key is written in a profile (`localtime`, `weekday`), for messages."""
    parts = split_key(attr)
    return parts[0] if parts is not None else attr


def seconds(text: Any) -> int | None:
    """Seconds of the day of a ``"HH:MM"`` or ``"HH:MM:SS"`` literal; None if it is not one."""
    if not isinstance(text, str):
        return None
    m = _TIME.fullmatch(text)
    if m is None:
        return None
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3) or 0)


def day(text: Any) -> str | None:
    """The day name of a weekday literal (``"sat"``, case-insensitive); None if it is not one."""
    if isinstance(text, str) and text.lower() in DAYS:
        return text.lower()
    return None


def zones(attrs: Iterable[str]) -> set[str | None]:
    """The zones (None: the engine's) whose derived keys appear among `attrs`."""
    out: set[str | None] = set()
    for a in attrs:
        parts = split_key(a)
        if parts is not None:
            out.add(parts[1])
    return out


def visible(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """`attrs` without the derived keys (what the event carried)."""
    return {k: v for k, v in attrs.items() if not k.startswith(MARK)}
