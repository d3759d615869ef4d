"""The state machine of one alarm key: raise, repeat, acknowledge, clear, re-arm.

States are ThingsBoard's: active/cleared x acknowledged/unacknowledged. Each operation
returns the `Transition` it made (delivery is decided later, by the rules); an operation that
asks for the state the alarm is already in raises `AlarmStateConflict`, an unknown id
`AlarmNotFound`. No clock: every operation is given its time.
"""

from __future__ import annotations

import heapq
from typing import Any

from notifiers.alarms.model import (
    RULE,
    Alarm,
    Kind,
    State,
    Transition,
    alarm_id,
    is_acked,
    is_active,
    make_state,
)
from notifiers.errors import AlarmNotFound, AlarmStateConflict
from profiles.alarm import AlarmSpec


class AlarmBook:
    """Every alarm key's current occurrence, by alarm id."""

    def __init__(self) -> None:
        self.alarms: dict[str, Alarm] = {}
        self.seq = 0  # transitions made so far: orders history
        # pruned alarm id -> its last occurrence: a later raise of the key goes on numbering
        # (occurrence and transition ids, the webhooks' Idempotency-Keys, stay unique)
        self.gone: dict[str, int] = {}
        self._closed: list[tuple[float, str]] = []  # (closed at, id): prune candidates, lazily
        # id -> labels of its current occurrence: made once (again when its fixed labels
        # change), shared by its transitions (read-only) instead of rebuilt for each
        self._labels: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------------ retention
    def prune(self, before: float, limit: int) -> list[Alarm]:
        """Forget at most ``limit`` alarms closed (cleared and acknowledged) before ``before``,
        oldest first; the ones forgotten."""
        out: list[Alarm] = []
        heap = self._closed
        while heap and heap[0][0] < before and len(out) < limit:
            at, aid = heapq.heappop(heap)
            a = self.alarms.get(aid)
            if a is not None and closed_at(a) == at:
                del self.alarms[aid]
                self._labels.pop(aid, None)
                self.gone[aid] = a.occurrence
                out.append(a)
        return out

    def prune_due(self, before: float) -> bool:
        """Whether `prune` has a candidate (maybe a stale one, which it discards)."""
        return bool(self._closed) and self._closed[0][0] < before

    def forget(self, aids: list[str]) -> None:
        """Forget these alarms (a journal replay of `prune`'s decision)."""
        for aid in aids:
            a = self.alarms.pop(aid, None)
            self._labels.pop(aid, None)
            if a is not None:
                self.gone[aid] = a.occurrence

    def reindex(self) -> None:
        """Rebuild the prune candidates (after a restore)."""
        self._closed = [(at, a.id) for a in self.alarms.values() if (at := closed_at(a))]
        heapq.heapify(self._closed)

    def _closing(self, a: Alarm) -> None:
        at = closed_at(a)
        if at is not None:
            heapq.heappush(self._closed, (at, a.id))

    # ------------------------------------------------------------------ the rule's side
    def match(
        self,
        profile: str,
        spec: AlarmSpec,
        ts: float,
        partition: dict[str, Any] | None,
        events: dict[str, str],
        subscriber: str | None,
    ) -> Transition:
        """A match of the profile: raise (first, or after a clear: a new occurrence) or repeat."""
        aid = alarm_id(profile, partition)
        a = self.alarms.get(aid)
        if a is not None and is_active(a.state):
            return self.repeat(a, spec, ts, events)
        occurrence = a.occurrence + 1 if a is not None else self.gone.pop(aid, 0) + 1
        a = Alarm(
            aid, profile, dict(partition or {}), spec.severity, subscriber, occurrence,
            "active-unacknowledged", 1, ts, ts, dict(events),
        )  # fmt: skip
        a.clear_due = ts + spec.clear_after if spec.clear_after is not None else None
        if spec.labels:
            a.fixed = dict(spec.labels)
        self.alarms[aid] = a
        self._labels[aid] = a.labels()
        return self._record(a, "raise", ts, RULE, "match" if occurrence == 1 else "re-arm", None)

    def repeat(self, a: Alarm, spec: AlarmSpec, ts: float, events: dict[str, str]) -> Transition:
        """A further match of the active alarm ``a`` (`match` when it finds one)."""
        before = a.state
        a.count += 1
        a.last_seen = ts
        a.events = dict(events)
        a.clear_due = ts + spec.clear_after if spec.clear_after is not None else None
        if spec.labels or a.fixed:  # a registry change moves the labels with the next match
            fixed = dict(spec.labels)
            if fixed != a.fixed:
                a.fixed = fixed
                self._labels.pop(a.id, None)
        return self._record(a, "repeat", ts, RULE, "match", before)

    def rule_clear(self, aid: str, ts: float, reason: str) -> Transition | None:
        """The clear condition held (an event, or no match for T): clears an active alarm only."""
        a = self.alarms.get(aid)
        if a is None or not is_active(a.state):
            return None
        return self._clear(a, ts, RULE, reason)

    # ------------------------------------------------------------------ people's side
    def get(self, ref: str) -> Alarm:
        """The alarm named by its id or its occurrence id (``ID.N``, the current one only)."""
        aid, _, occ = ref.partition(".")
        a = self.alarms.get(aid)
        if a is None or (occ and not occ.isdigit()) or (occ and int(occ) > a.occurrence):
            raise AlarmNotFound(ref)
        if occ and int(occ) != a.occurrence:
            raise AlarmStateConflict(ref, "superseded by occurrence " + str(a.occurrence), "change")
        return a

    def acknowledge(self, ref: str, ts: float, actor: str, note: str = "") -> Transition:
        a = self.get(ref)
        if is_acked(a.state):
            raise AlarmStateConflict(ref, a.state, "acknowledge")
        before = a.state
        a.state = make_state(is_active(a.state), True)
        a.acked_by, a.acked_at, a.ack_note = actor, ts, note or None
        self._closing(a)
        return self._record(a, "ack", ts, actor, note or "acknowledged", before)

    def clear(self, ref: str, ts: float, actor: str, reason: str) -> Transition:
        a = self.get(ref)
        if not is_active(a.state):
            raise AlarmStateConflict(ref, a.state, "clear")
        return self._clear(a, ts, actor, reason)

    # ------------------------------------------------------------------ parts
    def _clear(self, a: Alarm, ts: float, actor: str, reason: str) -> Transition:
        before = a.state
        a.state = make_state(False, is_acked(a.state))
        a.cleared_by, a.cleared_at, a.clear_reason = actor, ts, reason
        a.clear_due = None
        self._closing(a)
        return self._record(a, "clear", ts, actor, reason, before)

    def labels(self, a: Alarm) -> dict[str, str]:
        """``a.labels()``, made once per occurrence (read-only: shared by its transitions)."""
        labels = self._labels.get(a.id)
        if labels is None:  # restored from a snapshot
            labels = self._labels[a.id] = a.labels()
        return labels

    def _record(
        self, a: Alarm, kind: Kind, ts: float, actor: str, reason: str, before: State | None
    ) -> Transition:
        self.seq += 1
        a.transitions += 1
        labels = self.labels(a)
        # the alarm's events are replaced, never changed, on a match: shared, read-only
        return Transition(
            f"{a.id}.{a.occurrence}.{a.transitions}", self.seq, kind, a.id, a.occurrence, ts,
            actor, reason, before, a.state, a.severity, a.count, a.first_seen, a.last_seen,
            labels, a.events,
        )  # fmt: skip


def closed_at(a: Alarm) -> float | None:
    """When the alarm became cleared and acknowledged (None: it is not)."""
    if a.state != "cleared-acknowledged":
        return None
    return max(a.acked_at or 0.0, a.cleared_at or 0.0)
