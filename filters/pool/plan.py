"""How the primitive pool indexes one clause: its access predicate, its residual check, its plan.

A clause is a conjunction. All its equalities (its own and those the engine binds) form the
access key of an equality bucket, with at most one range searched by bisect inside the bucket;
a clause without equalities is indexed under its most selective other predicate (`_rank`);
the rest is compiled into a residual check. An auxiliary profile differs from the one before
it only in its bound values, so the planning is kept as a *plan* that `from_plan` fills in
with the next values (see `PrimitivePool._plan`).

Access predicates and plans are tuples, tagged by their first item:

- ("eqs", schema, values, range | None): a bucket; `range` = (attr, op, kind);
- ("in", attr, values), ("prefix", attr, prefix), ("between", attr, low, high),
  ("exists", attr), ("range", attr, op, value);
- plans: ("eqs", schema, sources, range, threshold, check), sources saying per schema attribute
  (True, position in the bound values) or (False, the filter's own value);
  ("static", access, threshold, check) for clauses without bound values.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from filters.compile import Check, compile_filter, norm
from profiles.ast import And, Between, Cmp, Exists, Filter, In, Or, StartsWith

Eqs: TypeAlias = tuple[tuple[str, Any], ...]  # extra `attr = value` predicates bound by the engine
Access: TypeAlias = tuple[Any, ...]  # an access predicate (see the module docstring)
Plan: TypeAlias = tuple[Any, ...]  # how a clause of a filter is indexed, for any bound values

_MAX_SPLIT = 32  # a top-level `or` with more branches is kept as one scanned clause


def kind_of(v: Any) -> str:
    """The comparison domain of a threshold: strings ("s") or numbers ("n")."""
    return "s" if isinstance(v, str) else "n"


def is_range(p: Filter) -> bool:
    return isinstance(p, Cmp) and p.op in ("<", "<=", ">", ">=") and not isinstance(p.value, bool)


def _rank(p: Filter) -> float | None:
    """For clauses without equality: lower is a better access predicate; None = not indexable."""
    if isinstance(p, In):
        return None if p.negated or not p.values else 1.0
    if isinstance(p, StartsWith):
        return 2.0
    if isinstance(p, Between):
        return 3.0
    if is_range(p):
        return 4.0
    if isinstance(p, Exists):
        return 5.0
    return None


def _conjuncts(f: Filter) -> list[Filter]:
    if isinstance(f, And):
        out: list[Filter] = []
        for item in f.items:
            out.extend(_conjuncts(item))
        return out
    return [f]


def split(f: Filter) -> list[list[Filter]]:
    """The filter's clauses: one per branch of a top-level `or`, each a list of conjuncts."""
    if isinstance(f, Or) and len(f.items) <= _MAX_SPLIT:
        out: list[list[Filter]] = []
        for item in f.items:
            if isinstance(item, Or):
                return [_conjuncts(f)]
            out.append(_conjuncts(item))
        return out
    return [_conjuncts(f)]


def access_of(p: Filter) -> Access:
    """The access predicate of a clause without equalities, indexed under `p`."""
    if isinstance(p, In):
        return ("in", p.attr, tuple(norm(v) for v in p.values))
    if isinstance(p, StartsWith):
        return ("prefix", p.attr, p.prefix)
    if isinstance(p, Between):
        return ("between", p.attr, p.low, p.high)
    if isinstance(p, Exists):
        return ("exists", p.attr)
    assert isinstance(p, Cmp)
    return ("range", p.attr, p.op, p.value)


def _equalities(parts: list[Filter], eqs: Eqs) -> tuple[dict[str, Any], set[int], bool]:
    """The clause's equalities (attr -> normalised value), the conjuncts they use, and whether
    two of them contradict each other (`a = 1 and a = 2`)."""
    eq: dict[str, Any] = {}
    used: set[int] = set()
    conflict = False
    for a, k in eqs:
        if a in eq and eq[a] != k:
            conflict = True
        eq[a] = k
    for i, p in enumerate(parts):
        if isinstance(p, Cmp) and p.op == "=":
            k = norm(p.value)
            if p.attr in eq and eq[p.attr] != k:
                conflict = True
            eq[p.attr] = k
            used.add(i)
    return eq, used, conflict


def _bucket_access(parts: list[Filter], eq: dict[str, Any], used: set[int]) -> tuple[Access, Any]:
    """The equality bucket's access predicate, with the clause's first range (its threshold)."""
    schema = tuple(sorted(eq))
    values = eq[schema[0]] if len(schema) == 1 else tuple(eq[a] for a in schema)
    for i, p in enumerate(parts):
        if i not in used and is_range(p):
            assert isinstance(p, Cmp)
            used.add(i)
            return ("eqs", schema, values, (p.attr, p.op, kind_of(p.value))), p.value
    return ("eqs", schema, values, None), None


def _best_access(parts: list[Filter], used: set[int]) -> Access | None:
    """The access predicate of a clause without equalities (None: the clause is scanned)."""
    best, best_rank = None, None
    for i, p in enumerate(parts):
        r = _rank(p)
        if r is not None and (best_rank is None or r < best_rank):
            best, best_rank = i, r
    if best is None:
        return None
    used.add(best)
    return access_of(parts[best])


def _residual(rest: list[Filter]) -> Check | None:
    """The compiled check of the conjuncts the access predicate does not cover (None: none)."""
    if not rest:
        return None
    check = compile_filter(rest[0] if len(rest) == 1 else And(tuple(rest)))
    return None if check.__name__ == "_always" else check


def _reusable(
    parts: list[Filter], eqs: Eqs, eq: dict[str, Any], access: Access | None, made: Plan
) -> Plan | None:
    """The clause's plan for other bound values, or None when it depends on these ones."""
    bound = dict(eqs)
    if any(isinstance(p, Cmp) and p.op == "=" and p.attr in bound for p in parts):
        return None
    if access is not None and access[0] == "eqs":
        positions = {a: j for j, (a, _) in enumerate(eqs)}
        sources = tuple(
            (True, positions[a]) if a in positions else (False, eq[a]) for a in access[1]
        )
        _, _, thr, check = made
        return ("eqs", access[1], sources, access[3], thr, check)
    return None if eqs else made


def plan_clause(
    parts: list[Filter], eqs: Eqs
) -> tuple[Access | None, Any, Check | None, Plan | None]:
    """(access predicate, range threshold, residual check, reusable plan or None) of a clause."""
    eq, used, conflict = _equalities(parts, eqs)
    if conflict:  # a = 1 and a = 2: can never match; the whole conjunction is checked
        rest = list(parts) + [Cmp(a, "=", k[1] if isinstance(k, tuple) else k) for a, k in eqs]
        return _best_access(parts, set()), None, _residual(rest), None
    thr = None
    access: Access | None
    if eq:
        access, thr = _bucket_access(parts, eq, used)
    else:
        access = _best_access(parts, used)
    check = _residual([p for i, p in enumerate(parts) if i not in used])
    made: Plan = ("static", access, thr, check)
    return access, thr, check, _reusable(parts, eqs, eq, access, made)


def from_plan(plan: Plan, eqs: Eqs) -> tuple[Access | None, Any, Check | None]:
    """(access predicate, threshold, check) of a clause planned before, for the bound `eqs`."""
    if plan[0] == "static":
        _, access, thr, check = plan
        return access, thr, check
    _, schema, sources, rng, thr, check = plan
    vals = tuple(eqs[v][1] if bound else v for bound, v in sources)
    return ("eqs", schema, vals[0] if len(vals) == 1 else vals, rng), thr, check
