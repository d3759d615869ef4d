"""The routing configuration file: schedules, escalation policies, quiet hours, the route tree.

YAML (or JSON). Every problem is collected with ``FILE:LINE:COL`` (as `ens check` reports a
profile file) and a file with any problem is rejected as a whole: nothing half-loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import yaml

import notifiers.routing.times as times
from notifiers.alarms.grouping import GroupPolicy
from notifiers.routing.errors import Loc, RoutingError, dotted
from notifiers.routing.escalation import EscalationPolicy, parse_policy
from notifiers.routing.grouping import parse_grouping
from notifiers.routing.routes import QuietHours, Route, Routing, parse_quiet, parse_route, walk
from notifiers.routing.schedules import Schedule, parse_schedule
from profiles.errors import ENSError, ManyErrors

TOP_KEYS = (
    "tz", "subscribers", "schedules", "escalation_policies", "quiet_hours", "grouping", "route",
)  # fmt: skip
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _child(node: yaml.Node | None, step: str | int, *, key: bool = False) -> yaml.Node | None:
    if isinstance(node, yaml.SequenceNode) and isinstance(step, int):
        return node.value[step] if step < len(node.value) else None
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == str(step):
                found: yaml.Node = k if key else v
                return found
    return None


def _node_at(node: yaml.Node | None, loc: Loc, *, key: bool = False) -> yaml.Node | None:
    """The deepest node along ``loc`` the file has (the key node itself when ``key``)."""
    for i, step in enumerate(loc):
        nxt = _child(node, step, key=key and i == len(loc) - 1)
        if nxt is None:
            break
        node = nxt
    return node


class _Collector:
    def __init__(self, name: str, root: yaml.Node | None) -> None:
        self.name, self.root = name, root
        self.errors: list[ENSError] = []

    def add(self, e: RoutingError, base: Loc, what: str = "") -> None:
        full = (*base, *e.loc)
        node = _node_at(self.root, full, key=e.message.startswith("unknown key"))
        at = self.name
        if node is not None:
            at += f":{node.start_mark.line + 1}:{node.start_mark.column + 1}"
        where = f"{what}: " if what else ""
        field = f"{dotted(e.loc)}: " if e.loc else ""
        self.errors.append(RoutingError(f"{at}: {where}{field}{e.message}"))


def _entries(data: dict[str, Any], key: str, c: _Collector) -> list[Any]:
    raw = data.get(key) or []
    if not isinstance(raw, list):
        c.add(RoutingError("expected a list", (key,)), ())
        return []
    return raw


def _label(item: Any, kind: str, i: int) -> str:
    if isinstance(item, dict) and isinstance(item.get("id"), (str, int)):
        return f"{kind} {str(item['id'])!r}"
    return f"{kind} #{i + 1}"


def parse_routing(
    text: str,
    name: str = "<routing>",
    need_route: bool = True,
    stored: Callable[[], Collection[str]] | None = None,
) -> tuple[Routing | None, list[ENSError]]:
    """The configuration in ``text`` (None when anything is wrong) and every problem.
    ``need_route=False``: a file of schedules alone (`ens schedule add`) is enough.
    ``stored``: the ids of the stored schedules (`ens serve`), asked only when a file that
    lists its ``subscribers`` names a receiver that is neither: such a receiver may be one."""
    try:
        root, data = _load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        return None, [
            RoutingError(f"{name}{where}: not valid YAML/JSON: {getattr(e, 'problem', e)}")
        ]
    c = _Collector(name, root)
    if not isinstance(data, dict):
        return None, [RoutingError(f"{name}: expected a mapping ({', '.join(TOP_KEYS)})")]
    for key in data:
        if key not in TOP_KEYS:
            c.add(RoutingError(f"unknown key (allowed: {', '.join(TOP_KEYS)})", (str(key),)), ())
    tz, subscribers = _tz_and_subscribers(data, c)
    schedules: dict[str, Schedule] = {}
    for i, item in enumerate(_entries(data, "schedules", c)):
        try:
            s = parse_schedule(item, tz)
            if s.id in schedules:
                raise RoutingError("a second schedule with this id", ("id",))
            schedules[s.id] = s
        except RoutingError as e:
            c.add(e, ("schedules", i), _label(item, "schedule", i))
    policies: dict[str, EscalationPolicy] = {}
    for i, item in enumerate(_entries(data, "escalation_policies", c)):
        try:
            p = parse_policy(item)
            if p.id in policies:
                raise RoutingError("a second policy with this id", ("id",))
            policies[p.id] = p
        except RoutingError as e:
            c.add(e, ("escalation_policies", i), _label(item, "policy", i))
    quiet: dict[str, QuietHours] = {}
    for i, item in enumerate(_entries(data, "quiet_hours", c)):
        try:
            q = parse_quiet(item, (), tz)
            if q.subscriber in quiet:
                raise RoutingError("a second entry for this subscriber", ("subscriber",))
            quiet[q.subscriber] = q
        except RoutingError as e:
            c.add(e, ("quiet_hours", i), f"quiet hours #{i + 1}")
    grouping: dict[str, GroupPolicy] = {}
    for i, item in enumerate(_entries(data, "grouping", c)):
        try:
            who, pol = parse_grouping(item)
            if who in grouping:
                raise RoutingError("a second entry for this subscriber", ("subscriber",))
            grouping[who] = pol
        except RoutingError as e:
            c.add(e, ("grouping", i), f"grouping #{i + 1}")
    root = _root(data, tz, c) if need_route or "route" in data else Route("root")
    if root is not None:
        _references(root, schedules, policies, quiet, grouping, subscribers, c, stored)
    if c.errors or root is None:
        return None, c.errors
    return Routing(root, schedules, policies, quiet, tz, grouping, "route" in data), []


def _load(text: str) -> tuple[Any, Any]:
    """The YAML node tree (for line numbers) and the document; `yaml.YAMLError` if invalid."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        return root, loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()


def _tz_and_subscribers(data: dict[str, Any], c: _Collector) -> tuple[str, set[str] | None]:
    """The file's ``tz`` (UTC) and its ``subscribers`` list (None: not given)."""
    tz = "UTC"
    if "tz" in data:
        try:
            times.tz(data["tz"], ("tz",))
            tz = str(data["tz"]).strip()
        except RoutingError as e:
            c.add(e, ())
    subscribers: set[str] | None = None
    if "subscribers" in data:
        try:
            subscribers = set(times.names(data["subscribers"], ("subscribers",), "subscribers"))
        except RoutingError as e:
            c.add(e, ())
    return tz, subscribers


def _root(data: dict[str, Any], tz: str, c: _Collector) -> Route | None:
    if "route" not in data:
        c.add(RoutingError("give the route tree (route: {receivers: [...], routes: [...]})"), ())
        return None
    raw = data["route"]
    if isinstance(raw, dict):
        for key in ("match", "active", "transitions", "continue"):
            if key in raw:
                c.add(
                    RoutingError("the root route takes every alarm: no " + key, (key,)), ("route",)
                )
                return None
    try:
        return parse_route(raw, "root", (), tz)
    except RoutingError as e:
        c.add(e, ("route",))
        return None


def _references(
    root: Route,
    schedules: dict[str, Schedule],
    policies: dict[str, EscalationPolicy],
    quiet: dict[str, QuietHours],
    grouping: dict[str, GroupPolicy],
    subscribers: set[str] | None,
    c: _Collector,
    stored: Callable[[], Collection[str]] | None = None,
) -> None:
    """Names that point nowhere: receivers, policies, and (with ``subscribers``) people."""
    stored_ids: list[Collection[str]] = []  # asked at most once

    def known(n: str) -> bool:
        if n in schedules or subscribers is None or n in subscribers:
            return True
        if stored is None:
            return False
        if not stored_ids:
            stored_ids.append(stored())
        return n in stored_ids[0]

    hint = "not a schedule nor one of the subscribers"
    if stored is not None:
        hint = "not a schedule (of the file or stored) nor one of the subscribers"
    for loc, r in _with_locs(root, ()):
        for i, n in enumerate(r.receivers):
            if not known(n):
                c.add(
                    RoutingError(f"unknown receiver {n!r}: {hint}", ("receivers", i)),
                    ("route", *loc),
                    f"route {r.name!r}",
                )
        if r.escalation is not None and r.escalation not in policies:
            c.add(
                RoutingError(f"no escalation policy {r.escalation!r}", ("escalation",)),
                ("route", *loc),
                f"route {r.name!r}",
            )
    for i, p in enumerate(policies.values()):
        for j, lv in enumerate(p.levels):
            for k, n in enumerate(lv.receivers):
                if not known(n):
                    loc = ("levels", j, "receivers", k)
                    c.add(
                        RoutingError(f"unknown receiver {n!r}: {hint}", loc),
                        ("escalation_policies", i),
                        f"policy {p.id!r}",
                    )
    if subscribers is None:
        return
    for i, s in enumerate(schedules.values()):
        if s.id in subscribers:
            c.add(
                RoutingError("a schedule and a subscriber share this id", ("id",)), ("schedules", i)
            )
        people = [x for layer in s.layers for x in layer.participants]
        people += [x for o in s.overrides for x in o.who]
        for n in people:
            if n not in subscribers:
                c.add(
                    RoutingError(f"unknown subscriber {n!r}"),
                    ("schedules", i),
                    f"schedule {s.id!r}",
                )
    for i, who in enumerate(grouping):
        if who != "*" and who not in subscribers:
            c.add(
                RoutingError(f"unknown subscriber {who!r}", ("subscriber",)),
                ("grouping", i),
            )
    for i, q in enumerate(quiet.values()):
        if q.subscriber not in subscribers:
            c.add(
                RoutingError(f"unknown subscriber {q.subscriber!r}", ("subscriber",)),
                ("quiet_hours", i),
            )


def _with_locs(route: Route, loc: Loc) -> list[tuple[Loc, Route]]:
    out: list[tuple[Loc, Route]] = [(loc, route)]
    for i, child in enumerate(route.routes):
        out.extend(_with_locs(child, (*loc, "routes", i)))
    return out


def load_routing(
    path: str | Path,
    need_route: bool = True,
    stored: Callable[[], Collection[str]] | None = None,
) -> Routing:
    """Load a routing file or raise every problem at once (``stored``: `parse_routing`'s)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RoutingError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise RoutingError(f"cannot read routing file {path}: {e.strerror}") from None
    routing, errors = parse_routing(text, str(path), need_route, stored)
    if errors:
        raise errors[0] if len(errors) == 1 else ManyErrors(errors)
    assert routing is not None
    return routing


__all__ = ["load_routing", "parse_routing", "walk"]
