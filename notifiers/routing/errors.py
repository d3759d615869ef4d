"""Where a routing problem is (a path of keys); the error itself, `RoutingError`, is in
`profiles.errors` with every user-visible error."""

from __future__ import annotations

from profiles.errors import RoutingError

__all__ = ["Loc", "RoutingError", "dotted"]

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)
