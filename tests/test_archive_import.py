"""`ens archive import` (docs/archive.md, "Importing history"): events recorded before ENS ran
(here the KETI excerpt through `ens data convert`) written as the archiver writes them; read
back by `ens archive export` as they went in; `ens backtest` over them = `ens replay` of the
file; a file with bad lines refused whole."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from adapters.archive.importer import write
from adapters.archive.layout import FILE_RE, PART_RE, list_files, open_archive
from ens.cli import app

runner = CliRunner()
KETI = Path(__file__).resolve().parent.parent / "examples" / "data" / "keti"
PROFILES = """\
profiles:
  - id: co2-high
    expr: 'seq(c: kind = "co2" and value > 450) per building, room'
  - id: bright-warm
    expr: 'seq(b: kind = "light" and value > 500, t: kind = "temperature" and value > 22) within 10m per building, room'
  - id: silent
    expr: absent(true) within 2m per sensor
"""


def _keti(tmp_path: Path, n: int) -> Path:
    out = tmp_path / "keti.jsonl"
    res = runner.invoke(app, ["data", "convert", "keti", str(KETI), "-n", str(n), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _import(events: Path, arc: Path, *more: str) -> str:
    res = runner.invoke(app, ["archive", "import", str(events), "--archive", str(arc), *more])
    assert res.exit_code == 0, res.output
    return res.output


def _export(arc: Path, out: Path) -> list[dict[str, object]]:
    res = runner.invoke(
        app,
        ["archive", "export", "--archive", str(arc), "--from", "0", "--to", "now", "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_import_export_round_trip_and_layout(tmp_path: Path) -> None:
    events = _keti(tmp_path, 20_000)
    # one event out of ts order (late, kept in its file place) and one of another gateway
    lines = events.read_text().splitlines()
    late = json.loads(lines[100])
    late["ts"] -= 7200
    lines.insert(5000, json.dumps(late))
    lines.insert(6000, json.dumps({"id": "g", "ts": 1377300000.5, "kind": "x", "gateway": "gw2"}))
    events.write_text("\n".join(lines) + "\n")
    arc = tmp_path / "arc"
    out = _import(events, arc)
    assert "imported 20002 events" in out and "2 out of ts order" in out  # and the gw2 one

    got = _export(arc, tmp_path / "back.jsonl")
    want = [json.loads(line) for line in lines]
    assert got == want  # same events, same fields, same order (seq = file order)

    files = list_files(open_archive(str(arc)))
    assert len({f.partition for f in files}) >= 2
    rows = []
    for f in files:
        assert FILE_RE.match(Path(f.path).name) and PART_RE.search(str(Path(f.path).parent))
        meta = pq.ParquetFile(f.path).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"
        rows.extend(pq.read_table(f.path).to_pylist())
    assert not list(arc.rglob(".*.tmp"))
    rows.sort(key=lambda r: r["seq"])
    assert [r["seq"] for r in rows] == list(range(20002))
    assert sum(r["late"] for r in rows) == 2
    assert {r["gateway"] for r in rows} == {"", "gw2"}

    # --gateway stamps every event, as the service does; a second import needs --append
    res = runner.invoke(app, ["archive", "import", str(events), "--archive", str(arc)])
    assert res.exit_code == 2 and "holds events already" in res.output
    out = _import(events, arc, "--append", "--gateway", "bms")
    assert "seq 20002..40003" in out
    again = _export(arc, tmp_path / "back2.jsonl")
    assert len(again) == 40004 and {e.get("gateway") for e in again[20002:]} == {"bms"}


def test_flushes_of_max_rows_split_by_hour(tmp_path: Path) -> None:
    ts0 = 1377298800.0  # an hour's start
    lines = [json.dumps({"id": f"e{i}", "ts": ts0 + i * 30, "kind": "k"}) for i in range(300)]
    res = write(open_archive(str(tmp_path / "a")), lines, "f", None, 7, max_rows=100)
    assert res.events == 300
    files = list_files(open_archive(str(tmp_path / "a")))
    # flushes at seq 7, 107, 207; the last two span two hours each (a file per hour, named alike)
    assert sorted((f.first_seq, f.partition[-2:]) for f in files) == [
        (7, "23"),
        (107, "00"),
        (107, "23"),
        (207, "00"),
        (207, "01"),
    ]


def test_backtest_of_import_equals_replay_of_file(tmp_path: Path) -> None:
    events = _keti(tmp_path, 30_000)
    arc = tmp_path / "arc"
    _import(events, arc)
    profiles = tmp_path / "p.yaml"
    profiles.write_text(PROFILES)
    first = json.loads(events.read_text().split("\n", 1)[0])["ts"]
    start, end = str(int(first)), str(int(first) + 86400)
    notes = tmp_path / "bt.jsonl"
    res = runner.invoke(
        app,
        [
            "backtest",
            str(profiles),
            "--archive",
            str(arc),
            "--from",
            start,
            "--to",
            end,
            "--spark",
            "off",
            "--plot",
            "",
            "--notifications",
            str(notes),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["events"] == 30_000
    replayed = tmp_path / "replay.jsonl"
    res = runner.invoke(
        app, ["replay", str(profiles), str(events), "--until", end, "--out", str(replayed)]
    )
    assert res.exit_code == 0, res.output
    assert notes.read_bytes() == replayed.read_bytes()
    kinds = {json.loads(line)["profile"] for line in notes.read_text().splitlines()}
    assert kinds == {"co2-high", "bright-warm", "silent"}


def test_bad_lines_named_nothing_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"ts": 1, "kind": "a"}\n{"ts": 2}\n\nnot json\n{"kind": "b"}\n{"ts": 3, "kind": "c"}\n'
    )
    arc = tmp_path / "arc"
    res = runner.invoke(app, ["archive", "import", str(bad), "--archive", str(arc)])
    assert res.exit_code == 2
    assert f"{bad}, line 2: missing required key 'kind'" in res.output
    assert f"{bad}, line 4, column 1: invalid JSON" in res.output
    assert f"{bad}, line 5: missing required key 'ts'" in res.output
    assert "3 bad lines: nothing imported" in res.output
    assert "Traceback" not in res.output
    assert not arc.exists()

    res = runner.invoke(
        app, ["archive", "import", str(tmp_path / "nope.jsonl"), "--archive", str(arc)]
    )
    assert res.exit_code == 2 and "no such file" in res.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    res = runner.invoke(app, ["archive", "import", str(empty), "--archive", str(arc)])
    assert res.exit_code == 2 and "no events to import" in res.output
