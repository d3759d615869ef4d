"""Route classes of `ens spark stream`: which engine (route) each profile runs in.

A route is one engine with its own state in Spark's per-key state: a value of `--key`, a value
of another `per` attribute, or a shard of the profiles without a partition. The rule is
`adapters.spark.plan.make_plan`'s; the source routes events by it and the engines of a route
class load the profiles of that class.
"""

from __future__ import annotations

import zlib

from profiles.ast import Profile

ROUTES = "ens:spark:routes"  # the keyed routes that have an engine (profile changes reach all)
GLOBAL = "g"  # the route of the global profiles' one engine
TICK = "~"  # the route of per-partition bookkeeping rows (no engine)
GSHARDS = 8  # the routes of the profiles without a partition (never change it: state by route)


def profile_class(p: Profile, key: str) -> str:
    """Where a profile runs (`adapters.spark.plan.make_plan`'s rule): 's', 'k' or 'g'."""
    if p.is_filter and not p.once:
        return "s"
    if key in p.per and not p.once:
        return "k"
    return GLOBAL


def route_class(p: Profile, key: str) -> str:
    """The routes a profile runs in: 's' (stateless, no route), 'k' (one per value of `key`),
    'a' + attribute (one per value of the first of its own `per` attributes, when `key` is
    not among them), or 'g0'..'g7' (no partition, or `once`: sharded by profile id, each
    shard one route over the whole stream)."""
    c = profile_class(p, key)
    if c != GLOBAL:
        return c
    if p.per and not p.once:
        return "a" + min(p.per)
    return f"g{zlib.crc32(p.id.encode()) % GSHARDS}"


def class_of_route(route: str) -> str:
    """The route class (`route_class`) of a route: 'k' + value, 'a' + attr + '|' + value, 'g0'..,
    or `GLOBAL` (every global profile in one engine: the tests' and older states' route)."""
    if route.startswith("a") and "|" in route:
        return route.split("|", 1)[0]
    if route[:1] == "g" and route[1:].isdigit():
        return route
    return GLOBAL if route == GLOBAL else "k"
