"""The ingest body parser's orjson fast path against the standard library alone.

`loads_body` reads with orjson and falls back to `loads_body_stdlib`; for any text, both
must give the same value of the same types, or the same error. No server needed.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.errors import BadEvent
from adapters.service.routes.bodies import loads_body, loads_body_stdlib

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats()  # NaN and infinities too: json.dumps writes them as NaN/Infinity
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 is not 1.0 or True; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, BadEvent):
        return str(a) == str(b)
    return bool(a == b)


def _outcome(parse: Any, text: str) -> tuple[str, Any]:
    try:
        return "value", parse(text)
    except ValueError as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _check(text: str) -> None:
    fast, reference = _outcome(loads_body, text), _outcome(loads_body_stdlib, text)
    assert fast[0] == reference[0], (text, fast, reference)
    if fast[0] == "value":
        assert _same(fast[1], reference[1]), (text, fast[1], reference[1])
    else:
        assert fast[1] == reference[1], text


@settings(max_examples=400, deadline=None)
@given(_values, st.booleans())
def test_fast_path_reads_json_as_the_standard_library_does(value: Any, ascii_only: bool) -> None:
    _check(json.dumps(value, ensure_ascii=ascii_only))


_JSONISH = st.text(alphabet='{}[],:"\\ -+.0123456789eEtrufalsnNI\ud800\ufeff\x01abu', max_size=40)


@settings(max_examples=600, deadline=None)
@given(_JSONISH)
def test_fast_path_agrees_on_arbitrary_text(text: str) -> None:
    _check(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"v": 123456789012345678901234567890}',  # beyond 64 bits: orjson would give a float
        '{"v": 1e400}',  # orjson refuses, json gives inf
        '{"v": NaN}',
        '"\\ud800"',  # a lone surrogate: json decodes it, check_values rejects it later
        "\ufeff{}",
        "[" * 5000 + "]" * 5000,
        '{"a": 1, "a": 2}',
        '{"v": -0.0, "w": 0.1, "x": 1e-400, "y": 18446744073709551615}',
        '{"v": 1' + "0" * 5000 + "}",  # over Python's 4300-digit limit: a BadEvent
    ],
)
def test_fast_path_hands_the_edge_cases_to_the_standard_library(text: str) -> None:
    _check(text)
