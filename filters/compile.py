"""Filter AST -> plain Python predicate over an attribute dict.

Filters are compiled to Python source once (cached by their AST, which is
hashable), so evaluating one is a single call with inline type checks: the
language's rule "absent or incomparable is false" costs a class test, not an
exception.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from profiles.ast import And, Between, Cmp, Const, Exists, Filter, In, Not, Or, StartsWith

Check = Callable[[dict[str, Any]], bool]

_NUM = frozenset({int, float})
_PY_OPS = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def norm(value: Any) -> Any:
    """Equality key: 1 and 1.0 are one key, True and 1 are not, "1" and 1 are not."""
    return (bool, value) if value.__class__ is bool else value


class _Gen:
    def __init__(self) -> None:
        self.env: dict[str, Any] = {"_N": _NUM}
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"_x{self.n}"

    def const(self, value: Any) -> str:
        self.n += 1
        name = f"_c{self.n}"
        self.env[name] = value
        return name

    def src(self, f: Filter) -> str:
        if isinstance(f, Const):
            return "True" if f.value else "False"
        if isinstance(f, And):
            return "(" + " and ".join(self.src(i) for i in f.items) + ")"
        if isinstance(f, Or):
            return "(" + " or ".join(self.src(i) for i in f.items) + ")"
        if isinstance(f, Not):
            return f"(not {self.src(f.item)})"
        if isinstance(f, Exists):
            return f"({f.attr!r} in a)"
        return self._test(f, f"a.get({f.attr!r})")

    def _test(self, f: Filter, get: str) -> str:
        """Source of an attribute test; `get` reads the attribute (None when absent)."""
        if isinstance(f, Cmp):
            return self._cmp(f, get)
        if isinstance(f, In):
            return self._in(f, get)
        if isinstance(f, Between):
            x = self.var()
            kind = "is str" if isinstance(f.low, str) else "in _N"
            return f"(({x} := {get}).__class__ {kind} and {f.low!r} <= {x} <= {f.high!r})"
        if isinstance(f, StartsWith):
            x = self.var()
            return f"(({x} := {get}).__class__ is str and {x}.startswith({f.prefix!r}))"
        raise TypeError(f"not a filter: {f!r}")

    def _cmp(self, f: Cmp, get: str) -> str:
        v = f.value
        if isinstance(v, bool):
            return f"({get} is {v == (f.op == '=')!r})"
        x = self.var()
        kind = "is str" if isinstance(v, str) else "in _N"
        if isinstance(v, str) and f.op == "=":
            return f"({get} == {v!r})"
        return f"(({x} := {get}).__class__ {kind} and {x} {_PY_OPS[f.op]} {v!r})"

    def _in(self, f: In, get: str) -> str:
        x = self.var()
        parts = []
        strs = frozenset(v for v in f.values if isinstance(v, str))
        nums = frozenset(v for v in f.values if not isinstance(v, (str, bool)))
        bools = frozenset(v for v in f.values if isinstance(v, bool))
        op = "not in" if f.negated else "in"
        if strs:
            parts.append(f"({x}.__class__ is str and {x} {op} {self.const(strs)})")
        if nums:
            parts.append(f"({x}.__class__ in _N and {x} {op} {self.const(nums)})")
        if bools:
            parts.append(f"({x}.__class__ is bool and {x} {op} {self.const(bools)})")
        if not parts:
            return "False"
        return f"(({x} := {get}) is not None and (" + " or ".join(parts) + "))"


@functools.lru_cache(maxsize=200_000)
def compile_filter(f: Filter) -> Check:
    """A fast predicate for `f` (cached: identical filters share one function)."""
    if isinstance(f, Const) and f.value:
        return _always
    gen = _Gen()
    body = gen.src(f)
    code = f"def _f(a):\n    return {body}\n"
    exec(compile(code, "<filter>", "exec"), gen.env)  # noqa: S102 - source generated from our own AST
    fn: Check = gen.env["_f"]
    fn.__doc__ = code
    return fn


def _always(a: dict[str, Any]) -> bool:
    return True


def evaluate(f: Filter, attrs: dict[str, Any]) -> bool:
    """Direct, uncompiled evaluation: the reference the index and the compiler are tested against."""
    if isinstance(f, Const):
        return f.value
    if isinstance(f, And):
        return all(evaluate(i, attrs) for i in f.items)
    if isinstance(f, Or):
        return any(evaluate(i, attrs) for i in f.items)
    if isinstance(f, Not):
        return not evaluate(f.item, attrs)
    if isinstance(f, Exists):
        return f.attr in attrs
    x = attrs.get(f.attr)
    if x is None:
        return False
    if isinstance(f, Cmp):
        return compare(x, f.op, f.value)
    if isinstance(f, In):
        comparable = [v for v in f.values if _kind(v) == _kind(x)]
        if not comparable:
            return False
        found = any(norm(x) == norm(v) for v in comparable)
        return not found if f.negated else found
    if isinstance(f, Between):
        return compare(x, ">=", f.low) and compare(x, "<=", f.high)
    if isinstance(f, StartsWith):
        return isinstance(x, str) and x.startswith(f.prefix)
    raise TypeError(f)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    return "str"


def compare(x: Any, op: str, v: Any) -> bool:
    """The language's comparison: false when absent or when the kinds do not compare."""
    if x is None or v is None:
        return False
    kx, kv = _kind(x), _kind(v)
    if kx != kv:
        return False
    if kx == "bool" and op not in ("=", "!="):
        return False
    ok: bool  # the comparisons of Any are Any to mypy
    if op == "=":
        ok = x == v
    elif op == "!=":
        ok = x != v
    elif op == "<":
        ok = x < v
    elif op == "<=":
        ok = x <= v
    elif op == ">":
        ok = x > v
    elif op == ">=":
        ok = x >= v
    else:
        raise ValueError(op)
    return ok
