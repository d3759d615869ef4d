"""Shared test fixtures. Everything here runs without ../shared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

# The suite draws the same examples on every run, so CI cannot fail by chance;
# `make fuzz` (HYPOTHESIS_PROFILE=explore) draws new ones to hunt for disagreements.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HERE = Path(__file__).parent
CONFORMANCE = HERE / "conformance"


def load_case(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def write_case_files(case: dict, tmp: Path) -> tuple[Path, Path]:
    """A conformance case as the files `ens replay` reads."""
    prof = tmp / "profiles.yaml"
    prof.write_text(yaml.safe_dump({"profiles": case["profiles"]}, sort_keys=False))
    evs = tmp / "events.jsonl"
    evs.write_text("".join(json.dumps(e, default=str) + "\n" for e in case["events"]))
    return prof, evs


def canon(notes: list[dict]) -> list[str]:
    """Notifications as a comparable multiset (ts to 1e-6 s)."""
    out = []
    for n in notes:
        key = {k: n[k] for k in ("profile", "events", "partition") if k in n}
        out.append(json.dumps(key, sort_keys=True) + f"@{round(float(n['ts']), 6):.6f}")
    return sorted(out)


@pytest.fixture
def case_files(tmp_path: Path):
    def make(case: dict) -> tuple[Path, Path]:
        return write_case_files(case, tmp_path)

    return make
