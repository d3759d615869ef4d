"""Typed representation of profiles (docs/language.md §2-§4).

Nodes are frozen dataclasses: hashable, so identical filters and predicates
compare equal and can be stored once in the pool (profile sharing).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, dataclass_transform

_T = TypeVar("_T")


def _hkey(v: object) -> object:
    if v.__class__ is bool:
        return ("bool", v)
    if isinstance(v, tuple):
        return tuple(_hkey(x) for x in v)
    return v


def _same(a: object, b: object) -> bool:
    """Equality of field values as the language sees it: `0 = false` is not `0 = 0`."""
    if a.__class__ is bool or b.__class__ is bool:
        return a.__class__ is b.__class__ and a == b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _cached_hash(self: Any) -> int:
    """Hash once, then reuse: the pool hashes filters on every auxiliary insert and delete."""
    h: int = self._h
    if not h:
        vals = [_hkey(getattr(self, n)) for n in self._compared]
        h = hash((self.__class__.__name__, *vals)) or 1
        object.__setattr__(self, "_h", h)
    return h


def _typed_eq(self: Any, other: object) -> bool:
    if self is other:
        return True
    if type(self) is not type(other):
        return NotImplemented  # type: ignore[no-any-return]
    for n in self._compared:  # type: ignore[attr-defined]  # (narrowed to object above)
        if not _same(getattr(self, n), getattr(other, n)):
            return False
    return True


def _reduce(self: Any) -> tuple[Any, ...]:
    """Pickle by constructor arguments: a cached hash must not travel to another process."""
    return (type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init))


@dataclass_transform(frozen_default=True)  # type checkers see the dataclass it makes
def _node(cls: type[_T]) -> type[_T]:
    """A node class: frozen and slotted, its hash computed once, equality type-aware (`0` is not
    `false`), pickled by constructor arguments (the cached hash must not travel)."""
    cls.__annotations__["_h"] = "int"
    cls._h = field(default=0, init=False, compare=False, repr=False)  # type: ignore[attr-defined]
    cls.__hash__ = _cached_hash  # type: ignore[assignment]
    cls.__eq__ = _typed_eq  # type: ignore[assignment,method-assign]
    cls.__reduce__ = _reduce  # type: ignore[assignment,method-assign]
    made: Any = dataclass(frozen=True, slots=True)(cls)
    made._compared = tuple(f.name for f in fields(made) if f.compare)
    return made  # type: ignore[no-any-return]


Scalar = str | int | float | bool

# --------------------------------------------------------------------- filters


@_node
class Cmp:
    """`attr op value` with op in = != < <= > >=."""

    attr: str
    op: str
    value: Scalar


@_node
class In:
    attr: str
    values: tuple[Scalar, ...]
    negated: bool = False


@_node
class Between:
    attr: str
    low: Scalar
    high: Scalar


@_node
class Exists:
    attr: str


@_node
class StartsWith:
    attr: str
    prefix: str


@_node
class And:
    items: tuple[Filter, ...]


@_node
class Or:
    items: tuple[Filter, ...]


@_node
class Not:
    item: Filter


@_node
class Const:
    """`true` (matches every event) or `false`."""

    value: bool


Predicate = Cmp | In | Between | Exists | StartsWith
Filter = Predicate | And | Or | Not | Const

# ---------------------------------------------------------------- composites

Duration = float  # seconds


@_node
class Component:
    name: str
    expr: Expr
    negated: bool = False


@_node
class Seq:
    components: tuple[Component, ...]
    within: Duration | None = None


@_node
class All:
    components: tuple[Component, ...]
    within: Duration | None = None


@_node
class AnyOf:
    components: tuple[Component, ...]
    within: Duration | None = None


@_node
class Absent:
    filter: Filter


@_node
class Clock:
    """A daily time event at hour:minute (service time zone)."""

    hour: int
    minute: int

    @property
    def text(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"


Composite = Seq | All | AnyOf
Expr = Filter | Composite | Absent | Clock

# --------------------------------------------------------------------- where


@_node
class Ref:
    """`name.attr` in a where clause."""

    name: str
    attr: str


@_node
class Lit:
    value: Scalar


@_node
class Arith:
    op: str  # + - * /
    left: Term
    right: Term


Term = Ref | Lit | Arith


@_node
class WCmp:
    op: str
    left: Term
    right: Term


@_node
class WAnd:
    items: tuple[Cond, ...]


@_node
class WOr:
    items: tuple[Cond, ...]


@_node
class WNot:
    item: Cond


Cond = WCmp | WAnd | WOr | WNot

# ------------------------------------------------------------------- profile

SelectKind = Literal["first", "last", "each", "nth"]
ConsumeKind = Literal["unique", "shared"]


@_node
class Selection:
    kind: SelectKind = "first"
    n: int = 1


@_node
class Profile:
    id: str
    expr: Expr
    within: Duration | None = None
    per: tuple[str, ...] = ()
    where: Cond | None = None
    select: Selection = field(default_factory=Selection)
    consume: ConsumeKind = "unique"
    once: bool = False
    subscriber: str | None = None
    source: str = ""
    # what an engine compiles from this profile (its pattern), kept with the profile so every
    # engine and every restore over the same object compiles it once; not compared, not
    # pickled (`_reduce` passes constructor arguments only), filled by `filters.pattern`
    compiled: object = field(default=None, init=False, compare=False, repr=False)

    @property
    def is_filter(self) -> bool:
        return is_filter(self.expr)


def is_filter(expr: object) -> bool:
    return isinstance(expr, (Cmp, In, Between, Exists, StartsWith, And, Or, Not, Const))


def refs_of(node: object) -> set[str]:
    """Component names a where condition or term mentions."""
    if isinstance(node, Ref):
        return {node.name}
    if isinstance(node, Lit):
        return set()
    if isinstance(node, (Arith, WCmp)):
        return refs_of(node.left) | refs_of(node.right)
    if isinstance(node, (WAnd, WOr)):
        out: set[str] = set()
        for item in node.items:
            out |= refs_of(item)
        return out
    if isinstance(node, WNot):
        return refs_of(node.item)
    raise TypeError(node)


def conjuncts(cond: Cond | None) -> list[Cond]:
    """Top-level `and` parts of a where clause (each checked as soon as it can be)."""
    if cond is None:
        return []
    if isinstance(cond, WAnd):
        out: list[Cond] = []
        for item in cond.items:
            out.extend(conjuncts(item))
        return out
    return [cond]
