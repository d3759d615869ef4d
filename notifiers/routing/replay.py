"""Alarm transitions through the routing and escalation in their own time: who would have been
told what, and when. The same calls the service makes, with event time as the clock."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from notifiers.alarms.model import Transition
from notifiers.routing.escalation import Escalator, Step
from notifiers.routing.routes import Delivery, Routing, explain, tell


@dataclass(frozen=True, slots=True)
class Told:
    """One line of the timeline: a subscriber told (or held back) of an alarm's transition
    (``what``: raise, ack, clear, …) or of an escalation step (``escalation L``)."""

    ts: float
    alarm: str
    what: str
    subscriber: str
    told: bool
    through: str  # the route, or "POLICY level N"
    via: str
    reason: str
    labels: dict[str, str]


def _rows(
    ts: float, alarm: str, what: str, labels: dict[str, str], deliveries: Iterable[Delivery]
) -> list[Told]:
    return [
        Told(ts, alarm, what, d.subscriber, d.told, d.route, d.via, d.reason, labels)
        for d in deliveries
    ]


def step_deliveries(routing: Routing, step: Step) -> list[Delivery]:
    """What an escalation step delivers: its receivers at its time, through quiet hours."""
    label = f"{step.policy} level {step.level + 1}" + (
        f" (repeat {step.cycle})" if step.cycle else ""
    )
    return tell(routing, step.receivers, step.labels.get("severity", ""), step.due_at, label)


def route_transition(routing: Routing, escalator: Escalator, t: Transition) -> list[Told]:
    """One transition: its route decision, and the escalation it starts (a raise, with the
    first route's policy) or stops (an ack or a clear). Only a transition the alarm rules
    deliver (``delivery == "sent"``: in the profile's ``notify``, not silenced) is routed and
    starts an escalation; an ack or a clear stops it either way."""
    if t.delivery != "sent":
        escalator.on_transition(t, None)
        return []
    d = explain(routing, t.labels, t.kind, t.ts)
    escalator.on_transition(t, d.escalations[0][0] if d.escalations else None)
    return _rows(t.ts, t.alarm, t.kind, t.labels, d.deliveries)


def replay_routing(
    routing: Routing, transitions: Iterable[Transition], until: float | None = None
) -> tuple[list[Told], Escalator]:
    """The timeline of a history of transitions (in time order); escalation steps due by a
    transition's time fire before it, and the ones due by ``until`` (default: the last
    transition) at the end. The escalator is returned with what is still pending."""
    esc = Escalator(routing.policies)
    out: list[Told] = []
    last = None
    for t in transitions:
        out += _escalate(routing, esc, t.ts)
        out += route_transition(routing, esc, t)
        last = t.ts
    end = until if until is not None else last
    if end is not None:
        out += _escalate(routing, esc, end)
    return out, esc


def _escalate(routing: Routing, esc: Escalator, now: float) -> list[Told]:
    out: list[Told] = []
    for step in esc.advance(now):
        what = f"escalation {step.level + 1}"
        alarm = step.key.rpartition(".")[0]
        out += _rows(step.due_at, alarm, what, step.labels, step_deliveries(routing, step))
    return out
