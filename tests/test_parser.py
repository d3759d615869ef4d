"""The profile language: parsing, positions in errors, semantic validation, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles.ast import All, AnyOf, Clock, Seq
from profiles.errors import ProfileError
from profiles.parser import parse_duration, parse_profile
from profiles.profile_file import parse_profile_document

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


def err(text: str) -> ProfileError:
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p1")
    return e.value


def test_every_clause_and_operator_parses() -> None:
    p = parse_profile(
        'seq(a: k = "A" and v between 1 and 2, not x: k = "X", b: any(c: k = "C", d: k = "D"),'
        ' all(e: k in ("E", "F"), f: name starts with "lab-" or s exists)) '
        "within 1.5h per room, building where e.v > a.v * 2 - 1 and (c.z != 'q' or d.z = 3) "
        "select nth 2 consume shared once",
        "p1",
    )
    assert isinstance(p.expr, Seq) and p.within == 5400.0
    assert p.per == ("room", "building") and p.select.kind == "nth" and p.select.n == 2
    assert p.consume == "shared" and p.once
    kinds = [type(c.expr).__name__ for c in p.expr.components]
    assert kinds == ["And", "Cmp", "AnyOf", "All"]
    assert p.expr.components[1].negated


def test_repeat_and_clock_and_unnamed_components() -> None:
    p = parse_profile('repeat(kind = "door", 3) within 10m per door', "r")
    assert [c.name for c in p.expr.components] == ["r1", "r2", "r3"]
    p = parse_profile('seq(n: clock("22:00"), k = "A", any(k = "B", k = "C")) within 8h', "c")
    assert p.expr.components[0].expr == Clock(22, 0)
    assert [c.name for c in p.expr.components][1:] == ["c2", "c3"]
    inner = p.expr.components[2].expr
    assert isinstance(inner, AnyOf) and [c.name for c in inner.components] == ["c4", "c5"]


def test_nested_within_is_kept() -> None:
    p = parse_profile('all(seq(a: k = "A", b: k = "B") within 5s, c: k = "C") within 20s', "n")
    assert isinstance(p.expr, All) and p.expr.components[0].expr.within == 5.0


@pytest.mark.parametrize(
    ("text", "message", "line", "column"),
    [
        ('seq(a: k = , b: k = "B") within 1s', "expected", 1, 12),
        ('seq(a: k = "A",\n    b: k = "B"\n  within 1s', "expected", 3, 3),
        ('seq(a: k = "A", b: k = "B") select each', "needs within", 1, 29),
        ('all(a: k = "A", b: k = "B") select each', "needs within", None, None),
        ('repeat(k = "A", 3) select each', "needs within", 1, 20),
        ('seq(n: clock("22:00"), b: k = "B") within 1h per room', "cannot use per", None, None),
        (
            'seq(a: k = "A", b: k = "B") within 1s where c.v = 1',
            "unknown component 'c'",
            None,
            None,
        ),
        ('seq(a: k = "A", a: k = "B") within 1s', "duplicate component name 'a'", None, None),
        ('seq(not a: k = "A", not b: k = "B") within 1s', "at least one positive", None, None),
        ('seq(a: k = "A", absent(k = "B")) within 1s', "only as the whole profile", None, None),
        ('absent(k = "A")', "needs within", None, None),
        ('seq(not m: k = "M", f: k = "F")', "needs within", None, None),
        ('seq(a: k = "A", not x: k = "X")', "needs within", None, None),
        ('clock("22:00")', "only as a component", None, None),
        ('seq(n: clock("25:00"), a: k = "A")', "HH:MM", None, None),
        ('k = "A" within 5m', "bare filter", None, None),
        ('seq(a: k = "A", b: k = "B") within 1s within 2s', "twice", None, None),
        ('seq(a: k = "A", b: k = "B") where a.v = b', "name.attribute", None, None),
        ("flag > true", "booleans compare only", None, None),
    ],
)
def test_errors_name_what_and_where(
    text: str, message: str, line: int | None, column: int | None
) -> None:
    e = err(text)
    assert message in str(e)
    assert "p1" in str(e)
    if line is not None:
        assert (e.line, e.column) == (line, column)


def test_syntax_error_lists_expected_tokens() -> None:
    e = err('seq(a: k = "A" b: k = "B")')
    assert e.line == 1 and e.column == 16
    assert '","' in str(e) and '")"' in str(e)


def test_check_collects_every_problem_with_file_lines() -> None:
    doc = """profiles:
  - id: good
    expr: k = "A"
  - id: bad1
    expr: |
      seq(a: k = "A",
          b: k = ) within 1s
  - id: bad2
    expr: 'seq(a: k = "A") select each'
  - id: good
    expr: k = "B"
"""
    pset, errors = parse_profile_document(doc)
    assert [p.id for p in pset.profiles] == ["good"]
    text = [str(e) for e in errors]
    assert len(errors) == 3
    assert "bad1" in text[0] and "line 2, column 12" in text[0] and "file line 7" in text[0]
    assert "bad2" in text[1] and "within" in text[1]
    assert "duplicate profile id" in text[2]


def test_profile_entries_of_the_wrong_shape_are_named() -> None:
    doc = "profiles:\n  - {id: a, expr: 3}\n  - {id: b}\n  - {id: c, expr: 'k = 1', colour: red}\n  - k = 1\n"
    _, errors = parse_profile_document(doc)
    text = [str(e) for e in errors]
    assert len(text) == 4
    assert (
        "'a'" in text[0]
        and "expr must be a string, got int" in text[0]
        and "file line 2" in text[0]
    )
    assert "'b'" in text[1] and "missing expr" in text[1]
    assert text[2] == (
        "<profiles>:4:28: profile 'c': unknown key 'colour' "
        "(allowed: id, expr, subscriber, description, alarm)"
    )
    assert "profile #4 must be a mapping" in text[3]


def test_invalid_yaml_is_reported_with_its_position() -> None:
    _, errors = parse_profile_document("profiles:\n  - id: x\n    expr: seq(a: k = 1)\n")
    assert len(errors) == 1 and "line 3" in str(errors[0])


def test_durations() -> None:
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("2d") == 172800.0


TOKENS = [
    "seq",
    "all",
    "any",
    "absent",
    "repeat",
    "clock",
    "(",
    ")",
    ",",
    ":",
    "not",
    "and",
    "or",
    "within",
    "per",
    "where",
    "select",
    "first",
    "each",
    "nth",
    "consume",
    "unique",
    "once",
    "=",
    "<",
    ">=",
    "in",
    "between",
    "exists",
    "starts",
    "with",
    "a",
    "b.v",
    '"x"',
    "3",
    "1.5",
    "10m",
    "true",
    "+",
    "*",
    "'q'",
    '"22:00"',
    "\n",
    "#",
    "\\",
    "é",
    "{",
    "@",
]


@settings(max_examples=1500, deadline=None)
@given(
    st.one_of(st.text(max_size=60), st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join))
)
def test_fuzz_parser_raises_only_its_own_error(text: str) -> None:
    try:
        parse_profile(text, "fuzz")
    except ProfileError as e:
        assert "fuzz" in str(e)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (
            'seq(a: k = "x", b: k = "y") within 30 minutes',
            "write the unit right after the number, without a space: 30m",
        ),
        (
            'seq(a: k = "x", b: k = "y") within 30min',
            "'min' is not a duration unit; the units are ms, s, m, h, d",
        ),
        ('seq(a: k = "x", b: k = "y") within 2w', "'w' is not a duration unit"),
        ('kind == "a"', "'==' is not an operator: use '=' for equality"),
        ('SEQ(a: k = "x", b: k = "y") within 1m', "keywords are lower case: 'seq', not 'SEQ'"),
        ('kind = "a" AND x = 1', "keywords are lower case: 'and', not 'AND'"),
        # issue 40: what a new operator guessed
        (
            'count(kind = "co2" and value > 1000) >= 3',
            "there is no count(...): N events matching F are repeat(F, N)",
        ),
        (
            'seq(a: kind = "co2" and value > 1000) times 3 within 10m',
            "there is no 'times': N events matching F are repeat(F, N)",
        ),
        ('kind = "co2" times 3', "there is no 'times'"),
        ('kind = "co2" && value > 1000', "write 'and', not '&&'"),
        ('kind = "co2" || kind = "voc"', "write 'or', not '||'"),
        ('kind = "co2" & value > 1', "write 'and', not '&'"),
        (
            'kind = "co2" and value > 1000ppm',
            "a number has no unit in a comparison: write 1000, not 1000ppm",
        ),
        (
            "seq(a: k = 1, b: k = 2) within 1h where b.v > a.v + 2.5kg",
            "write 2.5, not 2.5kg",
        ),
    ],
)
def test_syntax_errors_hint_at_the_usual_mistakes(text: str, hint: str) -> None:
    with pytest.raises(ProfileError) as ei:
        parse_profile(text, "p")
    assert hint in str(ei.value)


@pytest.mark.parametrize(
    "text",
    [
        "seq(a: k = 1, b: k = 2) within 1h where a.v > 3 b",  # a missing operator, not a unit
        "kind = 1 and value > 1000 ppm",  # spaced: not obviously a unit
        'counter(kind = "x")',  # only count( is counting
    ],
)
def test_no_counting_or_unit_hint_where_it_would_mislead(text: str) -> None:
    with pytest.raises(ProfileError) as ei:
        parse_profile(text, "p")
    assert "repeat(F, N)" not in str(ei.value) and "has no unit" not in str(ei.value)


def test_a_duration_error_lists_the_units() -> None:
    with pytest.raises(ProfileError) as ei:
        parse_profile('seq(a: k = "x", b: k = "y") within soon', "p")
    assert "a duration: a number and one of the units ms, s, m, h, d" in str(ei.value)


def test_an_unquoted_expression_with_a_colon_in_yaml_says_to_quote_it() -> None:
    text = 'profiles:\n  - id: x\n    expr: seq(a: kind = "x", b: kind = "y") within 1m\n'
    _, errors = parse_profile_document(text, "f.yaml")
    assert len(errors) == 1
    assert "must be quoted (expr: 'seq(a: ...)') or written as a block (expr: |)" in str(errors[0])
