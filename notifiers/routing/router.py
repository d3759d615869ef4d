"""The routing as the alarm rules' `Router`: the route tree, quiet hours, schedules and the
escalation of a routing file, driven by `notifiers.alarms.AlarmRules` in the service and in
`ens replay --alarms --routing` alike (the same calls, with time passed in).

A delivered transition reaches the subscribers `route_transition` names (the replay's code);
a raise through a route with an `escalation` starts it, an ack or a clear stops it; each
escalation step reaches its level's receivers, resolved and through quiet hours at its due
time. ``changed`` collects the occurrences whose pending step changed, so the service writes
them (``ens:escalation:due``) in the commit that changed them; ``log`` (when a list) gets every
row of the timeline (`Told`), told or held back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from notifiers.alarms.model import Transition
from notifiers.routing.escalation import Escalator, Pending
from notifiers.routing.replay import Told, _rows, route_transition, step_deliveries
from notifiers.routing.routes import Routing, explain
from notifiers.routing.schedules import Schedule


class Router:
    def __init__(self, routing: Routing, log: list[Told] | None = None) -> None:
        self.routing = routing
        self.file = routing  # as loaded: `use_schedules` adds the stored schedules to it
        self.escalator = Escalator(routing.policies)
        self.changed: set[str] = set()
        self.log = log
        self.held = 0  # deliveries held back (quiet hours, nobody on call), for metrics
        self.steps = 0  # escalation steps fired

    def use_schedules(self, stored: Mapping[str, Schedule]) -> list[str]:
        """Resolve receivers with the stored schedules (`ens schedule add`) too, from now on;
        a schedule of the routing file wins over a stored one of the same id. Returns the
        stored ids the file's schedules shadow."""
        merged = {**stored, **self.file.schedules}
        self.routing = replace(self.file, schedules=merged)
        return sorted(set(stored) & set(self.file.schedules))

    def transition(self, t: Transition) -> list[str]:
        before = self.escalator.pending.get(f"{t.alarm}.{t.occurrence}")
        if not self.routing.routed:  # grouping alone: the profile's subscriber
            return [t.labels.get("subscriber", "")] if t.delivery == "sent" else []
        rows = route_transition(self.routing, self.escalator, t)
        key = f"{t.alarm}.{t.occurrence}"
        if self.escalator.pending.get(key) is not before:
            self.changed.add(key)
        return self._told(rows)

    def route(self, kind: str, labels: dict[str, str], at: float, key: str) -> list[str]:
        """An alarm delivered when its silence ended: routed as its ``kind``; a raise starts
        the escalation the silenced raise did not."""
        if not self.routing.routed:
            return [labels.get("subscriber", "")]
        d = explain(self.routing, labels, kind, at)
        if kind == "raise" and d.escalations:
            if self.escalator.start(key, d.escalations[0][0], at, labels):
                self.changed.add(key)
        alarm = key.rpartition(".")[0]
        return self._told(_rows(at, alarm, "unsilenced", labels, d.deliveries))

    def _told(self, rows: list[Told]) -> list[str]:
        if self.log is not None:
            self.log.extend(rows)
        self.held += sum(1 for r in rows if not r.told)
        return [r.subscriber for r in rows if r.told]

    def due(self) -> float | None:
        return self.escalator.due()

    def advance(self, now: float) -> list[tuple[str, str, float, list[str]]]:
        out = []
        for step in self.escalator.advance(now):
            self.steps += 1
            self.changed.add(step.key)
            rows = _rows(
                step.due_at,
                step.key.rpartition(".")[0],
                f"escalation {step.level + 1}",
                step.labels,
                step_deliveries(self.routing, step),
            )
            out.append((step.id, step.key, step.due_at, self._told(rows)))
        return out

    def take_changed(self) -> set[str]:
        out, self.changed = self.changed, set()
        return out

    def next_step(self, key: str) -> dict[str, Any] | None:
        """What ``ens alarms show`` says of an occurrence's escalation: the next step, when,
        and to whom (receivers as named in the policy: schedules resolve when it fires)."""
        p = self.escalator.pending.get(key)
        return None if p is None else describe(self.routing, p)

    def snapshot(self) -> dict[str, Any]:
        return self.escalator.snapshot()

    def load(self, snap: dict[str, Any]) -> None:
        self.escalator = Escalator.restore(self.routing.policies, snap)
        self.changed.update(self.escalator.dropped)  # a policy gone: its steps are deleted
        self.changed.update(self.escalator.pending)  # rewritten: the policies may differ


def describe(routing: Routing, p: Pending) -> dict[str, Any]:
    pol = routing.policies[p.policy]
    return {
        "policy": p.policy,
        "occurrence": p.key,
        "started_at": p.started_at,
        "cycle": p.cycle,
        "level": p.level + 1,
        "levels": len(pol.levels),
        "due_at": p.due_at,
        "receivers": list(pol.levels[p.level].receivers),
        "step": f"{p.key}.{p.cycle}.{p.level}",
    }
