"""Parse profile expressions (docs/language.md §2-§4) into `profiles.ast` and validate them.

Parsing is LALR via lark, so syntax errors come with a position and the
tokens that were expected. Semantic rules that make a profile unusable
(unbounded state, unknown names, ...) are checked here, at parse time, so the
engine never sees an invalid profile.
"""

from __future__ import annotations

import ast as pyast
import dataclasses
import functools
import re
from dataclasses import dataclass, field, replace
from importlib.resources import files
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    VisitError,
)

from profiles import timeofday as tod
from profiles.ast import (
    Absent,
    All,
    And,
    AnyOf,
    Arith,
    Between,
    Clock,
    Cmp,
    Component,
    Cond,
    Const,
    Exists,
    Expr,
    Filter,
    In,
    Lit,
    Not,
    Or,
    Profile,
    Ref,
    Selection,
    Seq,
    StartsWith,
    WAnd,
    WCmp,
    WNot,
    WOr,
    is_filter,
    refs_of,
)
from profiles.errors import ProfileError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_TOKEN_NAMES = {
    "LPAR": '"("',
    "RPAR": '")"',
    "COMMA": '","',
    "COLON": '":"',
    "CMP": "a comparison operator",
    "STRING": "a string",
    "NUMBER": "a number",
    "INT": "an integer",
    "NAME": "a name",
    "DURATION": "a duration: a number and one of the units ms, s, m, h, d, written together "
    "(500ms, 30s, 30m, 1.5h, 2d)",
    "ADDOP": '"+" or "-"',
    "MULOP": '"*" or "/"',
    "$END": "end of profile",
}


def _table_cache() -> str | bool:
    """Where Lark keeps the built LALR tables between runs, or False (build them each time).

    Building them is ~0.15 s of every CLI start. The cache is a pickle, so it lives only in a
    private directory of the user's own (``~/.cache/ens``, mode 0700), never in a shared /tmp;
    Lark ignores (and rewrites) a file built from another grammar or set of options.
    """
    import os
    import sys
    from pathlib import Path

    import lark

    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ens"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = base.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
    except (OSError, RuntimeError):  # no home, read-only file system
        return False
    return str(
        base / f"grammar-lark{lark.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    )


@functools.cache
def _lark() -> Lark:
    grammar = files("profiles").joinpath("grammar.lark").read_text()
    return Lark(
        grammar,
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
        cache=_table_cache(),
    )


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not m:
        raise ValueError(f"bad duration {text!r} (expected e.g. 500ms, 30s, 10m, 1.5h, 2d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _describe(name: str) -> str:
    if name in _TOKEN_NAMES:
        return _TOKEN_NAMES[name]
    if name.isupper() and name.isalpha():
        return f'"{name.lower()}"'
    return name


class _Fail(Exception):
    def __init__(self, message: str, node: Any) -> None:
        self.message = message
        meta = getattr(node, "meta", None)
        if isinstance(node, Token):
            self.line, self.column = node.line, node.column
        elif meta is not None and not getattr(meta, "empty", True):
            self.line, self.column = meta.line, meta.column
        else:
            self.line = self.column = None


def _literal(tok: Token) -> Any:
    if tok.type == "STRING":
        return pyast.literal_eval(tok.value)
    if tok.type == "TRUE":
        return True
    if tok.type == "FALSE":
        return False
    text = tok.value
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return float(text)


def _kids(t: Tree[Any]) -> list[Any]:
    """A node's children; below `_Build` they are already AST values, not trees."""
    return t.children


@v_args(tree=True)
class _Build(Transformer[Token, Any]):
    """Tree -> AST. Composite nodes are returned as (node, meta) pairs where positions matter."""

    # ---- filters
    def f_true(self, t: Tree[Any]) -> Const:
        return Const(True)

    def f_false(self, t: Tree[Any]) -> Const:
        return Const(False)

    def attr(self, t: Tree[Any]) -> str:
        return str(_kids(t)[0])

    def literal(self, t: Tree[Any]) -> Any:
        return _literal(_kids(t)[0])

    def literals(self, t: Tree[Any]) -> tuple[Any, ...]:
        return tuple(_kids(t))

    def f_cmp(self, t: Tree[Any]) -> Filter:
        attr, op, value = _kids(t)
        if attr in tod.NAMES:
            return _derived_cmp(attr, str(op), value, t)
        if isinstance(value, bool) and op not in ("=", "!="):
            raise _Fail(f"booleans compare only with = and != (got {op})", t)
        return Cmp(attr, str(op), value)

    def f_in(self, t: Tree[Any]) -> In:
        return _in(_kids(t)[0], _kids(t)[2], False, t)

    def f_not_in(self, t: Tree[Any]) -> In:
        return _in(_kids(t)[0], _kids(t)[3], True, t)

    def f_between(self, t: Tree[Any]) -> Filter:
        attr, _, low, _, high = _kids(t)
        if attr == tod.LOCALTIME:
            lo, hi = _time_literal(low, t), _time_literal(high, t)
            k = tod.KEY_LOCALTIME
            if lo <= hi:
                return Between(k, lo, hi)
            return Or((Cmp(k, ">=", lo), Cmp(k, "<=", hi)))  # wraps midnight (§2.1)
        _not_for(attr, "between", t)
        if isinstance(low, bool) or isinstance(high, bool):
            raise _Fail("between needs numbers or strings, not booleans", t)
        if isinstance(low, str) != isinstance(high, str):
            raise _Fail("between needs two numbers or two strings", t)
        return Between(attr, low, high)

    def f_exists(self, t: Tree[Any]) -> Exists:
        _not_for(_kids(t)[0], "exists", t)
        return Exists(_kids(t)[0])

    def f_starts(self, t: Tree[Any]) -> StartsWith:
        _not_for(_kids(t)[0], "starts with", t)
        return StartsWith(_kids(t)[0], _literal(_kids(t)[3]))

    def f_not(self, t: Tree[Any]) -> Not:
        return Not(_kids(t)[1])

    def or_f(self, t: Tree[Any]) -> Or:
        return Or(tuple(c for c in _kids(t) if not isinstance(c, Token)))

    def and_f(self, t: Tree[Any]) -> And:
        return And(tuple(c for c in _kids(t) if not isinstance(c, Token)))

    # ---- where
    def w_ref(self, t: Tree[Any]) -> Ref:
        tok = _kids(t)[0]
        name, dot, attr = str(tok).partition(".")
        if not dot:
            raise _Fail(f"{tok} is not a reference; write name.attribute, e.g. a.{tok}", tok)
        return Ref(name, tod.key(attr, None) if attr in tod.NAMES else attr)

    def w_lit(self, t: Tree[Any]) -> Lit:
        return Lit(_literal(_kids(t)[0]))

    def a_bin(self, t: Tree[Any]) -> Arith:
        left, op, right = _kids(t)
        return Arith(str(op), left, right)

    def a_neg(self, t: Tree[Any]) -> Arith:
        op, operand = _kids(t)
        return Arith(str(op), Lit(0), operand)

    def w_cmp(self, t: Tree[Any]) -> WCmp:
        left, op, right = _kids(t)
        op = str(op)
        return WCmp(op, _where_literal(left, right, op, t), _where_literal(right, left, op, t))

    def w_not(self, t: Tree[Any]) -> WNot:
        return WNot(_kids(t)[1])

    def w_or(self, t: Tree[Any]) -> WOr:
        return WOr(tuple(c for c in _kids(t) if not isinstance(c, Token)))

    def w_and(self, t: Tree[Any]) -> WAnd:
        return WAnd(tuple(c for c in _kids(t) if not isinstance(c, Token)))


_LOCALTIME_FORMS = 'a time "HH:MM" or "HH:MM:SS" (00:00 to 23:59:59)'
_WEEKDAY_FORMS = "a day name: " + ", ".join(repr(d) for d in tod.DAYS)


def _time_literal(value: Any, where: Any) -> int:
    secs = tod.seconds(value)
    if secs is None:
        raise _Fail(f"localtime needs {_LOCALTIME_FORMS}, got {value!r}", where)
    return secs


def _day_literal(value: Any, where: Any) -> str:
    d = tod.day(value)
    if d is None:
        raise _Fail(f"weekday needs {_WEEKDAY_FORMS}; got {value!r}", where)
    return d


def _not_for(attr: str, what: str, where: Any) -> None:
    """`localtime`/`weekday` support only the comparisons of docs/language.md §2.1."""
    if attr == tod.LOCALTIME:
        raise _Fail(
            f"localtime is the local time of day: it supports = != < <= > >= and between, "
            f"not {what}",
            where,
        )
    if attr == tod.WEEKDAY:
        raise _Fail(
            f"weekday is the local day name: it supports =, !=, in and not in, not {what}", where
        )


def _derived_cmp(attr: str, op: str, value: Any, where: Any) -> Cmp:
    if attr == tod.LOCALTIME:
        return Cmp(tod.KEY_LOCALTIME, op, _time_literal(value, where))
    if op not in tod.WEEKDAY_OPS:
        _not_for(attr, op, where)
    return Cmp(tod.KEY_WEEKDAY, op, _day_literal(value, where))


def _in(attr: str, values: tuple[Any, ...], negated: bool, where: Any) -> In:
    if attr == tod.WEEKDAY:
        return In(tod.KEY_WEEKDAY, tuple(_day_literal(v, where) for v in values), negated)
    _not_for(attr, "not in" if negated else "in", where)
    return In(attr, values, negated)


def _where_literal(term: Any, other: Any, op: str, where: Any) -> Any:
    """A string literal compared with `x.localtime` or `x.weekday` in a where clause, read as a
    time (seconds of the day) or a day name, as in a filter."""
    if not (isinstance(term, Lit) and isinstance(other, Ref) and isinstance(term.value, str)):
        return term
    if other.attr == tod.KEY_LOCALTIME:
        return Lit(_time_literal(term.value, where))
    if other.attr == tod.KEY_WEEKDAY:
        if op not in tod.WEEKDAY_OPS:
            _not_for(tod.WEEKDAY, op, where)
        return Lit(_day_literal(term.value, where))
    return term


_BUILD = _Build()


def _no_edge_negation(comps: list[Component], t: Tree[Any]) -> None:
    """A nested seq may not start or end with a negation (only the top level can)."""
    for i, c in enumerate(comps):
        if c.negated:
            if i == 0 or all(x.negated for x in comps[:i]) or all(x.negated for x in comps[i:]):
                raise _Fail(
                    f"leading or trailing negation ({c.name!r}) is supported only at the top level",
                    t,
                )


class _Converter:
    """Walks the composite part of the tree, naming components and checking nesting rules."""

    def __init__(self) -> None:
        self.position = 0
        self.names: dict[str, Any] = {}  # name -> tree/token (for positions)
        self.primitive: set[str] = set()
        self.negated: set[str] = set()
        self.has_clock = False

    def claim(self, name: str, where: Any) -> None:
        if name in self.names:
            raise _Fail(f"duplicate component name {name!r}", where)
        self.names[name] = where

    def expr(self, node: Any, *, top: bool) -> Expr:
        if isinstance(node, Tree) and node.data in (
            "seq",
            "all",
            "any",
            "absent",
            "repeat",
            "clock",
        ):
            return self.composite(node, top=top)
        built: Expr = _BUILD.transform(node) if isinstance(node, Tree) else node
        return built

    def composite(self, t: Tree[Any], *, top: bool, name: str | None = None) -> Expr:
        kind = t.data
        if kind == "absent":
            if not top:
                raise _Fail("absent(...) is allowed only as the whole profile, not nested", t)
            return Absent(_BUILD.transform(_kids(t)[1]))
        if kind == "clock":
            if top:
                raise _Fail(
                    'clock(...) is usable only as a component, e.g. seq(n: clock("22:00"), ...)', t
                )
            return self.clock(_kids(t)[1])
        if kind == "repeat":
            return self.repeat(t, name)
        comps = []
        for child in _kids(t)[1].children:
            comps.append(self.component(child))
        if kind == "any":
            for c in comps:
                if c.negated:
                    raise _Fail(f"negated component {c.name!r} makes no sense in any(...)", t)
            return AnyOf(tuple(comps))
        if not any(not c.negated for c in comps):
            raise _Fail(f"{kind}(...) needs at least one positive component", t)
        if kind == "seq":
            if not top:
                _no_edge_negation(comps, t)
            return Seq(tuple(comps))
        return All(tuple(comps))

    def clock(self, tok: Token) -> Clock:
        text = pyast.literal_eval(tok.value)
        m = re.fullmatch(r"([01]\d|2[0-3]):([0-5]\d)", text)
        if not m:
            raise _Fail(f'clock needs a time "HH:MM" (00:00 to 23:59), got {text!r}', tok)
        self.has_clock = True
        return Clock(int(m.group(1)), int(m.group(2)))

    def repeat(self, t: Tree[Any], name: str | None) -> Seq:
        """repeat(F, n) is a seq of n copies of F, named r1..rN (or after its component)."""
        f = _BUILD.transform(_kids(t)[1])
        n = int(_kids(t)[2])
        if n < 1:
            raise _Fail("repeat needs a count of at least 1", _kids(t)[2])
        base = name if name else "r"
        comps = []
        for i in range(1, n + 1):
            self.position += 1
            cname = f"{base}{i}"
            self.claim(cname, t)
            self.primitive.add(cname)
            comps.append(Component(cname, f))
        return Seq(tuple(comps))

    def component(self, t: Tree[Any]) -> Component:
        self.position += 1
        pos = self.position
        if t.data == "named":
            name_tok, cexpr = _kids(t)[0], _kids(t)[1]
            negated = False
        elif t.data == "negated":
            name_tok, cexpr = _kids(t)[1], _kids(t)[2]
            negated = True
        else:
            name_tok, cexpr = None, _kids(t)[0]
            negated = False
        inner = cexpr.children[0]
        within = None
        if len(cexpr.children) > 1:
            within = parse_duration(str(cexpr.children[1].children[1]))
        name = str(name_tok) if name_tok is not None else f"c{pos}"
        if name_tok is not None and "." in name:
            raise _Fail(f"component name {name!r} must not contain a dot", name_tok)
        if isinstance(inner, Tree) and inner.data in (
            "seq",
            "all",
            "any",
            "absent",
            "repeat",
            "clock",
        ):
            return self.nested(t, inner, name, name_tok, within, negated, pos)
        self.claim(name, name_tok or t)
        self.primitive.add(name)
        if negated:
            self.negated.add(name)
        return Component(
            name, _BUILD.transform(inner) if isinstance(inner, Tree) else inner, negated
        )

    def nested(
        self,
        t: Tree[Any],
        inner: Tree[Any],
        name: str,
        name_tok: Token | None,
        within: float | None,
        negated: bool,
        pos: int,
    ) -> Component:
        """A component that is itself a composite, a repeat or a clock."""
        is_repeat = inner.data == "repeat"
        if not is_repeat and inner.data != "clock":
            self.claim(name, name_tok or t)
        expr = self.composite(
            inner, top=False, name=str(name_tok) if name_tok is not None else None
        )
        if isinstance(expr, Clock):
            self.claim(name, name_tok or t)
            self.primitive.add(name)
            if within is not None:
                raise _Fail("a clock component cannot have its own within", t)
        elif within is not None and isinstance(expr, Seq | All | AnyOf):
            expr = replace(expr, within=within)
        if negated:
            if not isinstance(expr, Clock):
                raise _Fail("a negated component must be a filter", t)
        if is_repeat:
            # repeat binds r1..rN itself; the wrapper has no name of its own
            return Component(f"#repeat{pos}", expr, negated)
        if negated:
            self.negated.add(name)
        return Component(name, expr, negated)


def parse_profile(
    text: str, profile_id: str = "?", subscriber: str | None = None, tz: str | None = None
) -> Profile:
    """Parse and validate one profile expression; raise ProfileError naming id, line and column.

    `tz`: the zone of its `localtime`/`weekday` (the profile file's ``tz:``); None: the
    engine's (``--tz``)."""
    if tz is None and (quick := _one_equality(text, profile_id, subscriber)) is not None:
        return quick
    return _parse_full(text, profile_id, subscriber, tz)


# `ATTR = "VALUE"` and `absent(ATTR = "VALUE") within Ns`: the forms an asset registry
# generates by the ten thousand (its sensor-silent faults and their clear conditions,
# docs/assets.md). Each shape (attribute, window) is parsed once by lark with a placeholder
# value, and the value is put in its place: a profile equal to lark's, ~50x faster
# (tests/test_assets.py compares them).
_ONE_EQUALITY = re.compile(
    r'(absent\()?([A-Za-z_][A-Za-z0-9_]*) = "([A-Za-z0-9_.:@-]*)"(?:\) within ([0-9]{1,9})s)?'
)
_PLACEHOLDER = "placeholder"


def _one_equality(text: str, profile_id: str, subscriber: str | None) -> Profile | None:
    m = _ONE_EQUALITY.fullmatch(text)
    if m is None or (m.group(1) is None) != (m.group(4) is None):
        return None
    tmpl = _equality_template(m.group(2), m.group(4))
    if tmpl is None:
        return None
    expr = tmpl.expr
    cmp = expr.filter if isinstance(expr, Absent) else expr
    if not (isinstance(cmp, Cmp) and cmp.op == "=" and cmp.value == _PLACEHOLDER):
        return None  # a name the parser treats apart (localtime, weekday)
    new: Any = replace(cmp, value=m.group(3))
    if isinstance(expr, Absent):
        new = replace(expr, filter=new)
    return replace(tmpl, id=profile_id, subscriber=subscriber, source=text, expr=new)


@functools.lru_cache(maxsize=256)
def _equality_template(attr: str, within: str | None) -> Profile | None:
    text = f'{attr} = "{_PLACEHOLDER}"'
    if within is not None:
        text = f"absent({text}) within {within}s"
    try:
        return _parse_full(text, "template", None, None)
    except ProfileError:  # a keyword as the attribute: the full parse says what is wrong
        return None


def _parse_full(text: str, profile_id: str, subscriber: str | None, tz: str | None) -> Profile:
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, profile_id) from None
    except LarkError as e:  # pragma: no cover - lark internal
        raise ProfileError(f"cannot parse: {e}", profile_id) from None
    try:
        profile = _build_profile(tree, text, profile_id, subscriber)
        return profile if tz is None else _zoned(profile, tz)
    except _Fail as f:
        raise ProfileError(f.message, profile_id, f.line, f.column) from None
    except VisitError as v:
        orig = v.orig_exc
        if isinstance(orig, _Fail):
            raise ProfileError(orig.message, profile_id, orig.line, orig.column) from None
        if isinstance(orig, (ValueError, SyntaxError)):
            raise ProfileError(str(orig), profile_id) from None
        raise
    except (ValueError, SyntaxError) as e:
        raise ProfileError(str(e), profile_id) from None


def _syntax_error(e: UnexpectedInput, text: str, profile_id: str) -> ProfileError:
    line, column = getattr(e, "line", None), getattr(e, "column", None)
    if isinstance(e, UnexpectedEOF) or line in (None, -1):
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
        what = "unexpected end of profile"
    elif isinstance(e, UnexpectedCharacters):
        at = e.pos_in_stream
        what = (
            f"unexpected character {text[at]!r}"
            if at is not None and at < len(text)
            else "unexpected input"
        )
        hint = _char_hint(text, at)
        if hint:
            what += f" ({hint})"
    else:
        tok = getattr(e, "token", None)
        what = (
            f"unexpected {tok.value!r}"
            if tok is not None and tok.value
            else "unexpected end of profile"
        )
        hint = _hint(text, tok)
        if hint:
            what += f" ({hint})"
    expected = sorted(
        {_describe(x) for x in (getattr(e, "expected", None) or getattr(e, "allowed", None) or [])}
    )
    return ProfileError(what, profile_id, line, column, expected[:12])


@functools.cache
def _keywords() -> frozenset[str]:
    """The language's keywords (the grammar's literal words: seq, within, and, ...)."""
    return frozenset(
        t.pattern.value
        for t in _lark().terminals
        if t.pattern.type == "str" and t.pattern.value.isalpha()
    )


def _hint(text: str, tok: Token | None) -> str | None:
    """What a user most likely meant, for the mistakes people make: ``==``, upper-case
    keywords, a duration with a space or an unknown unit."""
    if tok is None or tok.start_pos is None:
        return None
    pos = tok.start_pos
    if tok.value == "=" and text[pos - 1 : pos] == "=":
        return "'==' is not an operator: use '=' for equality"
    words = [tok.value] if tok.value.isalpha() else []
    before = re.search(r"([A-Za-z_]\w*)\s*$", text[:pos])
    if before:
        words.append(before.group(1))
    for w in words:
        if w != w.lower() and w.lower() in _keywords():
            return f"keywords are lower case: {w.lower()!r}, not {w!r}"
    m = re.match(r"\d+(?:\.\d+)?(\s*)([A-Za-z]+)", text[pos:])
    if m and tok.type in ("NUMBER", "INT"):
        if m.group(1):
            return "write the unit right after the number, without a space: 30m"
        return f"{m.group(2)!r} is not a duration unit; the units are ms, s, m, h, d"
    return _counting_hint(text, tok, before.group(1) if before else None)


_REPEAT = (
    'N events matching F are repeat(F, N), e.g. repeat(kind = "co2" and value > 1000, 3) within 10m'
)


def _counting_hint(text: str, tok: Token, word_before: str | None) -> str | None:
    """The ways people write "N times" and units on numbers, which the language spells
    differently."""
    pos = tok.start_pos or 0
    if tok.value == "(" and word_before is not None and word_before.lower() == "count":
        return f"there is no count(...): {_REPEAT}"
    if tok.type == "NAME" and tok.value.lower() in ("times", "x"):
        return f"there is no 'times': {_REPEAT}"
    if tok.type == "NAME":
        num = re.search(r"(?<![\w.])([+-]?\d+(?:\.\d+)?)$", text[:pos])  # glued: 1000ppm
        if num:
            return (
                f"a number has no unit in a comparison: write {num.group(1)}, not "
                f"{num.group(1)}{tok.value}"
            )
    return None


def _char_hint(text: str, at: int | None) -> str | None:
    """`&&`, `||`, `&`, `|`: the connectives are words."""
    if at is None or at >= len(text):
        return None
    ch = text[at]
    if ch in "&|":
        word = "and" if ch == "&" else "or"
        written = ch * 2 if text[at : at + 2] == ch * 2 else ch
        return f"write {word!r}, not {written!r}"
    return None


@dataclass
class _Clauses:
    """The clauses after the expression, as written (`seen`: clause node by name, for
    positions)."""

    seen: dict[str, Tree[Any]] = field(default_factory=dict)
    within: float | None = None
    per: tuple[str, ...] = ()
    where: Cond | None = None
    select: Selection = field(default_factory=Selection)
    consume: str = "unique"
    once: bool = False

    def read(self, c: Tree[Any]) -> None:
        key = c.data
        if key in self.seen:
            raise _Fail(f"clause {key[2:]!r} given twice", c)
        self.seen[key] = c
        kids = _kids(c)
        if key == "c_within":
            self.within = parse_duration(str(kids[1]))
        elif key == "c_per":
            self.per = tuple(str(x) for x in kids[1:])
            for name in self.per:
                if name in tod.NAMES:
                    raise _Fail(
                        f"per {name}: {name} is derived from ts, not an attribute to partition "
                        "on; partition by an attribute (per room) and test "
                        f"{name} in the components",
                        c,
                    )
            if len(set(self.per)) != len(self.per):
                raise _Fail("per names an attribute twice", c)
        elif key == "c_where":
            self.where = _BUILD.transform(kids[1])
        elif key == "c_select":
            kind = str(kids[1])
            n = 1
            if kind == "nth":
                n = int(kids[2])
                if n < 1:
                    raise _Fail("nth needs a count of at least 1", kids[2])
            self.select = Selection(kind, n)  # type: ignore[arg-type]
        elif key == "c_consume":
            self.consume = str(kids[1])
        elif key == "c_once":
            self.once = True


def _build_profile(tree: Tree[Any], text: str, profile_id: str, subscriber: str | None) -> Profile:
    expr_tree, *clauses = _kids(tree)
    conv = _Converter()
    expr = conv.expr(expr_tree, top=True)
    if is_filter(expr):
        conv.primitive.add("e")
        conv.names["e"] = expr_tree
    cl = _Clauses()
    for c in clauses:
        cl.read(c)
    _check_shape(expr, expr_tree, conv, cl)
    if cl.where is not None:
        _check_where(cl.where, conv, cl.seen["c_where"])
    if isinstance(expr, Seq | All | AnyOf):
        expr = replace(expr, within=cl.within)
    return Profile(
        id=profile_id,
        expr=expr,
        within=cl.within,
        per=cl.per,
        where=cl.where,
        select=cl.select,
        consume=cl.consume,  # type: ignore[arg-type]
        once=cl.once,
        subscriber=subscriber,
        source=text,
    )


def _check_shape(expr: Expr, expr_tree: Any, conv: _Converter, cl: _Clauses) -> None:
    """The rules that tie the clauses to the expression (windows, per, bare filters)."""
    seen, within = cl.seen, cl.within
    if is_filter(expr):
        for bad in ("c_within", "c_per", "c_where"):
            if bad in seen:
                raise _Fail(
                    f"a bare filter cannot take {bad[2:]!r}; wrap it, e.g. seq(e: ...) {bad[2:]} ...",
                    seen[bad],
                )
    if isinstance(expr, Absent):
        if within is None:
            raise _Fail("absent(...) needs within (how long the silence must last)", expr_tree)
        conv.primitive.add("last")
    needs_window = cl.select.kind == "each" and isinstance(expr, (Seq, All))
    if needs_window and within is None:
        raise _Fail(
            "select each needs within: without a window the partial matches are unbounded",
            seen["c_select"],
        )
    if conv.has_clock and cl.per:
        raise _Fail(
            "a profile with a clock component cannot use per (clock events have no attributes)",
            seen["c_per"],
        )
    if isinstance(expr, Seq):
        comps = expr.components
        if comps[0].negated and within is None:
            raise _Fail(f"leading negation {comps[0].name!r} needs within", expr_tree)
        if comps[-1].negated and within is None:
            raise _Fail(f"trailing negation {comps[-1].name!r} needs within", expr_tree)


def _check_where(where: Cond, conv: _Converter, clause: Tree[Any]) -> None:
    """where may name only primitive components of the profile."""
    for name in sorted(refs_of(where)):
        if name not in conv.names:
            known = ", ".join(sorted(conv.primitive)) or "none"
            raise _Fail(f"where refers to unknown component {name!r} (known: {known})", clause)
        if name not in conv.primitive:
            raise _Fail(
                f"where refers to {name!r}, a nested composite; refer to its primitive components",
                clause,
            )


def _zoned(node: Any, tz: str) -> Any:
    """`node` with its `localtime`/`weekday` keys read in zone `tz` (a new node where one
    changes; the same object otherwise)."""
    if isinstance(node, tuple):
        items = tuple(_zoned(x, tz) for x in node)
        return node if all(a is b for a, b in zip(items, node, strict=True)) else items
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        if not f.init:
            continue
        v = getattr(node, f.name)
        if f.name == "attr" and v in (tod.KEY_LOCALTIME, tod.KEY_WEEKDAY):
            nv = tod.key(v[1:], tz)
        else:
            nv = _zoned(v, tz)
        if nv is not v:
            changes[f.name] = nv
    return replace(node, **changes) if changes else node


def parse_filter(text: str) -> Any:
    """Parse a bare filter (used by tests and tools)."""
    p = parse_profile(text, "filter")
    if not p.is_filter:
        raise ProfileError("not a filter", "filter")
    return p.expr


__all__ = ["parse_profile", "parse_filter", "parse_duration", "And", "Or", "Not"]
