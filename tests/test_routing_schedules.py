"""On-call schedules: rotations across DST and handoffs, restrictions, overrides, bad input."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifiers.routing import RoutingError, on_call, parse_schedule, who

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str, z: ZoneInfo = BERLIN, fold: int = 0) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=z, fold=fold).timestamp()


def sched(*layers: dict, tz: str = "Europe/Berlin", overrides: list | None = None):
    data = {"id": "s", "tz": tz, "layers": list(layers)}
    if overrides is not None:
        data["overrides"] = overrides
    return parse_schedule(data)


DAILY = {
    "participants": ["a", "b", "c"],
    "rotation": "1d",
    "handoff": "07:00",
    "start": "2026-03-27",
}


def test_daily_rotation_keeps_its_local_handoff_across_spring_forward() -> None:
    s = sched(DAILY)
    assert who(s, at("2026-03-27T06:59")) == []  # before the first handoff
    assert who(s, at("2026-03-27T07:00")) == ["a"]
    assert who(s, at("2026-03-28T06:59")) == ["a"]
    assert who(s, at("2026-03-28T07:00")) == ["b"]
    # 2026-03-29: clocks jump 02:00 -> 03:00; the turn from Sat 07:00 to Sun 07:00 is 23 h
    assert who(s, at("2026-03-29T06:59")) == ["b"]
    assert who(s, at("2026-03-29T07:00")) == ["c"]
    shift = on_call(s, at("2026-03-29T03:30"))
    assert shift is not None and shift.end is not None
    assert shift.end - shift.start == 23 * 3600
    assert who(s, at("2026-03-30T07:00")) == ["a"]  # round again


def test_twelve_hour_shifts_across_fall_back() -> None:
    s = sched({"participants": ["day", "night"], "rotation": "12h", "handoff": "07:00",
               "start": "2026-10-24"})  # fmt: skip
    assert who(s, at("2026-10-24T07:00")) == ["day"]
    assert who(s, at("2026-10-24T19:00")) == ["night"]
    # 2026-10-25 03:00 CEST -> 02:00 CET: that night is 13 hours; the 07:00 handoff stays
    night = on_call(s, at("2026-10-25T02:30", fold=1))
    assert night is not None and night.who == ("night",) and night.end is not None
    assert night.end - night.start == 13 * 3600
    assert who(s, at("2026-10-25T06:59")) == ["night"]
    assert who(s, at("2026-10-25T07:00")) == ["day"]
    assert who(s, at("2026-10-25T19:00")) == ["night"]


def test_weekly_handoff_on_a_weekday() -> None:
    s = sched(
        {
            "participants": ["a", "b"],
            "rotation": "1w",
            "handoff": "Mon 09:00",
            "start": "2026-11-04",
        }
    )  # a Wednesday: the first handoff is Mon 2026-11-09
    assert who(s, at("2026-11-09T08:59")) == []
    assert who(s, at("2026-11-09T09:00")) == ["a"]
    assert who(s, at("2026-11-16T08:59")) == ["a"]
    assert who(s, at("2026-11-16T09:00")) == ["b"]
    assert who(s, at("2026-11-23T09:00")) == ["a"]


def test_day_and_night_layers_and_an_override() -> None:
    s = sched(
        {"name": "day", "participants": ["anna", "ben"], "rotation": "1w", "handoff": "Mon 07:00",
         "start": "2026-11-02", "restrict": "Mon-Sun 07:00-19:00"},
        {"name": "night", "participants": ["carla", "dmitri"], "rotation": "1d",
         "handoff": "19:00", "start": "2026-11-02", "restrict": ["Mon-Sun 19:00-07:00"]},
        overrides=[{"from": "2026-11-03T22:00", "until": "2026-11-04T02:00", "who": "erik"}],
    )  # fmt: skip
    assert who(s, at("2026-11-02T12:00")) == ["anna"]
    assert who(s, at("2026-11-02T20:00")) == ["carla"]
    assert who(s, at("2026-11-03T06:00")) == ["carla"]  # the night turn runs into the morning
    day = on_call(s, at("2026-11-03T08:00"))
    assert day is not None and day.who == ("anna",) and day.source == "layer day"
    assert day.end == at("2026-11-03T19:00")  # the restriction ends the turn, not the handoff
    assert who(s, at("2026-11-03T21:59")) == ["dmitri"]
    o = on_call(s, at("2026-11-03T22:00"))
    assert o is not None and o.who == ("erik",) and o.source == "override #1"
    assert who(s, at("2026-11-04T02:00")) == ["dmitri"]
    before = on_call(s, at("2026-11-03T21:00"))
    assert before is not None and before.end == at("2026-11-03T22:00")  # cut by the override


@pytest.mark.parametrize(
    ("data", "loc", "words"),
    [
        ({"id": "s", "layers": []}, "layers", "at least one"),
        ({"id": "s", "tz": "Mars/Olympus", "layers": [DAILY]}, "tz", "unknown time zone"),
        ({"id": "s", "layers": [{**DAILY, "participants": []}]}, "layers.0.participants", "at least one"),
        ({"id": "s", "layers": [{**DAILY, "rotation": "5h"}]}, "layers.0.rotation", "dividing a day"),
        ({"id": "s", "layers": [{**DAILY, "handoff": "25:00"}]}, "layers.0.handoff", "bad time"),
        ({"id": "s", "layers": [{**DAILY, "handoff": "Mon 07:00"}]}, "layers.0.handoff", "whole weeks"),
        ({"id": "s", "layers": [{**DAILY, "colour": 1}]}, "layers.0.colour", "unknown key"),
        ({"id": "s", "layers": [DAILY, {**DAILY, "name": "x"}]}, "layers.1", "overlaps layer '#1'"),
        ({"id": "s", "tz": "Europe/Berlin", "layers": [{**DAILY, "handoff": "02:30"}]},
         "layers.0.handoff", "does not exist on 2026-03-29"),
        ({"id": "s", "layers": [DAILY], "overrides": [{"from": "2026-11-03", "until": "2026-11-02",
          "who": "x"}]}, "overrides.0.until", "ends before"),
        ({"id": "s", "layers": [DAILY], "overrides": [
            {"from": "2026-11-01", "until": "2026-11-03", "who": "x"},
            {"from": "2026-11-02", "until": "2026-11-04", "who": "y"}]}, "overrides.1", "overlaps override #1"),
    ],
)  # fmt: skip
def test_bad_schedules_name_the_field(data: dict, loc: str, words: str) -> None:
    with pytest.raises(RoutingError) as e:
        parse_schedule(data)
    assert e.value.loc and ".".join(map(str, e.value.loc)) == loc
    assert words in e.value.message


# ---------------------------------------------------------------------- against brute force
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "UTC"]
ROTATIONS = {"1h": 60, "4h": 240, "8h": 480, "12h": 720, "1d": 1440, "2d": 2880, "1w": 10080}


def brute_force(zname: str, people: list[str], rot_min: int, start: date, handoff: int, t: float):
    """Walk local wall time minute by minute from the start date: a handoff is every minute
    whose local time is anchor + k * rotation (the first of a repeated local time)."""
    z = ZoneInfo(zname)
    anchor = datetime(start.year, start.month, start.day) + timedelta(minutes=handoff)
    first = anchor.replace(tzinfo=z).timestamp()
    if t < first:
        return []
    turns, m = 0, int(first // 60) * 60
    while m + 60 <= t:
        m += 60
        local = datetime.fromtimestamp(m, z)
        naive = local.replace(tzinfo=None)
        if local.fold == 0 and (naive - anchor) % timedelta(minutes=rot_min) == timedelta(0):
            turns += 1
    return [people[turns % len(people)]]


@settings(max_examples=60, deadline=None)
@given(
    zname=st.sampled_from(ZONES),
    rotation=st.sampled_from(sorted(ROTATIONS)),
    n=st.integers(1, 4),
    start=st.dates(date(2026, 3, 1), date(2026, 4, 10)) | st.dates(date(2026, 9, 25), date(2026, 11, 5)),
    handoff=st.integers(0, 23 * 60 + 59),
    offset=st.integers(-3600, 12 * 86400),
)  # fmt: skip
def test_who_matches_a_minute_by_minute_walk(
    zname: str, rotation: str, n: int, start: date, handoff: int, offset: int
) -> None:
    people = [f"p{i}" for i in range(n)]
    data = {"id": "s", "tz": zname, "layers": [{"participants": people, "rotation": rotation,
            "handoff": f"{handoff // 60:02d}:{handoff % 60:02d}", "start": start.isoformat()}]}  # fmt: skip
    try:
        s = parse_schedule(data)
    except RoutingError as e:
        assert "DST gap" in e.message  # the only reason a valid-looking layer is refused
        return
    z = ZoneInfo(zname)
    first = (datetime(start.year, start.month, start.day) + timedelta(minutes=handoff)).replace(
        tzinfo=z
    )
    t = float(int(first.timestamp()) // 60 * 60 + offset // 60 * 60)
    assert who(s, t) == brute_force(zname, people, ROTATIONS[rotation], start, handoff, t)


@settings(max_examples=40, deadline=None)
@given(
    zname=st.sampled_from(ZONES),
    day_start=st.integers(5, 9),
    day_hours=st.integers(8, 13),
    start=st.dates(date(2026, 3, 20), date(2026, 3, 30)) | st.dates(date(2026, 10, 20), date(2026, 10, 30)),
    offset=st.integers(0, 9 * 86400),
)  # fmt: skip
def test_day_and_night_layers_match_the_walk_of_the_layer_in_force(
    zname: str, day_start: int, day_hours: int, start: date, offset: int
) -> None:
    """Two restricted layers (a day crew, a night crew): the one whose window holds, and its
    turn by the minute-by-minute walk."""
    a, b = day_start * 60, (day_start + day_hours) * 60
    day = f"Mon-Sun {a // 60:02d}:00-{b // 60:02d}:00"
    night = f"Mon-Sun {b // 60:02d}:00-{a // 60:02d}:00"
    data = {"id": "s", "tz": zname, "layers": [
        {"name": "day", "participants": ["d0", "d1"], "rotation": "1w", "handoff": f"{a // 60:02d}:00",
         "start": start.isoformat(), "restrict": day},
        {"name": "night", "participants": ["n0", "n1", "n2"], "rotation": "1d",
         "handoff": f"{b // 60:02d}:00", "start": start.isoformat(), "restrict": night},
    ]}  # fmt: skip
    s = parse_schedule(data)
    z = ZoneInfo(zname)
    t = datetime(start.year, start.month, start.day, tzinfo=z).timestamp() + offset // 60 * 60
    layer = next((x for x in s.layers if x.restrict[0].contains(t)), None)
    assert layer is not None  # the two windows cover the week
    people = list(layer.participants)
    rot = 10080 if layer.name == "day" else 1440
    handoff = a if layer.name == "day" else b
    assert who(s, t) == brute_force(zname, people, rot, start, handoff, t)


def test_the_spans_nobody_covers_are_named() -> None:
    from notifiers.routing.schedules import uncovered

    day = {**DAILY, "restrict": "Mon-Fri 07:00-19:00"}
    assert uncovered(sched(day)) == [
        "Mon 19:00-Tue 07:00", "Tue 19:00-Wed 07:00", "Wed 19:00-Thu 07:00",
        "Thu 19:00-Fri 07:00", "Fri 19:00-Mon 07:00",
    ]  # fmt: skip
    night = {**DAILY, "handoff": "19:00", "restrict": "Mon-Fri 19:00-07:00"}
    assert uncovered(sched(night))[0] == "Tue 07:00-19:00"
    assert uncovered(sched(night))[-1] == "Sat 07:00-Mon 19:00"
    assert uncovered(sched(DAILY)) == []
