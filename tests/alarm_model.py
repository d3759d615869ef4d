"""A deliberately simple reference for the alarm rules (tests/test_alarms_property.py).

Written apart from notifiers/alarms: plain dicts, integer time, and a clock that ticks every
second, checking everything at every tick (no deadlines, no heap). The rules it implements are
those of docs/alarms.md; where they leave a choice (the order of things due at one instant)
it follows the documented order: clears, ended silences, group messages, digests.
"""

from __future__ import annotations

import re
from typing import Any

from notifiers.alarms import alarm_id
from profiles.alarm import AlarmSpec

HOUR = 100  # the cap's window in this test (GroupPolicy.cap_window)


class ModelError(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind  # "not-found" | "conflict" | "silence"


def matcher_ok(m: str, labels: dict[str, str]) -> bool:
    label, op, value = re.fullmatch(r"(\w+)(=~|!~|!=|=)(.*)", m).groups()  # type: ignore[union-attr]
    got = labels.get(label, "")
    if op == "=":
        return got == value
    if op == "!=":
        return got != value
    hit = re.fullmatch(value, got) is not None
    return hit if op == "=~" else not hit


class Model:
    def __init__(self, specs: dict[str, AlarmSpec], policies: dict[str, dict[str, Any]]) -> None:
        self.specs, self.policies = specs, policies
        self.now: int | None = None
        self.alarms: dict[str, dict[str, Any]] = {}
        self.silences: list[dict[str, Any]] = []
        self.groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.sent: dict[str, list[int]] = {}
        self.overflow: dict[str, list[dict[str, Any]]] = {}
        self.digest_at: dict[str, int | None] = {}
        self.singles = 0
        self.transitions: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- time
    def run_to(self, t: int) -> None:
        start = t if self.now is None else self.now + 1
        for tick in range(start, t + 1):
            self.tick(tick)
        self.now = t if self.now is None else max(self.now, t)

    def tick(self, t: int) -> None:
        while True:
            changed = False
            for aid in sorted(self.alarms):
                a = self.alarms[aid]
                spec = self.specs[a["profile"]]
                if a["active"] and spec.clear == "after" and a["last"] + spec.clear_after <= t:
                    self._clear(a, t, "rule")
                    changed = True
            for aid in sorted(self.alarms):
                a = self.alarms[aid]
                if a["flag"] and not self._muting(a, t):
                    a["flag"] = False
                    if a["active"]:
                        self._notice(a, t, "unsilenced")
                    changed = True
            for key in sorted(self.groups):
                g = self.groups[key]
                if g["pending"] and g["flush_at"] <= t:
                    items, g["pending"], g["last"] = g["pending"], [], t
                    kind = "group" if self.policies[g["sub"]]["group_by"] is not None else "single"
                    self._send(g["sub"], t, kind, g["labels"], items)
                    changed = True
            for sub in sorted(self.digest_at):
                if self.digest_at[sub] is not None and self.digest_at[sub] <= t:  # type: ignore[operator]
                    window = [s for s in self.sent[sub] if s > t - HOUR]
                    if len(window) >= self.policies[sub]["cap"]:
                        self.digest_at[sub] = min(window) + HOUR
                    else:
                        items, self.overflow[sub] = self.overflow[sub], []
                        self.digest_at[sub] = None
                        self.sent[sub].append(t)
                        self.messages.append(self._msg(sub, t, "digest", {}, items, len(items)))
                    changed = True
            if not changed:
                return

    # ---------------------------------------------------------------- inputs
    def op(self, t: int, fn: Any, *args: Any) -> None:
        """Time passes up to just before ``t``; the act; then what is due at ``t``."""
        if self.now is None or self.now < t - 1:
            self.run_to(t - 1)
        t = max(t, self.now or t)
        try:
            fn(t, *args)
        finally:
            self.tick(t)
            self.now = t

    def match(self, t: int, profile: str, part: dict[str, str], sub: str) -> None:
        if profile.endswith("#clear"):
            base = profile[: -len("#clear")]
            a = self.alarms.get(alarm_id(base, part))
            if a is not None and a["active"]:
                self._clear(a, t, "rule")
            return
        aid = alarm_id(profile, part)
        a = self.alarms.get(aid)
        if a is not None and a["active"]:
            before = self._state(a)
            a["count"] += 1
            a["last"] = t
            self._record(a, "repeat", t, "rule", before)
            return
        occ = a["occ"] + 1 if a is not None else 1
        a = {
            "id": aid, "profile": profile, "part": part, "sub": sub, "occ": occ,
            "active": True, "acked": False, "count": 1, "first": t, "last": t, "flag": False,
        }  # fmt: skip
        self.alarms[aid] = a
        self._record(a, "raise", t, "rule", None)

    def _find(self, ref: str) -> dict[str, Any]:
        aid, _, occ = ref.partition(".")
        a = self.alarms.get(aid)
        if a is None or (occ and int(occ) > a["occ"]):
            raise ModelError("not-found")
        if occ and int(occ) != a["occ"]:
            raise ModelError("conflict")
        return a

    def ack(self, t: int, ref: str, actor: str) -> None:
        a = self._find(ref)
        if a["acked"]:
            raise ModelError("conflict")
        before = self._state(a)
        a["acked"] = True
        self._record(a, "ack", t, actor, before)

    def clear(self, t: int, ref: str, actor: str) -> None:
        a = self._find(ref)
        if not a["active"]:
            raise ModelError("conflict")
        self._clear(a, t, actor)

    def add_silence(
        self, t: int, matchers: list[str], start: int, length: int, after: bool
    ) -> None:
        self.silences.append(
            {"id": f"s{len(self.silences) + 1}", "m": matchers, "start": start,
             "end": start + length, "after": after, "expired": None}
        )  # fmt: skip

    def expire(self, t: int, sid: str) -> None:
        for s in self.silences:
            if s["id"] == sid:
                if s["expired"] is not None:
                    raise ModelError("silence")
                s["expired"] = t
                return
        raise ModelError("silence")

    # ---------------------------------------------------------------- parts
    @staticmethod
    def _state(a: dict[str, Any]) -> str:
        return ("active-" if a["active"] else "cleared-") + (
            "acknowledged" if a["acked"] else "unacknowledged"
        )

    def _labels(self, a: dict[str, Any]) -> dict[str, str]:
        return {
            **a["part"], "profile": a["profile"],
            "severity": self.specs[a["profile"]].severity, "subscriber": a["sub"],
        }  # fmt: skip

    def _muting(self, a: dict[str, Any], t: int) -> list[dict[str, Any]]:
        labels = self._labels(a)
        return [
            s
            for s in self.silences
            if s["start"] <= t < s["end"]
            and (s["expired"] is None or t < s["expired"])
            and all(matcher_ok(m, labels) for m in s["m"])
        ]

    def _clear(self, a: dict[str, Any], t: int, actor: str) -> None:
        before = self._state(a)
        a["active"] = False
        self._record(a, "clear", t, actor, before)

    def _record(self, a: dict[str, Any], kind: str, t: int, actor: str, before: str | None) -> None:
        delivery = "none"
        if kind in self.specs[a["profile"]].notify:
            muting = self._muting(a, t)
            if muting:
                delivery = "silenced"
                if any(s["after"] for s in muting):
                    a["flag"] = True
            else:
                delivery = "sent"
                a["flag"] = False
        self.transitions.append(
            {"kind": kind, "alarm": a["id"], "occurrence": a["occ"], "ts": t, "actor": actor,
             "before": before, "after": self._state(a), "count": a["count"],
             "first_seen": a["first"], "last_seen": a["last"], "delivery": delivery}
        )  # fmt: skip
        if delivery == "sent":
            self._notice(a, t, kind)

    def _notice(self, a: dict[str, Any], t: int, kind: str) -> None:
        sub = a["sub"]
        pol = self.policies[sub]
        n = {"kind": kind, "alarm": a["id"], "occurrence": a["occ"], "state": self._state(a)}
        if pol["group_by"] is None:
            self.singles += 1
            key: tuple[Any, ...] = (sub, self.singles)
            labels: dict[str, str] = {}
            wait = interval = 0
        else:
            labels = {k: self._labels(a).get(k, "") for k in pol["group_by"]}
            key = (sub, tuple(sorted(labels.items())))
            wait, interval = pol["wait"], pol["interval"]
        g = self.groups.setdefault(
            key, {"sub": sub, "labels": labels, "pending": [], "flush_at": None, "last": None}
        )
        if not g["pending"]:
            if g["last"] is None or t >= g["last"] + interval:
                g["flush_at"] = t + wait
            else:
                g["flush_at"] = g["last"] + interval
        g["pending"].append(n)

    def _send(self, sub: str, t: int, kind: str, labels: dict[str, str], items: list[Any]) -> None:
        cap = self.policies[sub]["cap"]
        self.sent.setdefault(sub, [])
        self.overflow.setdefault(sub, [])
        self.digest_at.setdefault(sub, None)
        window = [s for s in self.sent[sub] if s > t - HOUR]
        if cap is not None and (self.overflow[sub] or len(window) >= cap):
            self.overflow[sub].extend(items)
            if self.digest_at[sub] is None:
                self.digest_at[sub] = min(window) + HOUR if len(window) >= cap else t
            return
        self.sent[sub].append(t)
        self.messages.append(self._msg(sub, t, kind, labels, items, 0))

    @staticmethod
    def _msg(
        sub: str, t: int, kind: str, labels: dict[str, str], items: list[Any], overflow: int
    ) -> dict[str, Any]:
        return {"subscriber": sub, "ts": t, "kind": kind, "group": dict(labels),
                "notices": list(items), "overflow": overflow}  # fmt: skip
