"""A routing problem (`RoutingError`, under `profiles.errors.ENSError`) and where it is (a path
of keys)."""

from __future__ import annotations

from profiles.errors import ENSError

__all__ = ["Loc", "RoutingError", "dotted"]

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


class RoutingError(ENSError):
    """A schedule, route, escalation policy or quiet-hours entry that cannot work.

    ``loc`` is the path of keys/indexes inside the entry (``layers.0.handoff``); the
    configuration loader turns it into ``FILE:LINE:COL``.
    """

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        self.message, self.loc = message, loc
        super().__init__(f"{'.'.join(map(str, loc))}: {message}" if loc else message)

    def under(self, *prefix: str | int) -> RoutingError:
        """The same problem, one level further out (``layers`` + ``0.handoff``)."""
        return RoutingError(self.message, (*prefix, *self.loc))
