"""docs/language.md is the language contract (spec/LANGUAGE.md of the shared repository) with our
notes added: without its *ENS note* blocks and its first line it is the contract byte for byte.
A clone has no ../shared: the checksum in the first line names the version it was copied from,
and the test compares when ../shared (or $ENS_SHARED) is there."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "language.md"
NOTE = re.compile(r"\n\n<!-- ENS note -->\n.*?\n<!-- /ENS note -->", re.S)


def _shared_spec() -> Path | None:
    env = os.environ.get("ENS_SHARED")
    for base in ([Path(env)] if env else []) + [ROOT.parent / "shared"]:
        if (base / "spec" / "LANGUAGE.md").is_file():
            return base / "spec" / "LANGUAGE.md"
    return None


def _contract_in_doc() -> tuple[str, str]:
    """(the checksum the first line records, the text without our first line and notes)."""
    first, _, rest = DOC.read_text().partition("\n")
    recorded = re.search(r"sha256 ([0-9a-f]{64})", first)
    assert recorded, f"{DOC}: the first line records no sha256 of the contract"
    return recorded.group(1), NOTE.sub("", rest)


def test_the_doc_is_the_recorded_contract_plus_marked_notes() -> None:
    recorded, text = _contract_in_doc()
    assert hashlib.sha256(text.encode()).hexdigest() == recorded, (
        "docs/language.md differs from the contract it was copied from outside its "
        "<!-- ENS note --> blocks: copy spec/LANGUAGE.md again and update the checksum"
    )


def test_the_doc_is_the_shared_contract() -> None:
    spec = _shared_spec()
    if spec is None:
        pytest.skip("no ../shared next to this clone")
    recorded, text = _contract_in_doc()
    assert hashlib.sha256(spec.read_bytes()).hexdigest() == recorded, (
        f"{spec} changed since docs/language.md was copied from it: copy it again"
    )
    assert text == spec.read_text()
