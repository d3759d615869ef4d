"""The public interface of a detection engine, as `ens`, the service and Spark use it.

`filters.engine.Engine` (single-step, CompAS) and `filters.twostep.engine.TwoStepEngine` (the
baseline) both implement it; `ens replay --engine`, `ens bench` and the differential tests
swap one for the other through it. Time is passed in (`process` moves it to the event's
time, `advance` and `finish` move it on): the engine reads no clock.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from filters.notification import Notification
from filters.temporal import TemporalPool
from profiles.ast import Profile
from profiles.events import Event


@runtime_checkable
class DetectionEngine(Protocol):
    """Profiles in, events in, notifications out."""

    now: float | None  # the engine's time: the latest event's or `advance`'s (None: none yet)
    timers: TemporalPool  # its terminators and clocks (given at construction, or its own)

    def add_profile(self, profile: Profile) -> None: ...

    def remove_profile(self, profile_id: str) -> None: ...

    @property
    def profiles(self) -> list[Profile]: ...

    def process(self, event: Event) -> None: ...

    def advance(self, now: float, *, inclusive: bool = False) -> None: ...

    def finish(self, until: float | None = None) -> None: ...

    def take_notifications(self) -> list[Notification]: ...

    def collect_into(self, out: list[Notification]) -> None: ...

    def pending(self) -> int: ...

    def stats(self) -> dict[str, int]: ...
