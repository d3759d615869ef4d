"""`POST /v1/events`: gateways' events, validated one by one and appended to the ingest
stream in one atomic script before the answer (202, or 422 listing the rejected ones)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.routes.base import (
    STORE_RETRY_AFTER,
    ApiSettings,
    ErrorOut,
    IngestLimits,
    too_busy,
)
from adapters.service.routes.gateways import Gateway, key_refused
from notifiers import store
from profiles.errors import BadEvent, TsOutOfWindow
from profiles.events import Event, event_from_obj

log = logging.getLogger("ens.service.api")
router = APIRouter()

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonl"}
)


class EventErrorOut(BaseModel):
    index: int = Field(description="0-based position of the event in the batch")
    line: int | None = Field(default=None, description="1-based line (JSON-lines bodies)")
    id: str | None = Field(default=None, description="the event's `id`, when it has a usable one")
    error: str


class IngestResult(BaseModel):
    accepted: int = Field(
        description="events appended to the ingest stream (durable), "
        "including duplicates of events accepted before"
    )
    duplicates: int | None = Field(
        default=None,
        description="of the accepted, events whose id "
        "this gateway sent within --dedup-window: stored once, not "
        "again (absent when none)",
    )
    rejected: int
    errors: list[EventErrorOut] = Field(default_factory=list)


_EVENTS_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "oneOf": [
                    {"type": "object", "description": "one event"},
                    {"type": "array", "items": {"type": "object"}, "description": "a batch"},
                ]
            },
            "example": {
                "id": "e7",
                "ts": "2024-03-01T22:15:00Z",
                "room": "273",
                "kind": "temperature",
                "value": 31.5,
            },
        },
        "application/x-ndjson": {
            "schema": {"type": "string", "description": "one JSON event per line"}
        },
    },
}


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


def loads_body(text: str) -> Any:
    """json.loads for request bodies: NaN/Infinity rejected; a nesting deep enough to exhaust
    the parser's recursion (``[`` x 100000) is a ValueError, not a RecursionError (a 500);
    an event with an over-long integer becomes a BadEvent (parsed again only then, so the
    common path keeps the C parser's int conversion)."""
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
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj: Any = loads_body(line)
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


async def _over_backlog(request: Request) -> bool:
    """Back-pressure: is the ingest backlog (`rs.ingest_backlog`'s count) over the bound?

    Two reads (the API's event count and the worker's heartbeat), at most every
    `backlog_check_interval` per process, so a request does not pay them each time.
    """
    settings: ApiSettings = request.app.state.settings
    backlog_seen: list[float] = request.app.state.backlog_seen  # (time read, backlog)
    now = time.monotonic()
    if now - backlog_seen[0] >= settings.backlog_check_interval:
        async with request.app.state.aredis.pipeline(transaction=False) as p:
            p.get(rs.INGEST_IN)
            p.hget(rs.ENGINE_STATUS, "stats")
            appended, stats = await p.execute()
        st = json.loads(stats) if stats else {}
        backlog = max(int(appended or 0) - int(st.get("total_read", 0)), 0)
        backlog_seen[:] = [now, backlog + int(st.get("buffered", 0))]
    return backlog_seen[1] > settings.max_backlog


@router.post(
    "/v1/events",
    status_code=202,
    response_model=IngestResult,
    tags=["events"],
    summary="Ingest events (one object, an array, or JSON lines)",
    responses={
        400: {"model": ErrorOut, "description": "unparseable body; nothing accepted"},
        401: {"model": ErrorOut, "description": "missing or unknown API key"},
        403: {"model": ErrorOut, "description": "revoked API key"},
        408: {"model": ErrorOut, "description": "body not received within --body-timeout"},
        413: {"model": ErrorOut, "description": "body over the size limit"},
        429: {
            "model": ErrorOut,
            "description": "ingest backlog over --max-backlog; nothing "
            "accepted, retry after Retry-After seconds",
        },
        422: {
            "model": IngestResult,
            "description": "some events invalid; the valid ones ARE accepted (see accepted)",
        },
        503: {"model": ErrorOut, "description": "ingest store unavailable; nothing accepted"},
    },
    openapi_extra={"requestBody": _EVENTS_BODY},
)
async def post_events(request: Request, gw: Gateway) -> JSONResponse:
    """Validate every event; append the valid ones to `ens:ingest` before answering.

    `ts` is required (RFC 3339 with offset, or epoch seconds); `id` is optional (the
    ingest entry id is used); other values must be scalars (LANGUAGE.md §1).
    """
    settings: ApiSettings = request.app.state.settings
    body = await read_body(request, settings.max_body, settings.limits.body_timeout)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    items, problem = parse_batch(body, ctype)
    if problem:
        m.REQUESTS.labels(status="400").inc()
        return JSONResponse({"error": problem}, 400)
    valid: list[str] = []  # per event: its id (or ""), its normalized JSON
    exact = False  # some event needs the standard library's exact integer parsing
    errors: list[EventErrorOut] = []
    now = time.time()
    odd = may_hold_surrogates(body)
    for index, line, obj in items:
        try:
            if isinstance(obj, ValueError):
                raise obj
            if odd:
                check_values(obj)
            ev = event_from_obj(obj, "-")
            check_ts_window(ev.ts, now, settings.limits)
            text, plain = normalized_json(obj, ev)
            valid.append("" if obj.get("id") is None else str(obj["id"]))
            valid.append(text)
            exact = exact or not plain
        except ValueError as exc:
            if isinstance(exc, TsOutOfWindow):
                m.EVENTS_REJECTED_TS.labels(gateway=gw, bound=exc.bound).inc()
            errors.append(EventErrorOut(index=index, line=line, id=error_id(obj), error=str(exc)))
    accepted = len(valid) // 2
    duplicates = 0
    if valid:
        limits = settings.limits
        try:
            if settings.max_backlog and await _over_backlog(request):
                return too_busy(settings.max_backlog)
            # one entry per request (rs.decode_entry reads it back), written only if the
            # key is still valid, the backlog bound allows it, and without the events
            # whose ids were seen: the checks and the write are one atomic round trip
            res = await request.app.state.ingest_script(
                keys=[*rs.INGEST_SCRIPT_KEYS, rs.seen_key(gw)],
                args=[
                    gw,
                    request.state.key_sha256,
                    rs.INGEST_EXACT if exact else rs.INGEST_NORMALIZED,
                    settings.max_backlog,
                    int(limits.dedup_window * 1000) if limits.dedup_window else 0,
                    limits.dedup_max,
                    *valid,
                ],
            )
            status_ = rs.text(res[0])
            if status_ in ("unknown", "revoked"):
                request.app.state.key_cache.drop(request.state.api_key)
                raise key_refused(status_, gw)
            if status_ == "backlog":
                request.app.state.backlog_seen[:] = [time.monotonic(), int(res[1])]
                return too_busy(settings.max_backlog)
            duplicates = int(res[2])
        except redis.RedisError as exc:
            log.error("ingest write failed: %s", exc)
            m.REQUESTS.labels(status="503").inc()
            return JSONResponse(
                {"error": "ingest store unavailable; retry later"},
                503,
                headers={"Retry-After": STORE_RETRY_AFTER},
            )
        m.EVENTS_IN.labels(gateway=gw).inc(accepted - duplicates)
        if duplicates:
            m.EVENTS_DUPLICATE.labels(gateway=gw).inc(duplicates)
    if errors:
        m.EVENTS_INVALID.labels(gateway=gw).inc(len(errors))
    status = 422 if errors else 202
    m.REQUESTS.labels(status=str(status)).inc()
    result = IngestResult(
        accepted=accepted, duplicates=duplicates or None, rejected=len(errors), errors=errors
    )
    return JSONResponse(result.model_dump(exclude_none=True), status)
