"""`ens replay --alarms`: matches through the alarm rules in event time (ens/alarm_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ens.cli import app
from notifiers.alarms import alarm_id

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

PROFILES = """\
profiles:
  - id: hot
    subscriber: hvac
    expr: 'seq(t: kind = "temperature" and value > 20) per room'
    alarm: {severity: major, clear: after 10m}
  - id: window
    subscriber: security
    expr: 'seq(w: kind = "window" and state = "open") per building, room'
    alarm:
      severity: minor
      clear: {on: 'kind = "window" and state = "closed"'}
      notify: [raise, clear]
  - id: plain
    expr: kind = "window"
subscribers:
  - id: hvac
    channels: [{email: "hvac@example.org"}]
  - id: security
    channels: [{email: "security@example.org"}]
"""


def _write(tmp: Path, events: list[dict]) -> tuple[Path, Path]:
    p, e = tmp / "p.yaml", tmp / "e.jsonl"
    p.write_text(PROFILES)
    e.write_text("".join(json.dumps(x) + "\n" for x in events))
    return p, e


def _run(args: list[str]) -> tuple[list[dict], str]:
    r = CliRunner().invoke(app, ["replay", "--alarms", *args])
    assert r.exit_code == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()], r.stderr


def test_quickstart_example_clear_after_in_event_time(tmp_path: Path) -> None:
    p, _ = _write(tmp_path, [])
    out, err = _run([str(p), str(EXAMPLES / "quickstart" / "events.jsonl")])
    hot = [
        (t["kind"], t["occurrence"], t["reason"]) for t in out if t["labels"]["profile"] == "hot"
    ]
    # t1 22:00 raises; 22:10 "no match for 10m" clears; t3 22:20 re-arms; t4 22:50 again
    assert hot == [
        ("raise", 1, "match"),
        ("clear", 1, "no match for 600s"),
        ("raise", 2, "re-arm"),
        ("clear", 2, "no match for 600s"),
        ("raise", 3, "re-arm"),
        ("clear", 3, "no match for 600s"),  # due 23:00, the last event's time: fires
    ]
    assert [t["ts"] for t in out] == sorted(t["ts"] for t in out)  # event time order
    assert "alarms per subscriber" in err and "hvac" in err


def _window(i: int, ts: int, room: str, state: str, building: str = "A") -> dict:
    return {"id": f"e{i}", "ts": ts, "kind": "window", "state": state, "room": room,
            "building": building}  # fmt: skip


def test_clear_on_expression_in_the_same_step_for_the_same_partition(tmp_path: Path) -> None:
    events = [
        _window(1, 100, "1", "open"),
        _window(2, 110, "2", "open"),
        _window(3, 120, "1", "open"),  # repeat
        _window(4, 130, "2", "closed"),  # clears room 2 only
        _window(5, 140, "1", "closed", building="B"),  # another partition: nothing
        _window(6, 150, "1", "closed"),  # clears room 1
        _window(7, 160, "1", "closed"),  # already cleared: nothing
        _window(8, 170, "1", "open"),  # re-arm
    ]
    p, e = _write(tmp_path, events)
    out, _ = _run([str(p), str(e)])
    got = [(t["kind"], t["labels"]["room"], t["ts"], t["occurrence"]) for t in out]
    assert got == [
        ("raise", "1", 100, 1),
        ("raise", "2", 110, 1),
        ("repeat", "1", 120, 1),
        ("clear", "2", 130, 1),
        ("clear", "1", 150, 1),
        ("raise", "1", 170, 2),
    ]
    clear = next(t for t in out if t["kind"] == "clear")
    assert clear["reason"] == "clear condition: event e4" and clear["actor"] == "rule"
    assert clear["alarm"] == alarm_id("window", {"building": "A", "room": "2"})
    assert next(t for t in out if t["kind"] == "repeat")["delivery"] == "none"  # not in notify


def test_storm_grouped_silenced_and_capped_summary(tmp_path: Path) -> None:
    # 60 rooms in two buildings open and close their windows over an hour
    events, i = [], 0
    for k in range(60):
        b, room = "AB"[k % 2], str(100 + k)
        events.append(_window(i := i + 1, 1000 + k * 30, room, "open", b))
        events.append(_window(i := i + 1, 1000 + k * 30 + 600, room, "closed", b))
    events.sort(key=lambda x: x["ts"])
    p, e = _write(tmp_path, events)
    sil = tmp_path / "s.yaml"
    sil.write_text(
        "silences:\n  - matchers: [building=B]\n    from: 0\n    until: 100000\n"
        "    creator: ops\n    comment: contractor in B\n"
    )
    msgs = tmp_path / "m.jsonl"
    out, err = _run([str(p), str(e), "--messages", str(msgs)])
    plain = [json.loads(x) for x in msgs.read_text().splitlines()]
    assert len(out) == 120 and len(plain) == 120  # one message per raise and per clear
    out, err = _run(
        [str(p), str(e), "--silences", str(sil), "--group-by", "building", "--group-wait",
         "30s", "--group-interval", "5m", "--messages", str(msgs)]
    )  # fmt: skip
    grouped = [json.loads(x) for x in msgs.read_text().splitlines()]
    assert sum(t["delivery"] == "silenced" for t in out) == 60  # building B: recorded, not sent
    assert {m["group"]["building"] for m in grouped} == {"A"}
    # every notice of A, in few messages, or still waiting for its group at the end
    assert sum(len(m["notices"]) for m in grouped) + _pending(err) == 60
    assert len(grouped) < 20
    assert "security" in err and "silenced" in err
    # the cap: 5 an hour; the replay runs on past the events until the digest is due
    out, err = _run([str(p), str(e), "--cap", "5", "--until", "8000", "--messages", str(msgs)])
    capped = [json.loads(x) for x in msgs.read_text().splitlines()]
    digests = [m for m in capped if m["kind"] == "digest"]
    sent = sum(len(m["notices"]) for m in capped)
    assert digests and all(m["overflow"] == len(m["notices"]) for m in digests)
    assert len(capped) - len(digests) == 5
    assert sent + _pending(err) == 120  # counted, never dropped: sent, or still held at the end


def _pending(summary: str) -> int:
    """The security row's last column (pending at the end) of the summary table."""
    row = next(line for line in summary.splitlines() if "security" in line)
    return int(row.split("│")[-2].strip().replace(",", ""))


def test_bad_silences_file_and_option_misuse(tmp_path: Path) -> None:
    p, e = _write(tmp_path, [_window(1, 100, "1", "open")])
    sil = tmp_path / "s.yaml"
    sil.write_text("silences:\n  - matchers: [room=1]\n    weekly: Mon-Fri 07:00\n")
    r = CliRunner().invoke(app, ["replay", "--alarms", str(p), str(e), "--silences", str(sil)])
    assert r.exit_code == 2
    assert f"{sil}: silence #1: silence weekly: 'Mon-Fri 07:00': expected DAYS" in r.stderr
    assert "Traceback" not in r.stderr
    r = CliRunner().invoke(app, ["replay", str(p), str(e), "--silences", str(sil)])
    assert r.exit_code == 2 and "go with --alarms" in r.stderr


def test_replay_without_alarms_is_unchanged(tmp_path: Path) -> None:
    p, e = _write(tmp_path, [_window(1, 100, "1", "open"), _window(2, 130, "1", "closed")])
    r = CliRunner().invoke(app, ["replay", str(p), str(e)])
    assert r.exit_code == 0
    profiles = [json.loads(x)["profile"] for x in r.stdout.splitlines()]
    assert sorted(profiles) == ["plain", "plain", "window"]  # no companion profile


AFTER = """\
profiles:
  - id: hot
    subscriber: hvac
    expr: 'seq(t: kind = "temperature" and value > 20) per room'
    alarm: {clear: after 10m, notify: [raise, repeat, clear]}
  - id: leak
    subscriber: hvac
    expr: kind = "leak"
    alarm: {clear: after 5m}
  - id: pair
    subscriber: hvac
    expr: 'seq(a: kind = "leak", b: kind = "leak") within 1h per room'
    alarm: {clear: after 5m}
"""


def test_clear_after_companion_is_an_absent_terminator() -> None:
    from profiles.alarm import clear_companion
    from profiles.profile_file import parse_profile_document

    pset, _ = parse_profile_document(AFTER, "a.yaml")
    comps = {p.id: clear_companion(p, pset.alarms[p.id]) for p in pset.profiles}
    assert comps["hot"] is not None and comps["hot"].source == "absent(<hot>) within 600s per room"
    assert comps["leak"] is not None and comps["leak"].per == ()
    assert comps["pair"] is None  # a match of two events is no event: the rules' timer clears it


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from((0, 60, 60, 300, 600, 900)),
            st.sampled_from(("temperature", "leak")),
            st.sampled_from(("1", "2")),
            st.integers(15, 30),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from((None, 0, 600, 3600)),
)
def test_clear_after_in_the_engine_agrees_with_the_rules_timer(
    steps: list[tuple[int, str, str, int]], extra: int | None
) -> None:
    """The companion `absent(F) within T per P`, detected by the engine in its single step,
    clears exactly when the alarm rules' own timer would (ties included)."""
    from ens.alarm_replay import replay_alarms
    from ens.replay import replay
    from filters.engine import Engine
    from profiles.events import event_from_obj
    from profiles.profile_file import parse_profile_document

    pset, _ = parse_profile_document(AFTER, "a.yaml")
    events, ts = [], 1_000_000
    for i, (dt, kind, room, value) in enumerate(steps):
        ts += dt
        obj = {"id": f"e{i}", "ts": ts, "kind": kind, "room": room, "value": value}
        events.append(event_from_obj(obj, f"e{i}"))
    until = None if extra is None else ts + extra

    from notifiers.alarms import alarm_id

    fired: set[tuple[float, str]] = set()  # the companions' notifications: (ts, alarm id)

    def run(keep_companions: bool):  # noqa: ANN202
        def notify(profiles: list) -> list:  # noqa: ANN001
            ps = [p for p in profiles if keep_companions or not p.id.endswith("#clear")]
            notes = replay(ps, events, until, engine=Engine(ps))
            fired.update(
                (n.ts, alarm_id(n.profile.split("#")[0], n.partition))
                for n in notes
                if n.profile.endswith("#clear")
            )
            return notes

        return replay_alarms(pset.profiles, pset.alarms, notify, events, until)

    engine, timer = run(True), run(False)
    # the same transitions at the same times; two alarms' clears at one instant may come in
    # another order (the engine's detection order, the timer's key order): `seq` aside
    assert _by_time(engine.transitions) == _by_time(timer.transitions)
    assert _by_time(engine.messages) == _by_time(timer.messages)
    # and each clear of a one-filter profile was detected by the engine (its companion)
    for t in engine.transitions:
        if t.kind == "clear" and t.labels["profile"] != "pair":
            assert (t.ts, t.alarm) in fired


def _by_time(records: list) -> list:  # noqa: ANN001
    out = [{k: v for k, v in r.to_json().items() if k not in ("seq", "id")} for r in records]
    return sorted(out, key=lambda d: json.dumps(d, sort_keys=True))
