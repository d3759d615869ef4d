"""On-call schedules: who is on call at a given instant.

A schedule has rotation layers and overrides, in one named time zone. A layer hands the
pager from one participant to the next every ``rotation`` (hours that divide a day, or whole
days/weeks) at its local ``handoff`` time: the arithmetic is in local wall time, so a 07:00
handoff stays at 07:00 across DST changes (that night shift is 11 or 13 hours long). A layer
may be restricted to weekly windows (a day crew, a night crew); layers must not overlap, so at
most one is in force at a time. An override puts someone else on call for a range and wins.
Pure: time is passed in (epoch seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import notifiers.routing.times as times
from notifiers.alarms.intervals import DAYS, WeeklyWindow, zone
from notifiers.routing.errors import RoutingError

DAY, WEEK_MINUTES = 86400, 7 * 1440
LAYER_KEYS = ("name", "participants", "rotation", "handoff", "start", "restrict")
OVERRIDE_KEYS = ("from", "until", "who")
SCHEDULE_KEYS = ("id", "tz", "layers", "overrides", "description")
GAP_HORIZON_DAYS = 3 * 366  # handoffs are checked for DST gaps this far from the start


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    participants: tuple[str, ...]
    step: timedelta  # the rotation length (wall time)
    anchor: datetime  # local naive: the first handoff (participants[0] takes over)
    restrict: tuple[WeeklyWindow, ...] = ()

    def in_force(self, at: float) -> bool:
        return not self.restrict or any(w.contains(at) for w in self.restrict)


@dataclass(frozen=True, slots=True)
class Override:
    start: float
    end: float
    who: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    tz: str
    layers: tuple[Layer, ...]
    overrides: tuple[Override, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True)
class Shift:
    """Who is on call at an instant, from where (``layer NAME`` or ``override #N``) and the
    span of that turn (``end`` None: open-ended)."""

    who: tuple[str, ...]
    source: str
    start: float
    end: float | None


# ---------------------------------------------------------------------- arithmetic
def handoff_at(layer: Layer, z: ZoneInfo, k: int) -> float:
    """The instant of the k-th handoff (k = 0: the anchor); the earlier of a repeated time."""
    return (layer.anchor + k * layer.step).replace(tzinfo=z).timestamp()


def slot(layer: Layer, z: ZoneInfo, at: float) -> int:
    """The index of the turn in force at ``at`` (-1 before the first handoff)."""
    if at < handoff_at(layer, z, 0):
        return -1
    k = int((at - handoff_at(layer, z, 0)) // layer.step.total_seconds())
    while handoff_at(layer, z, k + 1) <= at:  # DST moves a handoff by at most an hour or two
        k += 1
    while k > 0 and handoff_at(layer, z, k) > at:
        k -= 1
    return k


def on_call(schedule: Schedule, at: float) -> Shift | None:
    """The shift in force at ``at``, or None when nobody is on call."""
    for i, o in enumerate(schedule.overrides):
        if o.start <= at < o.end:
            return Shift(o.who, f"override #{i + 1}", o.start, o.end)
    z = zone(schedule.tz)
    for layer in schedule.layers:
        if not layer.in_force(at):
            continue
        k = slot(layer, z, at)
        if k < 0:
            continue
        end = handoff_at(layer, z, k + 1)
        for w in layer.restrict:
            close = w.end_after(at)
            if close is not None:
                end = min(end, close)
        later = [o.start for o in schedule.overrides if at < o.start < end]
        who = (layer.participants[k % len(layer.participants)],)
        return Shift(who, f"layer {layer.name}", handoff_at(layer, z, k), min([end, *later]))
    return None


def who(schedule: Schedule, at: float) -> list[str]:
    """The subscribers on call at ``at`` (empty when nobody is)."""
    shift = on_call(schedule, at)
    return list(shift.who) if shift is not None else []


# ---------------------------------------------------------------------- parsing
def _rotation(value: Any, loc: tuple[str | int, ...]) -> timedelta:
    seconds = times.duration(value, loc)
    minutes = seconds / 60
    whole_hours = minutes == int(minutes) and int(minutes) % 60 == 0
    if seconds <= 0 or not (
        (whole_hours and DAY % seconds == 0) or (seconds >= DAY and seconds % DAY == 0)
    ):
        raise RoutingError(
            f"{value!r}: a rotation is whole hours dividing a day (1h, 2h, 3h, 4h, 6h, 8h, 12h) "
            "or whole days (1d, 2d, 1w)",
            loc,
        )
    return timedelta(seconds=seconds)


def _handoff(value: Any, step: timedelta, loc: tuple[str | int, ...]) -> tuple[int | None, int]:
    """(weekday or None, local minutes) of ``HH:MM`` or ``Mon 09:00``."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1440:
        value = f"{value // 60:02d}:{value % 60:02d}"  # YAML 1.1 reads an unquoted 07:00 as 420
    text = str(value).strip()
    day_part, _, time_part = text.rpartition(" ")
    try:
        h, m = (int(x) for x in time_part.split(":"))
    except ValueError:
        raise RoutingError(f"{value!r}: expected HH:MM or DAY HH:MM (Mon 09:00)", loc) from None
    if not (0 <= h <= 23 and 0 <= m <= 59):
        raise RoutingError(f"{value!r}: bad time (00:00-23:59)", loc)
    if not day_part:
        return None, h * 60 + m
    if day_part.lower()[:3] not in DAYS or len(day_part) < 3:
        raise RoutingError(f"{value!r}: bad day {day_part!r} (Mon, Tue, ... Sun)", loc)
    if step.total_seconds() % (7 * DAY):
        raise RoutingError(f"{value!r}: a handoff day needs a rotation of whole weeks", loc)
    return DAYS.index(day_part.lower()[:3]), h * 60 + m


def _start_date(value: Any, loc: tuple[str | int, ...]) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise RoutingError(f"{value!r}: expected a date (2026-11-02)", loc) from None


def _check_gaps(layer: Layer, z: ZoneInfo, loc: tuple[str | int, ...]) -> None:
    """A handoff at a local time that a DST change skips is an error (it would not happen)."""
    step_min = int(layer.step.total_seconds() // 60)
    first = layer.anchor.hour * 60 + layer.anchor.minute
    tods = sorted({(first + i * step_min) % 1440 for i in range(max(1, 1440 // step_min))})
    day = layer.anchor.date()
    for _ in range(GAP_HORIZON_DAYS):
        midnight = datetime(day.year, day.month, day.day)
        a = midnight.replace(tzinfo=z).utcoffset()
        b = (midnight + timedelta(days=1)).replace(tzinfo=z).utcoffset()
        if a != b:  # a DST change that day: are the handoff times there?
            for tod in tods:
                naive = midnight + timedelta(minutes=tod)
                if times.nonexistent(naive, z):
                    raise RoutingError(
                        f"handoff at {tod // 60:02d}:{tod % 60:02d} does not exist on "
                        f"{day.isoformat()} in {z.key} (a DST gap): choose a time outside it",
                        loc,
                    )
        day += timedelta(days=1)


def parse_layer(data: Any, i: int, tzname: str) -> Layer:
    d = times.mapping(data, (), LAYER_KEYS)
    name = str(d.get("name", f"#{i + 1}"))
    if "participants" not in d:
        raise RoutingError("give the participants (subscriber ids, in rotation order)")
    parts = times.names(d["participants"], ("participants",), "participants")
    if len(set(parts)) != len(parts):
        raise RoutingError("a participant is listed twice", ("participants",))
    step = _rotation(d.get("rotation", "1w"), ("rotation",))
    if "start" not in d:
        raise RoutingError("give the date of the first handoff (start: 2026-11-02)")
    start = _start_date(d["start"], ("start",))
    weekday, minutes = _handoff(d.get("handoff", "00:00"), step, ("handoff",))
    if weekday is not None:
        start += timedelta(days=(weekday - start.weekday()) % 7)
    anchor = datetime(start.year, start.month, start.day) + timedelta(minutes=minutes)
    restrict = times.windows(d["restrict"], tzname, ("restrict",)) if "restrict" in d else ()
    layer = Layer(name, parts, step, anchor, restrict)
    _check_gaps(layer, zone(tzname), ("handoff",))
    return layer


def _coverage(layer: Layer) -> set[int]:
    """The local minutes of the week (0 = Monday 00:00) the layer is in force."""
    if not layer.restrict:
        return set(range(WEEK_MINUTES))
    out: set[int] = set()
    for w in layer.restrict:
        length = (w.end - w.start) % 1440 or 1440
        for d in w.days:
            out.update((d * 1440 + w.start + m) % WEEK_MINUTES for m in range(length))
    return out


def _at_minute(m: int) -> str:
    return f"{DAYS[m // 1440].capitalize()} {m % 1440 // 60:02d}:{m % 60:02d}"


def parse_schedule(data: Any, default_tz: str = "UTC") -> Schedule:
    """A schedule from its description (a configuration entry); errors name the field."""
    d = times.mapping(data, (), SCHEDULE_KEYS)
    sid = d.get("id")
    if not isinstance(sid, (str, int)) or isinstance(sid, bool) or str(sid).strip() == "":
        raise RoutingError("give the schedule an id", ("id",))
    tzname = str(d.get("tz", default_tz)).strip()
    times.tz(tzname, ("tz",))
    raw = d.get("layers")
    if not isinstance(raw, list) or not raw:
        raise RoutingError("give at least one rotation layer", ("layers",))
    layers: list[Layer] = []
    for i, item in enumerate(raw):
        try:
            layers.append(parse_layer(item, i, tzname))
        except RoutingError as e:
            raise e.under("layers", i) from None
    if len({x.name for x in layers}) != len(layers):
        raise RoutingError("two layers have the same name", ("layers",))
    cover = [_coverage(x) for x in layers]
    for i in range(len(layers)):
        for j in range(i):
            both = cover[i] & cover[j]
            if both:
                raise RoutingError(
                    f"overlaps layer {layers[j].name!r} (both in force at "
                    f"{_at_minute(min(both))} local); restrict them to separate hours",
                    ("layers", i),
                )
    overrides = _overrides(d.get("overrides") or [], zone(tzname))
    return Schedule(
        str(sid).strip(), tzname, tuple(layers), overrides, str(d.get("description", ""))
    )


def _overrides(raw: Any, z: ZoneInfo) -> tuple[Override, ...]:
    if not isinstance(raw, list):
        raise RoutingError("expected a list of {from, until, who}", ("overrides",))
    out: list[Override] = []
    for i, item in enumerate(raw):
        loc = ("overrides", i)
        d = times.mapping(item, loc, OVERRIDE_KEYS)
        for key in OVERRIDE_KEYS:
            if key not in d:
                raise RoutingError(f"give {key} (an override has from, until and who)", loc)
        start = times.local_time(d["from"], z, (*loc, "from"))
        end = times.local_time(d["until"], z, (*loc, "until"))
        if end <= start:
            raise RoutingError("the override ends before it starts", (*loc, "until"))
        o = Override(start, end, times.names(d["who"], (*loc, "who"), "subscribers"))
        for j, p in enumerate(out):
            if o.start < p.end and p.start < o.end:
                raise RoutingError(f"overlaps override #{j + 1}", loc)
        out.append(o)
    return tuple(out)


def describe_time(t: float, tzname: str) -> str:
    return datetime.fromtimestamp(t, zone(tzname)).strftime("%a %Y-%m-%d %H:%M %Z")


def _rotation_text(step: timedelta) -> str:
    s = int(step.total_seconds())
    for unit, size in (("w", 7 * DAY), ("d", DAY), ("h", 3600)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def schedule_to_json(s: Schedule) -> dict[str, Any]:
    """The schedule as a definition `parse_schedule` reads back to an equal schedule (the
    first handoff as ``start`` + ``handoff``, overrides in epoch seconds): what a store keeps."""
    layers = []
    for x in s.layers:
        d: dict[str, Any] = {
            "name": x.name,
            "participants": list(x.participants),
            "rotation": _rotation_text(x.step),
            "handoff": f"{x.anchor:%H:%M}",
            "start": x.anchor.date().isoformat(),
        }
        if x.restrict:
            d["restrict"] = [w.text for w in x.restrict]
        layers.append(d)
    out: dict[str, Any] = {"id": s.id, "tz": s.tz, "layers": layers}
    if s.overrides:
        out["overrides"] = [
            {"from": o.start, "until": o.end, "who": list(o.who)} for o in s.overrides
        ]
    if s.description:
        out["description"] = s.description
    return out


def uncovered(schedule: Schedule) -> list[str]:
    """The local weekly spans no layer covers (``Sat 00:00-Mon 07:00``): nobody is on call then
    unless an override says so. Empty when the layers cover the whole week."""
    covered: set[int] = set()
    for layer in schedule.layers:
        covered |= _coverage(layer)
    if len(covered) == WEEK_MINUTES:
        return []
    # walk the week from a covered minute, so a span across Sunday midnight stays one span
    start = min(covered) if covered else 0
    spans: list[str] = []
    gap: int | None = None
    for i in range(WEEK_MINUTES + 1):
        m = (start + i) % WEEK_MINUTES
        if m not in covered and gap is None and i < WEEK_MINUTES:
            gap = m
        elif (m in covered or i == WEEK_MINUTES) and gap is not None:
            a, b = _at_minute(gap), _at_minute(m)
            spans.append(f"{a}-{b[4:]}" if a[:3] == b[:3] and m > gap else f"{a}-{b}")
            gap = None
    return spans
