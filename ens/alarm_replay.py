"""`ens replay --alarms`: a history of events through the profiles and the alarm rules.

Event time is the clock: each match is given to the rules at its `ts`, and `clear: after T`,
silence ends and group messages fire as time passes between matches; the replay stops at the
end time (--until, or the last event), so what is still queued then is counted as pending.
The clear conditions (`clear: {on: F}`) are companion profiles (`<id>#clear`) run by the same
engine, in the same single step. "How many messages would the night crew have had last week":
the summary counts, per subscriber, the messages without and with grouping and silences.
With a routing file (``--routing``) the rules get the service's `Router`: who is told comes
from the route tree, schedules and quiet hours at each transition's time, escalation steps fire
in event time, and every decision is kept (``timeline``) — the same calls `ens serve --routing`
makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from filters.interface import DetectionEngine
from filters.notification import Notification
from notifiers.alarms import AlarmRules, Effects, GroupPolicy, Message, SilenceError, Transition
from notifiers.routing import Routing
from notifiers.routing.replay import Told
from notifiers.routing.router import Router
from profiles.alarm import AlarmSpec, clear_companion
from profiles.ast import Profile
from profiles.errors import ENSError
from profiles.events import Event


@dataclass
class AlarmReplay:
    transitions: list[Transition] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    rules: AlarmRules | None = None
    timeline: list[Told] = field(default_factory=list)  # with a routing: who was told, when

    def add(self, eff: Effects) -> None:
        self.transitions.extend(eff.transitions)
        self.messages.extend(eff.messages)


def with_companions(profiles: Iterable[Profile], alarms: dict[str, AlarmSpec]) -> list[Profile]:
    """The profiles and, for each `clear: {on: F}`, its companion `<id>#clear`."""
    out = list(profiles)
    for p in list(out):
        spec = alarms.get(p.id)
        comp = clear_companion(p, spec) if spec is not None else None
        if comp is not None:
            out.append(comp)
    return out


def read_silences(path: Path) -> list[dict[str, Any]]:
    """A silences file: YAML ``silences: [{matchers, from/until/for | weekly, tz, ...}]``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ENSError(f"cannot read silences file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ENSError(f"{path}: not valid YAML: {e}") from None
    items = data.get("silences") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ENSError(f"{path}: expected a mapping with a list 'silences'")
    return items


def replay_alarms(
    profiles: list[Profile],
    alarms: dict[str, AlarmSpec],
    notify: Callable[[list[Profile]], list[Notification]],
    events: list[Event],
    until: float | None,
    *,
    silences: list[dict[str, Any]] | None = None,
    policy: GroupPolicy | None = None,
    silences_name: str = "silences",
    routing: Routing | None = None,
) -> AlarmReplay:
    """Run ``notify`` (an engine replay over the given profiles) and feed its matches, in
    output order, to the alarm rules. Silences are in place from the first event on. With
    ``routing``: its route tree and escalation (`Router`) and its grouping per subscriber
    (``policy`` for the others, unless it has a ``*`` entry)."""
    subscriber = {p.id: p.subscriber for p in profiles}
    out = AlarmReplay()
    if routing is None:
        rules = AlarmRules(alarms, default=policy)
    else:
        policies = dict(routing.grouping)
        default = policies.pop("*", policy)
        rules = AlarmRules(alarms, policies, default, Router(routing, out.timeline))
    out.rules = rules
    start = min((e.ts for e in events), default=0.0)
    for i, data in enumerate(silences or []):
        try:
            out.add(rules.add_silence(data, start))
        except SilenceError as e:
            raise ENSError(f"{silences_name}: silence #{i + 1}: {e}") from None
    for n in notify(with_companions(profiles, alarms)):
        events_ = {name: ev.id for name, ev in n.events.items()}
        base = n.profile.split("#", 1)[0]
        out.add(rules.on_match(n.profile, n.ts, n.partition, events_, subscriber.get(base)))
    end = until if until is not None else max((e.ts for e in events), default=start)
    out.add(rules.advance(end))
    return out


def pending(rules: AlarmRules, subscriber: str) -> int:
    """Notices queued for a subscriber at the end (a group still waiting, the cap's overflow)."""
    queued = sum(
        len(g.pending) for g in rules.dispatch.groups.values() if g.subscriber == subscriber
    )
    outlet = rules.dispatch.outlets.get(subscriber)
    return queued + (len(outlet.overflow) if outlet is not None else 0)


SUMMARY_COLUMNS = (
    ("transitions", "every transition (history)"),
    ("to notify", "one message each, no grouping, no silences"),
    ("silenced", "held back by a silence"),
    ("after silences", "one message each, silences applied"),
    ("messages", "with grouping, silences and the cap"),
    ("digests", "messages that carry the cap's overflow"),
    ("overflow", "notices held back by the cap into a digest"),
    ("pending", "still queued at the end time"),
)


def summary_rows(rules: AlarmRules) -> list[dict[str, Any]]:
    rows = []
    for sub in sorted(rules.stats):
        c = rules.stats[sub]
        rows.append(
            {
                "subscriber": sub or "(none)",
                "transitions": c["transitions"],
                "to notify": c["to_notify"],
                "silenced": c["silenced"],
                "after silences": c["to_notify"] - c["silenced"] + c["unsilenced"],
                "messages": c["messages"],
                "digests": c["digests"],
                "overflow": c["overflow"],
                "pending": pending(rules, sub),
            }
        )
    return rows


def summary_table(rows: list[dict[str, Any]]) -> Any:
    """The rows as a rich table (per subscriber)."""
    from rich.table import Table

    table = Table(title="alarms per subscriber (ens replay --alarms)")
    table.add_column("subscriber")
    for name, _ in SUMMARY_COLUMNS:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(row["subscriber"], *(f"{row[name]:,}" for name, _ in SUMMARY_COLUMNS))
    return table


def run_engine(
    make: Callable[[list[Profile]], DetectionEngine],
    events: list[Event],
    until: float | None,
    progress: Callable[[int], None] | None = None,
) -> Callable[[list[Profile]], list[Notification]]:
    """``notify`` for `replay_alarms`: the ordinary replay over an engine built for the
    profiles plus companions."""
    from ens.replay import replay

    def notify(profiles: list[Profile]) -> list[Notification]:
        return replay(profiles, events, until, engine=make(profiles), progress=progress)

    return notify
