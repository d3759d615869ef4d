"""A reference interpreter of docs/language.md, written from the spec only (§3, §4, §4.1, §5).

It covers flat `seq(...)` profiles of primitive components — positive, and negated (leading,
between, trailing) — with `within`, `per r`, `where`, `select first | last | nth N` and
`consume unique | shared`: the shapes where the engines once agreed with each other and not
with the spec (issue 22). It shares no code with the engines, the parser or the filter
compiler: a profile is given as Python predicates (tests/strategies.py draws the profile text
and these predicates from the same choices).

How it reads the spec: the state is one partial match per partition (a prefix of the
positives, bound to events), and whether a partial match is *valid* is decided from scratch
by looking at the whole stream (`_valid`): order, window, the `where` conjuncts over what is
bound, and, for every negated component, the stream events in its scope. A binding (opening,
extending, replacing under `last`, counting under `nth`) is made only if the partial match
with it is valid (§4.1 items 1, 2, 5, 7); an event that does not touch a partial match kills
it when the match, seen up to that event, is no longer valid. Slow (quadratic and more) and
meant for streams of a dozen events.

`localtime` and `weekday` (§2.1) are read in UTC: the seconds since the last midnight and the
day name, from the calendar (`datetime`), added to each event's attributes under those names
(the streams drawn for it carry no attribute of the same name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Attrs = dict[str, Any]


@dataclass(frozen=True)
class Comp:
    name: str
    negated: bool
    test: Callable[[Attrs], bool]  # the component's filter


@dataclass(frozen=True)
class Conj:
    """One `and` part of the where clause: its component names and its truth over them
    (called only with every name bound; false when an attribute is absent)."""

    refs: frozenset[str]
    holds: Callable[[dict[str, Attrs]], bool]


@dataclass
class SeqSpec:
    id: str
    comps: list[Comp]
    within: float | None = None
    per: str | None = None  # the one `per` attribute, if any
    where: list[Conj] = field(default_factory=list)
    select: str = "first"  # first | last | nth
    n: int = 1
    shared: bool = False


@dataclass
class _Part:
    pm: list[int] | None = None  # stream positions bound to the positives, a prefix
    waiting: bool = False  # complete, waiting for the trailing negation's deadline
    counts: dict[int, int] = field(default_factory=dict)  # nth: events counted per positive
    starts: int = 0  # nth: starting events counted while the partition has no partial match
    starts_ts: float = 0.0
    values: dict[str, Any] | None = None


def interpret(
    spec: SeqSpec, events: list[dict[str, Any]], until: float | None = None
) -> list[dict[str, Any]]:
    """The notifications (§6 records, in detection order) of `spec` over the events."""
    return _Run(spec, events).run(until)


class _Run:
    def __init__(self, spec: SeqSpec, events: list[dict[str, Any]]) -> None:
        self.s = spec
        # §1: one total order, by ts, ties by arrival
        order = sorted(range(len(events)), key=lambda i: (float(events[i]["ts"]), i))
        self.evs = [events[i] for i in order]
        self.ts = [float(e["ts"]) for e in self.evs]
        comps = spec.comps
        self.pos = [j for j, c in enumerate(comps) if not c.negated]
        self.k = len(self.pos)
        first, last = self.pos[0], self.pos[-1]
        self.leading = [j for j in range(first)]
        self.trailing = [j for j in range(last + 1, len(comps))]
        # between: negated component -> ordinal of the positive before it
        self.between = {
            j: sum(1 for p in self.pos if p < j) - 1
            for j in range(first + 1, last)
            if comps[j].negated
        }
        self.key = [self._key(e) for e in self.evs]
        self.out: list[dict[str, Any]] = []

    # ------------------------------------------------------------ helpers
    def _key(self, e: dict[str, Any]) -> Any:
        if self.s.per is None:
            return ()
        return e.get(self.s.per)  # None: the event is ignored by the profile

    def _attrs(self, p: int) -> Attrs:
        out = {a: v for a, v in self.evs[p].items() if a not in ("id", "ts")}
        when = datetime.fromtimestamp(self.evs[p]["ts"], UTC)
        out["localtime"] = when.hour * 3600 + when.minute * 60 + when.second
        out["weekday"] = when.strftime("%a").lower()
        return out

    def _bound(self, pm: list[int]) -> dict[str, Attrs]:
        return {self.s.comps[self.pos[o]].name: self._attrs(p) for o, p in enumerate(pm)}

    def _kills(self, j: int, p: int, bound: dict[str, Attrs]) -> bool:
        """Does stream event p, matching negated component j, satisfy every where conjunct
        that mentions j (each decidable with what is bound)? Undecided: not (yet)."""
        comp = self.s.comps[j]
        if not comp.test(self._attrs(p)):
            return False
        env = dict(bound)
        env[comp.name] = self._attrs(p)
        for c in self.s.where:
            if comp.name in c.refs:
                if not c.refs <= env.keys():
                    return False  # decided when the component it names is bound (§4.1 item 7)
                if not c.holds(env):
                    return False
        return True

    def _valid(self, pm: list[int], now: int) -> bool:
        """Is the partial match `pm` valid with the stream seen up to position `now`?"""
        s, ts, key = self.s, self.ts, self.key[pm[0]]
        if any(a >= b for a, b in zip(pm, pm[1:], strict=False)):
            return False
        if s.within is not None and ts[pm[-1]] - ts[pm[0]] > s.within:
            return False
        bound = self._bound(pm)
        pos_names = {s.comps[p].name for p in self.pos}
        for c in s.where:
            if c.refs <= pos_names and c.refs <= bound.keys() and not c.holds(bound):
                return False
        mine = [p for p in range(len(self.evs)) if self.key[p] == key and p not in pm]
        for j, i in self.between.items():  # no x after the positive before it, before the next
            if i >= len(pm):
                continue
            hi = pm[i + 1] if i + 1 < len(pm) else now + 1
            if any(pm[i] < p < hi and self._kills(j, p, bound) for p in mine):
                return False
        if len(pm) == self.k:
            for j in self.leading:  # before the first positive, at or after last.ts - T
                lo = ts[pm[-1]] - (s.within or 0.0)
                if any(p < pm[0] and ts[p] >= lo and self._kills(j, p, bound) for p in mine):
                    return False
            for j in self.trailing:  # after the last positive, up to first.ts + T
                end = ts[pm[0]] + (s.within or 0.0)
                if any(
                    pm[-1] < p <= now and ts[p] <= end and self._kills(j, p, bound) for p in mine
                ):
                    return False
        return True

    def _report(self, ts: float, pm: list[int], part: _Part) -> None:
        names = [self.s.comps[p].name for p in self.pos]
        note: dict[str, Any] = {
            "profile": self.s.id,
            "ts": ts,
            "events": {n: self.evs[p]["id"] for n, p in zip(names, pm, strict=True)},
        }
        if self.s.per is not None:
            note["partition"] = part.values
        self.out.append(note)

    # ------------------------------------------------------------- time
    def _timers(self, parts: dict[Any, _Part], due: Callable[[float], bool]) -> None:
        w = self.s.within
        if w is None:
            return
        fired = []
        for part in parts.values():
            if part.pm is not None and due(self.ts[part.pm[0]] + w):
                fired.append((self.ts[part.pm[0]] + w, part))
            if part.starts and due(part.starts_ts + w):
                part.starts = 0  # the nth count lives one window from its first event (§4.1 item 2)
        for d, part in sorted(fired, key=lambda f: f[0]):
            if part.waiting:  # a trailing negation's deadline passed: the match is reported
                self._report(d, part.pm, part)  # type: ignore[arg-type]
            part.pm, part.waiting, part.counts = None, False, {}

    # ------------------------------------------------------------ events
    def run(self, until: float | None) -> list[dict[str, Any]]:
        parts: dict[Any, _Part] = {}
        for p in range(len(self.evs)):
            t = self.ts[p]
            self._timers(parts, lambda d, t=t: d < t)  # §5: deadlines before ts fire first
            key = self.key[p]
            if key is None:
                continue
            part = parts.get(key)
            if part is None:
                part = parts[key] = _Part(values={self.s.per: key} if self.s.per else None)
            self._event(part, p)
        if self.evs:
            end = until if until is not None else self.ts[-1]
            self._timers(parts, lambda d: d <= end)  # §4.1 item 8
        return self.out

    def _event(self, part: _Part, p: int) -> None:
        s, k, t = self.s, self.k, self.ts[p]
        attrs = self._attrs(p)
        matches = [o for o in range(k) if s.comps[self.pos[o]].test(attrs)]
        touched = consumed = False
        pm = part.pm
        if pm is not None:
            m = len(pm)
            done = False
            if m < k and m in matches and self._valid([*pm, p], p):
                if s.select == "nth" and part.counts.get(m, 0) + 1 < s.n:
                    part.counts[m] = part.counts.get(m, 0) + 1  # counted, not bound
                    done = True
                else:
                    done = True
                    new = [*pm, p]
                    if len(new) == k and not self.trailing:
                        self._report(t, new, part)
                        if not s.shared:
                            part.pm, part.counts, consumed = None, {}, True
                        # shared: the match stays as it was before this binding (§4.1 item 4)
                    else:
                        part.pm, part.waiting, touched = new, len(new) == k, True
                        part.counts.pop(m, None)
            if not done and s.select == "last" and m >= 1 and (m - 1) in matches:
                new = [*pm[:-1], p]  # the newest binding replaced, if the match stays valid
                if self._valid(new, p):
                    part.pm, touched = new, True
        if part.pm is not None and not touched and not self._valid(part.pm, p):
            part.pm, part.waiting, part.counts = None, False, {}  # killed by a negation
        if consumed or part.pm is not None or 0 not in matches:
            return
        if s.select == "nth":
            first = s.comps[self.pos[0]].name
            alone = [c for c in s.where if c.refs == {first}]
            if not all(c.holds({first: attrs}) for c in alone):
                return  # could not open: not counted (§4.1 item 2)
            if not part.starts:
                part.starts_ts = t
            part.starts += 1
            if part.starts < s.n:
                return
            part.starts = 0
        if not self._valid([p], p):
            return
        if k == 1 and not self.trailing:
            self._report(t, [p], part)  # complete at once: nothing of it remains
        else:
            part.pm, part.waiting = [p], k == 1
