"""The HTTP API: event ingestion for gateways, profile and subscriber management, health, metrics.

An accepted event is durable when it is answered: the batch is appended to ``ens:ingest`` in
one MULTI/EXEC before the 202/422 goes out, and the engine worker takes it from there. A batch
is validated event by event; the valid ones are accepted even when others are not (the 422
body says how many), so a gateway must resend only the events listed in ``errors``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import redis
import redis.asyncio
from fastapi import Depends, FastAPI, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.settings import DEFAULTS, ServiceSettings
from notifiers import store
from notifiers.config import describe_errors
from profiles.errors import BadEvent, ProfileError, TsOutOfWindow
from profiles.events import Event, event_from_obj

log = logging.getLogger("ens.service.api")

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonl"}
)


@dataclass
class IngestLimits:
    """Limits of POST /v1/events beyond the body size: the API's view of `ServiceSettings`
    (seconds; None: no limit)."""

    max_future: float | None = DEFAULTS.max_future  # an event's ts ahead of the wall clock
    max_past: float | None = DEFAULTS.max_past  # ... behind it (None for backfills)
    body_timeout: float | None = DEFAULTS.body_timeout  # to receive a whole body (408 after)
    dedup_window: float | None = DEFAULTS.dedup_window  # a gateway's event ids are remembered
    dedup_max: int = DEFAULTS.dedup_max  # ids remembered per gateway (the oldest go first)

    @classmethod
    def from_settings(cls, s: ServiceSettings) -> IngestLimits:
        return cls(s.max_future, s.max_past, s.body_timeout, s.dedup_window, s.dedup_max)


@dataclass
class ApiSettings:
    """What `create_app` needs: the HTTP part of `ServiceSettings` and the resolved store."""

    redis_url: str
    admin_token_sha256: str
    max_body: int = DEFAULTS.max_body
    heartbeat_stale: float = 5.0  # the worker beats every second
    limits: IngestLimits = field(default_factory=IngestLimits)
    max_backlog: int = DEFAULTS.max_backlog  # events not yet read by the engine; 0: no bound
    backlog_check_interval: float = 0.2  # the backlog is read at most this often per process
    # ENS_METRICS_TOKEN: /metrics wants it (or the admin token) when set; None: public
    metrics_token_sha256: str | None = None


# ----------------------------------------------------------------------------- models


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


class ErrorOut(BaseModel):
    error: str


class ProfileIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt `subscribr` is an error, not dropped
    id: str = Field(examples=["p4"])
    expr: str = Field(
        examples=[
            'seq(w: kind = "window" and state = "broken", p: kind = "presence") within 30m per room'
        ]
    )
    subscriber: str | None = Field(default=None, description="an existing subscriber id")


class ProfileOut(ProfileIn):
    model_config = ConfigDict(extra="ignore")
    created: float
    updated: float | None = None


class ProfileStored(ProfileOut):
    warnings: list[str] = Field(
        default_factory=list,
        description="what looks wrong but is valid: no subscriber, a number read as infinity, "
        "an attribute no recent event has carried",
    )


class ProfileErrorOut(BaseModel):
    error: str = Field(description="the message `ens check` prints")
    profile: str | None = None
    line: int | None = Field(default=None, description="1-based, inside expr")
    column: int | None = None
    expected: list[str] = Field(default_factory=list)


class SubscriberOut(BaseModel):
    id: str
    channels: list[dict[str, Any]]
    digest: float | None = None
    has_secret: bool = Field(description="a signing secret is set (never shown after creation)")


class HealthOut(BaseModel):
    status: str = Field(description="ok | degraded (worker silent) | down (redis unreachable)")
    redis: str
    worker: dict[str, Any] | None = Field(
        None, description="heartbeat age; with the admin token also holder, ts and stats"
    )
    ingest_backlog: int | None = None
    ingest_lag_seconds: float | None = None


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

_gateway_bearer = HTTPBearer(
    auto_error=False, scheme_name="GatewayKey", description="a gateway API key (ens gateway add)"
)
_gateway_header = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="GatewayKeyHeader")
_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminToken", description="the admin token (ENS_ADMIN_TOKEN)"
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _redact(sub: store.Subscriber) -> SubscriberOut:
    return SubscriberOut(
        id=sub.id,
        channels=[store.redact(c.model_dump(exclude_none=True)) for c in sub.channels],
        digest=sub.digest,
        has_secret=bool(sub.secret) or any(getattr(c, "secret", None) for c in sub.channels),
    )


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


async def require_gateway(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_gateway_bearer)],
    header: Annotated[str | None, Security(_gateway_header)],
) -> str:
    """The gateway name of a valid, unrevoked API key (401 unknown/missing, 403 revoked)."""
    key = header or (bearer.credentials if bearer else None)
    if not key:
        m.REQUESTS.labels(status="401").inc()
        raise HTTPException(
            401,
            "missing API key (Authorization: Bearer KEY or X-API-Key)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.api_key = key
    cache: KeyCache = request.app.state.key_cache
    hit = cache.get(key)
    if hit is not None:
        request.state.key_sha256 = hit[1]
        return hit[0]
    name = rs.gateway_of_key(key)
    raw = await request.app.state.aredis.hget(rs.GATEWAYS, name) if name else None
    check = rs.check_key_record(raw, key)
    if check.status != "ok" or check.gateway is None:
        raise key_refused(check.status, check.gateway)
    request.state.key_sha256 = cache.put(key, check.gateway)
    return check.gateway


def key_refused(status: str, gateway: str | None) -> HTTPException:
    """The answer to a key found `revoked` (403) or `unknown` (401), counted: when the key is
    checked before the body is read, and when the ingest script re-checks a cached one."""
    if status == "revoked":
        m.REQUESTS.labels(status="403").inc()
        return HTTPException(403, f"the API key of gateway {gateway!r} is revoked")
    m.REQUESTS.labels(status="401").inc()
    return HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})


class KeyCache:
    """Gateway keys this process has verified: key -> (gateway, its SHA-256).

    Saves a Redis round trip per request. It is safe because the ingest write re-checks the
    key in the same atomic script (`rs.INGEST_SCRIPT`): a key revoked since it was cached is
    refused on its next request, and then dropped from here.
    """

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self.keys: dict[str, tuple[str, str]] = {}

    def get(self, key: str) -> tuple[str, str] | None:
        return self.keys.get(key)

    def put(self, key: str, gateway: str) -> str:
        if len(self.keys) >= self.size:  # a flood of distinct valid keys: start over
            self.keys.clear()
        sha = rs.sha256(key)
        self.keys[key] = (gateway, sha)
        return sha

    def drop(self, key: str) -> None:
        self.keys.pop(key, None)


def require_admin(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_admin_bearer)],
) -> None:
    if bearer is None:
        raise HTTPException(
            401,
            "missing admin token (Authorization: Bearer TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    expected = request.app.state.settings.admin_token_sha256
    if not hmac.compare_digest(rs.sha256(bearer.credentials), expected):
        raise HTTPException(403, "invalid admin token")


REDIS_CONNECTIONS = 100  # of the async pool; Redis itself allows 10,000 clients
REDIS_POOL_WAIT = 5.0  # s a request waits for a free connection before its 503


def async_redis(url: str) -> redis.asyncio.Redis:
    """The HTTP side's Redis client. Its pool blocks when all connections are in use: a burst
    of requests queues for a connection (a 503 only after REDIS_POOL_WAIT) instead of failing
    with MaxConnectionsError as the default pool does beyond 100 concurrent requests."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, decode_responses=True, max_connections=REDIS_CONNECTIONS, timeout=REDIS_POOL_WAIT
    )
    return redis.asyncio.Redis.from_pool(pool)


STORE_RETRY_AFTER = "1"  # seconds: Redis restarts and connection bursts pass quickly


def too_busy(max_backlog: int) -> JSONResponse:
    """The 429 of back-pressure: nothing of the request was stored."""
    m.REQUESTS.labels(status="429").inc()
    return JSONResponse(
        {"error": f"ingest backlog over {max_backlog} events; retry later"},
        429,
        headers={"Retry-After": "1"},
    )


def store_unavailable(request: Request, exc: redis.RedisError) -> JSONResponse:
    """The 503 for any Redis failure; nothing of the request was stored."""
    log.warning("%s %s: redis unavailable: %s", request.method, request.url.path, exc)
    if request.url.path == "/v1/events":
        m.REQUESTS.labels(status="503").inc()
    return JSONResponse(
        {"error": "store unavailable (redis); retry later"},
        503,
        headers={"Retry-After": STORE_RETRY_AFTER},
    )


def sync_redis(request: Request) -> redis.Redis:
    return request.app.state.r


Gateway = Annotated[str, Depends(require_gateway)]
Admin = Annotated[None, Depends(require_admin)]
R = Annotated[redis.Redis, Depends(sync_redis)]


# ----------------------------------------------------------------------------- app


DOCS_STATIC = "/docs-static"


def _offline_docs(app: FastAPI) -> None:
    """`/docs` with Swagger UI from the installed package (fastapi-offline ships Swagger UI 5,
    which reads OpenAPI 3.1), not from a CDN: a building's network often has no internet."""
    from pathlib import Path

    import fastapi_offline
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    static = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_STATIC, StaticFiles(directory=static), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_STATIC}/favicon.png",
        )


def create_app(settings: ApiSettings) -> FastAPI:
    """The FastAPI app; Redis clients are opened in its lifespan (inside uvicorn's loop)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.aredis = async_redis(settings.redis_url)
        app.state.ingest_script = app.state.aredis.register_script(rs.INGEST_SCRIPT)
        m.Publisher.ensure(settings.redis_url)  # /metrics of every process sums them all
        app.state.r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        try:
            yield
        finally:
            try:
                m.unpublish(app.state.r)
            except redis.RedisError:
                pass
            await app.state.aredis.aclose()
            app.state.r.close()

    app = FastAPI(
        title="ENS service",
        version="0.1.0",
        description=(
            "Event ingestion for sensor gateways (`POST /v1/events`, API key), profile and "
            "subscriber management (admin token), health and Prometheus metrics. "
            "See docs/service.md."
        ),
        lifespan=lifespan,
        # no 307 to the client's Host header for `/v1/events/`: a POST is not redirected
        redirect_slashes=False,
        docs_url=None,  # served below from the package's own Swagger UI files
    )
    _offline_docs(app)
    app.state.settings = settings
    app.state.key_cache = KeyCache()
    m.INGEST_BACKLOG_MAX.set(settings.max_backlog)
    backlog_seen = [0.0, 0]  # (monotonic time read, backlog) for this process

    async def _over_backlog(ar: Any) -> bool:
        """Back-pressure: is the ingest backlog (`rs.ingest_backlog`'s count) over the bound?

        Two reads (the API's event count and the worker's heartbeat), at most every
        `backlog_check_interval` per process, so a request does not pay them each time.
        """
        now = time.monotonic()
        if now - backlog_seen[0] >= settings.backlog_check_interval:
            async with ar.pipeline(transaction=False) as p:
                p.get(rs.INGEST_IN)
                p.hget(rs.ENGINE_STATUS, "stats")
                appended, stats = await p.execute()
            st = json.loads(stats) if stats else {}
            backlog = max(int(appended or 0) - int(st.get("total_read", 0)), 0)
            backlog_seen[:] = [now, backlog + int(st.get("buffered", 0))]
        return backlog_seen[1] > settings.max_backlog

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(redis.RedisError)
    async def _redis_error(request: Request, exc: redis.RedisError) -> JSONResponse:
        """Redis down or its connection pool exhausted, wherever it is met (authentication,
        ingest, management): 503 with Retry-After, never a 500, so clients retry."""
        return store_unavailable(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _body_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        """Bad JSON bodies of the admin endpoints: one readable `error`, like every other
        answer (FastAPI's `detail` list is kept for clients that read it)."""
        errors = list(exc.errors())
        detail = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in errors]
        ctype = request.headers.get("content-type", "")
        if request.method == "POST" and ctype.split(";")[0].strip().lower() != "application/json":
            return JSONResponse(
                {
                    "error": f"Content-Type {ctype or '(none)'!r} is not "
                    "application/json: send the body as JSON with "
                    "Content-Type: application/json",
                    "detail": detail,
                },
                415,
            )
        message = describe_errors(errors, lambda loc: store.subscriber_field(loc, "body"))
        return JSONResponse({"error": message, "detail": detail}, 422)

    # ------------------------------------------------------------------ events
    @app.post(
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
                errors.append(
                    EventErrorOut(index=index, line=line, id=error_id(obj), error=str(exc))
                )
        accepted = len(valid) // 2
        duplicates = 0
        if valid:
            limits = settings.limits
            try:
                if settings.max_backlog and await _over_backlog(request.app.state.aredis):
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
                    backlog_seen[:] = [time.monotonic(), int(res[1])]
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

    # ------------------------------------------------------------------ profiles
    @app.get("/v1/profiles", response_model=list[ProfileOut], tags=["profiles"])
    def list_profiles(_: Admin, r: R) -> list[dict[str, Any]]:
        """Every stored profile, oldest first."""
        return rs.list_profiles(r)

    @app.post(
        "/v1/profiles",
        response_model=ProfileStored,
        status_code=201,
        tags=["profiles"],
        responses={
            200: {"model": ProfileStored, "description": "replaced an existing profile"},
            415: {"model": ErrorOut, "description": "the body is not sent as JSON"},
            422: {"model": ProfileErrorOut, "description": "the profile does not parse/validate"},
        },
    )
    def add_profile(body: ProfileIn, _: Admin, r: R) -> JSONResponse:
        """Validate and store a profile; the running engine picks it up without a restart.

        Replacing a profile (same id) drops its partial matches.
        """
        try:
            rec, created = rs.put_profile(r, body.id, body.expr, body.subscriber)
        except ProfileError as exc:
            out = ProfileErrorOut(
                error=str(exc),
                profile=exc.profile_id,
                line=exc.line,
                column=exc.column,
                expected=exc.expected,
            )
            return JSONResponse(out.model_dump(), 422)
        from profiles.lint import warnings as lint
        from profiles.parser import parse_profile

        warnings = lint(parse_profile(body.expr, body.id, body.subscriber), rs.seen_attributes(r))
        if body.subscriber is None:
            warnings.append(
                f"profile {body.id!r} has no subscriber: its notifications go to the outbox only"
            )
        stored = ProfileStored(**rec, warnings=warnings)
        return JSONResponse(stored.model_dump(), 201 if created else 200)

    @app.get(
        "/v1/profiles/{pid}",
        response_model=ProfileOut,
        tags=["profiles"],
        responses={404: {"model": ErrorOut}},
    )
    def get_profile(pid: str, _: Admin, r: R) -> dict[str, Any]:
        rec = rs.get_profile(r, pid)
        if rec is None:
            raise HTTPException(404, f"no profile {pid!r}")
        return rec

    @app.delete(
        "/v1/profiles/{pid}",
        status_code=204,
        tags=["profiles"],
        responses={404: {"model": ErrorOut}},
    )
    def delete_profile(pid: str, _: Admin, r: R) -> Response:
        """Remove a profile; the engine drops it (and its partial matches) at once."""
        if not rs.delete_profile(r, pid):
            raise HTTPException(404, f"no profile {pid!r}")
        return Response(status_code=204)

    # ------------------------------------------------------------------ subscribers
    @app.get("/v1/subscribers", response_model=list[SubscriberOut], tags=["subscribers"])
    def list_subscribers(_: Admin, r: R) -> list[SubscriberOut]:
        """Every subscriber; signing secrets are never shown here."""
        out = []
        for raw in r.hgetall(store.SUBSCRIBERS).values():
            out.append(_redact(store.Subscriber.model_validate_json(raw)))
        return sorted(out, key=lambda s: s.id)

    @app.get(
        "/v1/subscribers/{sid}",
        response_model=SubscriberOut,
        tags=["subscribers"],
        responses={404: {"model": ErrorOut}},
    )
    def get_subscriber(sid: str, _: Admin, r: R) -> SubscriberOut:
        sub = store.get_subscriber(r, sid)
        if sub is None:
            raise HTTPException(404, f"no subscriber {sid!r}")
        return _redact(sub)

    @app.post(
        "/v1/subscribers",
        status_code=201,
        tags=["subscribers"],
        response_model=store.Subscriber,
        responses={422: {"description": "invalid subscriber"}},
    )
    def add_subscriber(body: store.Subscriber, _: Admin, r: R) -> JSONResponse:
        """Store a subscriber (replacing one with the same id).

        A webhook without a secret gets a generated one: the response shows it, once.
        """
        try:
            rs.check_id(body.id, "subscriber id")
        except ProfileError as exc:
            return JSONResponse({"error": str(exc)}, 422)
        try:
            saved = store.put_subscriber(r, body)
        except ValidationError as exc:
            return JSONResponse({"error": store.subscriber_error(exc)}, 422)
        return JSONResponse(json.loads(saved.to_json()), 201)

    @app.delete(
        "/v1/subscribers/{sid}",
        status_code=204,
        tags=["subscribers"],
        responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
    )
    def delete_subscriber(sid: str, _: Admin, r: R) -> Response:
        """Remove a subscriber that no profile uses (409 lists the profiles that do)."""
        users = rs.profiles_of_subscriber(r, sid)
        if users:
            raise HTTPException(409, f"subscriber {sid!r} is used by profiles {users}")
        if not r.hdel(store.SUBSCRIBERS, sid):
            raise HTTPException(404, f"no subscriber {sid!r}")
        return Response(status_code=204)

    # ------------------------------------------------------------------ operations
    @app.get(
        "/healthz",
        response_model=HealthOut,
        tags=["operations"],
        responses={503: {"model": HealthOut, "description": "redis down or worker silent"}},
    )
    def healthz(
        request: Request,
        r: R,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_admin_bearer)],
    ) -> JSONResponse:
        """Redis ping and the engine worker's heartbeat age (stale after a few seconds).

        Public, for load balancers: the worker's ``holder`` (host, pid, lock token), its stats
        and Redis error texts only with the admin token (a wrong one is 403).
        """
        admin = bearer is not None
        if admin:
            require_admin(request, bearer)
        try:
            r.ping()
            status = rs.worker_status(r)
            backlog, lag = rs.ingest_backlog(r)
        except redis.RedisError as exc:
            why = str(exc) if admin else "unreachable"
            return JSONResponse(HealthOut(status="down", redis=why).model_dump(), 503)
        ok = status is not None and status["age"] <= settings.heartbeat_stale
        worker = status if admin or status is None else {"age": round(status["age"], 1)}
        out = HealthOut(
            status="ok" if ok else "degraded",
            redis="ok",
            worker=worker,
            ingest_backlog=backlog,
            ingest_lag_seconds=round(lag, 3),
        )
        return JSONResponse(out.model_dump(), 200 if ok else 503)

    @app.get("/metrics", tags=["operations"], response_class=Response)
    def metrics(
        r: R,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_admin_bearer)],
    ) -> Response:
        """Prometheus text: the service's metrics, then the notifiers' ones.

        With ``ENS_METRICS_TOKEN`` set, only for that token or the admin token (Prometheus:
        ``authorization: {credentials: TOKEN}``): the labels name the gateways.
        """
        want = settings.metrics_token_sha256
        if want is not None:
            if bearer is None:
                raise HTTPException(
                    401,
                    "missing metrics token (Authorization: Bearer TOKEN)",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            got = rs.sha256(bearer.credentials)
            if not (
                hmac.compare_digest(got, want)
                or hmac.compare_digest(got, settings.admin_token_sha256)
            ):
                raise HTTPException(403, "invalid metrics token")
        try:
            backlog, lag = rs.ingest_backlog(r)
            m.INGEST_BACKLOG.set(backlog)
            m.INGEST_LAG.set(lag)
            pending, age, dead = store.delivery_backlog(r)
            m.DELIVERY_BACKLOG.set(pending)
            m.DELIVERY_LAG.set(age)
            m.DEAD_LETTERS.set(dead)
            status = rs.worker_status(r)
            m.HEARTBEAT_AGE.set(status["age"] if status else -1)
            if status:
                m.set_engine_stats(status["stats"], status["stats"].get("buffered", 0))
        except redis.RedisError as exc:
            log.warning("metrics: redis unavailable: %s", exc)
        return Response(m.render(r), media_type=CONTENT_TYPE_LATEST)

    return app
