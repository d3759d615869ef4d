"""Which engine runs which profile, and which events each engine must see.

Profiles never interact, and a profile's partitions never interact, so a
profile can run anywhere as long as its engine sees all the events of the
partitions it owns, in stream order. Three classes follow:

- *stateless*: a bare filter without `once` reports each matching event on
  its own; it runs wherever the event is parsed (no shuffle, no sort);
- *keyed*: `per` includes the key attribute (and no `once`, which is global
  state): one engine per key value sees only that value's events;
- *global*: everything else (no `per` or a `per` without the key, `once`,
  clocks, `absent` without `per`) runs in one task over the whole stream.

An engine is only told about events that match one of its profiles' leaf
filters: any other event would only move time forward, and the detection keys
of `slices` do not depend on when a timer fires, only on its deadline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from filters.localclock import relaxed
from filters.pool.primitive import PrimitivePool
from profiles.ast import (
    Absent,
    All,
    AnyOf,
    Clock,
    Component,
    Const,
    Filter,
    Profile,
    Seq,
    is_filter,
)


@dataclass(frozen=True, slots=True)
class Leaf:
    """A primitive component of a profile: its name, its filter, whether it is negated."""

    profile: str
    name: str
    filter: Filter
    negated: bool = False


def leaves(profile: Profile) -> list[Leaf]:
    """The leaf filters in written order (clock leaves have no filter and are left out).

    A bare filter's leaf is `e`, an `absent(F)`'s is `last` — the names the
    notifications bind.
    """
    expr = profile.expr
    if is_filter(expr):
        return [Leaf(profile.id, "e", expr)]  # type: ignore[arg-type]
    if isinstance(expr, Absent):
        return [Leaf(profile.id, "last", expr.filter)]
    out: list[Leaf] = []

    def walk(comps: tuple[Component, ...]) -> None:
        for c in comps:
            if isinstance(c.expr, (Seq, All, AnyOf)):
                walk(c.expr.components)
            elif not isinstance(c.expr, Clock):
                out.append(Leaf(profile.id, c.name, c.expr, c.negated))  # type: ignore[arg-type]

    walk(expr.components)  # type: ignore[union-attr]
    return out


@dataclass
class Plan:
    """The profiles split by where they run; `positions` is the profile-file order."""

    key: str
    stateless: list[Profile] = field(default_factory=list)
    keyed: list[Profile] = field(default_factory=list)
    global_: list[Profile] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    evaluation: str = "eager"  # the engines' evaluation plan (docs/plans.md): same output
    rates: Any = None  # filters.plans.choose.Rates for evaluation "auto"

    def summary(self) -> str:
        return (
            f"{len(self.keyed)} per-{self.key} profile(s) in parallel, {len(self.global_)} global, "
            f"{len(self.stateless)} stateless filter(s)"
        )


def make_plan(profiles: Iterable[Profile], key: str) -> Plan:
    plan = Plan(key)
    for i, p in enumerate(profiles):
        plan.positions[p.id] = i
        if p.is_filter and not p.once:
            plan.stateless.append(p)
        elif key in p.per and not p.once:
            plan.keyed.append(p)
        else:
            plan.global_.append(p)
    return plan


class Relevance:
    """Does an event match any leaf filter of a profile set? (one primitive-pool lookup)"""

    def __init__(self, profiles: Iterable[Profile]) -> None:
        self.pool = PrimitivePool()
        self.empty = True
        self.always = False  # a `true` leaf (absent(true) ...): every event is relevant
        for p in profiles:
            for lf in leaves(p):
                f = relaxed(lf.filter)  # localtime/weekday: not in the attributes yet
                self.pool.add(f, 0)
                self.empty = False
                self.always |= f == Const(True)

    def __call__(self, attrs: dict[str, Any]) -> bool:
        return self.always or (not self.empty and bool(self.pool.match(attrs)))


def route_key(value: Any) -> str | None:
    """The shuffle key of a partition value: equal under `=` (1 and 1.0) => equal key.

    Unequal values may share a key (ints beyond 2**53); that only puts two
    partitions into one engine, which keeps them apart itself.
    """
    if value is None:
        return None
    if value.__class__ is bool:
        return "b1" if value else "b0"
    if isinstance(value, (int, float)):
        f = float(value)
        return "n" + (repr(f) if math.isfinite(f) else str(f))
    return "s" + str(value)
