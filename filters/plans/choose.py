"""Evaluation plans: which component of a composite opens partial matches (issue 16).

The single-step engine opens a partial match on every event of a composite's
first component (*eager*). When that component is frequent and a later one
rare, most partial matches expire unused. A *rare-first* plan keeps the
events of the components before the rare one in per-partition buffers bounded
by the window, and looks them up when the rare component arrives (see
`filters/rarefirst/lazy.py`). The plan is chosen per profile from measured rates
(`ens spark stats` output); the output is identical either way.

Pure: rates come in as numbers, nothing here reads files or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from filters import state as state_format
from filters.canon import filter_key
from profiles.ast import Absent, All, AnyOf, Clock, Profile, Seq

MODES = ("eager", "rare-first", "auto")
# auto: the driver must be at least this many times rarer than the first component. 1: the
# rarest (ties included) drives; `ens bench lazy` measured rare-first faster than eager even
# at 1:1 for every supported shape (docs/benchmarks.md)
AUTO_FACTOR = 1.0


@dataclass(frozen=True)
class Plan:
    """How one profile is evaluated, and why."""

    profile: str
    lazy: bool
    opener: str | None  # the component whose events open (or complete) matches
    reason: str
    rates: dict[str, float | None] = field(default_factory=dict)  # component -> events per hour
    window: float | None = None
    driver: int | None = None  # rare-first: the index of the driving component

    def describe(self) -> str:
        """One paragraph for `ens explain`: the plan, the rates it came from, why."""
        head = "rare-first" if self.lazy else "eager"
        by = ""
        if self.lazy:
            last = self.driver is None or self.driver == len(self.rates) - 1 or not self.rates
            by = (
                " (the last component: earlier ones are buffered)"
                if last
                else " (earlier components are buffered, later ones bound as they come)"
            )
        lines = [
            f"plan: {head}" + (f", matches opened by {self.opener}{by}" if self.opener else "")
        ]
        lines.append(f"  why: {self.reason}")
        if self.rates:
            w = self.window
            parts = []
            for name, r in self.rates.items():
                if r is None:
                    parts.append(f"{name}: unknown")
                elif w is not None:
                    parts.append(f"{name}: {r:g}/h ({r * w / 3600.0:.3g} per window)")
                else:
                    parts.append(f"{name}: {r:g}/h")
            lines.append("  rates: " + ", ".join(parts))
        return "\n".join(lines)


class Rates:
    """Measured component rates: an `ens spark stats` document (STATS.json, version 1).

    Looked up by profile id and component name first, then by the component's
    canonical filter text (so a profile added later, or renamed, still finds the
    rate of a filter that was counted).
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.by_profile: dict[str, dict[str, float | None]] = {}
        for pid, comps in (doc.get("profiles") or {}).items():
            self.by_profile[pid] = {name: _rate(c) for name, c in comps.items()}
        self.by_filter: dict[str, float | None] = {
            k: _rate(c) for k, c in (doc.get("filters") or {}).items()
        }

    def for_profile(
        self, profile: Profile, names: list[str], filters: list[Any]
    ) -> dict[str, float | None]:
        mine = self.by_profile.get(profile.id, {})
        out: dict[str, float | None] = {}
        for name, f in zip(names, filters, strict=True):
            r = mine.get(name)
            if r is None:
                r = self.by_filter.get(filter_key(f))
            out[name] = r
        return out


def _rate(c: Mapping[str, Any]) -> float | None:
    r = c.get("rate_per_hour")
    if r is None:
        r = c.get("matches")  # a zero-length history: counts still order the components
    return float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else None


def lazy_shape(profile: Profile) -> str | None:
    """Why the profile cannot be evaluated rare-first with the eager output (None: it can).

    Supported: `seq` of 2+ positive primitive components with `within`, under `select
    first` or `each` and either `consume`, with any `where` and `per`; the rarest
    component drives under `each`, the last under `first`. Anything else keeps the
    eager plan, for the reason returned.
    """
    expr = profile.expr
    if profile.is_filter:
        return "a filter has no partial matches"
    if isinstance(expr, Absent):
        return "absent(...) has no partial matches to defer"
    if isinstance(expr, AnyOf):
        return "any(...) reports every component's events: nothing to defer"
    if isinstance(expr, All):
        return "all(...) opens on any component already; rare-first supports seq(...) only"
    assert isinstance(expr, Seq)
    for c in expr.components:
        if isinstance(c.expr, (Seq, All, AnyOf)):
            return "nested composites stay eager (their own windows and resets)"
        if isinstance(c.expr, Clock):
            return "clock(...) components stay eager (time events)"
        if c.negated:
            return "negated components stay eager (a negation's scope needs every event in order)"
    if len(expr.components) < 2:
        return "one component: nothing to defer"
    if profile.within is None:
        return "no within: the buffers would be unbounded"
    kind = profile.select.kind
    if kind == "last":
        return (
            "select last stays eager: every duplicate of the newest binding may replace it, and "
            "whether it may depends on the where and on the events since (docs/language.md §4.1 "
            "item 1); buffered events cannot replay that chain"
        )
    if kind == "nth":
        return (
            "select nth stays eager: the N-th event is counted in arrival order among the "
            "events that could bind at that moment (docs/language.md §4.1 item 2); buffered events "
            "cannot recount them"
        )
    return None


def choose(
    profile: Profile,
    mode: str,
    names: list[str],
    filters: list[Any],
    rates: Rates | None,
) -> Plan:
    """The plan of one profile under `mode` (eager, rare-first or auto)."""
    if mode not in MODES:
        raise ValueError(f"unknown plan {mode!r} (one of {', '.join(MODES)})")
    window = float(profile.within) if profile.within is not None else None
    measured = rates.for_profile(profile, names, filters) if rates is not None and names else {}
    first = names[0] if names else None
    if mode == "eager":
        return Plan(profile.id, False, first, "--plan eager", measured, window)
    why = lazy_shape(profile)
    if why is not None:
        return Plan(profile.id, False, first if names else None, why, measured, window)
    n = len(names)
    last = names[-1]
    if mode == "rare-first":
        return Plan(
            profile.id,
            True,
            last,
            "--plan rare-first: the last component drives",
            measured,
            window,
            n - 1,
        )
    return _auto(profile, names, measured, window)


def _auto(
    profile: Profile, names: list[str], measured: dict[str, float | None], window: float | None
) -> Plan:
    """`--plan auto` for a profile that may be lazy: the measured rates decide."""
    n = len(names)
    first, last = names[0], names[-1]
    if not measured or any(r is None for r in measured.values()):
        return Plan(
            profile.id,
            False,
            first,
            "auto: no rates for every component (give --stats)",
            measured,
            window,
        )
    rs: list[float] = [measured[x] for x in names]  # type: ignore[misc]
    if profile.select.kind != "each":
        # `first` holds one partial match per partition, tracked online whatever the rates:
        # `ens bench lazy` measured it faster than eager at every ratio and order
        return Plan(
            profile.id,
            True,
            last,
            "auto: select first: the partition's one partial match is tracked online (no timer, no "
            "auxiliary profiles), cheaper than eager whichever component is rare",
            measured,
            window,
            n - 1,
        )
    k = max(i for i, r in enumerate(rs) if r == min(rs))  # the rarest; ties: the latest
    driver = names[k]
    if k == 0:
        return Plan(
            profile.id,
            False,
            first,
            f"auto: the first component ({first}) is the rarest: eager opens matches on it already",
            measured,
            window,
        )
    r_first, r_k = rs[0], rs[k]
    cost_eager, cost_lazy = costs(rs, window, k)
    if not r_first:
        return Plan(
            profile.id,
            False,
            first,
            f"auto: {first} never matched (rate 0): eager opens nothing",
            measured,
            window,
        )
    if r_k * AUTO_FACTOR > r_first or cost_lazy >= cost_eager:
        return Plan(
            profile.id,
            False,
            first,
            f"auto: {driver} is rarer than {first} by less than {AUTO_FACTOR:g}x, or the cost model prefers eager",
            measured,
            window,
        )
    ratio = r_first / max(r_k, 1e-12)
    how = (
        f"as frequent as {first} (ties go rare-first)"
        if ratio == 1
        else f"{ratio:.4g}x rarer than {first}"
    )
    return Plan(
        profile.id,
        True,
        driver,
        f"auto: {driver} is the rarest, {how}; estimated cost {cost_lazy:.3g} vs eager {cost_eager:.3g} per window",
        measured,
        window,
        k,
    )


def costs(
    rates: list[float], window: float | None, driver: int | None = None
) -> tuple[float, float]:
    """EFREQ-style costs (rate x window) of the eager and the rare-first plan, per window.

    Eager: every event of the first component opens a partial match and every
    partial match is extended by the next component's events: sum over m of
    prod_{j<=m} r_j w (partial matches created; the completions included).
    Rare-first driven by component k (default: the last): every event before it
    is only buffered (counted as 1/4 of a partial match: an append), each driver
    event looks up the buffered combinations, and from there on partial matches
    are extended as eagerly: sum_{j<k} r_j w / 4 + sum_{m>=k} prod_{j<=m} r_j w.
    """
    w = (window or 0.0) / 3600.0
    rw = [max(r, 0.0) * w for r in rates]
    k = len(rw) - 1 if driver is None else driver
    eager = lazy = 0.0
    prod = 1.0
    for m, x in enumerate(rw):
        prod *= x
        eager += prod
        if m >= k:
            lazy += prod
    lazy += sum(rw[:k]) / 4.0
    return eager, lazy


state_format.register("rates", Rates)
