"""Events (docs/language.md §1): flat JSON objects with a `ts`, an optional `id` and scalar attributes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from profiles.errors import EventError
from profiles.timeofday import MARK, visible

Scalar = str | int | float | bool

# Epoch seconds above this are year 5138+: a number this large is almost surely epoch
# milliseconds (1.7e12 today), which would otherwise land events in the year ~56000.
MAX_EPOCH_SECONDS = 1e11


@dataclass(slots=True)
class Event:
    """One event. `attrs` excludes `id` and `ts`; absent (`null`) attributes are simply missing."""

    id: str
    ts: float
    attrs: dict[str, Scalar] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The event as it came: without the `localtime`/`weekday` keys an engine adds (last,
        `filters.localclock`), so only the last key needs a look in the usual case."""
        attrs = self.attrs
        if attrs and next(reversed(attrs)).startswith(MARK):
            attrs = visible(attrs)
        return {"id": self.id, "ts": self.ts, **attrs}


def parse_ts(value: Any) -> float:
    """RFC 3339 with a zone offset, or epoch seconds, to float epoch seconds."""
    if isinstance(value, bool):
        raise ValueError(
            "ts must be an RFC 3339 string or a number of epoch seconds, not a boolean"
        )
    if isinstance(value, (int, float)):
        ts = float(value)
        if not math.isfinite(ts):
            raise ValueError("ts must be a finite number")
        if abs(ts) > MAX_EPOCH_SECONDS:
            if abs(ts) <= MAX_EPOCH_SECONDS * 1000:
                raise ValueError(
                    f"ts {value!r} looks like epoch milliseconds; send seconds (e.g. {ts / 1000:.3f})"
                )
            raise ValueError(
                f"ts {value!r} is out of range (epoch seconds, at most {MAX_EPOCH_SECONDS:g})"
            )
        return ts
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(
                f"ts {value!r} is not an RFC 3339 time (e.g. 2024-03-01T22:15:00Z)"
            ) from None
        if dt.tzinfo is None:
            raise ValueError(f"ts {value!r} has no zone offset (add Z or e.g. +01:00)")
        return dt.timestamp()
    raise ValueError(f"ts must be an RFC 3339 string or epoch seconds, got {type(value).__name__}")


def event_from_obj(obj: Any, default_id: str) -> Event:
    """Validate a decoded JSON object; raise ValueError naming the offending key."""
    if not isinstance(obj, dict):
        raise ValueError(f"an event must be a JSON object, got {type(obj).__name__}")
    if "ts" not in obj or obj["ts"] is None:
        raise ValueError("missing required key 'ts'")
    ts = parse_ts(obj["ts"])
    ev_id = obj.get("id")
    if ev_id is None:
        ev_id = default_id
    elif not isinstance(ev_id, str):
        raise ValueError(f"key 'id' must be a string, got {type(ev_id).__name__}")
    attrs: dict[str, Scalar] = {}
    for key, value in obj.items():
        if key == "ts" or key == "id" or value is None:
            continue
        if isinstance(value, (dict, list)):
            raise ValueError(
                f"key {key!r} holds a nested {'object' if isinstance(value, dict) else 'array'}; "
                f"events are flat (flatten it, e.g. {key}.x)"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"key {key!r} is not a finite number")
        attrs[key] = value
    return Event(ev_id, ts, attrs)


def event_from_normalized(obj: dict[str, Any], default_id: str) -> Event:
    """An event the service's API has validated and normalized (`ts` a number of epoch
    seconds, `id` a string if present, no nulls, scalar values): built without checking again.

    Takes ``obj`` over (its `id` and `ts` are removed). Raises TypeError or KeyError when ``obj``
    is not of that form, so a caller can fall back to `event_from_obj`.
    """
    ts = obj["ts"]
    if type(ts) is not float and type(ts) is not int:
        raise TypeError("ts is not a number")
    del obj["ts"]
    ev_id = obj.pop("id", None)
    return Event(default_id if ev_id is None else ev_id, float(ts), obj)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_event_line(line: str, lineno: int, source: str | None = None) -> Event:
    """One JSON line as an Event; errors are located as `SOURCE, line N[, column C]`.

    The words "line N" are part of the contract (conformance case 20-error-event).
    """
    where = f"{source}, line {lineno}" if source else f"line {lineno}"
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
        return event_from_obj(obj, f"#{lineno}")
    except json.JSONDecodeError as e:
        # the column is 1-based in characters of the line, as editors count it
        raise EventError(f"invalid JSON: {e.msg}", f"{where}, column {e.colno}") from None
    except ValueError as e:
        raise EventError(str(e), where) from None


def iter_event_lines(
    lines: Iterable[str], source: str | None = None
) -> Iterator[Event | EventError]:
    """Events of a JSON-lines stream (blank lines skipped); bad lines come back as EventError."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield parse_event_line(line, lineno, source)
        except EventError as e:
            yield e


def read_events(
    lines: Iterable[str], max_errors: int = 20, source: str | None = None
) -> list[Event]:
    """All events of a stream, or EventErrors for (up to `max_errors`) bad lines.

    `source` (a file name) makes the errors read `FILE, line N, column C: message`.
    """
    from profiles.errors import ManyErrors

    events: list[Event] = []
    errors: list[EventError] = []
    for item in iter_event_lines(lines, source):
        if isinstance(item, EventError):
            errors.append(item)
            if len(errors) >= max_errors:
                break
        else:
            events.append(item)
    if errors:
        if len(errors) == 1:
            raise errors[0]
        raise ManyErrors(list(errors))
    return events
