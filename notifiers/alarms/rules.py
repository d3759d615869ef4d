"""The alarm rules: matches, people and time in; transitions and messages out.

One object holds every alarm's state, the silences and the grouping queues; each call is
given its time and returns its `Effects`. As the engine's timers (docs/language.md §5), a deadline
``d`` fires when time passes it: a call at ``t`` first fires the deadlines before ``t``, then
acts, then fires those at ``t`` (a group without wait is sent at once); `advance(t)` fires
them up to ``t`` inclusive. Deadlines that fall at the same time fire in a fixed order: clears
(`clear: after`), then ended silences, then escalation steps, then group messages, then
digests; within a kind by key. A match exactly at a clear's deadline is therefore a repeat: the
alarm never went quiet for T.

With a `Router` (notifiers.routing) a delivered transition goes to the subscribers the router
names instead of the profile's subscriber, and the router's timers (escalation steps) fire as
the rules' own; without one, everything goes to the profile's subscriber.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from filters.errors import StateError
from notifiers.alarms.contract import Effects, Router
from notifiers.alarms.grouping import Dispatcher, GroupPolicy, Message
from notifiers.alarms.lifecycle import AlarmBook
from notifiers.alarms.model import Alarm, Notice, Transition, alarm_id, delivered, is_active
from notifiers.alarms.silences import Silence, parse_silence
from notifiers.errors import SilenceError, SilenceNotFound
from profiles.alarm import CLEAR_SUFFIX, AlarmSpec

VERSION = 1
CLEAR, UNSILENCE, ESCALATE, FLUSH, DIGEST = 0, 1, 2, 3, 4  # timer kinds, in tie order
# one match of `AlarmRules.on_matches`: profile, ts, partition, events, subscriber
Match = tuple[str, float, dict[str, Any] | None, dict[str, str], str | None]


class AlarmRules:
    """The pure alarm module (docs/alarms.md). ``alarms``: profile id -> its `alarm:`;
    ``policies``: subscriber -> grouping and cap (``default`` for the others)."""

    def __init__(
        self,
        alarms: Mapping[str, AlarmSpec],
        policies: Mapping[str, GroupPolicy] | None = None,
        default: GroupPolicy | None = None,
        router: Router | None = None,
    ) -> None:
        self.specs = dict(alarms)
        self.router = router
        self.book = AlarmBook()
        self.silences: dict[str, Silence] = {}
        self.silence_seq = 0
        self.dispatch = Dispatcher(dict(policies or {}), default or GroupPolicy())
        self.clock: float | None = None
        self.stats: dict[str, Counter[str]] = {}  # per subscriber ("" for none)
        self._heap: list[tuple[float, int, str]] = []
        self._lo = math.inf  # at most the earliest current deadline of the heap (`_due_by`)
        self._carry = Effects()  # effects of a refused call's advance, returned by the next call
        # notices an input call queued for subscribers without grouping (None: not in a call);
        # see `_op`: one of them with nothing else due is sent without a group and a timer
        self._instant: list[tuple[Notice, str]] | None = None

    # ------------------------------------------------------------------ inputs
    def on_match(
        self,
        profile: str,
        ts: float,
        partition: dict[str, Any] | None = None,
        events: dict[str, str] | None = None,
        subscriber: str | None = None,
    ) -> Effects:
        """A profile's match (an engine notification). ``P#clear`` matches clear P's alarm of
        the same partition; profiles without an alarm are ignored (no effects)."""
        eff = Effects()
        if not (profile.endswith(CLEAR_SUFFIX) and self._idle_clear(profile, ts, partition)):
            self._op(ts, self._match, profile, partition, events or {}, subscriber, into=eff)
        return eff

    def on_matches(self, matches: Iterable[Match]) -> Effects:
        """`on_match` of each ``(profile, ts, partition, events, subscriber)`` in order, as
        one `Effects` (the engine worker's commit): the same transitions and messages, each
        call's appended to one list (no `Effects` per match)."""
        eff = Effects()
        op, match, idle = self._op, self._match, self._idle_clear
        for profile, ts, partition, events, subscriber in matches:
            if profile.endswith(CLEAR_SUFFIX) and idle(profile, ts, partition):
                continue  # the common clear condition: its alarm is not active
            if not _quick(self, profile, ts, partition, events or {}, subscriber, eff):
                op(ts, match, profile, partition, events or {}, subscriber, into=eff)
        return eff

    def acknowledge(self, ref: str, now: float, actor: str, note: str = "") -> Effects:
        """Raises AlarmNotFound / AlarmStateConflict (already acknowledged)."""
        return self._op(
            now, lambda t, eff: self._deliver(self.book.acknowledge(ref, t, actor, note), t, eff)
        )

    def clear(self, ref: str, now: float, actor: str, reason: str) -> Effects:
        """A manual clear. Raises AlarmNotFound / AlarmStateConflict (already cleared)."""
        return self._op(
            now, lambda t, eff: self._deliver(self.book.clear(ref, t, actor, reason), t, eff)
        )

    def add_silence(self, data: Mapping[str, Any], now: float) -> Effects:
        """Validate and store a silence (``Effects.silence``); raises SilenceError naming the
        field. It holds back deliveries from then on."""

        def add(t: float, eff: Effects) -> None:
            silence = parse_silence(data, f"s{self.silence_seq + 1}", t)  # raises: none stored
            self.silence_seq += 1
            self.silences[silence.id] = silence
            eff.silence = silence
            eff.warnings.extend(self._unmatched(silence))

        return self._op(now, add)

    def expire_silence(self, sid: str, now: float) -> Effects:
        """End a silence now (it stays, expired, for history); what it held back is due."""

        def expire(t: float, eff: Effects) -> None:
            s = self.silences.get(sid)
            if s is None:
                raise SilenceNotFound(sid)
            if s.expired_at is not None and s.expired_at <= t:
                raise SilenceError("id", f"silence {sid!r} has already expired")
            self.silences[sid] = s.expired(t)
            for a in self.book.alarms.values():
                if a.unsilence_at is not None and a.unsilence_at > t:
                    self._set_unsilence(a, t)
            eff.silence = self.silences[sid]

        return self._op(now, expire)

    # ------------------------------------------------------------------ time
    def due(self) -> float | None:
        """The next deadline (a clear, a silence end, an escalation step, a group message, a
        digest), or None."""
        nxt = self._next()
        return None if nxt is None else nxt[0]

    def _next(self) -> tuple[float, int, str] | None:
        while self._heap and not _valid(self, *self._heap[0]):
            heapq.heappop(self._heap)
        top = self._heap[0] if self._heap else None
        self._lo = math.inf if top is None else top[0]
        esc = self.router.due() if self.router is not None else None
        if esc is not None and (top is None or (esc, ESCALATE) < top[:2]):
            return (esc, ESCALATE, "")
        return top

    def advance(self, now: float) -> Effects:
        """Fire every deadline up to ``now`` (inclusive), each at its own time, in order."""
        return self._advance(now, inclusive=True)

    def _advance(self, now: float, inclusive: bool) -> Effects:
        eff, self._carry = self._carry, Effects()
        now = self._now(now)
        while (nxt := self._next()) is not None and (nxt[0] < now or (inclusive and nxt[0] == now)):
            at, kind, key = nxt
            if kind != ESCALATE:
                heapq.heappop(self._heap)
            self.clock = max(self.clock or at, at)
            eff.extend(self._fire(kind, key, at))
        self.clock = now
        return eff

    def prune(self, now: float, keep: float, limit: int = 1000) -> list[Alarm]:
        """Forget at most ``limit`` alarms cleared and acknowledged more than ``keep`` seconds
        before ``now`` (their history stays); the ones forgotten. A later match of such a key
        raises its next occurrence."""
        return self.book.prune(self._now(now) - keep, limit)

    # ------------------------------------------------------------------ state
    def snapshot(self) -> dict[str, Any]:
        """The whole state as a versioned JSON-able record (the service keeps it in Redis)."""
        return {
            "version": VERSION,
            "clock": self.clock,
            "seq": self.book.seq,
            "alarms": {k: a.to_json() for k, a in self.book.alarms.items()},
            "gone": dict(self.book.gone),
            "silence_seq": self.silence_seq,
            "silences": [s.to_json() for s in self.silences.values()],
            "dispatch": self.dispatch.to_json(),
            "stats": {k: dict(v) for k, v in self.stats.items()},
            **({"router": self.router.snapshot()} if self.router is not None else {}),
            "carry": {
                "transitions": [t.to_json() for t in self._carry.transitions],
                "messages": [m.to_json() for m in self._carry.messages],
            },
        }

    @classmethod
    def restore(
        cls,
        snap: Mapping[str, Any],
        alarms: Mapping[str, AlarmSpec],
        policies: Mapping[str, GroupPolicy] | None = None,
        default: GroupPolicy | None = None,
        router: Router | None = None,
    ) -> AlarmRules:
        """The rules of a snapshot; ``router``'s pending steps from it (a snapshot without
        them, or a router that is gone, starts or drops them)."""
        version = snap.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise StateError(
                f"alarm state version {version!r} is newer than this release reads ({VERSION})"
            )
        rules = cls(alarms, policies, default, router)
        if router is not None and "router" in snap:
            router.load(snap["router"])
        _load(rules, snap)
        return rules

    def _unmatched(self, silence: Silence) -> list[str]:
        """The silence's matchers that no known alarm's label value satisfies (stored anyway:
        the alarm may come later, but a typo is likelier)."""
        labels = [a.labels() for a in self.book.alarms.values()]
        return [
            f"silence {silence.id}: matcher {m} matches no current alarm's labels"
            for m in silence.matchers
            if not any(m.matches(lab) for lab in labels)
        ]

    def muted(self, labels: Mapping[str, str], t: float) -> list[Silence]:
        """The silences in force at ``t`` that match these labels."""
        return [s for s in self.silences.values() if s.in_force(t) and s.matches(labels)]

    # ------------------------------------------------------------------ parts
    def _idle_clear(self, profile: str, ts: float, partition: dict[str, Any] | None) -> bool:
        """A clear condition that can change nothing (its alarm is not active, nothing is due
        up to ``ts``): time moves to ``ts``, as the full call would. Every event of a
        registered sensor is one (its `comm-fault` clear, docs/assets.md), and most closed
        windows of a `clear: {on: ...}` alarm: this keeps them cheap."""
        carry = self._carry
        if carry.transitions or carry.messages or carry.warnings:
            return False  # a refused call's effects: the full call returns them
        t = self._now(ts)
        if self._due_by(t, True):
            return False
        a = self.book.alarms.get(alarm_id(profile[: -len(CLEAR_SUFFIX)], partition))
        if a is not None and is_active(a.state):
            return False
        self.clock = t
        return True

    def _now(self, now: float) -> float:
        return now if self.clock is None else max(now, self.clock)

    def _op(
        self, now: float, act: Callable[..., None], *args: Any, into: Effects | None = None
    ) -> Effects:
        """Fire what is due before ``now``, act at ``now`` (``act(t, effects, *args)`` adds
        to the effects), fire what is due at ``now``; the effects, added to ``into`` if given.

        The common call has nothing due and queues at most one notice for a subscriber
        without grouping: that notice is sent at once (`Dispatcher.single`), as its group
        would be by the advance (the same message, number and counts) without a group, a
        timer and a heap round. With several, or anything else due, they go the general way."""
        eff = Effects() if into is None else into
        n_tr, n_msg = len(eff.transitions), len(eff.messages)
        carry = self._carry
        if carry.transitions or carry.messages or carry.warnings or self._due_by(now, False):
            eff.extend(self._advance(now, inclusive=False))
        else:  # `_advance` with nothing to fire: time moves to now
            self.clock = self._now(now)
        t = self._now(now)
        self._instant = []
        try:
            act(t, eff, *args)
        except Exception:  # a refusal: time still passes to t; its effects come with the next call
            self._queue_instants(t)
            mine = Effects(eff.transitions[n_tr:], eff.messages[n_msg:])  # this call's
            del eff.transitions[n_tr:], eff.messages[n_msg:]
            self._carry = mine.extend(self._advance(t, inclusive=True))
            raise
        if len(self._instant) == 1 and not self._due_by(t, True):
            notice, sub = self._instant[0]
            self._instant = None
            self._sent(self.dispatch.single(notice, sub, t), sub, eff)
        else:
            self._queue_instants(t)
        if self._due_by(t, True):
            eff.extend(self.advance(t))
        return eff

    def _due_by(self, t: float, inclusive: bool) -> bool:
        """Whether a deadline falls before ``t`` (or at it, ``inclusive``). ``_lo`` (at most
        the heap's earliest current deadline) answers the common "no" without the heap."""
        if self._lo > t and self.router is None:
            return False
        nxt = self._next()
        return nxt is not None and (nxt[0] < t or (inclusive and nxt[0] == t))

    def _queue_instants(self, t: float) -> None:
        """The notices queued in a call, to their groups (in order, as `_queue` would)."""
        instant, self._instant = self._instant or [], None
        for notice, sub in instant:
            key = self.dispatch.add(notice, sub, t)
            self._timer(FLUSH, key, self.dispatch.groups[key].flush_at)

    def _match(
        self,
        t: float,
        eff: Effects,
        profile: str,
        partition: dict[str, Any] | None,
        events: dict[str, str],
        subscriber: str | None,
    ) -> None:
        if profile.endswith(CLEAR_SUFFIX):
            base = profile[: -len(CLEAR_SUFFIX)]
            spec = self.specs.get(base)
            if spec is None:
                return
            tr = self.book.rule_clear(alarm_id(base, partition), t, _clear_reason(spec, events))
            if tr is not None:
                self._deliver(tr, t, eff)
            return
        spec = self.specs.get(profile)
        if spec is None:
            return
        tr = self.book.match(profile, spec, t, partition, events, subscriber)
        self._timer(CLEAR, tr.alarm, self.book.alarms[tr.alarm].clear_due)
        self._deliver(tr, t, eff)

    def _deliver(self, tr: Transition, t: float, eff: Effects) -> None:
        """Record the transition (in ``eff``); hand it to grouping unless a silence holds it
        back (to the router's subscribers with a router)."""
        self._decide(tr, t)
        eff.transitions.append(tr)
        if self.router is None:
            return
        subs = self.router.transition(tr)
        if tr.delivery == "sent":
            notice = Notice.of(tr)
            for sub in subs:
                self._queue(notice, sub, t)

    def _decide(self, tr: Transition, t: float) -> None:
        """Count the transition and set its delivery (queued to its subscriber without a
        router)."""
        a = self.book.alarms[tr.alarm]
        sub = a.subscriber or ""
        stats = self.stats.get(sub)
        if stats is None:
            stats = self.stats[sub] = Counter()
        stats["transitions"] += 1
        stats[tr.kind] += 1
        spec = self.specs.get(a.profile)
        if spec is None or tr.kind not in spec.notify:
            return
        stats["to_notify"] += 1
        muting = self.muted(tr.labels, t) if self.silences else None
        if muting:
            stats["silenced"] += 1
            if any(s.notify_after for s in muting):
                self._set_unsilence(a, min(s.end_after(t) for s in muting))
            delivered(tr, "silenced")
            return
        a.unsilence_at = None  # delivered now: nothing left to deliver when a silence ends
        if self.router is None:
            self._queue(Notice.of(tr), sub, t)
        delivered(tr, "sent")

    def _queue(self, notice: Notice, sub: str, t: float) -> None:
        stats = self.stats.get(sub)
        if stats is None:
            stats = self.stats[sub] = Counter()
        stats["notices"] += 1
        if self._instant is not None and self.dispatch.policy(sub).group_by is None:
            self._instant.append((notice, sub))  # `_op` sends or queues it after the act
            return
        key = self.dispatch.add(notice, sub, t)
        self._timer(FLUSH, key, self.dispatch.groups[key].flush_at)

    def _set_unsilence(self, a: Alarm, at: float) -> None:
        a.unsilence_at = at
        self._timer(UNSILENCE, a.id, at)

    def _fire(self, kind: int, key: str, at: float) -> Effects:
        eff = Effects()
        if kind == CLEAR:
            a = self.book.alarms[key]
            spec = self.specs.get(a.profile)
            after = f"{spec.clear_after:g}s" if spec and spec.clear_after else "T"
            tr = self.book.rule_clear(key, at, f"no match for {after}")
            if tr is not None:
                self._deliver(tr, at, eff)
        elif kind == UNSILENCE:
            _unsilence(self, self.book.alarms[key], at)
        elif kind == ESCALATE:
            _escalate(self, at)
        elif kind == FLUSH:
            sub = self.dispatch.groups[key].subscriber
            self._sent(self.dispatch.flush(key, at), sub, eff)
        else:
            self._sent(self.dispatch.digest(key, at), key, eff)
        return eff

    def _sent(self, msg: Message | None, sub: str, eff: Effects) -> None:
        """Count a message (into ``eff``); a flush the cap held back (or a digest put off)
        sets the digest."""
        self._timer(DIGEST, sub, self.dispatch.outlets[sub].digest_at)
        if msg is None:
            return
        stats = self.stats.get(msg.subscriber)
        if stats is None:
            stats = self.stats[msg.subscriber] = Counter()
        stats["messages"] += 1
        if msg.kind == "digest":
            stats["digests"] += 1
            stats["overflow"] += msg.overflow
        eff.messages.append(msg)

    def _timer(self, kind: int, key: str, at: float | None) -> None:
        if at is not None:
            heapq.heappush(self._heap, (at, kind, key))
            if at < self._lo:
                self._lo = at


def _load(rules: AlarmRules, snap: Mapping[str, Any]) -> None:
    """`AlarmRules.restore`'s state: the snapshot's alarms, silences, queues, counts and
    carried effects, and the timers they hold."""
    rules.clock = snap["clock"]
    rules.book.seq = snap["seq"]
    rules.book.alarms = {k: Alarm.from_json(a) for k, a in snap["alarms"].items()}
    rules.book.gone = dict(snap.get("gone", {}))
    rules.book.reindex()
    rules.silence_seq = snap["silence_seq"]
    rules.silences = {s["id"]: Silence.from_json(s) for s in snap["silences"]}
    rules.dispatch.load(snap["dispatch"])
    rules.stats = {k: Counter(v) for k, v in snap["stats"].items()}
    carry = snap.get("carry", {})
    rules._carry = Effects(
        [Transition.from_json(t) for t in carry.get("transitions", [])],
        [Message.from_json(m) for m in carry.get("messages", [])],
    )
    for a in rules.book.alarms.values():
        rules._timer(CLEAR, a.id, a.clear_due)
        rules._timer(UNSILENCE, a.id, a.unsilence_at)
    for k, g in rules.dispatch.groups.items():
        rules._timer(FLUSH, k, g.flush_at)
    for s, o in rules.dispatch.outlets.items():
        rules._timer(DIGEST, s, o.digest_at)


def _escalate(rules: AlarmRules, at: float) -> Effects:
    """The router's steps due at ``at``: a notice to each subscriber they reach, for an
    alarm still active and unacknowledged and not silenced (then counted, not sent)."""
    assert rules.router is not None
    for step, occ, due, subs in rules.router.advance(at):
        aid, _, n = occ.rpartition(".")
        a = rules.book.alarms.get(aid)
        if a is None or str(a.occurrence) != n or a.state != "active-unacknowledged":
            continue  # the router stops on ack and clear: a snapshot of an older build
        stats = rules.stats.setdefault(a.subscriber or "", Counter())
        stats["escalations"] += 1
        if rules.muted(a.labels(), due):
            stats["silenced"] += 1
            continue
        notice = Notice(
            "escalation", a.id, a.occurrence, step, due, a.state, a.severity, a.count,
            a.first_seen, a.last_seen, a.labels(),
        )  # fmt: skip
        for sub in subs:
            rules._queue(notice, sub, due)
    return Effects()


def _quick(
    rules: AlarmRules,
    profile: str,
    ts: float,
    partition: dict[str, Any] | None,
    events: dict[str, str],
    subscriber: str | None,
    eff: Effects,
) -> bool:
    """`_op` of `_match` the short way for the common matches — a raise, a repeat, a clear
    condition of an active alarm — when nothing is due up to ``ts``, no refused call left
    effects, there is no router, and the transition is not delivered or is delivered alone
    at once (no silence exists, its subscriber has no grouping): the same transition, timer,
    counts and message (into ``eff``) without the general call's rounds. False (nothing
    done): take the general way."""
    carry = rules._carry
    if carry.transitions or carry.messages or carry.warnings or rules.router is not None:
        return False
    t = rules._now(ts)
    if rules._lo <= t:
        return False
    book = rules.book
    if profile.endswith(CLEAR_SUFFIX):
        spec = rules.specs.get(profile[: -len(CLEAR_SUFFIX)])
        if spec is None:
            return False
        a = book.alarms.get(alarm_id(profile[: -len(CLEAR_SUFFIX)], partition))
        if a is None or not is_active(a.state) or not _alone(rules, spec, "clear", a.subscriber):
            return False
        rules.clock = t
        tr = book.rule_clear(a.id, t, _clear_reason(spec, events))
        assert tr is not None  # the alarm is active
    else:
        spec = rules.specs.get(profile)
        if spec is None or (spec.clear_after is not None and spec.clear_after <= 0):
            return False  # (its clear would be due at t)
        a = book.alarms.get(alarm_id(profile, partition))
        if a is not None and is_active(a.state):
            if not _alone(rules, spec, "repeat", a.subscriber):
                return False
            rules.clock = t
            tr = book.repeat(a, spec, t, events)
        else:
            if not _alone(rules, spec, "raise", subscriber):
                return False
            rules.clock = t
            tr = book.match(profile, spec, t, partition, events, subscriber)
            a = book.alarms[tr.alarm]
        rules._timer(CLEAR, a.id, a.clear_due)
    _quick_decide(rules, tr, a, spec, t, eff)
    return True


def _clear_reason(spec: AlarmSpec, events: Mapping[str, str]) -> str:
    """Why a `P#clear` match cleared P's alarm (history's reason)."""
    if spec.clear == "after":  # the temporal pool's `absent` terminator
        return f"no match for {spec.clear_after:g}s"
    return "clear condition: event " + ", ".join(events.values())


def _alone(rules: AlarmRules, spec: AlarmSpec, kind: str, subscriber: str | None) -> bool:
    """Whether a ``kind`` transition is not delivered, or delivered alone at once."""
    if kind not in spec.notify:
        return True
    return not rules.silences and rules.dispatch.policy(subscriber or "").group_by is None


def _quick_decide(
    rules: AlarmRules, tr: Transition, a: Alarm, spec: AlarmSpec, t: float, eff: Effects
) -> None:
    """`_decide`, then `_op`'s message, for `_quick`'s transition (no silence, no grouping)."""
    sub = a.subscriber or ""
    stats = rules.stats.get(sub)
    if stats is None:
        stats = rules.stats[sub] = Counter()
    stats["transitions"] += 1
    stats[tr.kind] += 1
    eff.transitions.append(tr)
    if tr.kind not in spec.notify:
        return
    stats["to_notify"] += 1
    a.unsilence_at = None
    stats["notices"] += 1  # `_queue`'s
    tr.delivery = "sent"
    rules._sent(rules.dispatch.single(Notice.of(tr), sub, t), sub, eff)
    if rules._lo <= t and rules._due_by(t, True):  # a digest the cap set for now
        eff.extend(rules.advance(t))


def _unsilence(rules: AlarmRules, a: Alarm, at: float) -> Effects:
    a.unsilence_at = None
    muting = rules.muted(a.labels(), at)
    if muting:
        rules._set_unsilence(a, min(s.end_after(at) for s in muting))
        return Effects()
    if not is_active(a.state):
        return Effects()
    sub = a.subscriber or ""
    rules.stats.setdefault(sub, Counter())["unsilenced"] += 1
    notice = Notice(
        "unsilenced", a.id, a.occurrence, None, at, a.state, a.severity, a.count,
        a.first_seen, a.last_seen, a.labels(),
    )  # fmt: skip
    subs = (
        [sub]
        if rules.router is None
        else rules.router.route(
            "raise" if a.state == "active-unacknowledged" else "ack",
            a.labels(),
            at,
            a.occurrence_id,
        )
    )
    for s in subs:
        rules._queue(notice, s, at)
    return Effects()


def _valid(rules: AlarmRules, at: float, kind: int, key: str) -> bool:
    """A heap entry is current if the state still holds that deadline (lazy deletion)."""
    if kind == CLEAR or kind == UNSILENCE:
        a = rules.book.alarms.get(key)
        if a is None:
            return False
        return (a.clear_due if kind == CLEAR else a.unsilence_at) == at
    if kind == FLUSH:
        g = rules.dispatch.groups.get(key)
        return g is not None and g.flush_at == at and bool(g.pending)
    o = rules.dispatch.outlets.get(key)
    return o is not None and o.digest_at == at
