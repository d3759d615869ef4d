"""Canonical keys of filters and their predicate leaves (pure: used by plans, Spark and the CLI).

Two filters that always agree get one key: `x = 1` and `x = 1.0` (numbers
compare numerically), `a and b` and `b and a`, `x in (2, 1)` and
`x in (1, 2)`. The key is readable filter text, so index tables and rates
documents can be inspected without unpickling anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from profiles import ast as A

Scalar = str | int | float | bool


def lit(v: Scalar) -> str:
    if v.__class__ is bool:
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        f = float(v)
        return str(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)
    return json.dumps(v, ensure_ascii=False)


def filter_key(f: Any) -> str:
    """Canonical text of a filter (commutative parts sorted, duplicates removed)."""
    if isinstance(f, A.Cmp):
        return f"{f.attr} {f.op} {lit(f.value)}"
    if isinstance(f, A.In):
        vals = ", ".join(sorted({lit(v) for v in f.values}))
        return f"{f.attr} {'not in' if f.negated else 'in'} ({vals})"
    if isinstance(f, A.Between):
        return f"{f.attr} between {lit(f.low)} and {lit(f.high)}"
    if isinstance(f, A.Exists):
        return f"{f.attr} exists"
    if isinstance(f, A.StartsWith):
        return f"{f.attr} starts with {lit(f.prefix)}"
    if isinstance(f, A.Const):
        return "true" if f.value else "false"
    if isinstance(f, A.Not):
        return f"not ({filter_key(f.item)})"
    if isinstance(f, (A.And, A.Or)):
        word = " and " if isinstance(f, A.And) else " or "
        parts = sorted({filter_key(i) for i in f.items})
        return parts[0] if len(parts) == 1 else "(" + word.join(parts) + ")"
    raise TypeError(f"not a filter: {f!r}")


def predicates(f: Any) -> Iterator[Any]:
    """The predicate leaves (Cmp, In, Between, Exists, StartsWith) of a filter."""
    if isinstance(f, (A.And, A.Or)):
        for i in f.items:
            yield from predicates(i)
    elif isinstance(f, A.Not):
        yield from predicates(f.item)
    elif not isinstance(f, A.Const):
        yield f


def boundaries(p: Any) -> Iterator[tuple[str, str, Scalar | None]]:
    """(attr, op, value) points a predicate puts on its attribute's axis, as a pool indexes them.

    `in` values are equalities (`not in`: `!=`), `between` is `>=` low and
    `<=` high; `exists` has no value.
    """
    if isinstance(p, A.Cmp):
        yield p.attr, p.op, p.value
    elif isinstance(p, A.In):
        for v in p.values:
            yield p.attr, "!=" if p.negated else "=", v
    elif isinstance(p, A.Between):
        yield p.attr, ">=", p.low
        yield p.attr, "<=", p.high
    elif isinstance(p, A.StartsWith):
        yield p.attr, "starts with", p.prefix
    elif isinstance(p, A.Exists):
        yield p.attr, "exists", None
