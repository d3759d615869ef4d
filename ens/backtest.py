"""`ens backtest`: the archive's events of a time range through a profile file, and what it
would have done: per profile its matches and the messages each subscriber would have
received (a subscriber's digest window folds the notifications of one window into one
message), a timeline of notifications per hour, a table, a PNG plot.

The notifications come from `ens replay`'s engine (local) or `ens spark replay`'s job
(Spark), which give the same notifications in the same order; the report is built from
them alike, so it does not depend on where they were computed. A report column is one entry
of `COLUMNS` (alarms raised and cleared join it when profiles have alarms).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from profiles.ast import Profile

HOUR = 3600.0
# (key of a profile's row, table heading): the columns of the report, in order
COLUMNS: list[tuple[str, str]] = [
    ("matches", "matches"),
    ("messages", "messages"),
    ("subscribers", "subscribers"),
    ("peak_hour", "busiest hour"),
]
# ... and when the profile file has `alarm:` blocks (docs/alarms.md)
ALARM_COLUMNS: list[tuple[str, str]] = [
    ("alarms_raised", "alarms raised"),
    ("alarms_cleared", "alarms cleared"),
]


@dataclass
class Report:
    start: float
    end: float
    archive: str
    engine: str  # "local" or "spark"
    events: int = 0
    files: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    hours: list[float] = field(default_factory=list)  # the timeline's hour starts
    plot: str | None = None
    seconds: float = 0.0
    alarms: bool = False  # the profile file has alarm: blocks: ALARM_COLUMNS too

    @property
    def columns(self) -> list[tuple[str, str]]:
        return COLUMNS + (ALARM_COLUMNS if self.alarms else [])

    def to_json(self) -> dict[str, Any]:
        return {
            "from": iso(self.start),
            "to": iso(self.end),
            "archive": self.archive,
            "engine": self.engine,
            "events": self.events,
            "files": self.files,
            "bytes": self.bytes,
            "skipped_files": [{"path": p, "error": e} for p, e in self.skipped],
            "profiles": self.profiles,
            "plot": self.plot,
            "seconds": round(self.seconds, 3),
        }


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _messages(times: list[float], digest: float | None) -> int:
    """Messages one channel sends for notifications at ``times`` (sorted): one each, or with
    a digest window one per window (a window opens at a notification and takes the ones of
    the next ``digest`` seconds)."""
    if not digest:
        return len(times)
    n, until = 0, float("-inf")
    for t in times:
        if t >= until:
            n += 1
            until = t + digest
    return n


def _channels(subscriber: dict[str, Any] | None) -> list[float | None]:
    """The digest window of each channel of a subscriber (None: none; unknown: one channel)."""
    if not subscriber:
        return [None]
    default = subscriber.get("digest")
    chans = subscriber.get("channels") or [{}]
    return [c.get("digest", default) if isinstance(c, dict) else default for c in chans]


def build(
    report: Report,
    profiles: list[Profile],
    subscribers: list[dict[str, Any]],
    notes: list[dict[str, Any]],
    transitions: list[Any] | None = None,
) -> Report:
    """Fill ``report`` from the notifications (`Notification.to_json` records) and, with
    alarms, their transitions (`notifiers.alarms.Transition`)."""
    alarm_counts = _alarm_counts(notes, transitions) if transitions is not None else None
    report.alarms = alarm_counts is not None
    subs = {s.get("id"): s for s in subscribers if isinstance(s, dict)}
    times: dict[str, list[float]] = defaultdict(list)
    for n in notes:
        times[n["profile"]].append(float(n["ts"]))
    first = int(report.start // HOUR)
    last = int(max(report.end - 1e-9, report.start) // HOUR)
    report.hours = [h * HOUR for h in range(first, last + 1)]
    for p in profiles:
        ts = sorted(times.get(p.id, []))
        per_hour = Counter(int(t // HOUR) for t in ts)
        sub = p.subscriber
        messages = sum(_messages(ts, d) for d in _channels(subs.get(sub))) if sub else 0
        peak = max(per_hour.items(), key=lambda kv: (kv[1], -kv[0]), default=None)
        report.profiles.append(
            {
                "id": p.id,
                "matches": len(ts),
                "messages": messages,
                "subscribers": {sub: messages} if sub else {},
                "peak_hour": iso(peak[0] * HOUR) if peak else None,
                "timeline": [per_hour.get(h, 0) for h in range(first, last + 1)],
            }
        )
        if alarm_counts is not None:
            counts = alarm_counts.get(p.id, {})
            report.profiles[-1]["alarms_raised"] = counts.get("raise", 0)
            report.profiles[-1]["alarms_cleared"] = counts.get("clear", 0)
    return report


def _alarm_counts(notes: list[dict[str, Any]], transitions: list[Any]) -> dict[str, dict[str, int]]:
    """Transitions by kind per profile (an alarm is its profile's and partition's)."""
    from notifiers.alarms import alarm_id

    owner = {alarm_id(n["profile"], n.get("partition")): n["profile"] for n in notes}
    out: dict[str, dict[str, int]] = defaultdict(Counter)  # type: ignore[arg-type]
    for t in transitions:
        pid = owner.get(t.alarm)
        if pid is not None:
            out[pid][t.kind] += 1
    return out


class _Match:
    """A notification record as `ens.alarm_replay.replay_alarms` reads a `Notification`."""

    __slots__ = ("profile", "ts", "partition", "events")

    def __init__(self, rec: dict[str, Any]) -> None:
        from types import SimpleNamespace

        self.profile = rec["profile"]
        self.ts = float(rec["ts"])
        self.partition = rec.get("partition")
        self.events = {k: SimpleNamespace(id=v) for k, v in rec["events"].items()}


def alarm_transitions(
    profiles: list[Profile], alarms: dict[str, Any], notes: list[dict[str, Any]], end: float
) -> list[Any]:
    """The alarm transitions of the notifications of the profiles and their companions
    (computed locally or on Spark alike: from the records)."""
    from ens.alarm_replay import replay_alarms

    matches = [_Match(n) for n in notes]
    result = replay_alarms(profiles, alarms, lambda _ps: matches, [], end)  # type: ignore[arg-type,return-value]
    return list(result.transitions)


def cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if key == "subscribers" and isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "(none)"
    return "" if value is None else str(value)


def plot(report: Report, out: str) -> None:
    """Notifications per hour per profile, one line each (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from datetime import datetime

    import matplotlib.pyplot as plt

    xs: Any = [datetime.fromtimestamp(h, UTC) for h in report.hours]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for row in report.profiles:
        ax.step(xs, row["timeline"], where="post", label=row["id"])
    ax.set_xlabel("hour (UTC)")
    ax.set_ylabel("notifications per hour")
    ax.set_title(f"backtest {iso(report.start)} .. {iso(report.end)} ({report.events} events)")
    if report.profiles:
        ax.legend(loc="upper right", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
