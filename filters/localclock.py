"""The local time of day and day of week of each event (docs/language.md §2.1), for both engines.

A profile that uses `localtime`/`weekday` reads them under reserved keys
(`profiles.timeofday`); before the primitive pool sees an event, the engine adds those keys to
a copy of its attributes, so the pool indexes them like any attribute and `where` and the
bound events see them too. Only engines with such a profile do this (`LocalClock.of` is None
otherwise): other profiles pay nothing.

The conversion is from UTC with the zone's rules (zoneinfo): local seconds = floor(ts) +
the UTC offset at ts, so a spring-forward day skips the missing hour and both passes through a
fall-back hour read the same. The offset is looked up once per UTC hour (and kept while it
holds); an hour in which the offset changes is looked up per event. Pure: time is the
event's `ts`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from zoneinfo import ZoneInfo

from profiles import timeofday as tod
from profiles.ast import And, Between, Cmp, Const, Exists, Filter, In, Not, Or, Profile, StartsWith
from profiles.events import Event
from profiles.lint import attributes

_HOUR = 3600
_DAY = 86400
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (date.weekday(): Monday is 0)
# day name by days since the epoch modulo 7
_BY_EPOCH_DAY = tuple(tod.DAYS[(d + _EPOCH_WEEKDAY) % 7] for d in range(7))
_floor = math.floor


class _Zone:
    """One zone's keys and the UTC offset of the hour last looked up."""

    __slots__ = ("tz", "k_time", "k_day", "lo", "hi", "off")

    def __init__(self, tz: dt.tzinfo, name: str | None) -> None:
        self.tz = tz
        self.k_time = tod.key(tod.LOCALTIME, name)
        self.k_day = tod.key(tod.WEEKDAY, name)
        self.lo = self.hi = 0.0  # [lo, hi): the UTC interval where `off` holds
        self.off = 0

    def offset(self, ts: float) -> int:
        """The zone's UTC offset at `ts`, in seconds (cached per UTC hour)."""
        if self.lo <= ts < self.hi:
            return self.off
        off = _offset(self.tz, ts)
        b = math.floor(ts / _HOUR) * _HOUR
        if _offset(self.tz, b) == off == _offset(self.tz, b + _HOUR - 1):
            self.lo, self.hi, self.off = float(b), float(b + _HOUR), off
        return off

    def local(self, ts: float) -> tuple[int, str]:
        """(seconds of the local day, local day name) at `ts`."""
        x = _floor(ts) + self.offset(ts)
        return x % _DAY, _BY_EPOCH_DAY[(x // _DAY) % 7]


def _offset(tz: dt.tzinfo, ts: float) -> int:
    off = dt.datetime.fromtimestamp(ts, tz).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


class LocalClock:
    """Adds `localtime`/`weekday` to the events of the zones an engine's profiles use."""

    __slots__ = ("default", "zones")

    def __init__(self, default: dt.tzinfo) -> None:
        self.default = default
        self.zones: dict[str | None, _Zone] = {}

    @staticmethod
    def of(
        clock: LocalClock | None, default: dt.tzinfo, profiles: Iterable[Profile]
    ) -> LocalClock | None:
        """`clock` (or a new one) knowing every zone the `profiles` use; None while none does.
        Zones are only added: a removed profile's zone stays (a few keys per event at most)."""
        for p in profiles:
            for name in tod.zones(attributes(p)):
                if clock is None:
                    clock = LocalClock(default)
                if name not in clock.zones:
                    tz = default if name is None else ZoneInfo(name)
                    clock.zones[name] = _Zone(tz, name)
        return clock

    def at(self, ts: float) -> dict[str, int | str]:
        """The derived keys and their values at `ts`."""
        out: dict[str, int | str] = {}
        for z in self.zones.values():
            out[z.k_time], out[z.k_day] = z.local(ts)
        return out

    def event(self, ev: Event) -> Event:
        """`ev` with the derived keys added to a copy of its attributes (last, so that
        `Event.to_json` finds them cheaply). `_Zone.local`, inlined: it runs per event."""
        attrs = ev.attrs.copy()
        ts = ev.ts
        for z in self.zones.values():
            x = _floor(ts) + (z.off if z.lo <= ts < z.hi else z.offset(ts))
            attrs[z.k_time] = x % _DAY
            attrs[z.k_day] = _BY_EPOCH_DAY[(x // _DAY) % 7]
        return Event(ev.id, ts, attrs)


def relaxed(f: Filter, positive: bool = True) -> Filter:
    """`f` with its `localtime`/`weekday` tests replaced by what never loses an event that
    could match (true where they count for a match, false under a `not`): for routers that
    decide on an event's attributes alone (Spark's relevance filters), without a zone."""
    if isinstance(f, (Cmp, In, Between, Exists, StartsWith)):
        return Const(positive) if tod.split_key(f.attr) is not None else f
    if isinstance(f, Not):
        inner = relaxed(f.item, not positive)
        return Const(not inner.value) if isinstance(inner, Const) else Not(inner)
    if isinstance(f, (And, Or)):
        unit = isinstance(f, And)  # the value that drops out (true in an and, false in an or)
        items = []
        for item in f.items:
            r = relaxed(item, positive)
            if isinstance(r, Const):
                if r.value != unit:
                    return r
                continue
            items.append(r)
        if not items:
            return Const(unit)
        return items[0] if len(items) == 1 else type(f)(tuple(items))
    return f
