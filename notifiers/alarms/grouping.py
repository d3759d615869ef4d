"""Grouping and flood control per subscriber: what is sent, when, in how many messages.

Alertmanager's meaning: a group (subscriber + the values of ``group_by`` labels) that gets its
first notice waits ``group_wait`` and then sends one message listing everything it collected;
later notices wait until ``group_interval`` after the group's last message. A group that stayed
quiet for ``group_interval`` starts again with ``group_wait``. ``group_by=None`` sends each
notice alone, at once. The cap (messages per subscriber in any hour) holds back whatever
exceeds it into one digest, sent as soon as the hour allows: counted, never dropped. A
subscriber's message times are kept only while a cap applies to it (a cap set later counts
from then): without one, nothing reads them.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from notifiers.alarms.model import Notice

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    group_by: tuple[str, ...] | None = None
    group_wait: float = 30.0
    group_interval: float = 300.0
    cap_per_hour: int | None = None
    cap_window: float = HOUR  # the cap's sliding window (an hour; shorter in tests)


@dataclass(frozen=True, slots=True)
class Message:
    """What a subscriber receives: one or more notices. ``kind``: "single" (no grouping),
    "group", or "digest" (held back by the cap; ``overflow`` notices)."""

    id: str
    subscriber: str
    ts: float
    kind: str
    group: dict[str, str]
    notices: tuple[Notice, ...]
    overflow: int = 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["notices"] = [n.to_json() for n in self.notices]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Message:
        notices = tuple(Notice.from_json(n) for n in d["notices"])
        return cls(**{**d, "notices": notices})


@dataclass(slots=True)
class Group:
    subscriber: str
    labels: dict[str, str]
    pending: list[Notice] = field(default_factory=list)
    flush_at: float | None = None
    last_flush: float | None = None


class Times:
    """Message times in the order sent: append at the end, forget from the front, both O(1).

    An array of doubles with a start index (the forgotten front is dropped once it is half
    the array): a list moved all the rest on each forget (~0.8 ms per message after an hour
    at 1,000 messages/s, 3.6 M times), and a deque of float objects is walked by every full
    garbage collection; an array holds no objects."""

    __slots__ = ("_a", "_head")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self._a = array("d", values)
        self._head = 0

    def append(self, t: float) -> None:
        self._a.append(t)

    def extend(self, ts: Iterable[float]) -> None:
        self._a.extend(ts)

    def first(self) -> float:
        return self._a[self._head]

    def popleft(self) -> float:
        t = self._a[self._head]
        self._head += 1
        if self._head >= 1024 and 2 * self._head >= len(self._a):
            del self._a[: self._head]
            self._head = 0
        return t

    def __len__(self) -> int:
        return len(self._a) - self._head

    def tolist(self) -> list[float]:
        return self._a[self._head :].tolist()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Times) and self.tolist() == other.tolist()

    def __repr__(self) -> str:
        return f"Times({self.tolist()!r})"


@dataclass(slots=True)
class Outlet:
    """A subscriber's side of the cap: the times of its messages this hour (kept only under a
    cap), and the overflow."""

    sent: Times = field(default_factory=Times)
    overflow: list[Notice] = field(default_factory=list)
    digest_at: float | None = None


class Dispatcher:
    """Notices in, messages out; every deadline is exposed (``flush_at``, ``digest_at``)."""

    def __init__(self, policies: dict[str, GroupPolicy], default: GroupPolicy) -> None:
        self.policies, self.default = policies, default
        self.groups: dict[str, Group] = {}
        self.outlets: dict[str, Outlet] = {}
        self.messages = 0  # numbers message ids
        self.singles = 0  # numbers the one-notice groups of ungrouped subscribers

    def policy(self, subscriber: str) -> GroupPolicy:
        return self.policies.get(subscriber, self.default)

    def add(self, notice: Notice, subscriber: str, now: float) -> str:
        """Queue a notice; returns the key of the group whose ``flush_at`` may have changed."""
        pol = self.policy(subscriber)
        if pol.group_by is None:
            labels: dict[str, str] = {}
            self.singles += 1  # same-instant messages go out by subscriber, then in this order
            key = json.dumps([subscriber, f"#{self.singles:012d}"])
            wait, interval = 0.0, 0.0
        else:
            labels = {k: notice.labels.get(k, "") for k in pol.group_by}
            key = json.dumps([subscriber, sorted(labels.items())])
            wait, interval = pol.group_wait, pol.group_interval
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = Group(subscriber, labels)
        if not g.pending:
            fresh = g.last_flush is None or now >= g.last_flush + interval
            g.flush_at = now + wait if fresh else (g.last_flush or 0.0) + interval
        g.pending.append(notice)
        return key

    def single(self, notice: Notice, subscriber: str, now: float) -> Message | None:
        """`add` then `flush` of a notice for a subscriber without grouping whose group would
        be flushed at once: the same message (or overflow), numbered the same, without the
        group."""
        self.singles += 1
        return self._send(subscriber, now, "single", {}, [notice])

    def _n(self) -> int:
        self.messages += 1
        return self.messages

    def flush(self, key: str, now: float) -> Message | None:
        """The group's deadline came: send what it holds (or hold it back under the cap)."""
        g = self.groups[key]
        notices, g.pending, g.flush_at, g.last_flush = g.pending, [], None, now
        if self.policy(g.subscriber).group_by is None:
            del self.groups[key]  # an ungrouped notice's group lives until it is sent
        kind = "single" if self.policy(g.subscriber).group_by is None else "group"
        return self._send(g.subscriber, now, kind, g.labels, notices)

    def digest(self, subscriber: str, now: float) -> Message | None:
        out = self.outlets[subscriber]
        cap = self.policy(subscriber).cap_per_hour
        if cap is not None:
            self._prune(out, now, self.policy(subscriber).cap_window)
        if cap is not None and len(out.sent) >= cap:  # not yet: the hour is still full
            out.digest_at = out.sent.first() + self.policy(subscriber).cap_window
            return None
        notices, out.overflow, out.digest_at = out.overflow, [], None
        if cap is not None:
            out.sent.append(now)
        return Message(f"m{self._n()}", subscriber, now, "digest", {}, tuple(notices), len(notices))

    def _send(
        self, subscriber: str, now: float, kind: str, labels: dict[str, str], notices: list[Notice]
    ) -> Message | None:
        out = self.outlets.get(subscriber)
        if out is None:
            out = self.outlets[subscriber] = Outlet()
        pol = self.policy(subscriber)
        cap = pol.cap_per_hour
        if cap is not None:  # without one no time is kept (`Outlet`)
            self._prune(out, now, pol.cap_window)
        if cap is not None and (out.overflow or len(out.sent) >= cap):
            out.overflow.extend(notices)  # in order, behind what is already held back
            if out.digest_at is None:
                full = len(out.sent) >= cap
                out.digest_at = out.sent.first() + pol.cap_window if full else now
            return None
        if cap is not None:  # only the cap reads them
            out.sent.append(now)
        return Message(f"m{self._n()}", subscriber, now, kind, dict(labels), tuple(notices))

    @staticmethod
    def _prune(out: Outlet, now: float, window: float) -> None:
        while len(out.sent) and out.sent.first() <= now - window:
            out.sent.popleft()

    # ------------------------------------------------------------------ snapshot
    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "singles": self.singles,
            "groups": {
                k: {
                    "subscriber": g.subscriber,
                    "labels": g.labels,
                    "pending": [n.to_json() for n in g.pending],
                    "flush_at": g.flush_at,
                    "last_flush": g.last_flush,
                }
                for k, g in self.groups.items()
            },
            "outlets": {
                s: {
                    "sent": o.sent.tolist(),
                    "overflow": [n.to_json() for n in o.overflow],
                    "digest_at": o.digest_at,
                }
                for s, o in self.outlets.items()
            },
        }

    def load(self, d: dict[str, Any]) -> None:
        self.messages, self.singles = d["messages"], d["singles"]
        self.groups = {
            k: Group(
                g["subscriber"],
                g["labels"],
                [Notice.from_json(n) for n in g["pending"]],
                g["flush_at"],
                g["last_flush"],
            )  # fmt: skip
            for k, g in d["groups"].items()
        }
        self.outlets = {
            s: Outlet(
                # the times count only under a cap (one set since counts from then)
                Times(o["sent"] if self.policy(s).cap_per_hour is not None else ()),
                [Notice.from_json(n) for n in o["overflow"]],
                o["digest_at"],
            )
            for s, o in d["outlets"].items()
        }
