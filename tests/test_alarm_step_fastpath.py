"""The alarm step's shortcuts give what the general way gives (issue 35, alarms on within 10 %
of alarms off):

- the rules answer "is anything due?" from a lower bound of the next deadline (`_lo`) before
  looking at the heap: same effects and snapshots as the exact look-up, after every call;
- an alarm message is written with each notice serialised once (`AlarmPart._alarm_message`):
  the same outbox bytes as the record built as a dict (`_alarm_record`);
- a step's label sets go to Redis in one script call (`alarm_store.index_many`): the same sets
  as one SADD per alarm and label (`index_labels`);
- a subscriber's message times are kept only under a cap: a cap set later counts from then.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.service import alarm_store as als
from adapters.service.alarm_worker import AlarmPart
from notifiers.alarms import AlarmNotFound, AlarmRules, AlarmStateConflict, Effects, GroupPolicy
from notifiers.alarms.model import alarm_id
from notifiers.errors import SilenceError
from notifiers.records import OutboxRecord
from profiles.alarm import AlarmSpec

SPECS = {
    "p": AlarmSpec("major", "after", 30.0, None, ("raise", "ack", "clear")),
    "q": AlarmSpec("minor", "on", None, "k = 1", ("raise", "repeat", "clear")),
}
SUBS = {"p": "night", "q": "day"}


class Exact(AlarmRules):
    """The rules with every "is anything due?" answered from the heap (the way before `_lo`)."""

    def _due_by(self, t: float, inclusive: bool) -> bool:
        nxt = self._next()
        return nxt is not None and (nxt[0] < t or (inclusive and nxt[0] == t))


def _ops(seed: int, n: int = 400) -> list[tuple[Any, ...]]:
    rnd = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rnd.choice((0, 0, 0.5, 1, 5, 10, 30, 31))
        kind = rnd.choice(
            ("match", "match", "match", "clearing", "ack", "clear", "advance", "silence", "expire")
        )
        out.append((kind, t, rnd.choice("pq"), str(rnd.randrange(3)), i))
    return out


def _apply(rules: AlarmRules, op: tuple[Any, ...]) -> Effects:
    kind, t, prof, room, i = op
    try:
        if kind == "match":
            return rules.on_match(prof, t, {"room": room}, {"e": f"e{i}"}, SUBS[prof])
        if kind == "clearing":
            return rules.on_match(f"{prof}#clear", t, {"room": room}, {"e": f"e{i}"}, SUBS[prof])
        if kind == "ack":
            return rules.acknowledge(alarm_id(prof, {"room": room}), t, "ana")
        if kind == "clear":
            return rules.clear(alarm_id(prof, {"room": room}), t, "ana", "fixed")
        if kind == "silence":
            data = {"matchers": [f"room={room}"], "for": f"{1 + i % 40}s", "comment": "c"}
            return rules.add_silence(data, t)
        if kind == "expire":
            return rules.expire_silence(f"s{1 + i % 4}", t)
    except (AlarmNotFound, AlarmStateConflict, SilenceError):
        return Effects()
    return rules.advance(t)


def _effects(e: Effects) -> dict[str, Any]:
    return {
        "transitions": [t.to_json() for t in e.transitions],
        "messages": [m.to_json() for m in e.messages],
        "silence": e.silence.to_json() if e.silence is not None else None,
        "warnings": e.warnings,
    }


@pytest.mark.fast
@pytest.mark.parametrize("cap", [None, 2])
@pytest.mark.parametrize("seed", range(10))
def test_the_due_bound_answers_as_the_heap_does(seed: int, cap: int | None) -> None:
    policies = {
        "night": GroupPolicy(None, cap_per_hour=cap, cap_window=60),
        "day": GroupPolicy(("room",), 0 if seed % 2 else 10, 20, cap, cap_window=60),
    }
    fast, exact = AlarmRules(SPECS, policies), Exact(SPECS, policies)
    delivered = 0
    for op in _ops(seed):
        got, want = _apply(fast, op), _apply(exact, op)
        assert _effects(got) == _effects(want), op
        assert fast.snapshot() == exact.snapshot(), op
        delivered += len(got.messages)
    assert delivered > 20


@pytest.mark.fast
@pytest.mark.parametrize("setting", ["capped", "grouped", "silenced"])
@pytest.mark.parametrize("seed", range(6))
def test_on_matches_is_on_match_of_each_the_exact_way(seed: int, setting: str) -> None:
    """A commit's matches in one call (idle clears dropped, raises, repeats and clears the
    short way where they can go it) against each alone, the exact way."""
    if setting == "grouped":
        policies = {"day": GroupPolicy(("room",), 0 if seed % 2 else 10, 20)}
        default = GroupPolicy(None, cap_per_hour=3, cap_window=60)
    else:
        policies, default = {}, GroupPolicy(None, cap_per_hour=3, cap_window=60)
    many, each = AlarmRules(SPECS, policies, default), Exact(SPECS, policies, default)
    if setting == "silenced":
        for rules in (many, each):
            rules.add_silence({"matchers": ["room=1"], "for": "40s", "comment": "c"}, 0.0)
    ops = _ops(seed)
    for lo in range(0, len(ops), 25):
        matches = [
            (
                prof if kind == "match" else f"{prof}#clear",
                t,
                {"room": room},
                {"e": f"e{i}"},
                SUBS[prof],
            )
            for kind, t, prof, room, i in ops[lo : lo + 25]
            if kind in ("match", "clearing")
        ]
        want = Effects()
        for m in matches:
            want.extend(each.on_match(*m))
        assert _effects(many.on_matches(matches)) == _effects(want)
        assert many.snapshot() == each.snapshot()
        end = ops[min(lo + 25, len(ops) - 1)][1]
        assert _effects(many.advance(end)) == _effects(each.advance(end))
    assert many.stats["night"]["messages"] > 5


def _messages(seed: int) -> list[Any]:
    """Messages of every kind: singles (one routed elsewhere), groups, digests."""
    rnd = random.Random(seed)
    specs = {
        "p": AlarmSpec("major", "manual", None, None, ("raise", "ack", "clear")),
        "q": AlarmSpec("critical", "manual", None, None, ("raise", "repeat", "clear")),
    }
    policies = {
        "night": GroupPolicy(None, cap_per_hour=3, cap_window=60),
        "day": GroupPolicy(("building",), 5, 10),
    }
    rules = AlarmRules(specs, policies)
    msgs: list[Any] = []
    t = 0.0
    for i in range(300):
        t += rnd.choice((0, 1, 3, 7))
        prof = rnd.choice("pq")
        part = {"building": rnd.choice(("A", "B", "Ü ☃")), "room": str(rnd.randrange(4))}
        eff = rules.on_match(
            prof,
            t,
            part,
            {"e": f"e{i}", "f": f"é{i}"},
            {"p": "night"}[prof] if prof == "p" else "day",
        )
        msgs.extend(eff.messages)
    msgs.extend(rules.advance(t + 3600).messages)
    return msgs


@pytest.mark.fast
@pytest.mark.parametrize("seed", range(3))
def test_an_alarm_message_is_written_as_its_record_byte_for_byte(seed: int) -> None:
    part: Any = SimpleNamespace(epoch="ep1")
    part._alarm_record = lambda m: AlarmPart._alarm_record(part, m)
    msgs = _messages(seed)
    kinds = {m.kind for m in msgs}
    assert kinds == {"single", "group", "digest"}, kinds
    for msg in msgs:
        want = OutboxRecord(AlarmPart._alarm_record(part, msg)).blob()
        assert OutboxRecord(AlarmPart._alarm_message(part, msg)).blob() == want
    # routed to a subscriber other than the profile's: the key names it
    other = msgs[0].__class__(**{**_fields(msgs[0]), "subscriber": "desk"})
    got = OutboxRecord(AlarmPart._alarm_message(part, other)).blob()
    assert got == OutboxRecord(AlarmPart._alarm_record(part, other)).blob()
    # an empty digest (no notices) and a value beyond orjson (the dict's way, same check)
    empty = msgs[0].__class__(**{**_fields(msgs[0]), "notices": (), "kind": "digest"})
    got = OutboxRecord(AlarmPart._alarm_message(part, empty)).blob()
    assert got == OutboxRecord(AlarmPart._alarm_record(part, empty)).blob()
    huge = msgs[0].__class__(**{**_fields(msgs[0]), "overflow": 1 << 70})
    got = OutboxRecord(AlarmPart._alarm_message(part, huge)).blob()
    assert got == OutboxRecord(AlarmPart._alarm_record(part, huge)).blob()


def _fields(msg: Any) -> dict[str, Any]:
    return {k: getattr(msg, k) for k in msg.__dataclass_fields__}


@pytest.mark.fast
def test_a_cap_set_later_counts_the_hour_from_then() -> None:
    """Without a cap no message time is kept (nothing reads them); restored under a cap of 2
    an hour, the next two messages go out and the third waits for the digest."""
    spec = {"p": AlarmSpec("major", "manual", None, None, ("raise", "clear"))}
    free = AlarmRules(spec)
    for i in range(5):
        assert len(free.on_match("p", float(i), {"room": str(i)}, {}, "night").messages) == 1
    snap = free.snapshot()
    assert snap["dispatch"]["outlets"]["night"]["sent"] == []
    capped = AlarmRules.restore(snap, spec, default=GroupPolicy(None, cap_per_hour=2))
    sent = [capped.on_match("p", 10.0 + i, {"room": f"x{i}"}, {}, "night") for i in range(3)]
    assert [len(e.messages) for e in sent] == [1, 1, 0]
    assert capped.snapshot()["dispatch"]["outlets"]["night"]["sent"] == [10.0, 11.0]


@pytest.mark.redis
def test_a_steps_label_sets_are_those_of_each_alarm(rt: Any) -> None:
    """One script call per 2,000 members (sets of one member and of more than a chunk)."""
    rnd = random.Random(5)
    raised = [
        (f"a{i}", {"room": f"r{rnd.randrange(900)}", "building": "B", "profile": "p"})
        for i in range(als.SETS_CHUNK + 700)
    ]
    with rt.pipeline(transaction=True) as p:
        als.index_many(p, raised)
        commands = len(p.command_stack)
        p.execute()
    assert commands <= 10  # 8,100 members of 902 sets: not one SADD per set
    got = {k: rt.smembers(k) for k in rt.keys(als.BY_LABEL + "*")}
    rt.flushdb()
    with rt.pipeline(transaction=False) as p:
        for aid, labels in raised:
            als.index_labels(p, aid, labels)
        p.execute()
    want = {k: rt.smembers(k) for k in rt.keys(als.BY_LABEL + "*")}
    assert got == want
    assert len(got[als.label_key("building", "B")]) == len(raised)


@pytest.mark.fast
def test_message_times_of_an_older_snapshot_count_only_under_a_cap() -> None:
    """A snapshot of a build that kept the times without a cap: restored without a cap they
    are dropped (nothing would ever read or forget them); under a cap they count."""
    spec = {"p": AlarmSpec("major", "manual", None, None, ("raise", "clear"))}
    rules = AlarmRules(spec)
    rules.on_match("p", 100.0, {"room": "1"}, {}, "night")
    snap = rules.snapshot()
    snap["dispatch"]["outlets"]["night"]["sent"] = [98.0, 99.0, 100.0]
    free = AlarmRules.restore(snap, spec)
    assert free.snapshot()["dispatch"]["outlets"]["night"]["sent"] == []
    capped = AlarmRules.restore(snap, spec, default=GroupPolicy(None, cap_per_hour=4))
    assert capped.snapshot()["dispatch"]["outlets"]["night"]["sent"] == [98.0, 99.0, 100.0]
    assert len(capped.on_match("p", 101.0, {"room": "2"}, {}, "night").messages) == 1
    assert capped.on_match("p", 102.0, {"room": "3"}, {}, "night").messages == []
