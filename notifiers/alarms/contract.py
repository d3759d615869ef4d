"""The stateful-operator contract the service drives the alarm rules by.

Modelled on bytewax's StatefulBatchLogic: each input call returns what it produced (here
`Effects`: transitions for history, messages for the outbox, written together in one
transaction); ``due()`` says when to call ``advance(now)`` next (the timer); ``snapshot()``
returns a versioned JSON-able record from which ``restore`` rebuilds the same state. Time is
always passed in; the operator never reads a clock, so a replay and the service agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from notifiers.alarms.grouping import Message
from notifiers.alarms.model import Transition
from notifiers.alarms.silences import Silence


@dataclass(slots=True)
class Effects:
    """What one call produced, in order: history records and messages to deliver."""

    transitions: list[Transition] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    silence: Silence | None = None  # add_silence / expire_silence: the silence as stored
    warnings: list[str] = field(default_factory=list)  # e.g. a matcher no alarm's label matches

    def extend(self, other: Effects) -> Effects:
        self.transitions.extend(other.transitions)
        self.messages.extend(other.messages)
        if other.silence is not None:
            self.silence = other.silence
        self.warnings.extend(other.warnings)
        return self


class Router(Protocol):
    """Who hears of a transition instead of the profile's subscriber, and the timers of what
    follows (escalation): `notifiers.routing.router.Router` is the implementation. Pure, with
    time passed in, like the rules that call it."""

    def transition(self, t: Transition) -> list[str]:
        """The subscribers a transition reaches (``t.delivery`` says whether it is delivered
        at all); an ack or a clear also stops what the raise started."""
        ...

    def route(self, kind: str, labels: dict[str, str], at: float, key: str) -> list[str]:
        """The subscribers a notice that is no transition reaches: an alarm occurrence
        ``key`` (``ID.N``) still active when its silence ended, delivered as a ``kind``
        (unacknowledged: its escalation starts then)."""
        ...

    def due(self) -> float | None: ...

    def advance(self, now: float) -> list[tuple[str, str, float, list[str]]]:
        """Steps due by ``now``, in order: (step id, alarm occurrence ``ID.N``, due, the
        subscribers it reaches)."""
        ...

    def snapshot(self) -> dict[str, Any]: ...

    def load(self, snap: dict[str, Any]) -> None: ...


class StatefulOperator(Protocol):
    """Inputs return `Effects`; the timer is ``due()``/``advance(now)``; state is
    ``snapshot()`` (the class's ``restore(snapshot, ...)`` inverts it)."""

    def advance(self, now: float) -> Effects: ...

    def due(self) -> float | None: ...

    def snapshot(self) -> dict[str, Any]: ...
