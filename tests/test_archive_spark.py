"""`ens backtest` on Spark gives the very bytes of the local backtest, and `ens spark replay
--archive` those of `ens replay --archive`, on the same archive range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from typer.testing import CliRunner

from adapters.archive.layout import list_files, open_archive
from ens.cli import app
from tests.test_archive import PROFILE_FILE, T0, _archive_of
from tests.test_service_worker import make_events

pytestmark = [pytest.mark.spark, pytest.mark.redis]

runner = CliRunner()

PROFILES = PROFILE_FILE.replace(
    'expr: kind = "alarm"', 'expr: kind = "alarm"\n    alarm: {clear: after 1m}'
).replace(
    "subscribers:",
    """  - id: pair
    expr: 'seq(a: kind = "motion", b: kind = "motion") within 5s per building select last'
    subscriber: ops
subscribers:""",
)


def test_backtest_local_equals_spark(
    spark: Any, rb: redis.Redis, rt: redis.Redis, tmp_path: Path
) -> None:
    events = make_events(1500, seed=21, t0=T0)
    for i, ev in enumerate(events):
        ev["building"] = f"b{i % 3}"
        if i % 7 == 0:  # equal ts: the engine's order breaks the tie, in both
            ev["ts"] = events[i - 1]["ts"] if i else ev["ts"]
    uri = _archive_of(tmp_path, rb, rt, events)
    # a corrupt file: skipped and counted by both
    victim = list_files(open_archive(uri))[-1]
    lost = pq.read_table(victim.path).num_rows
    Path(victim.path).write_bytes(b"garbage")
    prof = tmp_path / "p.yaml"
    prof.write_text(PROFILES)
    rng = ["--archive", uri, "--from", str(T0 + 10), "--to", str(T0 + 1400)]
    reports = {}
    for mode in ("off", "auto"):  # auto: Spark, the range being over a 1-byte threshold
        out = tmp_path / f"notes-{mode}.jsonl"
        res = runner.invoke(
            app,
            [
                "backtest",
                str(prof),
                *rng,
                "--spark",
                mode,
                "--spark-threshold",
                "1",
                "--json",
                "--notifications",
                str(out),
                "--plot",
                str(tmp_path / f"{mode}.png"),
            ],
        )
        assert res.exit_code == 0, res.output
        reports[mode] = json.loads(res.stdout)
    local, remote = (
        (tmp_path / "notes-off.jsonl").read_bytes(),
        (tmp_path / "notes-auto.jsonl").read_bytes(),
    )
    assert local == remote and local.count(b"\n") > 50
    a, b = reports["off"], reports["auto"]
    assert (a["engine"], b["engine"]) == ("local", "spark")
    assert a["profiles"] == b["profiles"] and a["events"] == b["events"]
    assert any(p.get("alarms_raised") for p in a["profiles"])  # alarms counted alike
    assert len(a["skipped_files"]) == len(b["skipped_files"]) == 1 and lost > 0

    out = tmp_path / "spark-replay.jsonl"
    res = runner.invoke(
        app,
        [
            "spark",
            "replay",
            "--profiles",
            str(prof),
            *rng,
            "--until",
            str(T0 + 1400),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["replay", str(prof), *rng, "--until", str(T0 + 1400)])
    assert res.exit_code == 0 and out.read_text() == res.stdout
