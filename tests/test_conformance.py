"""Every conformance case (copied from ../shared/conformance, plus our own) through `ens replay`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ens.cli import app
from tests.conftest import CONFORMANCE, canon, load_case

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

CASES = sorted(CONFORMANCE.glob("*.yaml")) + sorted(
    (Path(__file__).parent / "cases").glob("*.yaml")
)
# default variant: references; "+rare-first": every seq that allows it driven by its last component
ENGINES = [
    "single-step",
    "single-step:dynamic",
    "single-step:marking",
    "single-step+rare-first",
    "two-step",
]


def engine_args(engine: str) -> list[str]:
    """`ens replay` options of an ENGINES entry (name[:variant][+plan])."""
    engine, _, plan = engine.partition("+")
    name, _, variant = engine.partition(":")
    return (
        ["--engine", name]
        + (["--variant", variant] if variant else [])
        + (["--plan", plan] if plan else [])
    )


def case_options(case: dict) -> list[str]:
    """`ens replay` options a case asks for: `until` (--until), `replay_tz` (--tz)."""
    out = []
    if "until" in case:
        out += ["--until", str(case["until"])]
    if "replay_tz" in case:
        out += ["--tz", str(case["replay_tz"])]
    return out


runner = CliRunner()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case(path: Path, engine: str, case_files) -> None:
    case = load_case(path)
    prof, evs = case_files(case)
    args = ["replay", str(prof), str(evs), *engine_args(engine), *case_options(case)]
    result = runner.invoke(app, args)
    if "expect_error" in case:
        assert result.exit_code == 2, result.output
        assert case["expect_error"].lower() in result.stderr.lower()
        assert result.stdout == ""
        return
    assert result.exit_code == 0, result.stderr
    got = [json.loads(line) for line in result.stdout.splitlines()]
    assert canon(got) == canon(case["expect"])
    ts = [n["ts"] for n in got]
    assert ts == sorted(ts), "output must be ordered by ts"


def test_shared_copy_is_complete() -> None:
    shared = Path(__file__).parents[2] / "shared" / "conformance"
    if not shared.exists():
        pytest.skip("no ../shared next to this clone")
    for f in shared.glob("*.yaml"):
        assert (CONFORMANCE / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("engine", ENGINES)
def test_matches_completed_by_one_event_come_in_bound_event_order(engine: str, case_files) -> None:
    """docs/language.md §4: matches completed by the same event are reported in the order of their
    bound events, component by component (the cases compare notifications as a multiset)."""
    want = {
        "21-select-rows-seq3": [
            {"a": "a1", "b": "b1", "c": "c1"},
            {"a": "a1", "b": "b2", "c": "c1"},
            {"a": "a2", "b": "b1", "c": "c1"},
            {"a": "a2", "b": "b2", "c": "c1"},
            {"a": "a1", "b": "b1", "c": "c2"},
            {"a": "a1", "b": "b2", "c": "c2"},
            {"a": "a2", "b": "b1", "c": "c2"},
            {"a": "a2", "b": "b2", "c": "c2"},
        ],
        "35-unique-earliest-by-component": [
            {"a": "a1", "b": "b2", "c": "c1"},
            {"a": "a2", "b": "b1", "c": "c1"},
        ],
    }
    for stem, events in want.items():
        prof, evs = case_files(load_case(Path(__file__).parent / "cases" / f"{stem}.yaml"))
        args = ["replay", str(prof), str(evs), *engine_args(engine)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        got = [json.loads(line) for line in result.stdout.splitlines()]
        assert [n["events"] for n in got if n["profile"] == "es"] == events, stem


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_every_engine_writes_identical_output(path: Path, case_files) -> None:
    """docs/language.md §7: the output is identical whichever engine or option is chosen — byte for
    byte, including the order of notifications with the same ts (test_case compares multisets)."""
    case = load_case(path)
    if "expect_error" in case:
        pytest.skip("error case")
    prof, evs = case_files(case)
    outs = {}
    for engine in ENGINES:
        args = ["replay", str(prof), str(evs), *engine_args(engine), *case_options(case)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        outs[engine] = result.stdout
    for engine, out in outs.items():
        assert out == outs["two-step"], engine
