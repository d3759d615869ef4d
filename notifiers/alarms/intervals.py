"""Recurring weekly windows in a named time zone ("Mon-Fri 07:00-09:00", Europe/Berlin).

Local wall time through zoneinfo, so a window keeps its local hours across DST changes.
A window whose end is not after its start wraps midnight ("Mon 22:00-06:00": Monday night
to Tuesday morning). Times are epoch seconds; nothing here reads a clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from notifiers.errors import SilenceError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(
    r"(?P<days>[A-Za-z,\- ]+?)\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})"
)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SilenceError("tz", f"unknown time zone {name!r} (e.g. Europe/Berlin, UTC)") from None


def _minutes(text: str, field: str, *, end: bool) -> int:
    h, m = (int(x) for x in text.split(":"))
    if m > 59 or h > 24 or (h == 24 and (m or not end)):
        raise SilenceError(field, f"bad time {text!r} (HH:MM, 00:00-23:59; 24:00 as an end)")
    return h * 60 + m


def _days(text: str, field: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.replace(" ", "").lower().split(","):
        lo, _, hi = part.partition("-")
        if lo[:3] not in DAYS or (hi and hi[:3] not in DAYS) or len(lo) < 3:
            raise SilenceError(field, f"bad day {part!r} (Mon, Tue, ... Sun; ranges Mon-Fri)")
        a, b = DAYS.index(lo[:3]), DAYS.index((hi or lo)[:3])
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class WeeklyWindow:
    """Days of the week (0 = Monday) and local minutes [start, end) in zone ``tz``."""

    text: str
    tz: str
    days: frozenset[int]
    start: int
    end: int

    @classmethod
    def parse(cls, text: str, tz: str = "UTC", field: str = "weekly") -> WeeklyWindow:
        zone(tz)
        m = _WINDOW.fullmatch(text.strip())
        if m is None:
            raise SilenceError(field, f"{text!r}: expected DAYS HH:MM-HH:MM (Mon-Fri 07:00-09:00)")
        start = _minutes(m["start"], field, end=False)
        end = _minutes(m["end"], field, end=True)
        if start == end:
            raise SilenceError(field, f"{text!r}: the window is empty (start = end)")
        return cls(text.strip(), tz, _days(m["days"], field), start, end)

    @property
    def wraps(self) -> bool:
        return self.end <= self.start

    def _local(self, t: float) -> tuple[date, float]:
        dt = datetime.fromtimestamp(t, zone(self.tz))
        return dt.date(), dt.hour * 60 + dt.minute + (dt.second + dt.microsecond / 1e6) / 60

    def _opened_on(self, t: float) -> date | None:
        """The local date whose window contains ``t``, or None."""
        day, mins = self._local(t)
        if not self.wraps:
            ok = day.weekday() in self.days and self.start <= mins < self.end
            return day if ok else None
        if day.weekday() in self.days and mins >= self.start:
            return day
        prev = day - timedelta(days=1)
        if prev.weekday() in self.days and mins < self.end:
            return prev
        return None

    def contains(self, t: float) -> bool:
        return self._opened_on(t) is not None

    def end_after(self, t: float) -> float | None:
        """When the window that contains ``t`` closes (epoch seconds), or None if none does."""
        opened = self._opened_on(t)
        if opened is None:
            return None
        close = opened + timedelta(days=1 if self.wraps else 0)
        local = datetime(close.year, close.month, close.day, tzinfo=zone(self.tz)) + timedelta(
            minutes=self.end
        )
        # wall-clock arithmetic: 24:00 is the next local midnight (23 or 25 h away on DST days);
        # a local end that DST skips still closes after t
        return max(local.timestamp(), t + 1e-3)
