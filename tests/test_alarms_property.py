"""The alarm rules against a brute-force model (tests/alarm_model.py): any interleaving of
matches, clear conditions, acks, clears, silences and time gives the same transitions and the
same messages (and the same refusals)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifiers.alarms import (
    AlarmNotFound,
    AlarmRules,
    AlarmStateConflict,
    Effects,
    GroupPolicy,
    SilenceError,
    alarm_id,
)
from profiles.alarm import AlarmSpec
from tests.alarm_model import Model, ModelError

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

SPECS = {
    "p": AlarmSpec("major", "after", 50.0, None, ("raise", "ack", "clear")),
    "q": AlarmSpec("minor", "on", None, "k = 1", ("raise", "repeat", "ack", "clear")),
    "r": AlarmSpec("critical", "manual", None, None, ("raise",)),
}
SUBSCRIBER = {"p": "night", "q": "night", "r": "day"}
ROOMS = ("1", "2", "3")
MATCHERS = (
    "room=1", "room!=2", "room=~[12]", "profile=p", "severity=major", "subscriber=night",
    "room!~3",
)  # fmt: skip

match = st.tuples(
    st.just("match"), st.sampled_from(("p", "q", "r", "q#clear")), st.sampled_from(ROOMS)
)
op = st.one_of(
    match,
    match,
    match,
    st.tuples(st.just("ack"), st.sampled_from(("p", "q", "r", "x")), st.sampled_from(ROOMS),
              st.sampled_from(("", ".1", ".2"))),
    st.tuples(st.just("clear"), st.sampled_from(("p", "q", "r", "x")), st.sampled_from(ROOMS),
              st.sampled_from(("", ".1", ".2"))),
    st.tuples(st.just("silence"), st.lists(st.sampled_from(MATCHERS), min_size=1, max_size=2),
              st.sampled_from((0, 10, 20)), st.sampled_from((1, 10, 20, 50, 200)), st.booleans()),
    st.tuples(st.just("expire"), st.integers(1, 4)),
    st.tuples(st.just("advance"),),
)  # fmt: skip
# round steps make instants coincide (a match exactly at a deadline, an hour to the second)
DT = st.sampled_from((0, 0, 1, 10, 10, 20, 50, 100))
steps = st.lists(st.tuples(DT, op), min_size=10, max_size=60)
policy = st.fixed_dictionaries(
    {
        "group_by": st.sampled_from((None, ("room",), ())),
        "wait": st.sampled_from((0, 10, 20)),
        "interval": st.sampled_from((0, 10, 20, 50)),
        "cap": st.sampled_from((None, 1, 2, 4)),
    }
)


def _tr(t: Any) -> dict[str, Any]:
    keys = ("kind", "alarm", "occurrence", "ts", "actor", "before", "after", "count",
            "first_seen", "last_seen", "delivery")  # fmt: skip
    return {k: getattr(t, k) for k in keys}


def _msg(m: Any) -> dict[str, Any]:
    return {
        "subscriber": m.subscriber, "ts": m.ts, "kind": m.kind, "group": m.group,
        "notices": [{"kind": n.kind, "alarm": n.alarm, "occurrence": n.occurrence,
                     "state": n.state} for n in m.notices],
        "overflow": m.overflow,
    }  # fmt: skip


def _ref(profile: str, room: str, occ: str) -> str:
    return alarm_id(profile, {"room": room}) + occ


@settings(max_examples=500, deadline=None, derandomize=True)
@given(steps, policy, policy, st.booleans())
def test_rules_agree_with_the_brute_force_model(
    ops: list[Any], night: dict[str, Any], day: dict[str, Any], restore: bool
) -> None:
    policies = {"night": night, "day": day}
    rules = AlarmRules(
        SPECS,
        {
            s: GroupPolicy(p["group_by"], p["wait"], p["interval"], p["cap"], cap_window=100)
            for s, p in policies.items()
        },
    )
    model = Model(SPECS, policies)
    got: list[Effects] = []
    t = 0
    for i, (dt, (kind, *args)) in enumerate(ops):
        t += dt
        real_err = model_err = None
        try:
            if kind == "match":
                prof, room = args
                sub = SUBSCRIBER.get(prof.split("#")[0], "")
                got.append(rules.on_match(prof, t, {"room": room}, {"c": f"e{i}"}, sub))
            elif kind == "ack":
                got.append(rules.acknowledge(_ref(*args), t, "ana"))
            elif kind == "clear":
                got.append(rules.clear(_ref(*args), t, "ana", "by hand"))
            elif kind == "silence":
                matchers, start, length, after = args
                data = {"matchers": matchers, "from": t + start, "for": f"{length}s",
                        "notify_after": after}  # fmt: skip
                got.append(rules.add_silence(data, t))
            elif kind == "expire":
                got.append(rules.expire_silence(f"s{args[0]}", t))
            else:
                got.append(rules.advance(t))
        except AlarmNotFound:
            real_err = "not-found"
        except AlarmStateConflict:
            real_err = "conflict"
        except SilenceError:
            real_err = "silence"
        try:
            if kind == "match":
                prof, room = args
                sub = SUBSCRIBER.get(prof.split("#")[0], "")
                model.op(t, model.match, prof, {"room": room}, sub)
            elif kind == "ack":
                model.op(t, model.ack, _ref(*args), "ana")
            elif kind == "clear":
                model.op(t, model.clear, _ref(*args), "ana")
            elif kind == "silence":
                matchers, start, length, after = args
                model.op(t, model.add_silence, matchers, t + start, length, after)
            elif kind == "expire":
                model.op(t, model.expire, f"s{args[0]}")
            else:
                model.op(t, lambda _t: None)
        except ModelError as e:
            model_err = e.kind
        assert real_err == model_err, (i, kind, args)
        if restore and i % 3 == 2:  # the snapshot carries everything, at any point
            snap = json.loads(json.dumps(rules.snapshot()))
            rules = AlarmRules.restore(snap, SPECS, rules.dispatch.policies)
    end = t + 1000
    got.append(rules.advance(end))
    model.run_to(end)
    transitions = [_tr(x) for e in got for x in e.transitions]
    assert transitions == model.transitions
    assert [_msg(m) for e in got for m in e.messages] == model.messages
    # every notice sent is in exactly one message: the cap holds back, never drops
    sent = sum(1 for x in transitions if x["delivery"] == "sent") + sum(
        c["unsilenced"] for c in rules.stats.values()
    )
    assert sent == sum(len(m.notices) for e in got for m in e.messages)
