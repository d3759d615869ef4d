"""Caps on what one profile may hold and produce (issue 41, item 5): both engines apply them.

`select each` over a frequent component keeps one partial match (PM) per event inside the
window, and one event completing them all produces as many notifications: a day's window on
a kind seen every second held 52,920 PMs and one event produced 53,338 notifications, which
stalled the whole site. The caps bound that per profile:

- `partition`: PMs of one partition of a profile. At the cap, the partition's oldest PM
  (the first opened: the closest to expiring) is dropped to make room for the new one.
- `profile`: PMs of a profile over all its partitions. At the cap, the partition the new
  PM belongs to drops its own oldest PM if it holds one; a partition holding none refuses
  the new PM (one busy partition never evicts another's matches).
- `notifications`: notifications one event produces for one profile. The first ones in
  report order are kept, the rest dropped.

Every PM dropped or refused and every notification dropped is counted per profile
(`CapCounts`); the engine only counts (it is pure), the service logs and exports them.
Defaults are far above what the conformance, differential and benchmark workloads reach,
so a cap changes nothing until a profile runs away.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PARTITION = 10_000  # a day's window of one reading every ~9 s, in one partition
DEFAULT_PROFILE = 100_000  # ~200 MB of partial matches at the sizes measured (issue 41)
DEFAULT_NOTIFICATIONS = 1_000  # per profile and event: more is a flood, not a notification


@dataclass(frozen=True, slots=True)
class Caps:
    """The limits an engine applies to every profile (`Engine(caps=...)`)."""

    partition: int = DEFAULT_PARTITION
    profile: int = DEFAULT_PROFILE
    notifications: int = DEFAULT_NOTIFICATIONS

    def __post_init__(self) -> None:
        for name in ("partition", "profile", "notifications"):
            if getattr(self, name) < 1:
                raise ValueError(f"caps: {name} must be at least 1, not {getattr(self, name)}")


@dataclass(slots=True)
class CapHits:
    """What the caps took from one profile: PMs dropped or refused, notifications dropped."""

    partial_matches: int = 0
    notifications: int = 0


class CapCounts:
    """The caps and their hits per profile id (a base of both engines; not in snapshots:
    the caps are configuration, set again after a restore, and the counts are taken after
    each batch). The limits are plain int attributes: a runtime's check where a PM is made
    is one attribute read and one comparison."""

    cap_partition: int
    cap_profile: int
    cap_notifications: int

    def __init__(self, caps: Caps | None = None) -> None:
        self.set_caps(caps if caps is not None else Caps())
        self.cap_hits: dict[str, CapHits] = {}

    def set_caps(self, caps: Caps) -> None:
        self.cap_partition = caps.partition
        self.cap_profile = caps.profile
        self.cap_notifications = caps.notifications

    @property
    def caps(self) -> Caps:
        return Caps(self.cap_partition, self.cap_profile, self.cap_notifications)

    def _hit(self, pid: str) -> CapHits:
        hits = self.cap_hits.get(pid)
        if hits is None:
            hits = self.cap_hits[pid] = CapHits()
        return hits

    def count_dropped_pm(self, pid: str, n: int = 1) -> None:
        self._hit(pid).partial_matches += n

    def count_capped_notifications(self, pid: str, n: int) -> None:
        self._hit(pid).notifications += n

    def take_cap_hits(self) -> dict[str, CapHits]:
        """The hits since the last call, per profile id (profiles the caps never touched are
        not in it)."""
        hits, self.cap_hits = self.cap_hits, {}
        return hits
