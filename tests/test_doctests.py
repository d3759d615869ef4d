"""The examples in docstrings run as written (`doctest`), so they cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib

import pytest

from profiles.events import Event
from profiles.parser import parse_profile

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

# The docstrings use these names without importing them (they read as the module's API)
GLOBS = {"parse_profile": parse_profile, "Event": Event}


@pytest.mark.parametrize(
    "module", ["filters.engine", "filters.twostep.engine", "filters.partitions"]
)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(module)
    res = doctest.testmod(mod, extraglobs=GLOBS, optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0, f"{module}: no examples found"
    assert res.failed == 0, f"{module}: {res.failed} of {res.attempted} examples failed"
