"""The asset registry: files checked whole (FILE:LINE errors, nothing stored), the Redis
store and its generated fault profiles, enrichment's precedence, the `labels:` of an alarm,
and the engine worker raising and clearing a sensor-silent fault (docs/assets.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
from typer.testing import CliRunner

from adapters.service import alarm_store as als
from adapters.service import asset_store as ast
from adapters.service import redis_store as rs
from adapters.service.assets import Asset, AssetError, Registry, parse_registry, read_registry
from adapters.service.enrich import AssetCache
from adapters.service.worker import EngineWorker
from ens.commands.assets import register
from notifiers.alarms import AlarmRules
from profiles.alarm import parse_alarm
from profiles.errors import ManyErrors
from tests.helpers_service import worker_config
from tests.test_service_worker import drain, ingest

ROOT = Path(__file__).resolve().parent.parent
HEADER = "id,kind,point,room,floor,building,tz,interval\n"
T0 = 1_700_000_000.0


def problems(text: str, csv_format: bool = True) -> list[str]:
    with pytest.raises((AssetError, ManyErrors)) as info:
        parse_registry(text, "reg.csv" if csv_format else "reg.yaml", csv_format)
    exc = info.value
    return [str(e) for e in exc.errors] if isinstance(exc, ManyErrors) else [str(exc)]


# ----------------------------------------------------------------------------- files


def test_csv_problems_are_named_with_their_line() -> None:
    text = HEADER + (
        "t-1,sensor,temperature,101,1,A,Europe/Berlin,5m\n"
        "t-1,sensor,temperature,101,1,A,,\n"  # duplicate id
        "t-2,sensor,co2,102,1,A,Europe/Nowhere,\n"  # unknown time zone
        "t-3,sensor,co2,102,1,A,,-5s\n"  # bad interval
        "t-4,thing,co2,102,1,A,,\n"  # unknown kind
        "t-5,sensor,co2,102,1,A,,200ms\n"  # an interval below a second: a typo
        "t 6,sensor,co2,102,1,A,,\n"  # a bad id
        "t-7,sensor,co2\n"  # too few fields
    )
    assert problems(text) == [
        "reg.csv:3: duplicate sensor id 't-1' (first on line 2)",
        "reg.csv:4: unknown time zone 'Europe/Nowhere' (an IANA name: Europe/Berlin)",
        "reg.csv:5: interval '-5s': must be at least 1s",
        "reg.csv:6: kind 'thing': expected sensor or gateway",
        "reg.csv:7: interval '200ms': must be at least 1s",
        "reg.csv:8: id 't 6': 1-117 characters: letters, digits, _ . : @ - (starting with a "
        "letter or digit)",
        "reg.csv:9: 3 fields, the header has 8",
    ]


def test_csv_unknown_and_missing_columns() -> None:
    assert problems("id,room,colour,size\nx,1,red,2\n") == [
        "reg.csv:1: unknown columns 'colour', 'size' (allowed: id, kind, point, room, floor, "
        "building, tz, interval, severity)"
    ]
    assert problems("room,floor\n1,2\n") == ["reg.csv:1: no 'id' column"]
    assert problems("") == ["reg.csv:1: empty file: expected a header row"]
    assert problems("id\n") == ["reg.csv: no assets"]


def test_yaml_defaults_fault_and_positions() -> None:
    reg = parse_registry(
        "defaults: {building: SDH, tz: America/Los_Angeles, interval: 1m}\n"
        "fault: {severity: minor, subscriber: night}\n"
        "assets:\n"
        "  - {id: keti-413-co2, point: co2, room: '413', floor: 4}\n"
        "  - {id: keti-gw, kind: gateway, interval: null}\n",
        "reg.yaml",
        csv_format=False,
    )
    assert reg.fault_severity == "minor" and reg.fault_subscriber == "night"
    assert reg.assets[0] == Asset(
        "keti-413-co2", "sensor", "co2", "413", "4", "SDH", "America/Los_Angeles", 60.0
    )
    assert reg.assets[1].kind == "gateway" and reg.assets[1].interval is None
    bad = (
        "fault: {severity: huge}\n"
        "colour: red\n"
        "assets:\n"
        "  - {id: a, interval: 1m}\n"
        "  - {id: a, interval: 1m}\n"
        "  - {id: b, speed: fast}\n"
        "  - just-a-string\n"
    )
    assert problems(bad, csv_format=False) == [
        "reg.yaml:1: fault.severity 'huge': one of critical, major, minor, warning, info",
        "reg.yaml:2: unknown key 'colour' (allowed: assets, defaults, fault)",
        "reg.yaml:5: duplicate sensor id 'a' (first on line 4)",
        "reg.yaml:6: unknown column 'speed' (allowed: id, kind, point, room, floor, building, "
        "tz, interval, severity)",
        "reg.yaml:7: an asset is a mapping (id, kind, ...)",
    ]


def test_a_spreadsheet_bom_is_not_a_column(tmp_path: Path) -> None:
    f = tmp_path / "excel.csv"
    f.write_bytes(b"\xef\xbb\xbf" + (HEADER + "t-1,sensor,co2,1,1,A,,1m\n").encode())
    assert read_registry(f).assets[0].id == "t-1"


def test_the_keti_example_registry_reads() -> None:
    reg = read_registry(ROOT / "examples" / "assets" / "keti-registry.yaml")
    sensors = [a for a in reg.assets if a.kind == "sensor"]
    assert len(sensors) == 30 and all(a.building == "SDH" and a.interval for a in sensors)
    assert read_registry(ROOT / "examples" / "assets" / "keti-registry.csv").assets == reg.assets


# ----------------------------------------------------------------------------- the store


def _reg(*rows: str) -> Registry:
    return parse_registry(HEADER + "".join(rows), "reg.csv", csv_format=True)


def test_fault_profiles_are_valid_and_follow_the_registry(r: redis.Redis) -> None:
    res = ast.import_registry(
        r, _reg("s1,sensor,co2,101,1,A,,5m\n", "s2,sensor,co2,102,1,A,,\n", "g1,gateway,,,,A,,1h\n")
    )
    assert (res.added, res.faults, res.profiles_written) == (3, 2, 2)
    for pid in ("comm-fault:s1", "comm-fault-gw:g1"):
        rec = rs.get_profile(r, pid)
        assert rec is not None and rec["generated"] == "assets"
        prof = rs.validate_profile(r, pid, rec["expr"], rec["subscriber"])
        spec = rs.validate_alarm(prof, rec["alarm"])
        assert spec.clear == "on" and spec.severity == "major"
        assert dict(spec.labels)["class"] == "comm-fault"
    assert rs.get_profile(r, "comm-fault:s1")["expr"] == 'absent(sensor = "s1") within 300s'  # type: ignore[index]
    assert rs.get_profile(r, "comm-fault-gw:g1")["expr"] == 'absent(gateway = "g1") within 3600s'  # type: ignore[index]
    v = ast.version(r)
    control = r.xlen(rs.CONTROL)
    # the same file again: nothing written, no control entry, the version stays
    again = ast.import_registry(
        r, _reg("s1,sensor,co2,101,1,A,,5m\n", "s2,sensor,co2,102,1,A,,\n", "g1,gateway,,,,A,,1h\n")
    )
    assert (again.unchanged, again.profiles_written) == (3, 0)
    assert (ast.version(r), r.xlen(rs.CONTROL)) == (v, control)
    # merge: s1 moves room (its profile's labels change), s2 gains an interval
    res = ast.import_registry(r, _reg("s1,sensor,co2,201,2,A,,5m\n", "s2,sensor,co2,102,1,A,,1m\n"))
    assert (res.changed, res.profiles_written, res.removed) == (2, 2, 0)
    labels = rs.get_profile(r, "comm-fault:s1")["alarm"]["labels"]  # type: ignore[index]
    assert (labels["room"], labels["floor"]) == ("201", "2")
    # replace: s2 and g1 are not in the file: they go, with their profiles; s1 loses its
    # interval, and its profile; one control entry in all
    control = r.xlen(rs.CONTROL)
    res = ast.import_registry(r, _reg("s1,sensor,co2,201,2,A,,\n"), replace=True)
    assert (res.removed, res.profiles_deleted, res.faults) == (2, 3, 0)
    assert [a["id"] for a in ast.list_assets(r)] == ["s1"]
    assert not [k for k in r.hkeys(rs.PROFILES) if str(k).startswith("comm-fault")]
    assert r.xlen(rs.CONTROL) == control + 1


def test_an_unknown_fault_subscriber_stores_nothing(r: redis.Redis) -> None:
    with pytest.raises(AssetError, match="fault subscriber 'nobody': no such subscriber"):
        ast.import_registry(r, _reg("s1,sensor,co2,101,1,A,,5m\n"), subscriber="nobody")
    assert r.hlen(ast.ASSETS) == 0 and r.hlen(rs.PROFILES) == 0


def test_cli_import_list_show_rm(r: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "a,sensor,co2,1,1,A,,1m\na,sensor,co2,1,1,A,,2m\nb,,,,,,,xx\n")
    out = runner.invoke(app, ["assets", "import", str(bad), "--redis-url", redis_url])
    assert out.exit_code == 2
    assert f"error: {bad}:3: duplicate sensor id 'a' (first on line 2)" in out.output
    assert (
        f"error: {bad}:4: interval 'xx'" in out.output
        and "2 problems; nothing stored" in out.output
    )
    assert "Traceback" not in out.output and r.hlen(ast.ASSETS) == 0
    out = runner.invoke(app, ["assets", "check", str(bad)])
    assert out.exit_code == 2 and "2 problems; nothing stored" in out.output
    good = ROOT / "examples" / "assets" / "keti-registry.yaml"
    out = runner.invoke(app, ["assets", "import", str(good), "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    assert "31 assets: 31 added" in out.output and "30 with a sensor-silent fault" in out.output
    out = runner.invoke(app, ["assets", "list", "--json", "--redis-url", redis_url])
    assert len(json.loads(out.output)) == 31
    out = runner.invoke(app, ["assets", "show", "keti-419-co2", "--redis-url", redis_url])
    shown = json.loads(out.output)[0]
    assert (shown["room"], shown["floor"], shown["fault_profile"]) == (
        "419", "4", "comm-fault:keti-419-co2",
    )  # fmt: skip
    out = runner.invoke(app, ["assets", "rm", "keti-419-co2", "--redis-url", redis_url])
    assert out.exit_code == 0 and "1 removed (1 fault profiles deleted)" in out.output
    out = runner.invoke(app, ["assets", "rm", "keti-419-co2", "--redis-url", redis_url])
    assert out.exit_code == 2 and "no sensor 'keti-419-co2'" in out.output


# ----------------------------------------------------------------------------- enrichment


def test_enrich_precedence_and_conflicts() -> None:
    cache = AssetCache()
    cache.load(
        1,
        {
            "sensor/s1": json.dumps({"id": "s1", "room": "101", "floor": "1"}),
            "gateway/g": json.dumps({"id": "g", "kind": "gateway", "building": "A", "room": "x"}),
        },
    )
    assert cache.enrich({"sensor": "s1", "v": 1}, "g") == {
        "building": "A", "room": "101", "floor": "1", "sensor": "s1", "v": 1,
    }  # fmt: skip
    assert cache.enrich({"sensor": "s9"}, "g") == {"building": "A", "room": "x", "sensor": "s9"}
    plain = {"sensor": "s9"}
    assert cache.enrich(plain, "other") is plain  # nothing registered: the same dict
    assert cache.enrich({"sensor": "s1", "room": "999"}, "other")["room"] == "999"
    assert cache.logged == {"s1"}


# ----------------------------------------------------------------------------- alarm labels


def test_alarm_labels_are_checked_and_carried() -> None:
    spec, errs = parse_alarm(
        {"severity": "major", "labels": {"class": "comm-fault", "floor": 3}}, None, None, "p", "f"
    )
    assert (
        not errs and spec is not None and spec.labels == (("class", "comm-fault"), ("floor", "3"))
    )
    assert spec.to_json()["labels"] == {"class": "comm-fault", "floor": "3"}
    _, errs = parse_alarm(
        {"labels": {"severity": "x", "bad name": 1, "k": [1]}}, None, None, "p", "f"
    )
    assert [e.message for e in errs] == [
        "f: profile 'p': alarm.labels: 'severity' is set by the alarm itself (profile, "
        "severity, subscriber)",
        "f: profile 'p': alarm.labels: 'bad name' is not a label name",
        "f: profile 'p': alarm.labels: k: [1]: expected a string or number",
    ]
    rules = AlarmRules({"p": spec})
    eff = rules.on_match("p", 1.0, {"room": "1"}, {}, None)
    assert eff.transitions[0].labels == {
        "room": "1", "class": "comm-fault", "floor": "3", "profile": "p", "severity": "major",
        "subscriber": "",
    }  # fmt: skip
    snap = json.loads(json.dumps(rules.snapshot()))
    assert [a.pop("fixed") for a in snap["alarms"].values()] == [
        {"class": "comm-fault", "floor": "3"}
    ]  # a snapshot of before `fixed` existed restores without it
    back = AlarmRules.restore(snap, {"p": spec})
    assert [a.fixed for a in back.book.alarms.values()] == [{}]


def test_an_idle_clear_condition_changes_what_the_full_call_changes() -> None:
    """`AlarmRules.on_match` skips a clear condition that can change nothing (the alarm not
    active, nothing due): on random histories of matches, clears and silences, the effects
    and the snapshots equal those of the full call."""
    import random

    from profiles.alarm import AlarmSpec

    class Full(AlarmRules):
        def _idle_clear(self, *args: Any) -> bool:
            return False

    specs = {
        "a": AlarmSpec("major", "on", None, "k = 1", ("raise", "clear")),
        "b": AlarmSpec("minor", "after", 5.0, None, ("raise", "repeat", "clear")),
    }
    for seed in range(30):
        rnd = random.Random(seed)
        quick, full = AlarmRules(specs), Full(specs)
        t = 0.0
        for _ in range(200):
            t += rnd.choice((0.0, 0.5, 1.0, 3.0, 7.0))
            pid = rnd.choice(("a", "a#clear", "b", "b#clear", "c#clear"))
            part = {"room": str(rnd.randrange(3))}
            got = [rules.on_match(pid, t, part, {"e": "x"}, "s") for rules in (quick, full)]
            assert [e.transitions for e in got[0:1]] == [e.transitions for e in got[1:2]]
            assert got[0].messages == got[1].messages
            if rnd.random() < 0.05:
                data = {"matchers": ["room=1"], "for": "4s", "comment": "c"}
                quick.add_silence(data, t)
                full.add_silence(data, t)
        assert quick.snapshot() == full.snapshot()
        assert quick.advance(t + 100).transitions == full.advance(t + 100).transitions


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text",
    [
        'sensor = "keti-419-co2"',
        'absent(sensor = "a.b:c@d_e-1") within 60s',
        'absent(gateway = "gw_1") within 3600s',
        'sensor = ""',
        'localtime = "22:00"',  # parsed apart by lark: no quick form
        'weekday = "mon"',
        'absent(sensor = "x") within 0s',  # an error: lark's own message
        'and = "x"',  # a keyword: lark's own message
        'absent(sensor = "x")',
        'sensor = "x" within 5s',
    ],
)
def test_the_quick_equality_parse_equals_lark(text: str) -> None:
    """The generated forms skip lark (parsed once per shape); the profile is lark's own,
    and anything else, errors included, is lark's."""
    from profiles import parser
    from profiles.errors import ProfileError

    def both(fn: Any) -> Any:
        try:
            p = fn(text, "p1", "sub")
        except ProfileError as exc:
            return ("error", str(exc))
        return (p, p.source, p.id, p.subscriber, p.within)

    assert both(parser.parse_profile) == both(lambda t, i, s: parser._parse_full(t, i, s, None))


def test_long_intervals_are_parsed() -> None:
    rec = {"id": "s", "interval": 2_000_000.0}
    gen = ast.fault_profile(rec)
    assert gen is not None and gen[1]["expr"] == 'absent(sensor = "s") within 2000000s'
    rs.validate_profile(None, gen[0], gen[1]["expr"])
    frac = ast.fault_profile({"id": "s", "interval": 1.5})
    assert frac is not None and frac[1]["expr"].endswith("within 1.5s")
    rs.validate_profile(None, frac[0], frac[1]["expr"])


# ----------------------------------------------------------------------------- the engine


def _alarm(rt: redis.Redis, profile: str) -> dict[str, Any] | None:
    found = [a for a in als.list_alarms(rt) if a["profile"] == profile]
    return found[0] if found else None


def test_worker_raises_a_never_heard_sensor_and_clears_it(rb: redis.Redis, rt: redis.Redis) -> None:
    """Event time: the fault profiles are activated at the engine's first time (the first
    event); ``quiet`` is never heard, so its alarm is raised 10 s later; its first event clears
    it; ``live`` reports every 2 s and gets none. A registry import while the worker runs
    reaches it through one control entry."""
    ast.import_registry(rt, _reg("live,sensor,co2,1,1,A,,10s\n", "quiet,sensor,co2,2,1,A,,10s\n"))
    w = EngineWorker(rb, worker_config(reorder_seconds=0.0, batch=50, commit_min_interval=0))
    w.start()
    clock = [time.time()]
    ingest(rb, [{"id": f"l{i}", "ts": T0 + 2 * i, "sensor": "live"} for i in range(10)])
    drain(w, clock)
    a = _alarm(rt, "comm-fault:quiet")
    assert a is not None and a["state"] == "active-unacknowledged" and a["first_seen"] == T0 + 10
    assert a["labels"]["room"] == "2" and a["labels"]["class"] == "comm-fault"
    assert _alarm(rt, "comm-fault:live") is None
    ingest(rb, [{"id": "q1", "ts": T0 + 19, "sensor": "quiet"}])
    drain(w, clock)
    assert (_alarm(rt, "comm-fault:quiet") or {})["state"] == "cleared-unacknowledged"
    # a sensor registered while the worker runs is watched from the engine's time then; one
    # whose id is a number may be sent as one (its fault and its clear take both forms)
    ast.import_registry(rt, _reg("late,sensor,co2,3,1,A,,5s\n", "101,sensor,co2,4,1,A,,5s\n"))
    readings = [{"id": f"m{i}", "ts": T0 + 20 + i, "sensor": "live"} for i in range(8)]
    readings += [{"id": f"n{i}", "ts": T0 + 20.5 + i, "sensor": 101} for i in range(8)]
    ingest(rb, sorted(readings, key=lambda e: e["ts"]))
    drain(w, clock)
    late = _alarm(rt, "comm-fault:late")
    assert late is not None and T0 + 20 <= late["first_seen"] <= T0 + 26
    assert _alarm(rt, "comm-fault:101") is None  # heard, as a number
