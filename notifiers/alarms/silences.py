"""Silences: matchers on an alarm's labels and when they hold (a range or a weekly window).

Matchers follow Alertmanager: ``label=value``, ``label!=value``, ``label=~regex`` and
``label!~regex``, the regex anchored at both ends (a full match). A label the alarm lacks
reads as "". A silenced alarm still changes state; only its deliveries are held back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from notifiers.alarms.intervals import WeeklyWindow, zone
from notifiers.errors import SilenceError
from profiles.parser import parse_duration

_MATCHER = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*(=~|!~|!=|=)\s*(.*?)\s*")
OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str, field_name: str = "matchers") -> Matcher:
        m = _MATCHER.fullmatch(text)
        if m is None:
            raise SilenceError(
                field_name, f"{text!r}: expected LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX"
            )
        label, op, value = m.group(1), m.group(2), m.group(3)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        return cls.of(label, op, value, field_name)

    @classmethod
    def of(cls, label: str, op: str, value: str, field_name: str = "matchers") -> Matcher:
        regex = None
        if op in ("=~", "!~"):
            try:
                regex = re.compile(value)
            except re.error as e:
                raise SilenceError(field_name, f"bad regex {value!r} for {label}: {e}") from None
        return cls(label, op, value, regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.label, "")
        if self.regex is not None:
            return (self.regex.fullmatch(got) is not None) == (self.op == "=~")
        return (got == self.value) == (self.op == "=")

    def __str__(self) -> str:
        return f"{self.label}{self.op}{self.value}"


@dataclass(frozen=True, slots=True)
class Silence:
    """Held back deliveries for the alarms every matcher matches, while it is in force.

    In force: ``starts_at <= t < ends_at`` (a range), or inside ``weekly`` (from
    ``starts_at`` on); never from ``expired_at`` on. ``notify_after``: when it ends, the
    alarms it held back that are still active are delivered once.
    """

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float | None = None
    weekly: WeeklyWindow | None = None
    creator: str = ""
    comment: str = ""
    notify_after: bool = True
    created_at: float = 0.0
    expired_at: float | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def in_force(self, t: float) -> bool:
        if t < self.starts_at or (self.expired_at is not None and t >= self.expired_at):
            return False
        if self.weekly is not None:
            return self.weekly.contains(t)
        return self.ends_at is not None and t < self.ends_at

    def end_after(self, t: float) -> float:
        """When it stops holding at ``t`` (it is in force at ``t``)."""
        end = self.weekly.end_after(t) if self.weekly is not None else self.ends_at
        assert end is not None
        return min(end, self.expired_at) if self.expired_at is not None else end

    def expired(self, t: float) -> Silence:
        return replace(self, expired_at=t)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "matchers": [str(m) for m in self.matchers],
            "starts_at": self.starts_at,
            "creator": self.creator,
            "comment": self.comment,
            "notify_after": self.notify_after,
            "created_at": self.created_at,
            "expired_at": self.expired_at,
        }
        if self.weekly is not None:
            out.update(weekly=self.weekly.text, tz=self.weekly.tz)
        else:
            out["ends_at"] = self.ends_at
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Silence:
        weekly = WeeklyWindow.parse(d["weekly"], d.get("tz", "UTC")) if d.get("weekly") else None
        return cls(
            d["id"], tuple(Matcher.parse(m) for m in d["matchers"]), d["starts_at"],
            d.get("ends_at"), weekly, d.get("creator", ""), d.get("comment", ""),
            d.get("notify_after", True), d.get("created_at", 0.0), d.get("expired_at"),
        )  # fmt: skip


SILENCE_KEYS = (
    "matchers", "from", "until", "for", "weekly", "tz", "creator", "comment", "notify_after",
)  # fmt: skip


def parse_time(value: Any, field_name: str) -> float:
    """Epoch seconds, an RFC 3339 string, or a YAML timestamp (naive: UTC)."""
    if isinstance(value, bool):
        raise SilenceError(field_name, f"{value!r}: expected a time (RFC 3339 or epoch seconds)")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise SilenceError(
                field_name, f"{value!r}: expected a time (RFC 3339 or epoch seconds)"
            ) from None
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


def parse_silence(data: Any, sid: str, now: float) -> Silence:
    """A silence from its description (a silences file entry, a request body), checked at
    ``now``: an inverted or past range, an unknown zone, a bad window or regex is an error
    naming the field."""
    if not isinstance(data, Mapping):
        raise SilenceError("", "expected a mapping with matchers and a time range or weekly")
    for key in data:
        if key not in SILENCE_KEYS:
            raise SilenceError(str(key), f"unknown key (allowed: {', '.join(SILENCE_KEYS)})")
    raw = data.get("matchers")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise SilenceError("matchers", "give at least one matcher (e.g. building=A)")
    matchers = tuple(Matcher.parse(str(m)) for m in raw)
    creator, comment = str(data.get("creator", "")), str(data.get("comment", ""))
    after = bool(data.get("notify_after", True))
    starts = parse_time(data["from"], "from") if "from" in data else now
    if "weekly" in data:
        if "until" in data or "for" in data:
            raise SilenceError("weekly", "give weekly or a range (from/until/for), not both")
        tz = str(data.get("tz", "UTC"))
        zone(tz)
        weekly = WeeklyWindow.parse(str(data["weekly"]), tz)
        return Silence(sid, matchers, starts, None, weekly, creator, comment, after, now)
    if "tz" in data:
        raise SilenceError("tz", "only with weekly")
    if ("until" in data) == ("for" in data):
        raise SilenceError("until", "give until or for (or weekly)")
    if "for" in data:
        try:
            ends = starts + parse_duration(str(data["for"]))
        except ValueError as e:
            raise SilenceError("for", str(e)) from None
    else:
        ends = parse_time(data["until"], "until")
    if ends <= starts:
        raise SilenceError("until", "the range ends before it starts")
    if ends <= now:
        raise SilenceError("until", "the range is in the past")
    return Silence(sid, matchers, starts, ends, None, creator, comment, after, now)
