"""docs/language.md §4.1 (the eleven clarifications): one case each in tests/cases/41-*.yaml, run
through `ens replay` under every engine, every single-step variant and every plan.

test_conformance.py runs these cases too, under its usual engines; here every variant meets
every plan, and `--plan auto` gets rates that make the last component the rarest (so each
profile that rare-first can take is driven by it). Shapes that rare-first cannot keep
(`select last`, `select nth`) stay eager, and `ens explain` says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ens.cli import app
from filters.engine import Engine
from filters.pattern import Pattern
from profiles.ast import Absent
from profiles.parser import parse_profile
from tests.conftest import canon, load_case

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

CASES = sorted((Path(__file__).parent / "cases").glob("41-*.yaml"))
ENGINES = ["two-step"] + [
    f"{variant}+{plan}" for variant in Engine.VARIANTS for plan in ("eager", "rare-first", "auto")
]

runner = CliRunner()


def _stats(case: dict, path: Path) -> Path:
    """Rates for --plan auto: the first component 1000/h, every later one 1/h."""
    doc: dict = {"version": 1, "profiles": {}}
    for p in case["profiles"]:
        try:
            profile = parse_profile(p["expr"], p["id"])
        except Exception:  # the error case: the replay reports it
            continue
        if profile.is_filter or isinstance(profile.expr, Absent):
            continue
        names = [lf.name for lf in Pattern.build(profile).leaves]
        doc["profiles"][p["id"]] = {
            n: {"rate_per_hour": 1000.0 if i == 0 else 1.0} for i, n in enumerate(names)
        }
    path.write_text(json.dumps(doc))
    return path


def _args(engine: str, stats: Path) -> list[str]:
    if engine == "two-step":
        return ["--engine", "two-step"]
    variant, plan = engine.split("+")
    args = ["--engine", "single-step", "--variant", variant, "--plan", plan]
    return args + (["--stats", str(stats)] if plan == "auto" else [])


def test_every_item_has_a_case() -> None:
    assert sorted(load_case(p)["item"] for p in CASES) == list(range(1, 12))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_item_under_every_engine_variant_and_plan(path: Path, case_files, tmp_path: Path) -> None:
    case = load_case(path)
    prof, evs = case_files(case)
    stats = _stats(case, tmp_path / "stats.json")
    outs: dict[str, str] = {}
    for engine in ENGINES:
        args = ["replay", str(prof), str(evs), *_args(engine, stats)]
        if "until" in case:
            args += ["--until", str(case["until"])]
        result = runner.invoke(app, args)
        if "expect_error" in case:
            assert result.exit_code == 2, (engine, result.output)
            assert case["expect_error"].lower() in result.stderr.lower(), engine
            assert result.stdout == "", engine
            continue
        assert result.exit_code == 0, (engine, result.stderr)
        got = [json.loads(line) for line in result.stdout.splitlines()]
        assert canon(got) == canon(case["expect"]), engine
        outs[engine] = result.stdout
    for engine, out in outs.items():
        assert out == outs["two-step"], engine  # byte for byte, order included


@pytest.mark.parametrize(
    ("select", "why", "trace"),
    [
        ("select last", "select last stays eager", "replaced"),
        ("select nth 2", "select nth stays eager", "counted"),
    ],
)
@pytest.mark.parametrize("plan", ["rare-first", "auto"])
def test_explain_says_why_last_and_nth_stay_eager(
    select: str, why: str, trace: str, plan: str, tmp_path: Path
) -> None:
    """§4.1 items 1-2 need the partial match as it was at every event: rare-first keeps such
    profiles eager, and `ens explain` names the reason (with rates that would otherwise
    have chosen rare-first)."""
    prof = tmp_path / "p.yaml"
    expr = f'seq(a: k = "A", b: k = "B") within 1m {select}'
    prof.write_text(yaml.safe_dump({"profiles": [{"id": "p", "expr": expr}]}))
    ev = tmp_path / "e.jsonl"
    ev.write_text(
        "".join(
            json.dumps({"id": i, "ts": t, "k": i[0].upper()}) + "\n"
            for i, t in (("a1", 0), ("a2", 1), ("b1", 2), ("b2", 3))
        )
    )
    stats = tmp_path / "s.json"
    stats.write_text(
        json.dumps(
            {
                "version": 1,
                "profiles": {"p": {"a": {"rate_per_hour": 1000}, "b": {"rate_per_hour": 1}}},
            }
        )
    )
    args = ["explain", str(prof), str(ev), "-p", "p", "--plan", plan] + (
        ["--stats", str(stats)] if plan == "auto" else []
    )
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.stderr
    assert "plan: eager, matches opened by a" in r.stdout
    assert why in r.stdout and "docs/language.md §4.1" in r.stdout
    assert f"    {trace}" in r.stdout  # the eager trace: the replacement / the count
    assert "1 notification(s)" in r.stdout


def test_explain_shows_a_refused_replacement(tmp_path: Path) -> None:
    """§4.1 item 1 in the trace: b2 would put x1 between a1 and b, so it replaces nothing."""
    case = load_case(Path(__file__).parent / "cases" / "41-01-last-replacement-valid.yaml")
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"profiles": case["profiles"]}))
    ev = tmp_path / "e.jsonl"
    ev.write_text("".join(json.dumps(e) + "\n" for e in case["events"]))
    r = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "p1"])
    assert r.exit_code == 0, r.stderr
    assert (
        "ignored   b2 as b for {a: a1, b: b1}: the match would break (where/negation)" in r.stdout
    )
    assert "reported  {a: a1, b: b1, c: c1}" in r.stdout
