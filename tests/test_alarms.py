"""The pure alarm rules (notifiers/alarms): every transition, every silence form, grouping, the cap."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from filters.errors import StateError
from notifiers.alarms import (
    AlarmNotFound,
    AlarmRules,
    AlarmStateConflict,
    Effects,
    GroupPolicy,
    History,
    Matcher,
    SilenceError,
    SilenceNotFound,
    WeeklyWindow,
    alarm_id,
)
from profiles.alarm import AlarmSpec

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

ALL = ("raise", "repeat", "ack", "clear")
ROOM = {"room": "101"}
AID = alarm_id("w", ROOM)


def rules(clear: str = "manual", after: float | None = None, notify=ALL, **policy) -> AlarmRules:
    spec = AlarmSpec("major", clear, after, 'state = "closed"' if clear == "on" else None, notify)  # type: ignore[arg-type]
    return AlarmRules({"w": spec}, default=GroupPolicy(**policy) if policy else None)


def kinds(e: Effects) -> list[tuple[str, str | None, str]]:
    return [(t.kind, t.before, t.after) for t in e.transitions]


# ---------------------------------------------------------------------- identity and lifecycle


def test_identity_is_the_key_and_stable() -> None:
    assert alarm_id("w", {"room": "101", "b": "A"}) == alarm_id("w", {"b": "A", "room": "101"})
    assert alarm_id("w", ROOM) != alarm_id("w", {"room": "102"}) != alarm_id("v", ROOM)
    assert alarm_id("w", None) == alarm_id("w", {})


def test_raise_repeat_ack_clear_rearm() -> None:
    r = rules()
    e = r.on_match("w", 10, ROOM, {"w": "e1"}, "sec")
    assert kinds(e) == [("raise", None, "active-unacknowledged")]
    t = e.transitions[0]
    assert (t.id, t.occurrence, t.count, t.actor, t.labels["room"]) == (
        f"{AID}.1.1",
        1,
        1,
        "rule",
        "101",
    )
    e = r.on_match("w", 20, ROOM, {"w": "e2"}, "sec")
    t = e.transitions[0]
    assert (t.kind, t.count, t.first_seen, t.last_seen, t.events) == (
        "repeat",
        2,
        10,
        20,
        {"w": "e2"},
    )
    e = r.acknowledge(AID, 30, "ana", "on my way")
    assert kinds(e) == [("ack", "active-unacknowledged", "active-acknowledged")]
    assert (e.transitions[0].actor, e.transitions[0].reason) == ("ana", "on my way")
    e = r.clear(AID, 40, "ana", "window closed by hand")
    assert kinds(e) == [("clear", "active-acknowledged", "cleared-acknowledged")]
    e = r.on_match("w", 50, ROOM, {"w": "e3"}, "sec")  # re-arm: a new occurrence, a new id
    t = e.transitions[0]
    assert (t.kind, t.occurrence, t.id, t.reason, t.count) == (
        "raise",
        2,
        f"{AID}.2.1",
        "re-arm",
        1,
    )


def test_cleared_unacknowledged_then_acknowledged() -> None:
    r = rules()
    r.on_match("w", 0, ROOM, {}, "sec")
    assert kinds(r.clear(AID, 1, "bo", "done")) == [
        ("clear", "active-unacknowledged", "cleared-unacknowledged")
    ]
    assert kinds(r.acknowledge(f"{AID}.1", 2, "bo")) == [
        ("ack", "cleared-unacknowledged", "cleared-acknowledged")
    ]


def test_conflicts_and_not_found_are_typed() -> None:
    r = rules()
    with pytest.raises(AlarmNotFound):
        r.acknowledge("nope", 0, "a")
    r.on_match("w", 0, ROOM, {}, "sec")
    r.acknowledge(AID, 1, "a")
    with pytest.raises(AlarmStateConflict) as exc:
        r.acknowledge(AID, 2, "a")
    assert exc.value.state == "active-acknowledged"
    r.clear(AID, 3, "a", "x")
    with pytest.raises(AlarmStateConflict) as exc2:
        r.clear(AID, 4, "a", "x")
    assert exc2.value.state == "cleared-acknowledged"
    r.on_match("w", 5, ROOM, {}, "sec")  # occurrence 2
    with pytest.raises(AlarmStateConflict):
        r.acknowledge(f"{AID}.1", 6, "a")  # the old occurrence is superseded
    with pytest.raises(AlarmNotFound):
        r.acknowledge(f"{AID}.7", 6, "a")


def test_clear_after_falls_due_after_the_last_match() -> None:
    r = rules("after", 600)
    r.on_match("w", 0, ROOM, {}, "sec")
    r.on_match("w", 100, ROOM, {}, "sec")
    assert r.due() == 700  # T after the last match (grouping off: no other deadline)
    assert r.advance(699).transitions == []
    e = r.advance(10_000)
    assert [(t.kind, t.ts, t.actor, t.reason) for t in e.transitions] == [
        ("clear", 700, "rule", "no match for 600s")
    ]
    assert r.due() is None


def test_a_deadline_fires_when_time_passes_it() -> None:
    # as the engine's timers: a match exactly at the deadline comes first (a repeat)
    r = rules("after", 600)
    r.on_match("w", 0, ROOM, {}, "sec")
    e = r.on_match("w", 600, ROOM, {}, "sec")
    assert [(t.kind, t.occurrence) for t in e.transitions] == [("repeat", 1)]
    e = r.on_match("w", 1201, ROOM, {}, "sec")
    assert [(t.kind, t.ts, t.occurrence) for t in e.transitions] == [
        ("clear", 1200, 1),
        ("raise", 1201, 2),
    ]
    assert [t.ts for t in r.advance(1801).transitions] == [1801]  # advance: inclusive


def test_clear_on_companion_match_clears_only_active_alarms_of_its_partition() -> None:
    r = rules("on")
    assert r.on_match("w#clear", 0, ROOM, {"clear": "c0"}).transitions == []  # nothing open
    r.on_match("w", 1, ROOM, {}, "sec")
    r.on_match("w", 1, {"room": "102"}, {}, "sec")
    e = r.on_match("w#clear", 2, ROOM, {"clear": "c1"})
    assert [(t.kind, t.alarm, t.reason) for t in e.transitions] == [
        ("clear", AID, "clear condition: event c1")
    ]
    assert r.on_match("w#clear", 3, ROOM, {"clear": "c2"}).transitions == []  # already cleared
    assert r.on_match("other", 4, ROOM, {}).transitions == []  # a profile without an alarm


def test_notify_list_decides_what_is_delivered() -> None:
    r = rules(notify=("raise", "clear"))
    r.on_match("w", 0, ROOM, {}, "sec")
    e = r.on_match("w", 1, ROOM, {}, "sec")
    assert e.transitions[0].delivery == "none" and e.messages == []
    assert r.stats["sec"]["repeat"] == 1 and r.stats["sec"]["to_notify"] == 1


# ---------------------------------------------------------------------- silences


def test_matchers_follow_alertmanager() -> None:
    labels = {"room": "101", "building": "A"}
    assert Matcher.parse("room=101").matches(labels)
    assert not Matcher.parse("room!=101").matches(labels)
    assert Matcher.parse("room=~10.").matches(labels)
    assert not Matcher.parse("room=~10").matches(labels)  # anchored: a full match
    assert Matcher.parse("room!~2.*").matches(labels)
    assert Matcher.parse('floor=""').matches(labels)  # a missing label reads as ""
    with pytest.raises(SilenceError, match="matchers: bad regex"):
        Matcher.parse("room=~(")
    with pytest.raises(SilenceError, match="expected LABEL=VALUE"):
        Matcher.parse("room")


def test_silenced_alarm_changes_state_but_nothing_is_delivered() -> None:
    r = rules()
    r.add_silence({"matchers": ["room=101"], "for": "1h", "creator": "ops", "comment": "works"}, 0)
    e = r.on_match("w", 10, ROOM, {}, "sec")
    assert e.transitions[0].delivery == "silenced" and e.messages == []
    e = r.on_match("w", 10, {"room": "102"}, {}, "sec")  # not matched: delivered
    assert e.transitions[0].delivery == "sent" and len(e.messages) == 1
    e = r.acknowledge(AID, 20, "ana")
    assert e.transitions[0].after == "active-acknowledged" and e.messages == []
    # the silence ends at 3600: the alarm still active is delivered once
    e = r.advance(3600)
    assert [(m.ts, [n.kind for n in m.notices]) for m in e.messages] == [(3600, ["unsilenced"])]
    assert e.messages[0].notices[0].state == "active-acknowledged"
    assert r.advance(10_000).messages == []  # once


def test_nothing_delivered_after_the_silence_for_a_cleared_alarm() -> None:
    r = rules()
    r.add_silence({"matchers": ["severity=major"], "for": "1h"}, 0)
    r.on_match("w", 10, ROOM, {}, "sec")
    r.clear(AID, 20, "ana", "fixed")
    assert r.advance(10_000).messages == []


def test_notify_after_off() -> None:
    r = rules()
    r.add_silence({"matchers": ["profile=w"], "for": "1h", "notify_after": False}, 0)
    r.on_match("w", 10, ROOM, {}, "sec")
    assert r.advance(10_000).messages == []


def test_expire_silence_delivers_what_it_held_and_stays_in_history() -> None:
    r = rules()
    e = r.add_silence({"matchers": ["subscriber=sec"], "until": 5000}, 0)
    assert e.silence is not None and e.silence.id == "s1"
    r.on_match("w", 10, ROOM, {}, "sec")
    e = r.expire_silence("s1", 100)
    assert e.silence is not None and e.silence.expired_at == 100
    assert [(m.ts, m.notices[0].kind) for m in e.messages] == [(100, "unsilenced")]
    assert "s1" in r.silences
    with pytest.raises(SilenceError, match="already expired"):
        r.expire_silence("s1", 200)
    with pytest.raises(SilenceNotFound):
        r.expire_silence("s9", 200)


def test_overlapping_silences_deliver_when_the_last_ends() -> None:
    r = rules()
    r.add_silence({"matchers": ["room=101"], "for": "1h"}, 0)
    r.add_silence({"matchers": ["profile=w"], "for": "2h"}, 0)
    r.on_match("w", 10, ROOM, {}, "sec")
    assert r.advance(3600).messages == []
    assert [m.ts for m in r.advance(7200).messages] == [7200]


def test_absolute_range_in_the_future() -> None:
    r = rules()
    r.add_silence({"matchers": ["room=101"], "from": 100, "until": 200}, 0)
    assert r.on_match("w", 50, ROOM, {}, "sec").transitions[0].delivery == "sent"
    assert r.on_match("w", 150, ROOM, {}, "sec").transitions[0].delivery == "silenced"
    assert r.on_match("w", 200, ROOM, {}, "sec").transitions[0].delivery == "sent"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"matchers": ["room=1"], "from": 100, "until": 50}, "until"),  # inverted
        ({"matchers": ["room=1"], "from": 0, "until": 50}, "until"),  # past (now = 100)
        ({"matchers": ["room=1"], "weekly": "Mon-Fri 07:00-09:00", "tz": "Mars/Base"}, "tz"),
        ({"matchers": ["room=1"], "weekly": "Mon-Fry 07:00-09:00"}, "weekly"),
        ({"matchers": ["room=1"], "weekly": "Mon-Fri 07:00"}, "weekly"),
        ({"matchers": ["room=1"], "weekly": "Mon 25:00-26:00"}, "weekly"),
        ({"matchers": ["room=~["], "for": "1h"}, "matchers"),
        ({"matchers": [], "for": "1h"}, "matchers"),
        ({"matchers": ["room=1"]}, "until"),
        ({"matchers": ["room=1"], "for": "soon"}, "for"),
        ({"matchers": ["room=1"], "for": "1h", "colour": "red"}, "colour"),
        ({"matchers": ["room=1"], "until": "yesterday"}, "until"),
    ],
)
def test_bad_silence_names_the_field_and_stores_nothing(data: dict, field: str) -> None:
    r = rules()
    with pytest.raises(SilenceError) as exc:
        r.add_silence(data, 100)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"silence {field}: ")
    assert r.silences == {} and r.silence_seq == 0


def _ts(y: int, mo: int, d: int, h: int, mi: int, tz: str = "Europe/Berlin") -> float:
    return datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz)).timestamp()


def test_weekly_window_in_a_zone_is_dst_correct() -> None:
    w = WeeklyWindow.parse("Mon-Fri 07:00-09:00", "Europe/Berlin")
    # Friday 27 March 2026 (CET, UTC+1) and Monday 30 March 2026 (CEST, UTC+2): 07:00 local both
    assert w.contains(_ts(2026, 3, 27, 7, 0)) and w.contains(_ts(2026, 3, 30, 7, 0))
    assert not w.contains(_ts(2026, 3, 30, 6, 59)) and not w.contains(_ts(2026, 3, 30, 9, 0))
    assert not w.contains(_ts(2026, 3, 28, 8, 0))  # Saturday
    assert _ts(2026, 3, 30, 7, 0) - _ts(2026, 3, 27, 7, 0) == 3 * 86400 - 3600  # the lost hour
    assert w.end_after(_ts(2026, 3, 30, 8, 0)) == _ts(2026, 3, 30, 9, 0)
    assert datetime.fromtimestamp(_ts(2026, 3, 30, 7, 0), UTC).hour == 5


def test_weekly_window_wrapping_midnight_and_whole_days() -> None:
    night = WeeklyWindow.parse("Fri 22:00-06:00", "UTC")
    assert night.contains(_ts(2026, 11, 27, 23, 0, "UTC"))  # Friday night
    assert night.contains(_ts(2026, 11, 28, 5, 0, "UTC"))  # Saturday morning
    assert not night.contains(_ts(2026, 11, 28, 23, 0, "UTC"))
    assert night.end_after(_ts(2026, 11, 27, 23, 0, "UTC")) == _ts(2026, 11, 28, 6, 0, "UTC")
    weekend = WeeklyWindow.parse("Sat,Sun 00:00-24:00", "Europe/Berlin")
    assert weekend.contains(_ts(2026, 10, 25, 23, 59))  # the 25-hour Sunday
    assert weekend.end_after(_ts(2026, 10, 24, 12, 0)) == _ts(2026, 10, 25, 0, 0)


def test_weekly_silence_holds_during_the_window_and_delivers_after() -> None:
    r = rules()
    mon7 = _ts(2026, 3, 30, 7, 0)
    r.add_silence(
        {"matchers": ["room=101"], "weekly": "Mon-Fri 07:00-09:00", "tz": "Europe/Berlin"},
        mon7 - 10,
    )
    assert r.on_match("w", mon7 - 5, {"room": "101"}, {}, "sec").transitions[0].delivery == "sent"
    r.clear(AID, mon7 - 4, "a", "x")
    assert r.on_match("w", mon7 + 60, ROOM, {}, "sec").transitions[0].delivery == "silenced"
    e = r.advance(mon7 + 3 * 3600)
    assert [(m.ts, m.notices[0].kind) for m in e.messages] == [(mon7 + 7200, "unsilenced")]


# ---------------------------------------------------------------------- grouping and the cap


def test_grouping_wait_and_interval() -> None:
    r = AlarmRules(
        {"w": AlarmSpec("major", "manual")},
        default=GroupPolicy(("building",), group_wait=30, group_interval=300),
    )
    A1, A2, B1 = (
        {"building": "A", "room": "1"},
        {"building": "A", "room": "2"},
        {"building": "B", "room": "1"},
    )
    r.on_match("w", 0, A1, {}, "night")
    r.on_match("w", 10, A2, {}, "night")
    r.on_match("w", 20, B1, {}, "night")
    e = r.advance(30)
    assert [(m.ts, m.group, len(m.notices)) for m in e.messages] == [(30, {"building": "A"}, 2)]
    e = r.advance(50)
    assert [(m.ts, m.group, len(m.notices)) for m in e.messages] == [(50, {"building": "B"}, 1)]
    r.clear(alarm_id("w", A1), 40, "a", "x")  # (time does not go back: clamped to 50)
    r.clear(alarm_id("w", A2), 100, "a", "x")
    e = r.advance(329)
    assert e.messages == []
    e = r.advance(330)  # group_interval after A's last message
    assert [(m.ts, len(m.notices), m.kind) for m in e.messages] == [(330, 2, "group")]
    # quiet for group_interval: the next transition waits group_wait again
    r.on_match("w", 1000, A1, {}, "night")
    assert r.due() == 1030


def test_without_grouping_each_transition_is_its_own_message_at_once() -> None:
    r = rules()
    e = r.on_match("w", 0, ROOM, {}, "sec")
    assert [(m.ts, m.kind, len(m.notices)) for m in e.messages] == [(0, "single", 1)]


def test_cap_overflow_goes_into_the_next_digest_counted() -> None:
    r = AlarmRules({"w": AlarmSpec("major", "manual")}, default=GroupPolicy(cap_per_hour=2))
    sent = []
    for i in range(5):
        sent += r.on_match("w", i * 60, {"room": str(i)}, {}, "night").messages
    assert [m.ts for m in sent] == [0, 60]
    assert r.due() == 3600  # the hour after the first message
    e = r.advance(4000)
    assert [(m.kind, m.ts, m.overflow, len(m.notices)) for m in e.messages] == [
        ("digest", 3600, 3, 3)
    ]
    assert [n.labels["room"] for n in e.messages[0].notices] == ["2", "3", "4"]
    assert r.stats["night"]["overflow"] == 3 and r.stats["night"]["messages"] == 3
    assert r.stats["night"]["notices"] == 5  # every notice is in some message


# ---------------------------------------------------------------------- state and history


def test_snapshot_is_versioned_json_and_restores_the_same_behaviour() -> None:
    def build() -> AlarmRules:
        return AlarmRules(
            {"w": AlarmSpec("major", "after", 600.0)},
            default=GroupPolicy(("room",), 30, 300, 3),
        )

    a = build()
    a.add_silence({"matchers": ["room=102"], "for": "1h"}, 0)
    for i in range(6):
        a.on_match("w", i * 10, {"room": str(100 + i % 3)}, {"x": f"e{i}"}, "sec")
    snap = json.loads(json.dumps(a.snapshot()))
    assert snap["version"] == 1
    b = AlarmRules.restore(snap, a.specs, default=a.dispatch.default)
    assert b.snapshot() == a.snapshot()
    assert b.due() == a.due()
    ea, eb = a.advance(20_000), b.advance(20_000)
    assert ea == eb
    with pytest.raises(StateError, match="newer"):
        AlarmRules.restore({**snap, "version": 99}, a.specs)


def test_history_query_by_alarm_labels_and_time() -> None:
    r = rules()
    h = History(retention=1000)
    h.extend(r.on_match("w", 0, ROOM, {}, "sec").transitions)
    h.extend(r.on_match("w", 5, {"room": "102"}, {}, "sec").transitions)
    h.extend(r.acknowledge(AID, 10, "ana").transitions)
    assert [t.kind for t in h.query(alarm=AID)] == ["raise", "ack"]
    assert [t.labels["room"] for t in h.query(matchers=[Matcher.parse("room=102")])] == ["102"]
    assert [t.ts for t in h.query(since=5, until=10)] == [5, 10]
    assert h.prune(1005) == 1 and len(h.records) == 2


def test_deadlines_at_one_instant_fire_in_the_documented_order() -> None:
    # the clear falls due at 50 exactly when the group's next message does: it is in it
    r = AlarmRules(
        {"w": AlarmSpec("major", "after", 50.0, None, ("raise", "ack", "clear"))},
        default=GroupPolicy(("room",), group_wait=0, group_interval=50),
    )
    assert len(r.on_match("w", 0, ROOM, {}, "sec").messages) == 1
    r.acknowledge(AID, 40, "ana")
    e = r.advance(50)
    assert [[n.kind for n in m.notices] for m in e.messages] == [["ack", "clear"]]


def test_a_notice_exactly_group_interval_after_the_last_message_waits_group_wait() -> None:
    r = AlarmRules(
        {"w": AlarmSpec("major", "manual")},
        default=GroupPolicy(("room",), group_wait=10, group_interval=50),
    )
    r.on_match("w", 0, ROOM, {}, "sec")
    assert [m.ts for m in r.advance(10).messages] == [10]
    r.clear(AID, 60, "ana", "x")  # 60 = last message + group_interval: a fresh group
    assert r.due() == 70


def test_a_matcher_that_matches_no_current_label_is_stored_with_a_warning() -> None:
    r = rules()
    r.on_match("w", 0, ROOM, {}, "sec")
    e = r.add_silence({"matchers": ["room=101", "building=Z"], "for": "1h"}, 10)
    assert e.silence is not None and "s1" in r.silences
    assert e.warnings == ["silence s1: matcher building=Z matches no current alarm's labels"]


def test_a_repeat_after_a_change_of_fixed_labels_carries_the_new_ones() -> None:
    """Transitions share their alarm's labels, made once per occurrence: a repeat that moves
    the fixed labels (`alarm: labels:`, e.g. a registry change) makes them again."""
    rules = AlarmRules({"p": AlarmSpec("major", labels=(("zone", "north"),))})
    first = rules.on_match("p", 1.0, {"room": "1"}).transitions[0]
    rules.specs["p"] = AlarmSpec("major", labels=(("zone", "south"),))
    again = rules.on_match("p", 2.0, {"room": "1"}).transitions[0]
    assert (first.labels["zone"], again.labels["zone"]) == ("north", "south")
    assert first.labels["room"] == again.labels["room"] == "1"
