"""The rules' shortcuts give what the general way gives: a notice for a subscriber without
grouping is sent at once when nothing else is due (`AlarmRules._op`, `Dispatcher.single`)
instead of through a group, a timer and an advance, and `on_matches` is `on_match` of each.
Same transitions, same messages (ids included), same snapshot, after every call."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from notifiers.alarms import AlarmNotFound, AlarmRules, AlarmStateConflict, Effects, GroupPolicy
from notifiers.alarms.model import Notice, alarm_id
from profiles.alarm import AlarmSpec

pytestmark = pytest.mark.fast

SPECS = {
    "p": AlarmSpec("major", "after", 30.0, None, ("raise", "ack", "clear")),
    "q": AlarmSpec("minor", "on", None, "k = 1", ("raise", "repeat", "clear")),
}
SUBS = {"p": "night", "q": "day"}


class General(AlarmRules):
    """The rules with every notice queued to its group (the way before the shortcut)."""

    def _queue(self, notice: Notice, sub: str, t: float) -> None:
        instant, self._instant = self._instant, None
        try:
            super()._queue(notice, sub, t)
        finally:
            self._instant = instant


def _effects(e: Effects) -> dict[str, Any]:
    return {
        "transitions": [t.to_json() for t in e.transitions],
        "messages": [m.to_json() for m in e.messages],
    }


def _ops(seed: int, n: int = 300) -> list[tuple[Any, ...]]:
    rnd = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rnd.choice((0, 0, 1, 5, 10, 30))
        kind = rnd.choice(("match", "match", "match", "clearing", "ack", "advance"))
        out.append((kind, t, rnd.choice("pq"), str(rnd.randrange(3)), i))
    return out


def _apply(rules: AlarmRules, op: tuple[Any, ...]) -> Effects:
    kind, t, prof, room, i = op
    if kind == "match":
        return rules.on_match(prof, t, {"room": room}, {"e": f"e{i}"}, SUBS[prof])
    if kind == "clearing":
        return rules.on_match("q#clear", t, {"room": room}, {"e": f"e{i}"}, "day")
    if kind == "ack":
        try:
            return rules.acknowledge(alarm_id(prof, {"room": room}), t, "ana")
        except (AlarmNotFound, AlarmStateConflict):
            return Effects()
    return rules.advance(t)


@pytest.mark.parametrize("cap", [None, 2])
@pytest.mark.parametrize("seed", range(8))
def test_a_notice_sent_at_once_is_the_message_its_group_would_send(
    seed: int, cap: int | None
) -> None:
    policies = {
        "night": GroupPolicy(None, cap_per_hour=cap, cap_window=60),
        "day": GroupPolicy(("room",), 10, 20, cap, cap_window=60),
    }
    fast, general = AlarmRules(SPECS, policies), General(SPECS, policies)
    sent = 0
    for op in _ops(seed):
        got, want = _apply(fast, op), _apply(general, op)
        assert _effects(got) == _effects(want), op
        assert fast.snapshot() == general.snapshot(), op
        sent += len(got.messages)
    assert sent > 20  # the shortcut was taken (and the cap held some back)


@pytest.mark.parametrize("seed", range(4))
def test_on_matches_is_on_match_of_each(seed: int) -> None:
    policy = GroupPolicy(None, cap_per_hour=3, cap_window=60)
    one, many = AlarmRules(SPECS, default=policy), AlarmRules(SPECS, default=policy)
    matches = [
        (prof if kind == "match" else "q#clear", t, {"room": room}, {"e": f"e{i}"}, SUBS[prof])
        for kind, t, prof, room, i in _ops(seed)
        if kind in ("match", "clearing")
    ]
    each = Effects()
    for m in matches:
        each.extend(one.on_match(*m))
    assert _effects(many.on_matches(matches)) == _effects(each)
    assert json.dumps(many.snapshot()) == json.dumps(one.snapshot())
