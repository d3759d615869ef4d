"""`localtime` and `weekday` (docs/language.md §2.1): parsing, the profile file's `tz:`, the local
clock of the engines, what notifications show, lint. Matching semantics across midnight and DST
are in tests/cases/42-*.yaml (every engine) and tests/test_differential.py."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import typer
from typer.testing import CliRunner

from filters.engine import Engine
from filters.localclock import LocalClock, _Zone, relaxed
from filters.twostep.engine import TwoStepEngine
from profiles import timeofday as tod
from profiles.ast import Between, Cmp, Const, In, Or, Ref, WCmp
from profiles.errors import ProfileError
from profiles.events import Event, parse_ts
from profiles.lint import warnings
from profiles.parser import parse_profile
from profiles.profile_file import parse_profile_document

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

LT, WD = tod.KEY_LOCALTIME, tod.KEY_WEEKDAY


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('localtime between "22:00" and "06:00"', Or((Cmp(LT, ">=", 79200), Cmp(LT, "<=", 21600)))),
        ('localtime between "06:00" and "22:00:30"', Between(LT, 21600, 79230)),
        ('localtime between "06:00" and "06:00"', Between(LT, 21600, 21600)),
        ('localtime >= "07:30"', Cmp(LT, ">=", 27000)),
        ('localtime != "00:00:01"', Cmp(LT, "!=", 1)),
        ('weekday in ("sat", "Sun")', In(WD, ("sat", "sun"))),
        ('weekday not in ("mon")', In(WD, ("mon",), negated=True)),
        ('weekday = "fri"', Cmp(WD, "=", "fri")),
    ],
)
def test_localtime_and_weekday_parse_to_indexable_predicates(text: str, want: object) -> None:
    assert parse_profile(text, "p").expr == want


def test_where_reads_localtime_and_weekday_literals_like_a_filter() -> None:
    p = parse_profile(
        'seq(a: k = 1, b: k = 2) within 1h where a.localtime < "10:00" and b.weekday = "Mon"',
        "p",
    )
    assert p.where is not None
    first, second = p.where.items  # type: ignore[union-attr]
    assert first == WCmp("<", Ref("a", LT), _lit(36000))
    assert second == WCmp("=", Ref("b", WD), _lit("mon"))


def _lit(v: object) -> object:
    from profiles.ast import Lit

    return Lit(v)  # type: ignore[arg-type]


def test_the_night_door_rule_is_one_profile_per_room() -> None:
    p = parse_profile(
        'seq(d: kind = "door" and state = "open" and localtime between "22:00" and "06:00") '
        "per room",
        "night-door",
    )
    assert p.per == ("room",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'localtime > "10pm"',
            'localtime needs a time "HH:MM" or "HH:MM:SS" (00:00 to 23:59:59), got \'10pm\'',
        ),
        ('localtime between "22:00" and "24:00"', "got '24:00'"),
        ("localtime > 7", "got 7"),
        (
            'weekday = "saturday"',
            "weekday needs a day name: 'mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'; got 'saturday'",
        ),
        ('weekday in ("sat", "holiday")', "got 'holiday'"),
        (
            'weekday < "sat"',
            "weekday is the local day name: it supports =, !=, in and not in, not <",
        ),
        ('weekday between "mon" and "fri"', "not between"),
        ('localtime in ("10:00")', "it supports = != < <= > >= and between, not in"),
        ("localtime exists", "not exists"),
        ('weekday starts with "s"', "not starts with"),
        ("seq(a: k = 1) per weekday", "per weekday: weekday is derived from ts"),
        ('seq(a: k = 1, b: k = 2) within 1h where a.localtime < "7pm"', "got '7pm'"),
        ('seq(a: k = 1, b: k = 2) within 1h where a.weekday > "fri"', "not >"),
    ],
)
def test_a_bad_time_or_day_is_a_parse_error_naming_it(text: str, message: str) -> None:
    with pytest.raises(ProfileError) as ei:
        parse_profile(text, "p")
    assert message in str(ei.value)
    assert "profile 'p': line 1" in str(ei.value)


# ------------------------------------------------------------------ the profile file's tz:


def test_the_profile_files_tz_zones_its_profiles() -> None:
    pset, errors = parse_profile_document(
        "tz: Europe/Berlin\nprofiles:\n  - {id: n, expr: 'localtime >= \"22:00\"'}\n"
        "  - {id: k, expr: 'k = 1'}\n"
    )
    assert errors == [] and pset.tz == "Europe/Berlin"
    assert pset.profiles[0].expr == Cmp(tod.key("localtime", "Europe/Berlin"), ">=", 79200)
    assert pset.profiles[1].expr == Cmp("k", "=", 1)


@pytest.mark.parametrize("bad", ["Mars/Olympus", "", "12"])
def test_an_unknown_tz_in_the_file_is_an_error_at_its_line(bad: str) -> None:
    _, errors = parse_profile_document(f"profiles: []\ntz: '{bad}'\n", "f.yaml")
    assert len(errors) == 1
    assert str(errors[0]).startswith("f.yaml:2:5: tz: unknown time zone")


def test_profile_add_refuses_a_profile_zoned_by_the_files_tz(tmp_path: Path) -> None:
    """The service stores the expression only: a file's tz: would be lost, so it says so."""
    from ens.commands.service import register

    app = typer.Typer()
    register(app)
    f = tmp_path / "p.yaml"
    f.write_text("tz: Europe/Berlin\nprofiles:\n  - {id: n, expr: 'localtime >= \"22:00\"'}\n")
    res = CliRunner().invoke(app, ["profile", "add", str(f)])
    assert res.exit_code == 2
    assert "profile 'n': reads localtime/weekday in the file's tz: Europe/Berlin" in res.stderr
    assert "--tz Europe/Berlin" in res.stderr


# ------------------------------------------------------------------------- local clock


@pytest.mark.parametrize(
    "zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]
)
def test_the_cached_local_clock_is_zoneinfo_to_the_second(zone: str) -> None:
    """Every 7 minutes and 13.4 s through 2026 (both DST changes, a 30-minute one in Lord Howe,
    a +05:45 zone): seconds of the local day and day name as zoneinfo gives them."""
    z = _Zone(ZoneInfo(zone), None)
    start = parse_ts("2026-01-01T00:00:00Z")
    ts = start
    while ts < start + 366 * 86400:
        local = dt.datetime.fromtimestamp(int(ts // 1), ZoneInfo(zone))
        want = (local.hour * 3600 + local.minute * 60 + local.second, tod.DAYS[local.weekday()])
        assert z.local(ts) == want, (zone, ts)
        ts += 433.4


def test_the_local_clock_reads_out_of_order_events_too() -> None:
    z = _Zone(ZoneInfo("Europe/Berlin"), None)
    late = parse_ts("2026-03-29T00:59:59Z")  # 01:59:59 CET
    early = parse_ts("2026-03-29T01:00:00Z")  # 03:00:00 CEST
    assert z.local(early) == (3 * 3600, "sun")
    assert z.local(late) == (2 * 3600 - 1, "sun")
    assert z.local(early - 86400 * 30) == (2 * 3600, "fri")


def test_only_engines_with_a_local_profile_derive_anything() -> None:
    plain = [parse_profile('k = "a"', "a")]
    assert LocalClock.of(None, ZoneInfo("UTC"), plain) is None
    eng = Engine(plain)
    assert eng._local is None
    eng.add_profile(parse_profile('weekday = "sun"', "b"))
    assert eng._local is not None and set(eng._local.zones) == {None}


@pytest.mark.parametrize("make", [Engine, TwoStepEngine])
def test_notifications_show_the_event_as_it_came(make: type) -> None:
    """The keys the engine adds are not in a notification's events, and an attribute of the
    event named localtime stays as it was (shadowed in profiles, not overwritten)."""
    eng = make([parse_profile('kind = "door" and localtime >= "22:00"', "p")], tz="Europe/Berlin")
    eng.process(Event("e1", parse_ts("2026-07-01T21:30:00Z"), {"kind": "door", "localtime": "x"}))
    (n,) = eng.take_notifications()
    assert n.to_detail()["events"] == {
        "e": {"id": "e1", "ts": parse_ts("2026-07-01T21:30:00Z"), "kind": "door", "localtime": "x"}
    }


def test_a_snapshot_restores_the_local_clock() -> None:
    ps = [parse_profile('seq(a: k = 1, b: k = 2 and localtime < "01:00") within 2h per r', "p")]
    eng = Engine(ps, tz="America/New_York")
    eng.process(Event("a", parse_ts("2026-11-01T04:10:00Z"), {"k": 1, "r": 1}))
    back = Engine.restore(eng.snapshot())
    assert back._local is not None
    back.process(Event("b", parse_ts("2026-11-01T04:50:00Z"), {"k": 2, "r": 1}))  # 00:50 EDT
    assert [n.to_json()["events"] for n in back.take_notifications()] == [{"a": "a", "b": "b"}]


def test_spark_relevance_never_drops_an_event_a_local_filter_could_match() -> None:
    def rel(text: str) -> object:
        return relaxed(parse_profile(text, "p").expr)  # type: ignore[arg-type]

    assert rel('kind = "door" and localtime between "22:00" and "06:00"') == Cmp(
        "kind", "=", "door"
    )
    assert rel('weekday = "sat" or kind = "door"') == Const(True)
    assert rel('not (weekday = "sat" and kind = "door")') == Const(True)
    assert rel('not (weekday = "sat" or kind = "door")') == rel('not (kind = "door")')


# -------------------------------------------------------------------------------- lint


def test_lint_warns_when_events_carry_a_shadowed_attribute() -> None:
    p = parse_profile('kind = "door" and localtime >= "22:00"', "p")
    got = warnings(p, {"kind", "localtime"})
    assert got == [
        "profile 'p': events carry an attribute 'localtime', which the profile cannot read: "
        "localtime is the event's local time of day (docs/language.md §2.1); rename the attribute "
        "at the source"
    ]
    assert warnings(p, {"kind"}) == []  # and never "no event has attribute 'localtime'"


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        ('kind = "t" and not (suspect exists)', False),
        ('kind = "t" and suspect exists', False),
        ('kind = "t" and (suspect exists or value > 3)', False),
        ('kind = "t" and not (suspect exists) and suspect = true', True),
        ('kind = "t" and suspect = true', True),
    ],
)
def test_lint_does_not_warn_about_an_attribute_only_tested_for_presence(
    text: str, warned: bool
) -> None:
    got = warnings(parse_profile(text, "p"), {"kind", "value"})
    assert any("'suspect'" in w for w in got) == warned, got


def test_replaying_the_facility_examples_warns_about_nothing(tmp_path: Path) -> None:
    """`not (suspect exists)` guards the reading rules; a feed without `suspect` is the usual
    case, not a typo (issue 40)."""
    from ens.cli import app

    root = Path(__file__).parents[1]
    feed = tmp_path / "feed.jsonl"
    res = CliRunner().invoke(
        app, ["generate", "facility", "--buildings", "1", "--days", "1", "--out", str(feed)]
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        app, ["replay", str(root / "examples" / "facility" / "profiles.yaml"), str(feed)]
    )
    assert res.exit_code == 0, res.stderr
    assert "warning" not in res.stderr, res.stderr
    assert [json.loads(line) for line in res.stdout.splitlines()]


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        ('kind = "door" and time > "22:00"', True),
        ('kind = "door" and hour between "22:00" and "23:59"', True),
        ('kind = "door" and time = "22:00"', False),  # equality with a text is a plain test
        ('kind = "door" and localtime > "22:00"', False),
        ('kind = "door" and name > "b"', False),
    ],
)
def test_lint_points_a_time_compared_as_text_to_localtime(text: str, warned: bool) -> None:
    """Issue 40: `time > "22:00"` was accepted silently by `ens check` (no events needed)."""
    got = warnings(parse_profile(text, "p"))
    assert any("write localtime instead of" in w for w in got) == warned, got
