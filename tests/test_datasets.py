"""Data-set adapters on the committed excerpts in examples/data (no ../shared needed).

Expected values are read from the raw excerpt files with independent, simple code (or are
literal values from the files), so the tests check the adapters rather than echo them.
"""

from __future__ import annotations

import calendar
import csv
import gzip
import io
import json
import lzma
import os
import re
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from adapters.datasets import DATASETS, DatasetError, get_adapter, iter_dataset, keti
from adapters.datasets.common import is_suspect, parse_number, resolve_tz
from adapters.datasets.uci_sml2010 import parse_datetime, parse_header
from ens.commands.data import _batches, app
from profiles.events import parse_event_line

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data"
KETI = DATA / "keti"
OCC = DATA / "uci-occupancy"
APPL = DATA / "uci-appliances-energy" / "energydata_complete.csv.gz"
SML = DATA / "uci-sml2010"
SHARED = Path(os.environ.get("ENS_SHARED_DATA", ROOT.parent / "shared" / "data"))
needs_shared = pytest.mark.skipif(
    not (SHARED / "keti" / "MANIFEST.tsv").is_file(), reason="full data (../shared/data) absent"
)

REQUIRED = {"id": str, "ts": float, "building": str, "room": str, "sensor": str, "kind": str}


def utc(text: str) -> float:
    return float(calendar.timegm(datetime.fromisoformat(text).timetuple()))


def manifest_rows(root: Path) -> dict[str, int]:
    with (root / "MANIFEST.tsv").open() as f:
        return {r["file"]: int(r["rows"]) for r in csv.DictReader(f, delimiter="\t")}


def raw_keti_rows(root: Path) -> list[tuple[int, str, str, str]]:
    """(epoch, room, sensor, value text) of every line, read without the adapter."""
    rows = []
    for f in sorted(root.glob("*/*.csv.xz")):
        with lzma.open(f, "rt") as fh:
            for line in fh:
                t, v = line.rstrip("\n").split(", ")
                rows.append((int(t), f.parent.name, f.name.split(".")[0], v))
    return rows


def check_shape(ev: dict) -> None:
    for key, typ in REQUIRED.items():
        assert isinstance(ev[key], typ), (key, ev)
    assert isinstance(ev["value"], int | float) and not isinstance(ev["value"], bool)
    assert ev["kind"] == ev["kind"].lower()
    assert ev.get("suspect", True) is True  # present only when true
    for v in ev.values():
        assert isinstance(v, str | int | float | bool)  # flat


@pytest.fixture(scope="module")
def keti_events() -> list[dict]:
    return list(iter_dataset("keti", KETI))


# --- registry ----------------------------------------------------------------------------------


def test_registry_names_and_attributes() -> None:
    assert list(DATASETS) == ["keti", "uci-occupancy", "uci-appliances", "uci-sml2010"]
    for name, a in DATASETS.items():
        assert a.name == name and a.description and callable(a.iter_events)
        assert (DATA / a.folder).is_dir(), "every data set has a committed excerpt"
    with pytest.raises(DatasetError, match="unknown data set 'nope'"):
        get_adapter("nope")


# --- KETI --------------------------------------------------------------------------------------


def test_keti_excerpt_is_in_the_original_format() -> None:
    rows = manifest_rows(KETI)
    assert len(rows) == 30 and {f.split("/")[0] for f in rows} >= {"419", "723"}
    line = re.compile(rb"^\d{10}, -?\d+\.\d\d\n$")
    for name, n in rows.items():
        path = KETI / (name + ".xz")
        assert path.read_bytes()[:6] == b"\xfd7zXZ\x00"  # xz container, like the originals
        lines = lzma.decompress(path.read_bytes()).splitlines(keepends=True)
        assert len(lines) == n and all(line.match(x) for x in lines), name
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 320_000


def test_keti_every_line_becomes_one_event(keti_events: list[dict]) -> None:
    assert len(keti_events) == sum(manifest_rows(KETI).values())
    assert DATASETS["keti"].estimate_events(KETI) == len(keti_events)
    ids = [e["id"] for e in keti_events]
    assert len(set(ids)) == len(ids)


def test_keti_merged_stream_is_ordered_by_ts_room_sensor(keti_events: list[dict]) -> None:
    raw = sorted(raw_keti_rows(KETI))  # (ts, room, sensor): the documented tie order
    assert [f"keti:{r}:{s}:{t}" for t, r, s, _ in raw] == [e["id"] for e in keti_events]
    assert all(a["ts"] <= b["ts"] for a, b in zip(keti_events, keti_events[1:], strict=False))
    ties = [e for e in keti_events if e["ts"] == keti_events[0]["ts"]]
    assert len(ties) > 1


def test_keti_event_attributes(keti_events: list[dict]) -> None:
    units = {"co2": "ppm", "humidity": "%", "light": "lux", "temperature": "°C"}
    for ev in keti_events[:5000]:
        check_shape(ev)
        _, room, sensor, epoch = ev["id"].split(":")
        assert ev["building"] == "SDH" and ev["room"] == room
        assert ev["sensor"] == f"keti-{room}-{sensor}" and ev["ts"] == float(epoch)
        if sensor == "pir":
            assert ev["kind"] == "presence" and type(ev["value"]) is int and "unit" not in ev
        else:
            assert ev["kind"] == sensor and type(ev["value"]) is float
            assert ev["unit"] == units[sensor]
    first = keti_events[0]
    assert first == {
        "id": "keti:419:co2:1377856800",
        "ts": 1377856800.0,
        "building": "SDH",
        "room": "419",
        "sensor": "keti-419-co2",
        "kind": "co2",
        "value": 446.0,
        "unit": "ppm",
    }


def test_keti_outliers_are_kept_and_flagged(keti_events: list[dict]) -> None:
    raw_579 = lzma.decompress((KETI / "419" / "temperature.csv.xz").read_bytes()).count(
        b", 579.27\n"
    )
    assert raw_579 > 100  # room 419's sensor errors are in the excerpt
    t419 = [e for e in keti_events if e["sensor"] == "keti-419-temperature"]
    bad = [e for e in t419 if e["value"] == 579.27]
    assert len(bad) == raw_579 and all(e["suspect"] is True for e in bad)
    assert all("suspect" not in e for e in t419 if e["value"] < 60)
    at = {e["sensor"]: e for e in keti_events if e["id"].endswith(":1377879174")}
    assert at["keti-723-humidity"]["value"] == -500.96 and at["keti-723-humidity"]["suspect"]
    assert at["keti-723-light"]["value"] == 30551.0 and at["keti-723-light"]["suspect"]
    assert at["keti-723-temperature"]["value"] == 265.73 and at["keti-723-temperature"]["suspect"]
    suspects = {(e["room"], e["kind"]) for e in keti_events if e.get("suspect")}
    assert suspects == {
        ("419", "temperature"),
        ("723", "humidity"),
        ("723", "light"),
        ("723", "temperature"),
    }  # stuck 668 light is plausible reading by reading


def test_keti_pir_activity_in_excerpt(keti_events: list[dict]) -> None:
    busy = [e for e in keti_events if e["kind"] == "presence" and e["value"] > 0]
    assert len(busy) > 500 and {e["room"] for e in busy} >= {"419", "752"}


def test_keti_filters_limit_and_single_room() -> None:
    evs = list(iter_dataset("keti", KETI, rooms=["419,723"], kinds=["presence", "co2"]))
    assert {(e["room"], e["kind"]) for e in evs} == {
        (r, k) for r in ("419", "723") for k in ("presence", "co2")
    }
    pir = list(iter_dataset("keti", KETI, rooms=["752"], kinds=["pir"]))  # file name works too
    assert pir and {e["kind"] for e in pir} == {"presence"}
    one_room = list(iter_dataset("keti", KETI / "752", kinds=["presence"]))
    assert [e["id"] for e in one_room] == [e["id"] for e in pir]
    assert len(list(iter_dataset("keti", KETI, limit=7))) == 7
    for bad in ({"rooms": ["999"]}, {"kinds": ["noise"]}, {"tz": "UTC"}, {"limit": -1}):
        with pytest.raises(DatasetError):
            iter_dataset("keti", KETI, **bad)
    with pytest.raises(DatasetError, match="no such file"):
        iter_dataset("keti", DATA / "missing")


def _write(path: Path, lines: list[str]) -> None:
    data = "".join(lines).encode()
    if path.name.endswith(".xz"):
        data = lzma.compress(data)
    elif path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


series = st.lists(st.integers(1_000_000_000, 1_000_000_060), max_size=40, unique=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["a1", "b2", "c3"]), st.sampled_from(keti.SENSORS), series),
        min_size=1,
        max_size=6,
    )
)
def test_keti_merge_matches_sort_for_any_files(files: list) -> None:
    """Random per-file series with many equal timestamps, in all three supported encodings."""
    with tempfile.TemporaryDirectory() as tmp:
        want = {}
        for n, (room, sensor, times) in enumerate(files):
            suffix = (".csv.xz", ".csv.gz", ".csv")[n % 3]
            for old in Path(tmp).glob(f"{room}/{sensor}.csv*"):
                old.unlink()
            _write(
                Path(tmp) / room / f"{sensor}{suffix}",
                [f"{t}, {t % 7}.50\n" for t in sorted(times)],
            )
            want[(room, sensor)] = sorted(times)
        if not any(want.values()):
            return
        expected = sorted((t, r, s) for (r, s), ts in want.items() for t in ts)
        got = [(int(e["ts"]), e["room"], e["id"].split(":")[2]) for e in iter_dataset("keti", tmp)]
        assert got == expected


def test_keti_bad_content_is_a_clear_error(tmp_path: Path) -> None:
    _write(tmp_path / "1" / "co2.csv", ["1377299107, 488.00\n", "1377299100, 490.00\n"])
    with pytest.raises(DatasetError, match="not increasing"):
        list(iter_dataset("keti", tmp_path))
    _write(tmp_path / "1" / "co2.csv", ["time, value\n"])
    with pytest.raises(DatasetError, match="epoch"):
        list(iter_dataset("keti", tmp_path))
    _write(tmp_path / "1" / "co2.csv", ["1377299107, 488.00"])  # no final newline
    assert [e["value"] for e in iter_dataset("keti", tmp_path)] == [488.0]


# --- UCI occupancy ------------------------------------------------------------------------------


def test_occupancy_raw_quirks_present() -> None:
    header, first = (OCC / "datatraining.txt").read_text().splitlines()[:2]
    assert len(header.split(",")) == 7 and len(first.split(",")) == 8
    assert first.startswith('"1","2015-02-04 17:51:00",')  # quoted date
    assert (
        (OCC / "datatest2.txt").read_text().splitlines()[1].startswith('"1",2015-02-11 14:48:00,')
    )
    assert (OCC / "datatest.txt").read_text().splitlines()[1].startswith('"140",')


def test_occupancy_quoted_row_parses() -> None:
    evs = list(iter_dataset("uci-occupancy", OCC / "datatraining.txt", limit=12))
    row = {e["kind"]: e for e in evs[:6]}
    assert [e["kind"] for e in evs[:6]] == list(DATASETS["uci-occupancy"].kinds)
    ts = utc("2015-02-04 17:51:00")
    assert all(e["ts"] == ts for e in evs[:6]) and evs[6]["ts"] == ts + 59
    assert row["temperature"]["value"] == 23.18 and row["temperature"]["unit"] == "°C"
    assert row["humidity"]["value"] == 27.272 and row["light"]["value"] == 426.0
    assert row["co2"]["value"] == 721.25 and row["humidity_ratio"]["value"] == 0.00479298817650529
    assert row["occupancy"]["value"] == 1 and type(row["occupancy"]["value"]) is int
    assert row["co2"]["id"] == "uci-occupancy:office:co2:20150204T175100"
    assert evs[6]["id"].endswith(":20150204T175159")  # the 1-s jitter is kept
    for e in evs:
        check_shape(e)
        assert (e["building"], e["room"]) == ("uci-office", "office")
    assert all(e["value"] != 1.0 or e["kind"] == "occupancy" for e in evs)  # row id not a value


def test_occupancy_unquoted_date_file() -> None:
    evs = list(iter_dataset("uci-occupancy", OCC / "datatest2.txt", kinds=["temperature"]))
    assert len(evs) == 60 and evs[0]["ts"] == utc("2015-02-11 14:48:00")
    assert evs[0]["value"] == 21.76


def test_occupancy_directory_merges_files_by_time() -> None:
    evs = list(iter_dataset("uci-occupancy", OCC))
    assert len(evs) == (60 + 90 + 60) * 6
    assert all(a["ts"] <= b["ts"] for a, b in zip(evs, evs[1:], strict=False))
    assert evs[0]["ts"] == utc("2015-02-02 14:19:00")  # datatest.txt is the earliest period
    assert len({e["id"] for e in evs}) == len(evs)
    occ = [e["value"] for e in evs if e["kind"] == "occupancy"]
    assert set(occ) == {0, 1}


def test_occupancy_tz_changes_ts_not_ids() -> None:
    base = list(iter_dataset("uci-occupancy", OCC, limit=6))
    for tz in ("Europe/Brussels", "+01:00", "UTC+1"):
        shifted = list(iter_dataset("uci-occupancy", OCC, limit=6, tz=tz))
        assert [e["id"] for e in shifted] == [e["id"] for e in base]
        assert [e["ts"] + 3600 for e in shifted] == [e["ts"] for e in base]


# --- UCI appliances -----------------------------------------------------------------------------


def test_appliances_raw_quirks_present() -> None:
    raw = gzip.decompress(APPL.read_bytes())
    lines = raw.split(b"\n")
    assert all(x.endswith(b"\r") for x in lines[:-1]) and lines[-1] == b""  # CRLF
    assert lines[1].startswith(b'"2016-01-11 17:00:00","  60","30",')  # quoted, leading spaces
    assert b'" 6.5999999999999996e+00"' in lines[1]


def test_appliances_first_row_matches_raw_fields() -> None:
    with gzip.open(APPL, "rt", newline="") as f:
        header, first = list(csv.reader(io.StringIO(f.read())))[:2]
    raw = dict(zip(header, first, strict=True))
    evs = list(iter_dataset("uci-appliances", APPL, limit=26))
    assert len(evs) == 26 and len({e["ts"] for e in evs}) == 1
    assert evs[0]["ts"] == utc("2016-01-11 17:00:00")
    by = {e["id"].split(":")[2]: e for e in evs}
    assert set(by) == {c.lower() for c in header if c not in ("date", "rv1", "rv2")}
    for col, text in raw.items():
        if col.lower() in by:
            assert by[col.lower()]["value"] == float(text), col
    assert by["appliances"]["value"] == 60 and type(by["appliances"]["value"]) is int
    assert (by["lights"]["kind"], by["lights"]["unit"], by["lights"]["room"]) == (
        "energy",
        "Wh",
        "house",
    )
    assert (by["t1"]["room"], by["t1"]["kind"]) == ("kitchen", "temperature")
    assert (by["rh_6"]["room"], by["rh_6"]["kind"]) == ("outside", "humidity")
    assert (by["t8"]["room"], by["t9"]["room"]) == ("teen2", "parents")
    assert by["t_out"]["value"] == 6.6 and by["t_out"]["room"] == "weather"
    assert by["press_mm_hg"]["kind"] == "pressure"
    assert by["t1"]["id"] == "uci-appliances:kitchen:t1:20160111T170000"
    assert by["t1"]["sensor"] == "uci-appliances-kitchen-t1"


def test_appliances_whole_excerpt() -> None:
    evs = list(iter_dataset("uci-appliances", APPL.parent))
    assert len(evs) == 144 * 26 and len({e["id"] for e in evs}) == len(evs)
    assert not any(e.get("suspect") for e in evs)
    rooms = {e["room"] for e in evs}
    assert rooms == {
        "house",
        "kitchen",
        "living",
        "laundry",
        "office",
        "bathroom",
        "outside",
        "ironing",
        "teen2",
        "parents",
        "weather",
    }
    kitchen = list(iter_dataset("uci-appliances", APPL, rooms=["kitchen"], kinds=["humidity"]))
    assert len(kitchen) == 144 and {e["sensor"] for e in kitchen} == {"uci-appliances-kitchen-rh_1"}


def test_appliances_dst_gap_with_zone(tmp_path: Path) -> None:
    """02:00-02:50 on 2016-03-27 do not exist in Brussels: ts repeat, ids stay unique."""
    with gzip.open(APPL, "rt", newline="") as f:
        header, first = f.readline(), f.readline()
    rows = [
        first.replace("2016-01-11 17:00:00", f"2016-03-27 {h}")
        for h in ("01:50:00", "02:10:00", "03:10:00")
    ]
    path = tmp_path / "energydata_complete.csv"
    path.write_text(header + "".join(rows), newline="")
    local = [
        e
        for e in iter_dataset("uci-appliances", path, kinds=["energy"], tz="Europe/Brussels")
        if e["id"].split(":")[2] == "lights"
    ]
    assert [e["ts"] for e in local][1] == local[2]["ts"]
    assert len({e["id"] for e in local}) == 3
    fixed = [e["ts"] for e in iter_dataset("uci-appliances", path, kinds=["energy"], tz="+01:00")]
    assert fixed == sorted(fixed) and len(set(fixed)) == 3


# --- UCI SML2010 --------------------------------------------------------------------------------


def test_sml2010_raw_quirks_present() -> None:
    lines = (SML / "NEW-DATA-1.T15.txt").read_text().splitlines()
    assert lines[0].startswith("#  1:Date 2:Time 3:Temperature_Comedor_Sensor")
    assert lines[1].startswith("13/03/2012 11:45 ")  # dd/mm/yyyy (day 13 cannot be a month)
    assert parse_header(lines[0])[23] == "Day_Of_Week"
    assert parse_datetime("02/05/2012", "03:15") == datetime(2012, 5, 2, 3, 15)


def test_sml2010_first_row() -> None:
    evs = list(iter_dataset("uci-sml2010", SML / "NEW-DATA-1.T15.txt", limit=18))
    assert {e["ts"] for e in evs} == {utc("2012-03-13 11:45:00")}
    by = {(e["room"], e["id"].split(":")[2]): e for e in evs}
    assert by[("dining", "temperature")]["value"] == 18.1875
    assert by[("room", "temperature")]["value"] == 17.8275
    assert by[("forecast", "temperature")]["value"] == 0.0  # start-up value, kept as is
    assert by[("dining", "co2")]["value"] == 216.56 and by[("room", "co2")]["value"] == 221.92
    assert by[("outside", "sun_south")]["value"] == 95436.8
    assert (
        by[("outside", "sun_south")]["kind"] == "light"
        and "suspect" not in by[("outside", "sun_south")]
    )  # outdoor light range
    assert by[("outside", "irradiance")]["unit"] == "W/m²"
    assert by[("outside", "humidity")]["value"] == 48.375
    assert by[("dining", "co2")]["id"] == "uci-sml2010:dining:co2:20120313T114500"
    assert {e["building"] for e in evs} == {"sml2010"}
    assert not any("entalpic" in e["id"] or "day" in e["id"] for e in evs)


def test_sml2010_directory_midnight_and_gap() -> None:
    evs = list(iter_dataset("uci-sml2010", SML, rooms=["dining"], kinds=["temperature"]))
    assert len(evs) == 60 + 36
    stamps = [e["id"].rsplit(":", 1)[1] for e in evs]
    assert "20120314T000000" in stamps  # 14/03/2012 00:00, dd/mm read correctly
    assert "20120502T024500" in stamps and "20120502T031500" in stamps
    assert "20120502T030000" not in stamps and "20120502T044500" not in stamps  # file's gaps
    assert all(a["ts"] < b["ts"] for a, b in zip(evs, evs[1:], strict=False))


# --- rules and helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "room", "value", "suspect"),
    [
        ("temperature", "419", 579.27, True),
        ("temperature", "656A", -40.1, True),
        ("temperature", "office", 24.0, False),
        ("temperature", "outside", -45.0, False),
        ("humidity", "723", -500.96, True),
        ("humidity", "x", 100.0, False),
        ("light", "723", 30551.0, True),
        ("light", "outside", 95436.8, False),
        ("presence", "415", 34456, True),
        ("presence", "415", 30, False),
        ("co2", "562", 8.0, False),
        ("co2", "x", -1.0, True),
        ("energy", "house", 1080, False),
        ("irradiance", "outside", -4.2, False),
    ],
)
def test_suspect_rules(kind: str, room: str, value: float, suspect: bool) -> None:
    assert is_suspect(kind, room, value) is suspect


def test_helpers() -> None:
    assert parse_number("  60", integer=True) == 60
    assert parse_number(" 6.5999999999999996e+00", integer=False) == 6.6
    assert parse_number("NA", integer=False) is None
    assert resolve_tz("-07:00").utcoffset(None).total_seconds() == -7 * 3600
    with pytest.raises(DatasetError):
        resolve_tz("Nowhere/Town")


# --- CLI ----------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_convert_stdout_is_valid_event_json_lines() -> None:
    res = runner.invoke(
        app,
        ["convert", "keti", str(KETI), "--rooms", "419", "--kinds", "temperature", "--limit", "50"],
    )
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 50
    for n, line in enumerate(lines, 1):
        obj = json.loads(line)
        assert obj["room"] == "419" and obj["kind"] == "temperature"
        ev = parse_event_line(line, n)  # ENS's own event reader accepts it
        assert ev.id == obj["id"] and ev.ts == obj["ts"]


def test_cli_convert_to_gzip_file(tmp_path: Path) -> None:
    out = tmp_path / "sml.jsonl.gz"
    res = runner.invoke(
        app,
        [
            "convert",
            "uci-sml2010",
            str(SML),
            "--out",
            str(out),
            "-k",
            "co2,humidity",
            "--tz",
            "+01:00",
        ],
    )
    assert res.exit_code == 0, res.stderr
    assert "wrote 480 events" in res.stderr  # co2: 2 rooms, humidity: 3
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert len(lines) == (60 + 36) * 5
    evs = [json.loads(x) for x in lines]
    assert {e["kind"] for e in evs} == {"co2", "humidity"}
    assert evs[0]["ts"] == utc("2012-03-13 11:45:00") - 3600
    assert not list(tmp_path.glob("*.part"))


def test_cli_convert_plain_file(tmp_path: Path) -> None:
    out = tmp_path / "occ.jsonl"
    res = runner.invoke(app, ["convert", "uci-occupancy", str(OCC), "-o", str(out), "-n", "10"])
    assert res.exit_code == 0, res.stderr
    assert len(out.read_text().splitlines()) == 10


def test_cli_batch_encoder_equals_json_dumps_even_for_tricky_strings() -> None:
    evs = list(iter_dataset("uci-sml2010", SML, limit=5000))
    evs += [{"id": "a},{b", "ts": 1.0}, {"id": "x", "ts": 2.0, "room": "},{", "unit": "°C"}]
    text = "".join(_batches(iter(evs)))
    assert text == "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in evs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "nope", "."], "unknown data set 'nope'"),
        (["convert", "keti", "/no/such/dir"], "no such file or directory"),
        (["convert", "uci-appliances", str(OCC)], "no UCI appliances files"),
        (["convert", "keti", str(KETI), "--rooms", "999"], "unknown room(s) 999"),
        (["convert", "keti", str(KETI), "--tz", "UTC"], "tz does not apply"),
        (["convert", "keti", str(KETI), "-o", "/no/such/dir/x.jsonl"], "cannot write"),
        (["excerpt", "--src", "/no/such/dir"], "not the shared data folder"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_cli_list() -> None:
    res = runner.invoke(app, ["list"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for name in DATASETS:
        assert name in res.stdout


# --- full data (skipped in a clean clone) -------------------------------------------------------


@needs_shared
def test_full_keti_room_counts_match_manifest() -> None:
    rows = manifest_rows(SHARED / "keti")
    want = {s: rows[f"413/{s}.csv"] for s in keti.SENSORS}
    got = dict.fromkeys(keti.SENSORS, 0)
    last = 0.0
    for ev in iter_dataset("keti", SHARED / "keti", rooms=["413"]):
        got[ev["id"].split(":")[2]] += 1
        assert ev["ts"] >= last
        last = ev["ts"]
    assert got == want


@needs_shared
def test_excerpt_regenerates_byte_identical(tmp_path: Path) -> None:
    res = runner.invoke(app, ["excerpt", "--src", str(SHARED), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.stderr
    committed = sorted(
        p.relative_to(DATA) for p in DATA.rglob("*") if p.is_file() and p.parent != DATA
    )
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh == committed
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (DATA / rel).read_bytes(), rel
