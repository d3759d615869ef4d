"""The body of `POST /v1/events`: read within its size and time limits (413, 408), split
into events (a JSON object, an array, or JSON lines) and each checked, so that one bad event
is rejected alone and never fails the batch."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import Request
from starlette.exceptions import HTTPException

from adapters.errors import BadEvent, ForeignGateway, TsOutOfWindow
from adapters.service import metrics as m
from adapters.service.records import GATEWAY_ATTR
from adapters.service.routes.base import IngestLimits
from notifiers import store
from profiles.events import Event

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonl"}
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_TOO_DEEP = "JSON nested too deeply (events are flat objects)"


class LongNumber:
    """A JSON integer over Python's int-str conversion limit (4300 digits): json.loads would
    raise ValueError for the whole body; it is kept as this marker and rejects its event only."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def _parse_int(text: str) -> int | LongNumber:
    try:
        return int(text)
    except ValueError:
        return LongNumber(text)


def _reject_long_numbers(data: Any) -> Any:
    """Events (top-level objects, or the objects of a top-level array) holding a LongNumber
    are replaced by a BadEvent naming the key."""
    if isinstance(data, list):
        return [_reject_long_numbers(x) if isinstance(x, dict) else x for x in data]
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, LongNumber):
                return BadEvent(
                    f"key {key!r}: a number of {value.digits} digits is too long "
                    f"(at most {sys.get_int_max_str_digits()})",
                    data,
                )
    return data


# 19 digits in a row may be an integer beyond 64 bits, which orjson would read as a float
_LONG_DIGITS = re.compile(r"[0-9]{19}")


def loads_body(text: str, short_numbers: bool | None = None) -> Any:
    """json.loads for request bodies: NaN/Infinity rejected; a nesting deep enough to exhaust
    the parser's recursion (``[`` x 100000) is a ValueError, not a RecursionError (a 500);
    an event with an over-long integer becomes a BadEvent (`loads_body_stdlib`).

    orjson reads first (a fifth of the standard library's time per event): what it accepts
    the standard library reads the same (a hypothesis test compares them). Anything it
    refuses (NaN, ``1e400``, lone surrogates, deep nesting, bad JSON) and any long digit run
    goes to the standard library, so values and error messages stay the standard library's.
    ``short_numbers``: the caller checked the whole body for long digit runs (None: check).
    """
    if short_numbers is None:
        short_numbers = _LONG_DIGITS.search(text) is None
    if short_numbers:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return loads_body_stdlib(text)


def loads_body_stdlib(text: str) -> Any:
    """`loads_body` by the standard library alone (its reference): an over-long integer is
    parsed again only when the common path fails on one, keeping the C int conversion."""
    try:
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError) or "integer string" not in str(exc):
                raise
        data = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    return _reject_long_numbers(data)


def may_hold_surrogates(body: bytes) -> bool:
    """Whether check_values is needed: a lone surrogate can only come from a ``\\u``
    escape (the UTF-8 decoder refuses encoded surrogates), so most bodies skip it."""
    return b"\\u" in body


def check_values(obj: Any) -> None:
    """Raise ValueError naming the key whose key or string value holds a lone surrogate.

    JSON may escape one (``"\\ud800"``); Python decodes it, but it cannot be encoded as
    UTF-8 for Redis, and failing there would lose the whole batch.
    """
    if not isinstance(obj, dict):
        return
    for key, value in obj.items():
        for text in (key, value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ValueError(
                        f"key {key!r}: lone surrogate {text[exc.start]!r} at position "
                        f"{exc.start} is not valid Unicode"
                    ) from None


def _iso(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):  # beyond the years datetime can show
        return f"{ts:g}"


def check_ts_window(ts: float, now: float, limits: IngestLimits) -> None:
    """Reject a ts far from the wall clock: one far-future event would move engine time for
    good (every later event late, wall-clock timers stalled), and it survives restarts."""
    if limits.max_future is not None and ts - now > limits.max_future:
        raise TsOutOfWindow(
            f"ts {_iso(ts)} is {ts - now:.0f} s ahead of the server clock "
            f"(at most {limits.max_future:g} s: --max-future)",
            "future",
        )
    if limits.max_past is not None and now - ts > limits.max_past:
        raise TsOutOfWindow(
            f"ts {_iso(ts)} is {now - ts:.0f} s behind the server clock "
            f"(at most {limits.max_past:g} s: --max-past, 'off' for backfills)",
            "past",
        )


def check_gateway(obj: dict[str, Any], gateway: str) -> None:
    """Refuse an event that names another gateway than its API key's: `GATEWAY_ATTR` is the
    service's (every event is stamped with its gateway when read), and a body that could set it
    could fire another gateway's profiles. Its own name, or null, is harmless and accepted."""
    value = obj.get(GATEWAY_ATTR)
    if value is not None and value != gateway:
        raise ForeignGateway(
            f"key {GATEWAY_ATTR!r} is reserved: the service sets it to the gateway of the "
            f"API key ({gateway!r}); remove it from the event (got {value!r})",
            value,
        )


def normalized_json(obj: dict[str, Any], ev: Event) -> tuple[str, bool]:
    """A validated event as the ingest stream stores it, and whether orjson may read it back.

    Normalized (``ts`` in epoch seconds, nulls dropped; ``id`` only if the event had one, so
    the worker gives the others their ingest key), the engine worker builds the event without
    validating it again (`event_from_normalized`). orjson would read an integer beyond 64 bits
    back as a float, so such an event is written by the standard library and flagged.
    """
    norm = (
        {"id": obj["id"], "ts": ev.ts, **ev.attrs}
        if obj.get("id") is not None
        else {"ts": ev.ts, **ev.attrs}
    )
    return store.encode(norm)


def error_id(obj: Any) -> str | None:
    """The `id` to name a rejected event by in the 422, when it has a usable one (not one
    with a lone surrogate, which the answer could not encode)."""
    if isinstance(obj, BadEvent):
        obj = obj.obj
    eid = obj.get("id") if isinstance(obj, dict) else None
    if isinstance(eid, bool) or not isinstance(eid, str | int):
        return None
    try:
        text = str(eid)  # ValueError: an int over Python's 4300-digit limit
        text.encode("utf-8")  # UnicodeEncodeError (a ValueError): a lone surrogate
    except ValueError:
        return None
    return text


def parse_batch(body: bytes, content_type: str) -> tuple[list[tuple[int, int | None, Any]], str]:
    """Split a body into (index, line, decoded object or ValueError); or an error for 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], f"body is not UTF-8: {exc.reason} at byte {exc.start}"
    if content_type in NDJSON_TYPES:
        items: list[tuple[int, int | None, Any]] = []
        short = _LONG_DIGITS.search(text) is None  # once per body, not per line
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj: Any = loads_body(line, short)
            except json.JSONDecodeError as exc:
                obj = ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}")
            except ValueError as exc:
                obj = exc
            items.append((len(items), lineno, obj))
        if not items:
            return [], "empty body: send one JSON event per line"
        return items, ""
    if not text.strip():
        return [], "empty body: send a JSON object, a JSON array or JSON lines"
    try:
        data = loads_body(text)
    except json.JSONDecodeError as exc:
        hint = (
            " (JSON lines need Content-Type: application/x-ndjson)"
            if "Extra data" in exc.msg
            else ""
        )
        return [], f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}{hint}"
    except ValueError as exc:
        return [], f"invalid JSON: {exc}"
    if isinstance(data, dict | BadEvent):
        return [(0, None, data)], ""
    if isinstance(data, list):
        return [(i, None, obj) for i, obj in enumerate(data)], ""
    return [], f"expected a JSON object or array of objects, got {type(data).__name__}"


_DRAIN_MAX = 8 << 20  # of a rejected body, read (and drop) up to this much before answering 413
_DRAIN_IDLE = 0.2  # s: a client that sends nothing meanwhile waits for the answer


async def _too_big(
    request: Request, message: str, read: int, chunks: AsyncIterator[bytes] | None = None
) -> HTTPException:
    """413 for a body over the limit, after draining what the client is still sending.

    Answering while the client is still sending and closing makes its TCP stack reset the
    connection, and the client then sees "connection reset" instead of the 413. Draining
    stops after _DRAIN_MAX bytes, or once the client pauses for _DRAIN_IDLE (one that sent
    only the headers of a large Content-Length gets its 413 at once).
    """
    m.REQUESTS.labels(status="413").inc()
    if chunks is None:
        chunks = request.stream().__aiter__()
    while read <= _DRAIN_MAX:
        try:
            read += len(await asyncio.wait_for(anext(chunks), _DRAIN_IDLE))
        except (StopAsyncIteration, TimeoutError):
            break
    return HTTPException(413, message, headers={"Connection": "close"})


async def _read_limited(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to be too big (never buffers more than limit)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        msg = f"body of {declared} bytes exceeds the limit of {limit} bytes"
        if int(declared) > _DRAIN_MAX:  # not worth reading: answer now
            m.REQUESTS.labels(status="413").inc()
            raise HTTPException(413, msg, headers={"Connection": "close"})
        raise await _too_big(request, msg, 0)
    chunks: list[bytes] = []
    size = 0
    stream = request.stream().__aiter__()  # drained further by _too_big: a second stream()
    async for chunk in stream:  # raises "Stream consumed" once the last chunk came in
        size += len(chunk)
        if size > limit:
            msg = f"body exceeds the limit of {limit} bytes"
            raise await _too_big(request, msg, size, stream)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, limit: int, timeout: float | None) -> bytes:
    """The body within ``timeout`` seconds, else 408: a client that sends half a body and
    stalls must not hold a connection (and its buffers) open for ever."""
    try:
        async with asyncio.timeout(timeout):
            return await _read_limited(request, limit)
    except TimeoutError:
        m.REQUESTS.labels(status="408").inc()
        raise HTTPException(
            408, f"request body not received within {timeout:g} s", headers={"Connection": "close"}
        ) from None
