"""Escalation: who is told next while an alarm stays unacknowledged.

A policy has levels, each with its receivers (subscribers or schedules) and a delay after the
level before it (the first level's delay counts from the raise). With ``repeat``, the ladder
starts again from the first level ``repeat`` after the last level fired, while nobody
acknowledges (at most ``max_repeats`` times when given). An acknowledgement or a clear stops it.

`Escalator` holds the pending escalations, one per alarm occurrence; like notifiers.alarms it
has no clock: ``due()`` says when the next step is due, ``advance(now)`` fires every step due
by ``now`` (each once, in time order), and ``snapshot()``/``restore()`` carry the pending steps
across a restart as a versioned dict. Each step has an id (``KEY.CYCLE.LEVEL``): the
idempotency key of what it delivers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import notifiers.routing.times as times
from notifiers.alarms.model import Transition
from notifiers.routing.errors import RoutingError

VERSION = 1
POLICY_KEYS = ("id", "levels", "repeat", "max_repeats", "description")
LEVEL_KEYS = ("receivers", "delay")


@dataclass(frozen=True, slots=True)
class Level:
    receivers: tuple[str, ...]
    delay: float  # seconds after the level before (the first: after the raise)


@dataclass(frozen=True, slots=True)
class EscalationPolicy:
    id: str
    levels: tuple[Level, ...]
    repeat: float | None = None  # the ladder starts again this long after its last level
    max_repeats: int | None = None  # None: while unacknowledged
    description: str = ""


@dataclass(frozen=True, slots=True)
class Step:
    """One level reached: its receivers are to be told (``due_at``: when it became due)."""

    id: str
    key: str
    policy: str
    cycle: int
    level: int
    receivers: tuple[str, ...]
    due_at: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Pending:
    """An escalation in progress: the next step (``cycle``, ``level``) and when it is due."""

    key: str
    policy: str
    started_at: float
    cycle: int
    level: int
    due_at: float
    labels: dict[str, str] = field(default_factory=dict)


def parse_policy(data: Any) -> EscalationPolicy:
    d = times.mapping(data, (), POLICY_KEYS)
    pid = d.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid).strip() == "":
        raise RoutingError("give the policy an id", ("id",))
    raw = d.get("levels")
    if not isinstance(raw, list) or not raw:
        raise RoutingError("give at least one level (receivers and delay)", ("levels",))
    levels = []
    for i, item in enumerate(raw):
        loc = ("levels", i)
        lv = times.mapping(item, loc, LEVEL_KEYS)
        if "receivers" not in lv:
            raise RoutingError("give the receivers of this level", loc)
        delay = times.duration(lv.get("delay", 0), (*loc, "delay"))
        if delay < 0:
            raise RoutingError("a delay is not negative", (*loc, "delay"))
        if i > 0 and delay <= 0:
            raise RoutingError("a level after the first needs a delay > 0 (e.g. 15m)", loc)
        levels.append(Level(times.names(lv["receivers"], (*loc, "receivers")), delay))
    repeat = times.duration(d["repeat"], ("repeat",)) if d.get("repeat") is not None else None
    if repeat is not None and repeat <= 0:
        raise RoutingError("repeat is a duration > 0 (e.g. 30m)", ("repeat",))
    most = d.get("max_repeats")
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 0):
        raise RoutingError(f"{most!r}: expected a whole number >= 0", ("max_repeats",))
    if most is not None and repeat is None:
        raise RoutingError("only with repeat", ("max_repeats",))
    return EscalationPolicy(
        str(pid).strip(), tuple(levels), repeat, most, str(d.get("description", ""))
    )


class Escalator:
    """The pending escalations, by key (an alarm occurrence: ``ALARM.OCCURRENCE``)."""

    def __init__(self, policies: Mapping[str, EscalationPolicy]) -> None:
        self.policies = dict(policies)
        self.pending: dict[str, Pending] = {}
        self.dropped: list[str] = []  # keys restored whose policy is gone

    # ------------------------------------------------------------------ changes
    def start(
        self, key: str, policy: str, now: float, labels: Mapping[str, str] | None = None
    ) -> bool:
        """Begin escalating ``key`` under ``policy`` (False: it already escalates)."""
        pol = self.policies.get(policy)
        if pol is None:
            raise RoutingError(f"no escalation policy {policy!r}", ("escalation",))
        if key in self.pending:
            return False
        due = now + pol.levels[0].delay
        self.pending[key] = Pending(key, policy, now, 0, 0, due, dict(labels or {}))
        return True

    def stop(self, key: str) -> Pending | None:
        """Acknowledged or cleared: nothing more is sent for ``key``."""
        return self.pending.pop(key, None)

    def on_transition(self, t: Transition, policy: str | None) -> bool:
        """An alarm's transition: a raise starts ``policy`` (when given), an ack or clear
        stops its occurrence's escalation. True when something changed."""
        key = f"{t.alarm}.{t.occurrence}"
        if t.kind == "raise" and policy is not None:
            return self.start(key, policy, t.ts, t.labels)
        if t.kind in ("ack", "clear"):
            return self.stop(key) is not None
        return False

    # ------------------------------------------------------------------ time
    def due(self) -> float | None:
        return min((p.due_at for p in self.pending.values()), default=None)

    def advance(self, now: float) -> list[Step]:
        """Every step due by ``now``, each once, in time order (then by key)."""
        out: list[Step] = []
        while True:
            ready = [p for p in self.pending.values() if p.due_at <= now]
            if not ready:
                return out
            p = min(ready, key=lambda q: (q.due_at, q.key))
            pol = self.policies[p.policy]
            lv = pol.levels[p.level]
            out.append(
                Step(
                    f"{p.key}.{p.cycle}.{p.level}",
                    p.key,
                    p.policy,
                    p.cycle,
                    p.level,
                    lv.receivers,
                    p.due_at,
                    dict(p.labels),
                )  # fmt: skip
            )
            self._next(p, pol)

    def _next(self, p: Pending, pol: EscalationPolicy) -> None:
        if p.level + 1 < len(pol.levels):
            p.level += 1
            p.due_at += pol.levels[p.level].delay
        elif pol.repeat is not None and (pol.max_repeats is None or p.cycle < pol.max_repeats):
            p.cycle, p.level = p.cycle + 1, 0
            p.due_at += pol.repeat
        else:
            del self.pending[p.key]

    # ------------------------------------------------------------------ durability
    def snapshot(self) -> dict[str, Any]:
        return {"version": VERSION, "pending": [asdict(p) for p in self.pending.values()]}

    @classmethod
    def restore(cls, policies: Mapping[str, EscalationPolicy], d: Mapping[str, Any]) -> Escalator:
        """From a snapshot. A pending escalation whose policy is gone is dropped (its key is
        in ``dropped``); one whose policy lost levels goes on at its last level."""
        if d.get("version") != VERSION:
            raise RoutingError(
                f"escalation snapshot version {d.get('version')!r} (this build reads {VERSION})"
            )
        esc = cls(policies)
        for raw in d.get("pending", []):
            try:
                p = Pending(**raw)
            except TypeError as e:  # written by hand or damaged: say so, do not guess
                raise RoutingError(f"escalation snapshot: bad pending entry {raw!r}: {e}") from None
            pol = esc.policies.get(p.policy)
            if pol is None:
                esc.dropped.append(p.key)
                continue
            p.level = min(p.level, len(pol.levels) - 1)
            esc.pending[p.key] = p
        return esc


def timeline(
    policy: EscalationPolicy, start: float, limit: int = 20
) -> list[tuple[int, int, float, tuple[str, ...]]]:
    """The steps (cycle, level, due, receivers) a start at ``start`` would take while nobody
    acknowledges, at most ``limit`` of them (for explanations)."""
    esc = Escalator({policy.id: policy})
    esc.start("", policy.id, start)
    out: list[tuple[int, int, float, tuple[str, ...]]] = []
    while len(out) < limit and (due := esc.due()) is not None:
        out += [(s.cycle, s.level, s.due_at, s.receivers) for s in esc.advance(due)]
    return out[:limit]
