"""`POST /v1/events`: gateways' events, validated one by one and appended to the ingest
stream in one atomic script before the answer (202, or 422 listing the rejected ones)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from adapters.errors import ForeignGateway, TsOutOfWindow
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.enrich import AssetCache
from adapters.service.redis_limits import MemoryState, is_oom, store_problem
from adapters.service.routes.base import (
    STORE_RETRY_AFTER,
    ApiSettings,
    ErrorOut,
    too_busy,
)
from adapters.service.routes.bodies import (
    check_gateway,
    check_ts_window,
    check_values,
    error_id,
    may_hold_surrogates,
    normalized_json,
    parse_batch,
    read_body,
)
from adapters.service.routes.gateways import Gateway, key_refused
from profiles.events import event_from_obj

log = logging.getLogger("ens.service.api")
router = APIRouter()
LOG_EVERY = 10.0  # s between two log lines about failing ingest writes (per process)


_posed: set[str] = set()  # gateways whose events named another one: logged once per process


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


async def _over_backlog(request: Request) -> bool:
    """Back-pressure: is the ingest backlog (`rs.backlog_of`, as `rs.ingest_backlog` counts it)
    over the bound?

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
        backlog_seen[:] = [now, rs.backlog_of(appended, json.loads(stats) if stats else {})]
    return backlog_seen[1] > settings.max_backlog


def _store_failed(request: Request, exc: redis.RedisError) -> JSONResponse:
    """The 503 of a refused or failed ingest write (nothing was appended: the script is
    atomic, and over maxmemory its first write is refused)."""
    oom = is_oom(exc)
    if oom:
        m.REDIS_OOM.labels(part="api").inc()
    hint = "; raise Redis' maxmemory or free memory" if oom else ""
    _say_throttled(request, f"ingest write failed: {exc}{hint}", logging.ERROR)
    m.REQUESTS.labels(status="503").inc()
    return JSONResponse(
        {"error": store_problem(exc)}, 503, headers={"Retry-After": STORE_RETRY_AFTER}
    )


def _say_throttled(request: Request, what: str, level: int = logging.WARNING) -> None:
    """Log why a POST got 503, at most every `LOG_EVERY` seconds per process, with how many
    were refused meanwhile (a flood of retries is not a flood of lines)."""
    seen: list[float] = request.app.state.store_errors  # [last logged, refused since]
    now = time.monotonic()
    seen[1] += 1
    if now - seen[0] >= LOG_EVERY:
        n = int(seen[1])
        log.log(
            level,
            "%s (%d request%s answered 503 since the last such line)",
            what,
            n,
            "" if n == 1 else "s",
        )
        seen[:] = [now, 0]


async def _nearly_full(request: Request) -> str | None:
    """Why ingest pauses, if Redis uses more than ``--ingest-memory-share`` of its maxmemory.

    The rest is the engine's: over Redis' own limit it could not commit or snapshot, and the
    snapshot is what trims the ingest stream, so memory would never free by itself. Read
    (`INFO memory`) at most every `backlog_check_interval` per process.
    """
    settings: ApiSettings = request.app.state.settings
    seen: list[Any] = request.app.state.memory_seen  # [time read, MemoryState or None]
    now = time.monotonic()
    if now - seen[0] >= settings.backlog_check_interval:
        info = await request.app.state.aredis.info("memory")
        seen[:] = [now, MemoryState.from_info(info)]
    mem: MemoryState | None = seen[1]
    if mem is None or not mem.maxmemory:
        return None
    if mem.used - mem.not_counted <= settings.limits.memory_share * mem.maxmemory:
        return None
    return (
        f"ingest store is nearly full (Redis {mem.describe()}; ingest pauses above "
        f"{settings.limits.memory_share:.0%} of it so that the engine can still commit); "
        "retry later"
    )


def _foreign_gateway(gw: str, named: object) -> None:
    """Count an event that named another gateway; log it the first time (it may be a
    misconfigured gateway rather than an attack, and then it would log every event)."""
    m.EVENTS_REJECTED_GATEWAY.labels(gateway=gw).inc()
    if gw not in _posed:
        _posed.add(gw)
        log.warning(
            "gateway %s posted an event naming gateway %s: refused (422); such events are "
            "counted in ens_events_rejected_gateway_total, logged once per gateway",
            gw,
            repr(named)[:80],
        )


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
        503: {
            "model": ErrorOut,
            "description": "ingest store unavailable or full (Redis over maxmemory, disk "
            "full); nothing accepted, retry after Retry-After seconds",
        },
    },
    openapi_extra={"requestBody": _EVENTS_BODY},
)
async def post_events(request: Request, gw: Gateway) -> JSONResponse:
    """Validate every event; append the valid ones to `ens:ingest` before answering.

    `ts` is required (RFC 3339 with offset, or epoch seconds); `id` is optional (the
    ingest entry id is used); other values must be scalars (docs/language.md §1). `gateway` is
    reserved: every event carries the gateway of the API key, and one naming another is refused.
    """
    settings: ApiSettings = request.app.state.settings
    body = await read_body(request, settings.max_body, settings.limits.body_timeout)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    items, problem = parse_batch(body, ctype)
    if problem:
        m.REQUESTS.labels(status="400").inc()
        return JSONResponse({"error": problem}, 400)
    assets: AssetCache = request.app.state.assets
    await assets.refresh(request.app.state.aredis)
    ids, texts, exact, errors = _check_events(
        items, gw, settings, assets, may_hold_surrogates(body)
    )
    assets.count()
    accepted = len(texts)
    duplicates = 0
    if texts:
        limits = settings.limits
        try:
            if settings.max_backlog and await _over_backlog(request):
                return too_busy(settings.max_backlog)
            if limits.memory_share < 1 and (full := await _nearly_full(request)):
                _say_throttled(request, full)
                m.REQUESTS.labels(status="503").inc()
                return JSONResponse({"error": full}, 503, headers={"Retry-After": "1"})
            # one entry per request (rs.decode_entry reads it back), written only if the
            # key is still valid, the backlog bound allows it, and without the events
            # whose ids were seen: the checks and the write are one atomic round trip
            res = await request.app.state.ingest_script(
                keys=[*rs.INGEST_SCRIPT_KEYS, rs.seen_key(gw)],
                args=rs.ingest_args(
                    gw,
                    request.state.key_sha256,
                    rs.INGEST_EXACT if exact else rs.INGEST_NORMALIZED,
                    settings.max_backlog,
                    int(limits.dedup_window * 1000) if limits.dedup_window else 0,
                    limits.dedup_max,
                    ids,
                    texts,
                ),
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
            return _store_failed(request, exc)
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


def _check_events(
    items: list[Any], gw: str, settings: ApiSettings, assets: AssetCache, odd: bool
) -> tuple[list[str], list[str], bool, list[EventErrorOut]]:
    """Each event checked and normalized: the valid ones' ids (or "") and JSON texts, whether
    one needs exact integer parsing, and the invalid ones' errors (counted in the metrics)."""
    ids: list[str] = []  # per valid event: its id (or "")
    texts: list[str] = []  # ... and its normalized JSON
    exact = False  # some event needs the standard library's exact integer parsing
    errors: list[EventErrorOut] = []
    now = time.time()
    for index, line, obj in items:
        try:
            if isinstance(obj, ValueError):
                raise obj
            if odd:
                check_values(obj)
            ev = event_from_obj(obj, "-")
            check_gateway(obj, gw)
            check_ts_window(ev.ts, now, settings.limits)
            if assets:  # the registry's attributes of its sensor or gateway (docs/assets.md)
                ev.attrs = assets.enrich(ev.attrs, gw)
            text, plain = normalized_json(obj, ev)
            ids.append("" if obj.get("id") is None else str(obj["id"]))
            texts.append(text)
            exact = exact or not plain
        except ValueError as exc:
            if isinstance(exc, TsOutOfWindow):
                m.EVENTS_REJECTED_TS.labels(gateway=gw, bound=exc.bound).inc()
            elif isinstance(exc, ForeignGateway):
                _foreign_gateway(gw, exc.named)
            errors.append(EventErrorOut(index=index, line=line, id=error_id(obj), error=str(exc)))
    return ids, texts, exact, errors
