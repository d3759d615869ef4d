"""Spark batch jobs (adapters/spark) in local mode, with one shared session.

The detection-order merge is checked without Spark on many random streams
(`split_replay`, the job's logic on plain lists); the Spark jobs themselves
run a few times on small generated inputs.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ens.replay import replay
from filters.compile import evaluate
from profiles.events import Event, event_from_obj
from profiles.parser import parse_profile

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

PROFILES = [
    ("hot", 'kind = "t" and value > 7'),  # stateless
    ("seq-room", 'seq(a: kind = "t" and value > 3, b: kind = "p") within 10s per building, room'),
    ("trail", 'seq(a: kind = "t", not x: kind = "p") within 6s per building'),
    ("silent", "absent(true) within 5s per building, sensor"),
    ("quiet", 'absent(kind = "t") within 4s'),  # global, starts at the first event
    (
        "muggy",
        'all(a: kind = "t" and value > 6, h: kind = "h" and value > 4) within 8s per room select each',
    ),
    ("once", 'seq(a: kind = "h", b: kind = "p") within 5s per building once'),  # global: once
    (
        "last",
        'seq(a: kind = "t", b: kind = "t", c: kind = "h") within 9s per building select last consume shared',
    ),
    ("night", 'seq(n: clock("00:01"), hi: kind = "t" and value > 7) within 30s'),
    (
        "lead",
        'seq(not x: kind = "h", a: kind = "t", b: kind = "p") within 6s per building where a.value > 4',
    ),
]


def gen_events(rng: random.Random, n: int, spread: int) -> list[Event]:
    out = []
    for i in range(n):
        b, r, k = rng.choice(["B1", "B2", "B3"]), rng.choice(["r1", "r2", "r3"]), rng.choice("tph")
        attrs: dict = {
            "building": b,
            "room": r,
            "kind": k,
            "value": rng.randint(0, 9),
            "sensor": f"{b}{r}{k}",
        }
        if rng.random() < 0.05:
            del attrs["building"]
        if rng.random() < 0.05:
            attrs["building"] = rng.choice([1, 1.0, True])
        out.append(Event(f"e{i}", 50.0 + rng.randint(0, spread) + rng.choice([0, 0, 0.5]), attrs))
    return out


def profiles(items: list[tuple[str, str]] = PROFILES) -> list:
    return [parse_profile(expr, pid) for pid, expr in items]


def lines(notes: list) -> str:
    return "".join(json.dumps(n.to_json(), separators=(", ", ": ")) + "\n" for n in notes)


def write_jsonl(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(json.dumps(e.to_json()) + "\n" for e in events))
    return path


# `spark`: the session-wide fixture of tests/conftest.py (which marks its users `spark`)


# ------------------------------------------------------------ no Spark


@pytest.mark.parametrize("seed", range(60))
def test_split_replay_is_local_replay(seed: int) -> None:
    """Engines per key + a global one + stateless, merged by detection key == one engine."""
    from adapters.spark.slices import split_replay

    rng = random.Random(seed)
    ps = profiles(rng.sample(PROFILES, rng.randint(2, len(PROFILES))))
    evs = gen_events(rng, rng.randint(5, 150), rng.choice([3, 20, 80]))
    until = rng.choice([None, 60.0, 400.0])
    ref = lines(replay(ps, evs, until))
    for key in ("building", "room"):
        assert lines(split_replay(ps, evs, until, key)) == ref, key
        # the engines' evaluation plan (docs/plans.md) does not change the output either
        assert lines(split_replay(ps, evs, until, key, ("rare-first", None))) == ref, key


def test_detection_key_encoding_sorts_like_tuples() -> None:
    from adapters.spark.slices import encode_key

    rng = random.Random(3)
    vals = [-1e9, -2.5, -0.0, 0.0, 1.0, 1.5, 1e12, float("-inf")]
    keys = []
    for _ in range(300):
        ts = rng.choice(vals)
        step = (rng.choice(vals), rng.choice([0, 1, 2]), rng.choice([-1, 0, 5, 2**40]))
        keys.append((ts, step, rng.choice([0, 1]), rng.randint(-1, 3), rng.randint(0, 9)))
    assert sorted(keys) == sorted(keys, key=encode_key)


def test_canonical_filter_keys() -> None:
    from adapters.spark.canon import filter_key

    def key(text: str) -> str:
        return filter_key(parse_profile(text, "p").expr)

    assert key('b = 1 and a = "x"') == key("a = 'x' and b = 1.0")
    assert key("x in (2, 1, 2)") == key("x in (1, 2)")
    assert key("x = true") != key("x = 1")
    assert key('x = "1"') != key("x = 1")


# ------------------------------------------------------------ index


def test_index_round_trip_and_errors(spark, tmp_path: Path) -> None:
    from adapters.spark.generate import generate
    from adapters.spark.index import index_job, load_index, read_manifest

    recs = list(generate(400, rooms=30, bad=0.05, seed=7))
    recs.insert(10, {"id": "p3", "expr": 'kind = "dup"'})  # a repeated id
    recs.insert(20, {"id": "noexpr"})
    text = "".join(json.dumps(r) + "\n" for r in recs) + "{not json\n"
    src = tmp_path / "profiles.jsonl"
    src.write_text(text)
    manifest = index_job(spark, str(src), str(tmp_path / "idx"), errors=str(tmp_path / "err.jsonl"))

    expected, bad = [], {}
    for r in recs:
        try:
            if r["id"] == "p3" and r["expr"] == 'kind = "dup"':
                raise ValueError("duplicate")
            expected.append(parse_profile(r["expr"], r["id"], r.get("subscriber")))
        except Exception:  # noqa: BLE001 - every kind of bad record
            bad[r["id"]] = r
    loaded = load_index(tmp_path / "idx")
    assert loaded == expected  # same profiles, same order, no parsing
    assert [p.source for p in loaded] == [p.source for p in expected]

    errors = [json.loads(x) for x in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert len(errors) == len(bad) + 1  # + the line that is not JSON
    assert manifest["counts"]["errors"] == len(errors)
    assert manifest["counts"]["profiles"] == len(expected)
    by_id = {e["id"]: e for e in errors}
    assert by_id["p3"]["error"] == "duplicate profile id"
    assert by_id["noexpr"]["error"] == "missing expr"
    assert any(e["id"] is None and "invalid JSON" in e["error"] for e in errors)
    syntax = [e for e in errors if "unexpected end" in e["error"]]
    assert syntax and all(e["line"] == 1 and e["column"] == 32 for e in syntax)
    assert read_manifest(tmp_path / "idx")["counts"]["filters"] < manifest["counts"]["filter_uses"]


def test_serve_activates_an_index_without_parsing(spark, tmp_path: Path, monkeypatch) -> None:
    """`ens serve --index`: the snapshot's profiles are imported into Redis and run unparsed."""
    import redis

    from adapters.service import redis_store as rs
    from adapters.service.worker import EngineWorker, WorkerConfig
    from adapters.spark.index import index_job, load_index
    from tests.helpers_service import outbox, redis_server

    loads: list[str] = []  # the snapshots the worker read (`ens serve` gives it load_index)

    def counted_load(path: str) -> list:
        loads.append(str(path))
        return load_index(path)

    recs = [
        {
            "id": f"r{i}",
            "expr": f'seq(a: kind = "door" and room = "{i}", b: kind = "motion") '
            "within 1m per room",
        }
        for i in range(150)
    ]
    src = tmp_path / "profiles.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    index_job(spark, str(src), str(tmp_path / "idx"))
    with redis_server(tmp_path) as url:
        rt = redis.Redis.from_url(url, decode_responses=True)
        rb = redis.Redis.from_url(url)
        rs.put_profile(rt, "r7", 'kind = "stored first"')  # a stored definition wins over the index
        parsed: list[str] = []
        real = rs.validate_profile

        def spy(r, pid, expr, sub=None):  # noqa: ANN001, ANN202
            parsed.append(pid)
            return real(r, pid, expr, sub)

        monkeypatch.setattr(rs, "validate_profile", spy)
        cfg = WorkerConfig(
            name="w",
            clock="event",
            reorder_seconds=0,
            block=0,
            index=str(tmp_path / "idx"),
            load_index=counted_load,
        )
        w = EngineWorker(rb, cfg)
        w.start()
        assert parsed == ["r7"]  # only the profile whose stored text differs from the index
        stored = {p["id"]: p for p in rs.list_profiles(rt)}
        assert len(stored) == 150 and stored["r7"]["expr"] == 'kind = "stored first"'
        assert stored["r3"]["expr"] == recs[3]["expr"]
        assert len(w.defs) == 150 and w.engine.stats()["profiles"] == 150
        assert not rt.exists(rs.JOURNAL)  # the bulk start was snapshotted, not journalled
        for i, ev in enumerate([{"kind": "door", "room": "3"}, {"kind": "motion", "room": "3"}]):
            rt.xadd(
                rs.INGEST,
                {
                    rs.INGEST_EVENT: json.dumps({"id": f"e{i}", "ts": 100.0 + i, **ev}),
                    rs.INGEST_GATEWAY: "test",
                },
            )
        for _ in range(5):
            w.step(block=0, now=200.0)
        w.snapshot()
        notes = outbox(rt)
        assert [(n["profile"], n["events"]["b"]["id"]) for n in notes] == [("r3", "e1")]
        w._release(keys=[rs.ENGINE_LOCK], args=[w.holder])

        # a restart with the same index: the checkpoint holds every profile, nothing is loaded
        loads.clear()
        w2 = EngineWorker(rb, cfg)
        w2.start()
        assert loads == [] and parsed == ["r7"] and len(w2.defs) == 150
        w2._release(keys=[rs.ENGINE_LOCK], args=[w2.holder])

        # the checkpoint lost: the stored profiles come back from the index, loaded on demand
        rt.delete(rs.CHECKPOINT, rs.CHECKPOINT_PROFILES, rs.JOURNAL)
        w3 = EngineWorker(rb, cfg)
        w3.start()
        assert loads == [str(tmp_path / "idx")] and parsed == ["r7", "r7"]
        assert w3.engine.stats()["profiles"] == 150
        assert len(rt.hkeys(rs.INDEX_IMPORTED)) == 1  # one import, recorded once
        rt.close()
        rb.close()


# ------------------------------------------------------------ replay


def test_spark_replay_equals_local_replay(spark, tmp_path: Path) -> None:
    from adapters.spark.feed import read_feed
    from adapters.spark.replay import replay_job

    rng = random.Random(11)
    evs = gen_events(rng, 400, 120)
    ps = profiles()
    feed = write_jsonl(tmp_path / "feed.jsonl", evs)
    until = 300.0
    out = tmp_path / "notes.jsonl"
    st = replay_job(
        spark, ps, lambda plan: read_feed(spark, str(feed), "building", plan), str(out), until=until
    )
    ref = lines(replay(ps, evs, until))
    assert out.read_text() == ref
    assert st.events == 400 and st.notifications == ref.count("\n") > 50
    assert st.keys == 5  # B1, B2, B3, 1 = 1.0 (one key) and true (another)


def test_spark_replay_rare_first_equals_local_replay(spark, tmp_path: Path) -> None:
    """`ens spark replay --plan rare-first`: the plan travels to every task, same output."""
    from adapters.spark.feed import read_feed
    from adapters.spark.replay import replay_job

    rng = random.Random(12)
    evs = gen_events(rng, 300, 80)
    ps = profiles()
    feed = write_jsonl(tmp_path / "feed.jsonl", evs)
    out = tmp_path / "notes.jsonl"
    replay_job(
        spark,
        ps,
        lambda plan: read_feed(spark, str(feed), "building", plan),
        str(out),
        until=200.0,
        evaluation="rare-first",
    )
    assert out.read_text() == lines(replay(ps, evs, 200.0))


def test_cli_replay_csv_by_room_and_errors(spark, tmp_path: Path) -> None:
    import yaml

    from ens.commands.spark import app

    rng = random.Random(5)
    evs = [e for e in gen_events(rng, 200, 60) if isinstance(e.attrs.get("building", ""), str)]
    feed = tmp_path / "feed.csv"
    with feed.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "ts", "building", "room", "kind", "value", "sensor"])
        for e in evs:
            w.writerow(
                [e.id, e.ts]
                + [e.attrs.get(k, "") for k in ("building", "room", "kind", "value", "sensor")]
            )
    items = [p for p in PROFILES if p[0] not in ("lead", "night")]
    prof = tmp_path / "profiles.yaml"
    prof.write_text(yaml.safe_dump({"profiles": [{"id": i, "expr": x} for i, x in items]}))
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    res = runner.invoke(
        app, ["replay", str(feed), "--profiles", str(prof), "--out", str(out), "--key", "room"]
    )
    assert res.exit_code == 0, res.output
    assert out.read_text() == lines(replay(profiles(items), evs))

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ts": 1, "kind": "t"}\n{"ts": "yesterday"}\n\n{"ts": 2, "x": {"y": 1}}\n')
    res = runner.invoke(
        app, ["replay", str(bad), "--profiles", str(prof), "--out", str(tmp_path / "x.jsonl")]
    )
    assert res.exit_code == 2
    assert "line 2:" in res.stderr and "line 4:" in res.stderr and "nested" in res.stderr
    assert not (tmp_path / "x.jsonl").exists()

    prof.write_text("profiles:\n  - id: p\n    expr: kind = \n")
    res = runner.invoke(app, ["replay", str(feed), "--profiles", str(prof), "--out", str(out)])
    assert res.exit_code == 2 and "profile 'p'" in res.stderr
    res = runner.invoke(
        app, ["stats", str(tmp_path / "nope.jsonl"), "--index", str(tmp_path), "--out", "s.json"]
    )
    assert res.exit_code == 2 and "not an index snapshot" in res.stderr
    res = runner.invoke(
        app, ["replay", str(feed), "--profiles", str(prof), "--out", str(out), "--tz", "Nope"]
    )
    assert res.exit_code == 2 and "unknown time zone 'Nope'" in res.stderr


# ------------------------------------------------------------- stats


def test_stats_match_direct_counts(spark, tmp_path: Path) -> None:
    from adapters.spark.canon import filter_key
    from adapters.spark.feed import read_feed
    from adapters.spark.plan import leaves
    from adapters.spark.stats import stats_job

    rng = random.Random(2)
    evs = gen_events(rng, 300, 3600)
    evs.append(Event("flag1", 60.0, {"x": 1}))
    evs.append(Event("flag2", 61.0, {"x": True}))
    feed = write_jsonl(tmp_path / "feed.jsonl", evs)
    ps = profiles() + [parse_profile("x = 1", "one"), parse_profile("x = true", "yes")]
    doc = stats_job(
        spark, ps, lambda: read_feed(spark, str(feed), "building"), str(tmp_path / "s.json")
    )
    assert json.loads((tmp_path / "s.json").read_text()) == doc
    objs = [event_from_obj(e.to_json(), "") for e in evs]
    hours = (max(e.ts for e in evs) - min(e.ts for e in evs)) / 3600
    assert doc["events"] == len(evs) and doc["hours"] == pytest.approx(hours)
    for p in ps:
        for lf in leaves(p):
            got = doc["profiles"][p.id][lf.name]
            n = sum(evaluate(lf.filter, e.attrs) for e in objs)
            assert got["matches"] == n, (p.id, lf.name)
            assert got["filter"] == filter_key(lf.filter) and got["negated"] == lf.negated
            assert got["selectivity"] == pytest.approx(n / len(evs))
            assert got["rate_per_hour"] == pytest.approx(n / hours, rel=1e-5)
    assert (
        doc["profiles"]["one"]["e"]["matches"] == 1 and doc["profiles"]["yes"]["e"]["matches"] == 1
    )


def test_dataset_replay_by_room_fused_equals_local(spark, tmp_path: Path) -> None:
    """A KETI-shaped data set (one file per room and sensor): engines run where files are read."""
    from adapters.datasets import iter_dataset
    from adapters.spark.feed import read_dataset
    from adapters.spark.replay import replay_job

    rng = random.Random(4)
    root = tmp_path / "keti"
    for room in ("413", "415", "419"):
        (root / room).mkdir(parents=True)
        for sensor in ("co2", "pir", "temperature"):
            t, rows = 1377299100, []
            for _ in range(rng.randint(40, 80)):
                t += rng.choice([5, 5, 10, 400])  # some gaps: silent sensors
                v = (
                    rng.randint(0, 3)
                    if sensor == "pir"
                    else rng.choice([400, 1200])
                    if sensor == "co2"
                    else 25 + rng.random() * 5
                )
                rows.append(f"{t}, {v:.2f}\n")
            (root / room / f"{sensor}.csv").write_text("".join(rows))
    items = [
        (
            "hot",
            'seq(h: kind = "temperature" and value > 28, not ok: kind = "temperature" and value <= 28) within 60s per room',
        ),
        (
            "stuffy",
            'seq(c: kind = "co2" and value > 1000, p: kind = "presence" and value > 0) within 120s per room',
        ),
        ("silent", "absent(true) within 300s per room, sensor"),
        ("empty", 'absent(kind = "presence" and value > 0) within 200s per building'),
        ("high", 'kind = "co2" and value > 1100'),
    ]
    ps = profiles(items)
    evs = [event_from_obj(o, "") for o in iter_dataset("keti", root)]
    ref = lines(replay(ps, evs))
    out = tmp_path / "n.jsonl"
    src = str(root)
    for fused in (True, False):
        replay_job(
            spark,
            ps,
            lambda plan: read_dataset(spark, "keti", src, "room", plan),
            str(out),
            key="room",
            dataset=("keti", src, None) if fused else None,
        )
        assert out.read_text() == ref, fused
    assert ref.count("\n") > 10


@pytest.mark.spark
def test_a_new_spark_session_prints_no_spark_log_lines(tmp_path: Path) -> None:
    """Spark's shell banner ('Setting default log level', setLogLevel hint) and INFO lines stay off."""
    import subprocess
    import sys

    code = "from adapters.spark.session import get_spark; get_spark().stop()"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert res.returncode == 0, res.stderr
    # the one line left is the JVM launcher's own (Spark adds an incubator module), not a log line
    lines = [x for x in res.stderr.splitlines() if x and "Using incubator modules" not in x]
    assert lines == [], res.stderr
