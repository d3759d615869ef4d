"""Routing: who is told about an alarm's transition, when, and who next if nobody answers.

A pure package like notifiers.alarms (no I/O but reading a configuration file, no clock):
on-call `schedules`, the `routes` tree with quiet hours, `escalation` policies, and the
`config` file that holds them. docs/routing.md describes the model.
"""

from notifiers.routing.config import load_routing, parse_routing
from notifiers.routing.errors import RoutingError
from notifiers.routing.escalation import (
    EscalationPolicy,
    Escalator,
    Level,
    Pending,
    Step,
    parse_policy,
)
from notifiers.routing.routes import (
    TRANSITIONS,
    Decision,
    Delivery,
    QuietHours,
    Route,
    Routing,
    Tried,
    explain,
    tell,
)
from notifiers.routing.schedules import (
    Layer,
    Override,
    Schedule,
    Shift,
    on_call,
    parse_schedule,
    who,
)

__all__ = [
    "TRANSITIONS",
    "Decision",
    "Delivery",
    "EscalationPolicy",
    "Escalator",
    "Layer",
    "Level",
    "Override",
    "Pending",
    "QuietHours",
    "Route",
    "Routing",
    "RoutingError",
    "Schedule",
    "Shift",
    "Step",
    "Tried",
    "explain",
    "tell",
    "load_routing",
    "on_call",
    "parse_policy",
    "parse_routing",
    "parse_schedule",
    "who",
]
