"""Sample outbox records of every kind of message, for `ens subscriber preview` and the tests.

The shapes are those the service writes: a profile's notification (`store.enqueue`) and an
alarm message (docs/alarms.md: ``alarm`` with the first notice's fields, the message kind and
every notice), one per transition (raise, repeat, ack, clear) and a grouped and a capped
(digest) message of several alarms.
"""

from __future__ import annotations

from typing import Any

KINDS: tuple[str, ...] = ("notification", "raise", "repeat", "ack", "clear", "group", "digest")

_TS = 1709331005.0  # 2024-03-01 22:10:05 UTC
_STATE = {
    "raise": "active-unacknowledged",
    "repeat": "active-unacknowledged",
    "ack": "active-acknowledged",
    "clear": "cleared-acknowledged",
}


def _notice(transition: str, aid: str, room: str, count: int, subscriber: str) -> dict[str, Any]:
    return {
        "transition_kind": transition,
        "alarm": aid,
        "occurrence": 1,
        "transition": f"{aid}:1:{count}",
        "ts": _TS,
        "state": _STATE[transition],
        "severity": "major",
        "count": count,
        "first_seen": _TS - 600,
        "last_seen": _TS,
        "labels": {
            "profile": "door-open",
            "severity": "major",
            "subscriber": subscriber,
            "room": room,
        },
        "acknowledge": {
            "command": f"ens alarms ack {aid}",
            "http": f"POST /v1/alarms/{aid}/ack",
        },
    }


def sample(kind: str, subscriber: str = "ops") -> dict[str, Any]:
    """The outbox record of one sample message of ``kind`` (one of `KINDS`) for ``subscriber``."""
    if kind == "notification":
        return {
            "id": "n-000042",
            "profile": "door-open",
            "subscriber": subscriber,
            "ts": _TS,
            "events": {
                "a": {"id": "e1", "ts": _TS - 15, "kind": "door", "room": "101", "state": "open"},
                "b": {"id": "e2", "ts": _TS, "kind": "motion", "room": "101", "level": 3},
            },
            "partition": {"room": "101"},
        }
    if kind not in KINDS:
        raise ValueError(f"unknown sample {kind!r} (known: {', '.join(KINDS)})")
    if kind in _STATE:
        notices = [_notice(kind, "a1b2c3", "101", 1 if kind == "raise" else 3, subscriber)]
    else:
        rooms = ("101", "102", "215")
        notices = [
            _notice("raise", f"a{i}f{i}e{i}", room, 1, subscriber) for i, room in enumerate(rooms)
        ]
    msg_kind = kind if kind in ("group", "digest") else "single"
    alarm: dict[str, Any] = dict(notices[0])
    alarm.update(
        message=f"m-{kind}",
        message_kind=msg_kind,
        group={"room": "101"} if kind == "group" else {},
        overflow=2 if kind == "digest" else 0,
        notices=notices,
    )
    single = msg_kind == "single"
    return {
        "id": notices[0]["transition"] if single else f"msg:1:m-{kind}",
        "profile": "door-open",
        "subscriber": subscriber,
        "ts": _TS,
        "events": {},
        "alarm": alarm,
    }
