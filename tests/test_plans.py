"""Evaluation plans (issue 16): which shapes go rare-first, what auto picks from rates, the CLI.

Equality of the output with the eager engine is tested in test_differential.py (hypothesis,
eager vs rare-first vs two-step) and test_conformance.py (every case with --plan rare-first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ens.cli import app
from ens.plans import count_stats
from filters.engine import Engine
from filters.plans.choose import Rates, costs
from filters.rarefirst.lazy import LazySeqRuntime
from profiles.events import Event
from profiles.parser import parse_profile

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

runner = CliRunner()

SEQ = 'seq(t: kind = "temperature", w: kind = "window") within 30m per room'


def _plan(text: str, mode: str = "rare-first", rates: Rates | None = None):  # noqa: ANN202
    p = parse_profile(text, "p")
    return Engine([], plan=mode, rates=rates).plan_of(p)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('kind = "x"', "a filter"),
        ('absent(kind = "x") within 1m', "absent"),
        ("any(a: k = 1, b: k = 2)", "any(...)"),
        ("all(a: k = 1, b: k = 2) within 1m", "seq(...) only"),
        ("seq(a: k = 1, b: seq(c: k = 2, d: k = 3)) within 1m", "nested"),
        ("seq(a: k = 1, not x: k = 9, b: k = 2) within 1m", "negated"),
        ("seq(a: k = 1, not x: k = 9) within 1m", "negated"),
        ('seq(n: clock("22:00"), a: k = 1) within 1h', "clock"),
        ("seq(a: k = 1, b: k = 2)", "no within"),
        ("seq(a: k = 1, b: k = 2) within 1m select last", "select last"),
        ("seq(a: k = 1, b: k = 2) within 1m select nth 2", "select nth"),
        ("seq(a: k = 1) within 1m", "one component"),
    ],
)
def test_shapes_that_stay_eager_say_why(text: str, why: str) -> None:
    plan = _plan(text)
    assert not plan.lazy
    assert why in plan.reason


@pytest.mark.parametrize(
    "sel", ["", "select first", "select each consume shared", "select each consume unique"]
)
def test_rare_first_shapes_are_driven_by_the_last_component(sel: str) -> None:
    plan = _plan(f"{SEQ} where w.v > t.v {sel}")
    assert plan.lazy and plan.opener == "w"
    eng = Engine([parse_profile(f"{SEQ} {sel}", "p")], plan="rare-first")
    assert isinstance(eng._by_id["p"], LazySeqRuntime)


def test_auto_follows_the_measured_rates() -> None:
    each = SEQ + " select each"
    doc = {
        "version": 1,
        "profiles": {"p": {"t": {"rate_per_hour": 1200.0}, "w": {"rate_per_hour": 1.0}}},
    }
    plan = _plan(each, "auto", Rates(doc))
    assert plan.lazy and plan.opener == "w" and "1200x rarer" in plan.reason
    assert plan.rates == {"t": 1200.0, "w": 1.0}
    assert "t: 1200/h (600 per window)" in plan.describe()
    doc["profiles"]["p"] = {"t": {"rate_per_hour": 1.0}, "w": {"rate_per_hour": 50.0}}
    plan = _plan(each, "auto", Rates(doc))
    assert not plan.lazy and "the first component (t) is the rarest" in plan.reason
    assert _plan(SEQ, "auto", Rates(doc)).lazy  # select first: tracked online, whatever the rates
    assert "no rates" in _plan(each, "auto").reason and not _plan(each, "auto").lazy
    assert not _plan(SEQ, "eager", Rates(doc)).lazy


MID = (
    'seq(a: kind = "temperature", w: kind = "window", c: kind = "presence") within 30m per room '
    "select each consume shared"
)


def test_auto_lets_the_rarest_component_drive_under_each() -> None:
    """Under `each` the rarest component drives wherever it is; under `first`, only the last."""
    doc = {
        "version": 1,
        "profiles": {
            "p": {
                "a": {"rate_per_hour": 60.0},
                "w": {"rate_per_hour": 0.5},
                "c": {"rate_per_hour": 12.0},
            }
        },
    }
    plan = _plan(MID, "auto", Rates(doc))
    assert (
        plan.lazy and plan.opener == "w" and plan.driver == 1 and "120x rarer than a" in plan.reason
    )
    assert "earlier components are buffered, later ones bound as they come" in plan.describe()
    eager, lazy = costs([60.0, 0.5, 12.0], 1800.0, 1)  # per window: 30 a, 0.25 w, 6 c
    assert lazy == pytest.approx(30 / 4 + 30 * 0.25 + 30 * 0.25 * 6) and eager == pytest.approx(
        30 + 7.5 + 45
    )
    first = _plan(MID.replace("select each", "select first"), "auto", Rates(doc))
    assert first.lazy and first.driver == 2 and "tracked online" in first.reason
    doc["profiles"]["p"]["a"] = {"rate_per_hour": 0.1}
    assert not _plan(MID, "auto", Rates(doc)).lazy  # the first is the rarest: eager opens on it
    eng = Engine([parse_profile(MID, "p")], plan="auto", rates=Rates(doc))
    doc["profiles"]["p"]["a"] = {"rate_per_hour": 60.0}
    assert eng.replan("auto", Rates(doc)) == ["p"] and eng._by_id["p"].k == 1
    doc["profiles"]["p"]["c"] = {"rate_per_hour": 0.01}
    assert eng.replan("auto", Rates(doc)) == ["p"] and eng._by_id["p"].k == 2  # another driver


def test_rates_fall_back_to_the_canonical_filter_text() -> None:
    """A profile the stats did not see (added later, renamed) finds its filters' counts."""
    p = parse_profile(SEQ, "p")
    evs = [Event(f"e{i}", float(i), {"kind": "temperature", "room": "1"}) for i in range(10)]
    evs.append(Event("w", 20.0, {"kind": "window", "room": "1"}))
    doc = count_stats([p], evs)
    doc["profiles"] = {}
    plan = Engine([], plan="auto", rates=Rates(doc)).plan_of(parse_profile(SEQ, "other"))
    assert plan.lazy and plan.rates["t"] == pytest.approx(10 / (20 / 3600))


def test_cost_model_prefers_the_rare_driver() -> None:
    eager, lazy = costs([120.0, 0.1], 1800.0)  # per window: 60 t, 0.05 w
    assert lazy < eager
    assert costs([1.0, 1.0], None) == (0.0, 0.0)


def test_rare_first_state_is_bounded_by_the_window() -> None:
    """Frequent events are buffered per partition and forgotten when the window has passed."""
    eng = Engine([parse_profile(f"{SEQ} select each consume shared", "p")], plan="rare-first")
    for i in range(1000):
        eng.process(Event(f"t{i}", i * 60.0, {"kind": "temperature", "room": str(i % 3)}))
    assert eng.stats()["partial_matches"] <= 3 * 32  # 30 per room and window (+ the edge)
    eng.process(Event("w", 1000 * 60.0, {"kind": "window", "room": "1"}))
    got = eng.take_notifications()
    assert len(got) == 10 and all(n.partition == {"room": "1"} for n in got)
    assert [n.events["t"].ts for n in got] == sorted(n.events["t"].ts for n in got)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "profiles:\n"
        f"  - {{id: w, expr: '{SEQ} select each consume shared'}}\n"
        '  - {id: n, expr: \'seq(a: kind = "temperature", not x: kind = "ack", b: kind = "window") within 30m\'}\n'
    )
    ev = tmp_path / "e.jsonl"
    lines = [{"id": f"t{i}", "ts": i * 60, "room": "1", "kind": "temperature"} for i in range(40)]
    lines.insert(35, {"id": "w1", "ts": 35 * 60, "room": "1", "kind": "window"})
    ev.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return prof, ev


def test_replay_plans_write_identical_output(tmp_path: Path) -> None:
    prof, ev = _files(tmp_path)
    stats = tmp_path / "stats.json"
    stats.write_text(
        json.dumps(
            {
                "version": 1,
                "profiles": {"w": {"t": {"rate_per_hour": 60}, "w": {"rate_per_hour": 1}}},
            }
        )
    )
    outs = []
    for extra in ([], ["--plan", "rare-first"], ["--plan", "auto", "--stats", str(stats)]):
        r = runner.invoke(app, ["replay", str(prof), str(ev), *extra])
        assert r.exit_code == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2]
    # w1 at 35 min pairs with t5 ... t34; n (eager: a negation) has t31 open (t0 expired at 30 min)
    assert [json.loads(x)["profile"] for x in outs[0].splitlines()] == ["w"] * 30 + ["n"]


def test_explain_prints_the_plan_and_its_rates(tmp_path: Path) -> None:
    prof, ev = _files(tmp_path)
    stats = tmp_path / "stats.json"
    stats.write_text(
        json.dumps(
            {
                "version": 1,
                "profiles": {"w": {"t": {"rate_per_hour": 60}, "w": {"rate_per_hour": 1}}},
            }
        )
    )
    r = runner.invoke(
        app, ["explain", str(prof), str(ev), "-p", "w", "--plan", "auto", "--stats", str(stats)]
    )
    assert r.exit_code == 0, r.stderr
    assert "plan: rare-first, matches opened by w" in r.stdout
    assert "rates: t: 60/h (30 per window), w: 1/h (0.5 per window)" in r.stdout
    assert "buffered  t0 as t" in r.stdout and "30 notification(s)" in r.stdout
    r = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "n", "--plan", "rare-first"])
    assert "plan: eager" in r.stdout and "negated components stay eager" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plan", "lazy"], "--plan: unknown plan 'lazy'"),
        (["--stats", "nope.json"], "--stats: no such file"),
        (
            ["--engine", "two-step", "--plan", "auto"],
            "--plan applies to the single-step engine only",
        ),
    ],
)
def test_bad_plan_options_are_user_errors(tmp_path: Path, args: list[str], message: str) -> None:
    prof, ev = _files(tmp_path)
    r = runner.invoke(app, ["replay", str(prof), str(ev), *args])
    assert r.exit_code == 2 and message in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ('{"version": 2}', "not an `ens spark stats` document"),
        ('{"version": 1, "profiles": []}', "must be an object"),
    ],
)
def test_bad_stats_files_are_user_errors(tmp_path: Path, text: str, message: str) -> None:
    prof, ev = _files(tmp_path)
    stats = tmp_path / "s.json"
    stats.write_text(text)
    r = runner.invoke(app, ["replay", str(prof), str(ev), "--plan", "auto", "--stats", str(stats)])
    assert r.exit_code == 2 and message in r.stderr and r.stdout == ""


@pytest.mark.redis
def test_service_worker_runs_rare_first_across_a_crash(tmp_path: Path) -> None:
    """`ens serve --plan rare-first`, restarted with `--plan auto --replan-every`: the worker's engine (snapshots, journal replay after a
    crash) gives the eager replay's notifications, exactly once."""
    import random
    import time

    import redis

    from adapters.service import redis_store as rs
    from adapters.service.worker import EngineWorker
    from ens.replay import replay
    from profiles.events import event_from_obj
    from tests.helpers_service import outbox, redis_server, replay_records
    from tests.test_service_worker import canon, config, feed_to_the_end, ingest, make_events

    profiles = {
        "door": 'seq(d: kind = "door" and state = "open", m: kind = "motion") within 30s per room select each',
        "door2": 'seq(d: kind = "door", t: kind = "temp", m: kind = "motion") within 20s per room '
        "where t.value > 40",
    }
    events = make_events(300, seed=5)
    arrival = sorted(events, key=lambda e: e["ts"] + random.Random(3).uniform(0, 2.0))
    want = [
        n.to_json()
        for n in replay(
            [parse_profile(x, p) for p, x in profiles.items()],
            [event_from_obj(e, "") for e in events],
        )
    ]
    assert want
    with redis_server(tmp_path) as url:
        rb, rt = redis.Redis.from_url(url), redis.Redis.from_url(url, decode_responses=True)
        for pid, expr in profiles.items():
            rs.put_profile(rt, pid, expr)
        ingest(rb, arrival[:200])
        clock = [time.time()]
        a = EngineWorker(rb, config(plan="rare-first"))
        a.start()
        assert isinstance(a.engine._by_id["door"], LazySeqRuntime)
        assert a.engine.replan_every == 0
        for step in range(12):
            clock[0] += 0.01
            a.step(block=0, now=clock[0])
            if step == 6:
                a.snapshot()
        rb.delete(rs.ENGINE_LOCK)  # kill -9
        b = EngineWorker(
            rb, config(batch=50, commit_min_interval=0, plan="auto", replan_every=3, drift=1.5)
        )
        b.start()
        assert b.engine.plan == "auto" and b.engine.replan_every == 3  # this run's options apply
        feed_to_the_end(b, rb, arrival[200:], events[-1]["ts"], clock)
        got = outbox(rt)
        rb.close()
        rt.close()
    assert len({n["id"] for n in got}) == len(got)
    assert canon(replay_records(got)) == canon(want)
