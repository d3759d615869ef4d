"""Warnings about valid profiles that will likely never do what their author meant.

They are warnings, not errors: the profile is stored or replayed anyway. A number literal
beyond the float range reads as infinity (`value > 1e400` never matches), and an attribute
that no event seen so far has carried is often a typo (`knd = "window"`) -- unless the profile
only asks whether it is there (`not (suspect exists)` guards against an attribute that
most feeds never carry). Events that carry an attribute named `localtime` or `weekday` are
warned about when a profile uses those names: the profile reads the time of day, not the
attribute (docs/language.md §2.1).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Iterator

from profiles import timeofday as tod
from profiles.ast import (
    Absent,
    All,
    And,
    AnyOf,
    Arith,
    Between,
    Cmp,
    Component,
    Exists,
    In,
    Lit,
    Not,
    Or,
    Profile,
    Ref,
    Seq,
    StartsWith,
    WAnd,
    WCmp,
    WNot,
    WOr,
)

EVENT_KEYS = frozenset({"id", "ts"})  # every event has them; not attributes to warn about
# The service stamps every event with the gateway that posted it (its reserved attribute
# `gateway`, adapters.service.records.GATEWAY_ATTR): known even where no event carried it yet
# (a fresh service, an exported file without it).
SERVICE_KEYS = frozenset({"gateway"})


def _walk(node: object) -> Iterator[object]:
    yield node
    if isinstance(node, (And, Or, WAnd, WOr)):
        for item in node.items:
            yield from _walk(item)
    elif isinstance(node, (Not, WNot)):
        yield from _walk(node.item)
    elif isinstance(node, (Seq, All, AnyOf)):
        for c in node.components:
            yield from _walk(c)
    elif isinstance(node, Component):
        yield from _walk(node.expr)
    elif isinstance(node, Absent):
        yield from _walk(node.filter)
    elif isinstance(node, (Arith, WCmp)):
        yield from _walk(node.left)
        yield from _walk(node.right)


def _nodes(p: Profile) -> Iterator[object]:
    yield from _walk(p.expr)
    if p.where is not None:
        yield from _walk(p.where)


def attributes(p: Profile) -> set[str]:
    """Event attributes the profile reads (filters, `per`, `where`)."""
    out = set(p.per)
    for n in _nodes(p):
        if isinstance(n, (Cmp, In, Between, Exists, StartsWith)):
            out.add(n.attr)
        elif isinstance(n, Ref):
            out.add(n.attr)
    return out


def _compared(p: Profile) -> set[str]:
    """Attributes the profile reads other than by `exists` (compared, partitioned on, or
    referred to in `where`)."""
    out = set(p.per)
    for n in _nodes(p):
        if isinstance(n, (Cmp, In, Between, StartsWith, Ref)):
            out.add(n.attr)
    return out


def local_zones(p: Profile) -> set[str | None]:
    """The zones of the `localtime`/`weekday` the profile reads (None: the engine's)."""
    return tod.zones(attributes(p))


def _clock_as_text(n: object) -> str | None:
    """`time > "22:00"`: an attribute ordered against "HH:MM" strings, where `localtime` was
    most likely meant (text order is not time order across midnight, and no event carries
    the time of day as text in the usual feeds)."""
    if isinstance(n, Cmp) and n.op not in ("=", "!="):
        values: tuple[object, ...] = (n.value,)
    elif isinstance(n, Between):
        values = (n.low, n.high)
    else:
        return None
    if tod.split_key(n.attr) is None and all(tod.seconds(v) is not None for v in values):
        return n.attr
    return None


def _numbers(n: object) -> Iterable[object]:
    if isinstance(n, Cmp):
        return (n.value,)
    if isinstance(n, In):
        return n.values
    if isinstance(n, Between):
        return (n.low, n.high)
    if isinstance(n, Lit):
        return (n.value,)
    return ()


def warnings(p: Profile, seen: set[str] | None = None) -> list[str]:
    """What looks wrong in a valid profile; ``seen``: attribute names events have carried
    (None: unknown, no check)."""
    out = []
    for n in _nodes(p):
        if any(isinstance(v, float) and math.isinf(v) for v in _numbers(n)):
            out.append(
                f"profile {p.id!r}: a number is beyond the float range and reads as "
                "infinity (e.g. `value > 1e400` can never match)"
            )
            break
    for n in _nodes(p):
        if (attr := _clock_as_text(n)) is not None:
            out.append(
                f"profile {p.id!r}: attribute {attr!r} is compared with a time of day as "
                f"text; for the event's local time of day write localtime instead of {attr} "
                "(docs/language.md §2.1)"
            )
    if seen:
        derived = {tod.shown(a) for a in attributes(p) if tod.split_key(a) is not None}
        for name in sorted(derived & seen):
            out.append(
                f"profile {p.id!r}: events carry an attribute {name!r}, which the profile "
                f"cannot read: {name} is the event's local "
                f"{'time of day' if name == tod.LOCALTIME else 'day of the week'} "
                "(docs/language.md §2.1); rename the attribute at the source"
            )
        read = {a for a in _compared(p) if tod.split_key(a) is None}
        for attr in sorted(read - seen - EVENT_KEYS - SERVICE_KEYS):
            close = difflib.get_close_matches(attr, sorted(seen), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"profile {p.id!r}: no event seen so far has attribute {attr!r}{hint}")
    return out


# `select each` keeps one partial match per starting event for the whole window: with this many
# expected at once a profile is a memory and latency risk (issue 41: 52,920 PMs, one event
# producing 53,338 notifications); a tenth of the default cap per partition
UNBOUNDED_AT = 1_000


def _starts(p: Profile) -> list[Component]:
    """The positive top-level components that open a partial match (a seq's first, every one
    of an all)."""
    expr = p.expr
    pos = [c for c in getattr(expr, "components", ()) if not c.negated]
    if isinstance(expr, Seq):
        return pos[:1]
    if isinstance(expr, All):
        return pos
    return []


def start_components(p: Profile) -> list[tuple[str, object]]:
    """(name, filter) of the components whose events open partial matches of a `select each`
    profile ([] for other profiles): what `unbounded_matches` wants the rates of."""
    if p.select.kind != "each":
        return []
    return [(c.name, c.expr) for c in _starts(p)]


def unbounded_matches(
    p: Profile, rates: dict[str, float | None], cap: int, notifications: int
) -> list[str]:
    """A `select each` profile whose starting components are frequent (``rates``: events per
    hour by component name, from `ens spark stats`) for its window: about rate x window
    partial matches live at once, and one completing event reports them all."""
    starts = [c.name for c in _starts(p)] if p.select.kind == "each" else []
    known = [rates[n] for n in starts if rates.get(n) is not None]
    if not starts or not known:
        return []
    per_hour = float(sum(known))  # type: ignore[arg-type]  # None filtered out
    if per_hour <= 0:
        return []
    names = ", ".join(repr(n) for n in starts)
    shared = " consume shared" if p.consume == "shared" else ""
    if p.within is None:
        live = "no window: they never expire"
    else:
        expected = per_hour * float(p.within) / 3600.0
        if expected < UNBOUNDED_AT:
            return []
        live = f"about {expected:,.0f} live at once"
    fix = "`select first` or `last`, a shorter window, or `per`"
    return [
        f"profile {p.id!r}: `select each{shared}` opens a partial match per {names} event "
        f"(~{per_hour:,.0f}/h measured) for its whole window, {live}; one completing event "
        f"reports each of them. Beyond {cap:,} per partition the oldest are dropped and "
        f"beyond {notifications:,} notifications per event the rest are (ens serve "
        f"--max-partial-matches, --max-notifications-per-event); consider {fix}"
    ]
