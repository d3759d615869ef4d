"""`ens replay --summary | --json | --plot`: the per-profile summary of the notifications a
replay gives, checked against those notifications (the default output of the same replay)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ens.cli import app
from ens.summary import (
    OTHER,
    SILENT_ROWS,
    TOP_PARTITIONS,
    hourly_series,
    partition_label,
    plot_hourly,
    when,
)

runner = CliRunner()
ROOT = Path(__file__).parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"
T0 = 1_709_251_200  # 2024-03-01 00:00 UTC
PNG = b"\x89PNG\r\n\x1a\n"


def _inputs(tmp_path: Path, profiles: int = 11) -> tuple[str, str]:
    """``profiles`` profiles ``kN`` per room (profile kN fires on about N events in 7 rooms,
    spread over a day), one that never fires, and an unpartitioned one."""
    doc: dict[str, Any] = {
        "profiles": [
            {"id": f"k{k}", "expr": f'seq(e: kind = "k{k}") per room'} for k in range(profiles)
        ]
        + [
            {"id": "never", "expr": 'kind = "nothing"'},
            {"id": "any-hot", "expr": "v > 90", "subscriber": "ops"},
        ],
        "subscribers": [{"id": "ops", "channels": [{"email": "o@example.org"}]}],
    }
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(doc))
    evs = []
    for k in range(profiles):
        for i in range(k + 1):
            ts = T0 + (i * 2477 + k * 613) % 86400
            evs.append(
                {"id": f"e{k}-{i}", "ts": ts, "kind": f"k{k}", "room": f"r{i * k % 7}", "v": i * 10}
            )
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))
    return str(prof), str(path)


def _replay(*args: str) -> Any:
    r = runner.invoke(app, ["replay", *args])
    assert r.exit_code == 0, r.output
    return r


def _expected(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile what the summary must say, from the notification lines themselves."""
    out: dict[str, dict[str, Any]] = {}
    for n in lines:
        row = out.setdefault(n["profile"], {"ts": [], "parts": Counter()})
        row["ts"].append(n["ts"])
        if "partition" in n:
            row["parts"][partition_label(n["partition"])] += 1
    return out


def test_summary_json_and_table_match_the_notifications(tmp_path: Path) -> None:
    prof, evs = _inputs(tmp_path)
    plain = _replay(prof, evs).stdout
    lines = [json.loads(x) for x in plain.splitlines()]
    want = _expected(lines)
    assert len(want) >= 12  # k0..k10 and any-hot fired

    doc = json.loads(_replay(prof, evs, "--json").stdout)
    assert doc["notifications"] == len(lines)
    by_id = {p["profile"]: p for p in doc["profiles"]}
    assert by_id["never"]["matches"] == 0 and by_id["never"]["first"] is None
    assert by_id["any-hot"]["subscriber"] == "ops"
    for pid, w in want.items():
        got = by_id[pid]
        assert got["matches"] == len(w["ts"]), pid
        first = datetime.fromtimestamp(min(w["ts"]), UTC).isoformat().replace("+00:00", "Z")
        assert got["first"] == first
        assert got["last"] == datetime.fromtimestamp(max(w["ts"]), UTC).isoformat().replace(
            "+00:00", "Z"
        )
        assert got["partitions"] == len(w["parts"])
        top = [(partition_label(t["partition"]), t["count"]) for t in got["top_partitions"]]
        assert len(top) == min(TOP_PARTITIONS, len(w["parts"]))
        assert all(w["parts"][p] == c for p, c in top)  # the counts are the partitions' own
        rest = [c for p, c in w["parts"].items() if p not in dict(top)]
        assert all(c <= min(c for _, c in top) for c in rest)  # and they are the largest

    # the table says what the JSON says (same rows), without the notification lines
    res = _replay(prof, evs, "--summary")
    table = res.stdout
    assert '"profile"' not in table
    assert "│ total " in table and f" {len(lines)} │" in table
    for p in doc["profiles"]:
        row = [ln for ln in table.splitlines() if ln.startswith(f"│ {p['profile']} ")]
        assert len(row) == 1, (p["profile"], table)
        cells = [c.strip() for c in row[0].strip("│").split("│")]
        first = when(datetime.fromisoformat(p["first"]).timestamp()) if p["first"] else "-"
        last = when(datetime.fromisoformat(p["last"]).timestamp()) if p["last"] else "-"
        assert cells[2] == str(p["matches"]) and cells[4] == first and cells[5] == last, row
        if p["top_partitions"]:
            t = p["top_partitions"][0]
            assert cells[3] == f"{partition_label(t['partition'])}: {t['count']}"
        if p["partitions"] > TOP_PARTITIONS:  # the rest is counted
            assert f"+{p['partitions'] - TOP_PARTITIONS} more" in table


def test_summary_writes_the_notifications_only_to_out(tmp_path: Path) -> None:
    prof, evs = str(QUICKSTART / "profiles.yaml"), str(QUICKSTART / "events.jsonl")
    plain = _replay(prof, evs).stdout
    assert plain.startswith('{"profile"')  # unchanged without the new flags
    out = tmp_path / "n.jsonl"
    res = _replay(prof, evs, "--summary", "--out", str(out))
    assert out.read_text() == plain and "Notifications per profile" in res.stdout
    res = _replay(prof, evs, "--json", "--out", str(tmp_path / "m.jsonl"))
    assert json.loads(res.stdout)["notifications"] == len(plain.splitlines())
    assert (tmp_path / "m.jsonl").read_text() == plain
    # --plot alone adds a file and changes nothing else
    res = _replay(prof, evs, "--plot", str(tmp_path / "q.png"))
    assert res.stdout == plain and (tmp_path / "q.png").read_bytes().startswith(PNG)


def test_plot_has_the_top_profiles_and_other(tmp_path: Path) -> None:
    prof, evs = _inputs(tmp_path)
    png = tmp_path / "hourly.png"
    res = _replay(prof, evs, "--summary", "--plot", str(png), "--top", "4")
    assert "Notifications per profile" in res.stdout
    assert png.read_bytes().startswith(PNG)
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (450, 1000)

    notes = [json.loads(x) for x in _replay(prof, evs).stdout.splitlines()]
    per = Counter(n["profile"] for n in notes)
    hours, series = hourly_series(notes, top=4)
    ranked = sorted(per, key=lambda p: (-per[p], p))
    assert list(series) == [*ranked[:4], OTHER]
    assert sum(series[OTHER]) == sum(per[p] for p in ranked[4:])
    assert all(sum(series[p]) == per[p] for p in ranked[:4])
    assert len(hours) == len(series[OTHER]) and hours == sorted(hours)
    fig = plot_hourly(notes, tmp_path / "again.png", top=4)
    ax = fig.axes[0]
    assert len(ax.collections) == 5  # one stacked area per series
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith(f"{OTHER} (") and labels[-1] == f"{ranked[0]} ({per[ranked[0]]})"
    # few profiles: no "other"
    few = plot_hourly(notes, tmp_path / "few.png", top=len(per))
    assert len(few.axes[0].collections) == len(per)


def test_plot_and_summary_errors_are_user_errors(tmp_path: Path) -> None:
    prof, evs = str(QUICKSTART / "profiles.yaml"), str(QUICKSTART / "events.jsonl")
    for plot, needle in (
        (tmp_path, "is a directory"),
        (tmp_path / "no" / "x.png", "no directory"),
    ):
        r = runner.invoke(app, ["replay", prof, evs, "--plot", str(plot)])
        assert r.exit_code == 2 and needle in r.stderr, r.output
        assert "Traceback" not in r.output
    r = runner.invoke(app, ["replay", prof, evs, "--summary", "--top", "0"])
    assert r.exit_code == 2 and "--top" in r.stderr


def test_readme_summary_example_is_the_real_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's `ens replay --summary` example shows what the command prints."""
    readme = (ROOT / "README.md").read_text()
    args = "examples/quickstart/profiles.yaml examples/quickstart/events.jsonl --summary"
    shown = readme.split(f"ens replay {args}\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    out = _replay(*args.split()).stdout
    assert [ln.rstrip() for ln in out.splitlines()] == shown.splitlines()


def test_many_silent_profiles_are_counted_in_one_row(tmp_path: Path) -> None:
    """A large profile set: the table lists the profiles that fired and counts the others;
    the JSON document lists every profile."""
    prof, evs = _inputs(tmp_path)
    doc = json.loads(Path(prof).read_text())
    doc["profiles"] += [{"id": f"quiet{i}", "expr": f'kind = "q{i}"'} for i in range(SILENT_ROWS)]
    Path(prof).write_text(json.dumps(doc))
    table = _replay(prof, evs, "--summary").stdout
    assert "quiet0" not in table and "never" not in table
    assert f"({SILENT_ROWS + 1} profiles without notifications)" in table
    assert "│ k10 " in table and "│ any-hot " in table
    listed = json.loads(_replay(prof, evs, "--json").stdout)["profiles"]
    assert len(listed) == len(doc["profiles"])
