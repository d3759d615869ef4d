"""The routing tree: which receivers an alarm's transition reaches, at which time, and why.

Alertmanager's tree: the root takes everything; each child route that matches is entered
(depth first, in order) and the search of its siblings stops unless it says ``continue``;
the deepest matching routes deliver, and a route without receivers inherits its parent's.
Unlike Alertmanager, a route's active time and transitions are part of its match: a night
route that is outside its hours does not match, so the sibling after it is tried.

Receivers are subscriber ids or schedule ids (a schedule stands for whoever is on call).
Quiet hours hold back a subscriber's deliveries below a minimum severity. `explain` returns
the decision with every route tried, matched or not, and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import notifiers.routing.times as times
from notifiers.alarms.grouping import GroupPolicy
from notifiers.alarms.intervals import WeeklyWindow
from notifiers.alarms.silences import Matcher
from notifiers.errors import SilenceError
from notifiers.routing.errors import Loc, RoutingError
from notifiers.routing.escalation import EscalationPolicy
from notifiers.routing.schedules import Schedule, on_call
from profiles.alarm import SEVERITIES

TRANSITIONS = ("raise", "repeat", "ack", "clear")
ROUTE_KEYS = (
    "name", "match", "receivers", "escalation", "continue", "active", "tz", "transitions",
    "routes",
)  # fmt: skip
QUIET_KEYS = ("subscriber", "windows", "tz", "min_severity")


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    matchers: tuple[Matcher, ...] = ()
    receivers: tuple[str, ...] = ()  # empty: the parent's (none with an escalation)
    escalation: str | None = None
    cont: bool = False
    active: tuple[WeeklyWindow, ...] = ()  # empty: always
    transitions: frozenset[str] | None = None  # None: every transition
    routes: tuple[Route, ...] = ()

    @property
    def catch_all(self) -> bool:
        return not self.matchers and not self.active and self.transitions is None


@dataclass(frozen=True, slots=True)
class QuietHours:
    """While a window holds, the subscriber gets only severities at least ``min_severity``."""

    subscriber: str
    windows: tuple[WeeklyWindow, ...]
    min_severity: str = "critical"

    def holds_back(self, severity: str, at: float) -> WeeklyWindow | None:
        window = next((w for w in self.windows if w.contains(at)), None)
        if window is None or passes(severity, self.min_severity):
            return None
        return window


def passes(severity: str, minimum: str) -> bool:
    """``severity`` is at least ``minimum`` (critical > major > minor > warning > info)."""
    return severity in SEVERITIES and SEVERITIES.index(severity) <= SEVERITIES.index(minimum)


@dataclass(frozen=True, slots=True)
class Routing:
    """Everything a decision needs: the tree, the schedules, the policies, the quiet hours."""

    root: Route
    schedules: Mapping[str, Schedule] = field(default_factory=dict)
    policies: Mapping[str, EscalationPolicy] = field(default_factory=dict)
    quiet: Mapping[str, QuietHours] = field(default_factory=dict)
    tz: str = "UTC"  # the file's zone: local times without an offset are read in it
    # subscriber -> grouping and cap of its alarm messages ("*": everyone else's)
    grouping: Mapping[str, GroupPolicy] = field(default_factory=dict)
    routed: bool = True  # False: a file without `route:` (alarms go to their subscriber)

    def resolve(self, receiver: str, at: float) -> tuple[list[str], str]:
        """The subscribers a receiver stands for at ``at``, and how (for explanations)."""
        s = self.schedules.get(receiver)
        if s is None:
            return [receiver], "subscriber"
        shift = on_call(s, at)
        if shift is None:
            return [], f"schedule {receiver}: nobody on call"
        return list(shift.who), f"schedule {receiver} ({shift.source})"


@dataclass(frozen=True, slots=True)
class Tried:
    """One route tried: ``depth`` 0 is the root."""

    route: str
    depth: int
    matched: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """One subscriber reached (``told``) or held back, through ``receiver`` of ``route``."""

    subscriber: str
    receiver: str
    route: str
    via: str
    told: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    tried: tuple[Tried, ...]
    deliveries: tuple[Delivery, ...]
    escalations: tuple[tuple[str, str], ...]  # (policy, route) of the routes that deliver

    @property
    def receivers(self) -> list[str]:
        """The subscribers told, each once, in route order."""
        return [d.subscriber for d in self.deliveries if d.told]


# ---------------------------------------------------------------------- deciding
def _test(route: Route, labels: Mapping[str, str], kind: str, at: float) -> tuple[bool, str]:
    for m in route.matchers:
        if not m.matches(labels):
            return False, f"{m} does not match ({m.label}={labels.get(m.label, '')!r})"
    if route.transitions is not None and kind not in route.transitions:
        return False, f"transition {kind} not in [{', '.join(sorted(route.transitions))}]"
    if route.active and not any(w.contains(at) for w in route.active):
        zones = route.active[0].tz
        return (
            False,
            f"outside its active time ({'; '.join(w.text for w in route.active)}, {zones})",
        )
    parts = [", ".join(str(m) for m in route.matchers) or "no matchers"]
    if route.transitions is not None:
        parts.append(f"transition {kind}")
    if route.active:
        parts.append("inside " + "; ".join(w.text for w in route.active))
    return True, "matches: " + ", ".join(parts)


def _walk(
    route: Route,
    inherited: tuple[str, ...],
    labels: Mapping[str, str],
    kind: str,
    at: float,
    depth: int,
    tried: list[Tried],
) -> list[tuple[Route, tuple[str, ...]]] | None:
    ok, reason = _test(route, labels, kind, at)
    tried.append(Tried(route.name, depth, ok, reason))
    if not ok:
        return None
    # a route with an escalation tells its receivers through it (its first level)
    receivers = route.receivers or (() if route.escalation else inherited)
    out: list[tuple[Route, tuple[str, ...]]] = []
    for i, child in enumerate(route.routes):
        got = _walk(child, receivers, labels, kind, at, depth + 1, tried)
        if got is None:
            continue
        out.extend(got)
        if not child.cont:
            for rest in route.routes[i + 1 :]:
                why = f"not tried: {child.name} matched and does not continue"
                tried.append(Tried(rest.name, depth + 1, False, why))
            break
    return out or [(route, receivers)]


def explain(routing: Routing, labels: Mapping[str, str], transition: str, at: float) -> Decision:
    """Which subscribers the transition (raise, repeat, ack, clear) of an alarm with these
    labels reaches at ``at``, and why: every route tried and every receiver resolved."""
    tried: list[Tried] = []
    chosen = _walk(routing.root, (), labels, transition, at, 0, tried) or []
    severity = labels.get("severity", "")
    out: list[Delivery] = []
    seen: dict[str, str] = {}
    escalations: list[tuple[str, str]] = []
    for route, receivers in chosen:
        if route.escalation is not None:
            escalations.append((route.escalation, route.name))
        if not receivers and route.escalation is None:
            out.append(Delivery("", "", route.name, "", False, "the route has no receivers"))
        out += tell(routing, receivers, severity, at, route.name, seen)
    return Decision(tuple(tried), tuple(out), tuple(escalations))


def tell(
    routing: Routing,
    receivers: tuple[str, ...],
    severity: str,
    at: float,
    route: str = "",
    seen: dict[str, str] | None = None,
) -> list[Delivery]:
    """Receivers (subscribers, schedules) resolved at ``at`` and passed through quiet hours:
    what a route delivers, and what an escalation step delivers (``route``: its name)."""
    seen = {} if seen is None else seen
    out: list[Delivery] = []
    for rec in receivers:
        subs, via = routing.resolve(rec, at)
        if not subs:
            out.append(Delivery("", rec, route, via, False, "nobody on call"))
        for sub in subs:
            out.append(_deliver(routing, sub, rec, route, via, severity, at, seen))
    return out


def _deliver(
    routing: Routing,
    sub: str,
    rec: str,
    route: str,
    via: str,
    severity: str,
    at: float,
    seen: dict[str, str],
) -> Delivery:
    if sub in seen:
        return Delivery(sub, rec, route, via, False, f"already told (route {seen[sub]})")
    q = routing.quiet.get(sub)
    window = q.holds_back(severity, at) if q is not None else None
    if q is not None and window is not None:
        why = f"quiet hours {window.text}: {severity or '(no severity)'} is below {q.min_severity}"
        return Delivery(sub, rec, route, via, False, why)
    seen[sub] = route
    return Delivery(sub, rec, route, via, True, "")


# ---------------------------------------------------------------------- parsing
def _matchers(value: Any, loc: Loc) -> tuple[Matcher, ...]:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, dict):  # {room: 101}: equality matchers
        items = [f"{k}={v}" for k, v in items.items()]
    if not isinstance(items, list):
        raise RoutingError("expected matchers (a list such as [building=A, 'room=~1..'])", loc)
    out = []
    for i, m in enumerate(items):
        try:
            out.append(Matcher.parse(str(m), "match"))
        except SilenceError as e:
            raise RoutingError(times.message_of(e), (*loc, i)) from None
    return tuple(out)


def contradiction(matchers: tuple[Matcher, ...]) -> str | None:
    """Why no labels can match all of these, when an equality decides it (else None)."""
    for m in matchers:
        if m.op != "=":
            continue
        for other in matchers:
            if other is not m and other.label == m.label and not other.matches({m.label: m.value}):
                return f"{m} and {other} cannot both hold"
    return None


def parse_route(
    data: Any, name: str, loc: Loc, tz: str, inherited: tuple[Matcher, ...] = ()
) -> Route:
    """A route and its children; ``inherited``: the matchers of its ancestors (a child that
    contradicts them can never match)."""
    d = times.mapping(data, loc, ROUTE_KEYS)
    rname = str(d.get("name", name))
    matchers = _matchers(d["match"], (*loc, "match")) if "match" in d else ()
    why = contradiction(inherited + matchers)
    if why is not None:
        raise RoutingError(f"route {rname!r} can never match: {why}", (*loc, "match"))
    receivers = times.names(d["receivers"], (*loc, "receivers")) if "receivers" in d else ()
    esc = d.get("escalation")
    if esc is not None and (not isinstance(esc, str) or not esc.strip()):
        raise RoutingError(f"{esc!r}: expected a policy id", (*loc, "escalation"))
    cont = d.get("continue", False)
    if not isinstance(cont, bool):
        raise RoutingError(f"{cont!r}: expected true or false", (*loc, "continue"))
    rtz = str(d.get("tz", tz))
    times.tz(rtz, (*loc, "tz"))
    active = times.windows(d["active"], rtz, (*loc, "active")) if "active" in d else ()
    kinds: frozenset[str] | None = None
    if "transitions" in d:
        got = times.names(d["transitions"], (*loc, "transitions"), "transitions")
        for i, k in enumerate(got):
            if k not in TRANSITIONS:
                raise RoutingError(
                    f"{k!r} is not a transition (one of {', '.join(TRANSITIONS)})",
                    (*loc, "transitions", i),
                )
        kinds = frozenset(got)
    raw = d.get("routes") or []
    if not isinstance(raw, list):
        raise RoutingError("expected a list of routes", (*loc, "routes"))
    children: list[Route] = []
    for i, item in enumerate(raw):
        child = parse_route(item, f"{name}.{i + 1}", (*loc, "routes", i), rtz, inherited + matchers)
        shadow = next((c for c in children if c.catch_all and not c.cont), None)
        if shadow is not None:
            raise RoutingError(
                f"route {child.name!r} can never match: route {shadow.name!r} before it takes "
                "everything and does not continue",
                (*loc, "routes", i),
            )
        children.append(child)
    return Route(rname, matchers, receivers, esc, cont, active, kinds, tuple(children))


def parse_quiet(data: Any, loc: Loc, tz: str) -> QuietHours:
    d = times.mapping(data, loc, QUIET_KEYS)
    for key in ("subscriber", "windows"):
        if key not in d:
            raise RoutingError(f"give {key} (quiet hours have subscriber, windows)", loc)
    sub = times.names(d["subscriber"], (*loc, "subscriber"), "subscriber")
    if len(sub) != 1:
        raise RoutingError("one subscriber per entry", (*loc, "subscriber"))
    qtz = str(d.get("tz", tz))
    times.tz(qtz, (*loc, "tz"))
    minimum = str(d.get("min_severity", "critical"))
    if minimum not in SEVERITIES:
        raise RoutingError(
            f"unknown severity {minimum!r} (one of {', '.join(SEVERITIES)})", (*loc, "min_severity")
        )
    return QuietHours(sub[0], times.windows(d["windows"], qtz, (*loc, "windows")), minimum)


def escalation_clashes(route: Route) -> list[tuple[Route, Route]]:
    """Pairs of escalating routes that may both match one alarm (an earlier sibling subtree
    ``continue``s into a later one) with different policies: only the first one's starts, as an
    alarm occurrence has one escalation. For `ens route check` to warn about."""
    out: list[tuple[Route, Route]] = []
    kids = route.routes
    for i, a in enumerate(kids):
        out += escalation_clashes(a)
        if not a.cont:
            continue
        first = [x for x in walk(a) if x.escalation is not None]
        for b in kids[i + 1 :]:
            later = [x for x in walk(b) if x.escalation is not None]
            out += [(x, y) for x in first for y in later if x.escalation != y.escalation]
    return list(dict.fromkeys(out))


def walk(route: Route) -> list[Route]:
    """The route and all below it, depth first."""
    out = [route]
    for c in route.routes:
        out.extend(walk(c))
    return out
