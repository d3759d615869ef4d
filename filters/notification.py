"""What the engine reports: one notification per match (docs/language.md §6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiles.events import Event


@dataclass(slots=True)
class Notification:
    """A detected match.

    `events` maps every bound positive component name to its event (in the
    order the components are written); `partition` is set when the profile
    has `per`. `seq` is the engine's detection counter, unique and increasing
    within one engine (used for ordering and for notification ids).
    """

    profile: str
    ts: float
    events: dict[str, Event]
    partition: dict[str, Any] | None = None
    seq: int = 0
    subscriber: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The §6 output record of `ens replay`."""
        out: dict[str, Any] = {
            "profile": self.profile,
            "ts": self.ts,
            "events": {name: ev.id for name, ev in self.events.items()},
        }
        if self.partition is not None:
            out["partition"] = self.partition
        return out

    def to_detail(self) -> dict[str, Any]:
        """A record with the bound events' attributes (for the outbox, webhooks and mail)."""
        out = self.to_json()
        out["events"] = {name: ev.to_json() for name, ev in self.events.items()}
        if self.subscriber is not None:
            out["subscriber"] = self.subscriber
        return out
