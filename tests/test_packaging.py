"""What `make install` and `make test` print: skip reasons, no setuptools deprecation warnings."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_skipped_tests_say_why(tmp_path: Path) -> None:
    """The project's pytest options print each skip's reason in the closing summary."""
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n\ndef test_x():\n    pytest.skip('no widget on this machine')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p", "no:xdist"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert "SKIPPED [1]" in out.stdout and "no widget on this machine" in out.stdout, out.stdout


def test_license_is_an_spdx_string() -> None:
    """setuptools >= 77 warns on every build about a `license` table: the SPDX string form with
    its file is what it wants, and the build requires a setuptools that reads it."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    for name in meta["project"]["license-files"]:
        assert (ROOT / name).is_file(), name
    assert "setuptools>=77" in meta["build-system"]["requires"]
