"""History: every transition, kept for a retention and queried by alarm, labels and time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from notifiers.alarms.model import Transition
from notifiers.alarms.silences import Matcher


class History:
    """Transitions in the order they were made (records are immutable)."""

    def __init__(self, retention: float | None = None) -> None:
        self.retention = retention  # seconds; None keeps everything
        self.records: list[Transition] = []

    def extend(self, transitions: Iterable[Transition]) -> None:
        self.records.extend(transitions)

    def prune(self, now: float) -> int:
        """Drop records older than the retention; returns how many."""
        if self.retention is None:
            return 0
        keep = [t for t in self.records if t.ts >= now - self.retention]
        dropped = len(self.records) - len(keep)
        self.records = keep
        return dropped

    def query(
        self,
        alarm: str | None = None,
        matchers: Sequence[Matcher] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Transition]:
        """``alarm``: an alarm id or occurrence id (``ID.N``)."""
        for t in self.records:
            if alarm is not None and alarm not in (t.alarm, f"{t.alarm}.{t.occurrence}"):
                continue
            if since is not None and t.ts < since:
                continue
            if until is not None and t.ts > until:
                continue
            if all(m.matches(t.labels) for m in matchers):
                yield t
