"""The event archive (docs/archive.md): written by the engine worker's commits and the
archiver against a real redis-server; every processed event exactly once, in engine order,
across crashes of either; whole files only; retention; `ens archive`, `ens replay --archive`,
`ens backtest` (local; the Spark comparison is in test_archive_spark.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from typer.testing import CliRunner

import adapters.service.archiver as archiver_mod
from adapters.archive.layout import list_files, open_archive, partition
from adapters.archive.reader import read_events, summary
from adapters.archive.retention import prune
from adapters.service import redis_store as rs
from adapters.service.archive_feed import FEED, POSITION, ArchiverConfig
from adapters.service.archiver import Archiver
from adapters.service.worker import EngineWorker
from ens.cli import app
from tests.test_service_worker import PROFILES, config, drain, ingest, make_events

pytestmark = pytest.mark.redis

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z: the events span two hours


class Recording(EngineWorker):
    """Remembers the order in which events reached the engine (not journal replays)."""

    order: list[str]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        process = self.intake.process  # every event reaches the engine through it

        def recording(ev: Any, gw: str, replay: bool = False) -> None:
            if not replay:
                self.order.append(ev.id)
            process(ev, gw, replay)

        self.intake.process = recording  # type: ignore[method-assign]


def archived(uri: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    arc = open_archive(uri)
    for f in list_files(arc):
        rows.extend(pq.read_table(f.path).to_pylist())
    return sorted(rows, key=lambda r: r["seq"])


def setup_profiles(rt: redis.Redis) -> None:
    for pid, expr in PROFILES.items():
        rs.put_profile(rt, pid, expr)


def run_archiver(a: Archiver) -> None:
    """Step until the feed is empty and nothing is pending."""
    for _ in range(1000):
        a.step(block=0)
        if not a.pending and not a.r.xlen(FEED):
            return
    raise AssertionError("archiver did not drain the feed")


def test_archive_holds_every_event_once_in_engine_order(
    rb: redis.Redis, rt: redis.Redis, tmp_path: Path
) -> None:
    setup_profiles(rt)
    events = make_events(730, seed=3, t0=T0)  # 12 min in one hour ...
    events += make_events(50, seed=4, t0=T0 + 3600)  # ... and some of the next
    for i, ev in enumerate(events):
        ev["id"] = f"e{i}"
    w = Recording(rb, config(archive=True, archive_commit=0.0, commit_min_interval=0))
    w.order = []
    w.start()
    clock = [time.time()]
    uri = str(tmp_path / "archive")
    a = Archiver(rb, ArchiverConfig(uri, flush=0.0, max_rows=97))
    for i in range(0, len(events), 40):
        ingest(rb, events[i : i + 40])
        drain(w, clock)
        a.step(block=0)
    ingest(rb, [{"id": "flush", "ts": events[-1]["ts"] + 100, "kind": "none", "room": "x"}])
    drain(w, clock)
    w.snapshot()
    run_archiver(a)
    rows = archived(uri)
    assert [r["id"] for r in rows] == w.order  # engine order, each once
    # every event but "flush", which the reorder window still holds
    assert sorted(r["id"] for r in rows) == sorted(e["id"] for e in events)
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert {r["gateway"] for r in rows} == {"test"}
    first = rows[0]
    assert json.loads(first["event"])["gateway"] == "test" and first["ingest_ts"] > T0
    parts = {f.partition for f in list_files(open_archive(uri))}
    assert {partition(T0), partition(T0 + 3600)} <= parts
    assert rb.xlen(FEED) == 0  # trimmed once archived


@pytest.mark.parametrize("crash_at", [3, 7, 11])
def test_crashes_of_engine_and_archiver_lose_and_duplicate_nothing(
    rb: redis.Redis, rt: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: int
) -> None:
    """The engine abandoned mid-stream (uncommitted inputs lost, decided again), and the
    archiver killed between renaming one partition's file and the next: exactly once."""
    setup_profiles(rt)
    events = make_events(400, seed=crash_at, t0=T0 + 2600)  # crosses the hour at T0 + 2800
    ingest(rb, events[:250])
    clock = [time.time()]
    w = EngineWorker(rb, config(batch=2, archive=True, archive_commit=1e9))
    w.start()
    for step in range(crash_at):
        clock[0] += 0.01
        w.step(block=0, now=clock[0])
        if step == 2:
            w.snapshot()
        elif step % 4 == 1:
            w.commit()
    if crash_at > 3:
        assert len(
            w.intake.archive_rows
        )  # fed, not committed: lost with the worker, fed again by w2
    rb.delete(rs.ENGINE_LOCK)  # kill -9: its uncommitted inputs (and rows) are gone

    uri = str(tmp_path / "archive")
    real = archiver_mod.write_columns
    crashed = []

    def crash_after_first_file(arc: Any, cols: dict[str, list[Any]], seq0: int) -> Any:
        hours = sorted({int(t // 3600) for t in cols["ts"]})
        if len(hours) > 1 and not crashed:
            keep = [int(t // 3600) == hours[0] for t in cols["ts"]]
            real(
                arc,
                {k: [v for v, x in zip(vs, keep, strict=True) if x] for k, vs in cols.items()},
                seq0,
            )
            crashed.append(seq0)
            raise KeyboardInterrupt("kill -9")
        return real(arc, cols, seq0)

    monkeypatch.setattr(archiver_mod, "write_columns", crash_after_first_file)
    w2 = EngineWorker(rb, config(batch=50, archive=True, archive_commit=0.0, commit_min_interval=0))
    w2.start()
    ingest(rb, events[250:])
    ingest(rb, [{"id": "flush", "ts": events[-1]["ts"] + 100, "kind": "none", "room": "x"}])
    for _ in range(100):
        clock[0] += 0.01
        if not w2.step(block=0, now=clock[0]):
            break
    w2.snapshot()
    a = Archiver(rb, ArchiverConfig(uri, flush=0.0, max_rows=10_000))
    with pytest.raises(KeyboardInterrupt):
        run_archiver(a)
    assert crashed and rt.hget(POSITION, "flushing")  # a flush was cut after one file
    b = Archiver(rb, ArchiverConfig(uri, flush=0.0))  # the restart finishes it
    run_archiver(b)
    rows = archived(uri)
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(e["id"] for e in events)  # each exactly once ("flush" is held)
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert not rt.hget(POSITION, "flushing")


def test_files_appear_whole(rb: redis.Redis, rt: redis.Redis, tmp_path: Path) -> None:
    """A reader polling the archive while it is written never lists a partial file."""
    setup_profiles(rt)
    uri = str(tmp_path / "archive")
    w = EngineWorker(rb, config(archive=True, archive_commit=0.0, commit_min_interval=0))
    w.start()
    clock = [time.time()]
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader() -> None:
        arc = open_archive(uri)
        while not stop.is_set():
            for f in list_files(arc):
                try:
                    pq.read_table(f.path)
                    reads[0] += 1
                except FileNotFoundError:
                    pass  # pruned meanwhile: not this test
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{f.path}: {exc}")

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    a = Archiver(rb, ArchiverConfig(uri, flush=0.0))
    events = make_events(3000, seed=9, t0=T0)
    for i in range(0, len(events), 100):
        ingest(rb, events[i : i + 100])
        drain(w, clock)
        a.step(block=0)
    w.snapshot()
    run_archiver(a)
    stop.set()
    t.join(10)
    assert not problems
    assert reads[0] > 0
    names = [p.name for p in Path(uri).rglob("*") if p.is_file()]
    assert names and all(n.startswith("part-") and n.endswith(".parquet") for n in names)


def _archive_of(
    tmp_path: Path, rb: redis.Redis, rt: redis.Redis, events: list[dict[str, Any]]
) -> str:
    setup_profiles(rt)
    uri = str(tmp_path / "archive")
    w = EngineWorker(rb, config(archive=True, archive_commit=0.0, commit_min_interval=0))
    w.start()
    ingest(rb, events)  # and one 100 s later: it releases them all (and stays held)
    ingest(rb, [{"id": "flush", "ts": max(e["ts"] for e in events) + 100, "kind": "none"}])
    drain(w, [time.time()])
    w.snapshot()
    run_archiver(Archiver(rb, ArchiverConfig(uri, flush=0.0, max_rows=500)))
    return uri


def test_retention_by_age_and_size(rb: redis.Redis, rt: redis.Redis, tmp_path: Path) -> None:
    events = [
        {"id": f"h{h}-{i}", "ts": T0 + h * 3600 + i, "kind": "motion", "room": "r1"}
        for h in range(5)
        for i in range(40)
    ]
    uri = _archive_of(tmp_path, rb, rt, events)
    arc = open_archive(uri)
    assert len({f.partition for f in list_files(arc)}) == 5
    now = T0 + 5 * 3600
    gone = prune(arc, now, max_age=2.5 * 3600)  # hours ending before now - 2.5 h
    assert gone == [partition(T0), partition(T0 + 3600)]
    left = list_files(arc)
    assert {f.partition for f in left} == {partition(T0 + h * 3600) for h in (2, 3, 4)}
    one = max(f.size for f in left)
    gone = prune(arc, now, max_bytes=one + 1)  # only the newest hour fits
    assert gone == [partition(T0 + 2 * 3600), partition(T0 + 3 * 3600)]
    assert {f.partition for f in list_files(arc)} == {partition(T0 + 4 * 3600)}


PROFILE_FILE = """
profiles:
  - id: door
    expr: 'seq(d: kind = "door" and state = "open", m: kind = "motion") within 30s per room'
    subscriber: ops
  - id: alarm
    expr: kind = "alarm"
    subscriber: night
subscribers:
  - id: ops
    channels: [{email: ops@example.org}]
  - id: night
    digest: 600
    channels: [{email: night@example.org}]
"""

runner = CliRunner()


def test_cli_list_export_and_replay_from_archive(
    rb: redis.Redis, rt: redis.Redis, tmp_path: Path
) -> None:
    events = make_events(600, seed=5, t0=T0)
    uri = _archive_of(tmp_path, rb, rt, events)
    res = runner.invoke(app, ["archive", "list", "--archive", uri, "--json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)[0]
    assert listed["events"] == 600 and listed["files"] >= 1 and not listed["corrupt"]
    res = runner.invoke(app, ["archive", "list", "--archive", uri])
    assert res.exit_code == 0 and partition(T0) in res.stdout

    out = tmp_path / "range.jsonl"
    start, end = str(T0 + 60), str(T0 + 400)
    res = runner.invoke(
        app,
        ["archive", "export", "--archive", uri, "--from", start, "--to", end, "--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert len(lines) == 340 and json.loads(lines[0])["ts"] == T0 + 60
    pq_out = tmp_path / "range.parquet"
    res = runner.invoke(
        app,
        ["archive", "export", "--archive", uri, "--from", start, "--to", end, "-o", str(pq_out)],
    )
    assert res.exit_code == 0 and pq.read_table(pq_out).num_rows == 340

    profiles = tmp_path / "p.yaml"
    profiles.write_text(PROFILE_FILE)
    a = runner.invoke(
        app,
        ["replay", str(profiles), "--archive", uri, "--from", start, "--to", end, "--until", end],
    )
    b = runner.invoke(app, ["replay", str(profiles), str(out), "--until", end])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert a.stdout == b.stdout and a.stdout.count("\n") > 3

    # --alarms reads the archive alike (the alarm transitions of the same events)
    alarmed = tmp_path / "alarms.yaml"
    alarmed.write_text(
        PROFILE_FILE.replace(
            'expr: kind = "alarm"', 'expr: kind = "alarm"\n    alarm: {clear: after 1m}'
        )
    )
    a = runner.invoke(
        app,
        [
            "replay",
            str(alarmed),
            "--archive",
            uri,
            "--from",
            start,
            "--to",
            end,
            "--until",
            end,
            "--alarms",
        ],
    )
    b = runner.invoke(app, ["replay", str(alarmed), str(out), "--until", end, "--alarms"])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert a.stdout == b.stdout and '"raise"' in a.stdout


def test_backtest_report_and_bad_input(rb: redis.Redis, rt: redis.Redis, tmp_path: Path) -> None:
    events = make_events(900, seed=6, t0=T0)
    uri = _archive_of(tmp_path, rb, rt, events)
    profiles = tmp_path / "p.yaml"
    profiles.write_text(PROFILE_FILE)
    plot = tmp_path / "t.png"
    args = ["backtest", str(profiles), "--archive", uri, "--from", str(T0), "--to", str(T0 + 900)]
    res = runner.invoke(app, [*args, "--json", "--plot", str(plot), "--spark", "off"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["events"] == 900 and rep["engine"] == "local" and not rep["skipped_files"]
    by = {p["id"]: p for p in rep["profiles"]}
    alarms = sum(1 for e in events if e["kind"] == "alarm")
    assert by["alarm"]["matches"] == alarms
    assert 0 < by["alarm"]["messages"] <= 2  # a 600 s digest: 900 s of alarms in one or two
    assert by["door"]["messages"] == by["door"]["matches"] > 0
    assert sum(by["alarm"]["timeline"]) == alarms
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = runner.invoke(app, [*args, "--plot", str(plot), "--spark", "off"])
    assert res.exit_code == 0 and "door" in res.stdout and "backtest:" in res.stderr
    assert "alarms raised" not in res.stdout  # no alarm: blocks, no alarm columns

    # with alarm: blocks, alarms raised and cleared per profile
    alarmed = tmp_path / "alarms.yaml"
    alarmed.write_text(
        PROFILE_FILE.replace(
            'expr: kind = "alarm"', 'expr: kind = "alarm"\n    alarm: {clear: after 1m}'
        )
    )
    args_a = ["backtest", str(alarmed), *args[2:], "--plot", str(plot), "--spark", "off"]
    res = runner.invoke(app, [*args_a, "--json"])
    assert res.exit_code == 0, res.output
    by_a = {p["id"]: p for p in json.loads(res.stdout)["profiles"]}
    assert by_a["alarm"]["matches"] == alarms
    assert 0 < by_a["alarm"]["alarms_raised"] <= alarms
    assert by_a["alarm"]["alarms_cleared"] in (
        by_a["alarm"]["alarms_raised"],
        by_a["alarm"]["alarms_raised"] - 1,
    )
    assert by_a["door"]["alarms_raised"] == 0
    res = runner.invoke(app, args_a)
    assert res.exit_code == 0 and "alarms raised" in res.stdout

    # a range the archive does not hold: the range it does hold
    res = runner.invoke(
        app,
        [
            "backtest",
            str(profiles),
            "--archive",
            uri,
            "--from",
            str(T0 + 86400 * 3),
            "--to",
            str(T0 + 86400 * 4),
        ],
    )
    assert res.exit_code == 2
    assert "no events in 2023-11-17T22:13:20Z" in res.stderr
    assert "it holds 2023-11-14T22:00:00Z .. 2023-11-14T23:00:00Z" in res.stderr

    # a corrupt file: named, skipped, counted; the rest is read
    victim = list_files(open_archive(uri))[0]
    good = pq.read_table(victim.path).num_rows
    Path(victim.path).write_bytes(b"PAR1 this is not parquet")
    res = runner.invoke(app, [*args, "--json", "--plot", str(plot), "--spark", "off"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert [s["path"] for s in rep["skipped_files"]] == [victim.path]
    assert rep["events"] == 900 - good
    assert f"skipped corrupt archive file {victim.path}" in res.stderr
    res = runner.invoke(app, ["archive", "list", "--archive", uri, "--json"])
    assert json.loads(res.stdout)[0]["corrupt"][0]["path"] == victim.path
    evs, sc = read_events(open_archive(uri), None, None, lambda m: None)
    assert len(evs) == 900 - good and len(sc.skipped) == 1
    assert summary(open_archive(uri))["events"] == 900 - good
    os.unlink(victim.path)


@pytest.mark.parametrize("mode", ["output", "feed"])
def test_late_events_are_archived_flagged(
    rb: redis.Redis, rt: redis.Redis, tmp_path: Path, mode: str
) -> None:
    """A late event (sent to the late output, or fed in arrival order with --late-events
    feed) is accepted, so it is archived, once, with ``late`` set."""
    setup_profiles(rt)
    uri = str(tmp_path / "archive")
    w = EngineWorker(
        rb, config(archive=True, archive_commit=0.0, commit_min_interval=0, late_events=mode)
    )
    w.start()
    clock = [time.time()]
    events = make_events(50, seed=8, t0=T0)
    ingest(rb, events)
    ingest(rb, [{"id": "flush", "ts": T0 + 200, "kind": "none", "room": "x"}])
    drain(w, clock)
    ingest(rb, [{"id": "old", "ts": T0 + 1, "kind": "alarm", "room": "r1"}])  # behind the engine
    drain(w, clock)
    w.snapshot()
    run_archiver(Archiver(rb, ArchiverConfig(uri, flush=0.0)))
    rows = archived(uri)
    assert [r["id"] for r in rows] == [*(e["id"] for e in events), "old"]
    assert [r["id"] for r in rows if r["late"]] == ["old"]
    assert w.totals["late"] == 1
