"""What every router of the HTTP API shares: its settings (a view of `ServiceSettings`), the
admin token check, the Redis clients of a request and the 503/429 answers."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field
from typing import Annotated

import redis
import redis.asyncio
from fastapi import Depends, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.redis_limits import store_problem
from adapters.service.settings import DEFAULTS, ServiceSettings

log = logging.getLogger("ens.service.api")


@dataclass
class IngestLimits:
    """Limits of POST /v1/events beyond the body size: the API's view of `ServiceSettings`
    (seconds; None: no limit)."""

    max_future: float | None = DEFAULTS.max_future  # an event's ts ahead of the wall clock
    max_past: float | None = DEFAULTS.max_past  # ... behind it (None for backfills)
    body_timeout: float | None = DEFAULTS.body_timeout  # to receive a whole body (408 after)
    dedup_window: float | None = DEFAULTS.dedup_window  # a gateway's event ids are remembered
    dedup_max: int = DEFAULTS.dedup_max  # ids remembered per gateway (the oldest go first)
    memory_share: float = DEFAULTS.ingest_memory_share  # of Redis' maxmemory ingest may fill

    @classmethod
    def from_settings(cls, s: ServiceSettings) -> IngestLimits:
        return cls(
            s.max_future,
            s.max_past,
            s.body_timeout,
            s.dedup_window,
            s.dedup_max,
            s.ingest_memory_share,
        )


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
    access_log: bool = DEFAULTS.access_log  # one log line per request (--access-log)
    console: bool = DEFAULTS.console  # the operator console at /console (--no-console)
    archive_uri: str | None = None  # --archive: the console's backtests read it


class ErrorOut(BaseModel):
    error: str


admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminToken", description="the admin token (ENS_ADMIN_TOKEN)"
)


def require_admin(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
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


def require_ack(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
) -> str:
    """The admin token, or a token of scope ``ack`` (`ens token add`): may list and
    acknowledge alarms only. Returns who acts (``admin`` or ``token:NAME``)."""
    if bearer is None:
        raise HTTPException(
            401,
            "missing token (Authorization: Bearer TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    sha = rs.sha256(bearer.credentials)
    if hmac.compare_digest(sha, request.app.state.settings.admin_token_sha256):
        return "admin"
    from adapters.service import alarm_store

    tok = alarm_store.token_of(request.app.state.r, sha)
    if tok is None or tok.get("scope") != "ack":
        raise HTTPException(403, "invalid token")
    return f"token:{tok['name']}"


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
        {"error": store_problem(exc, "store (redis)")},
        503,
        headers={"Retry-After": STORE_RETRY_AFTER},
    )


def sync_redis(request: Request) -> redis.Redis:
    return request.app.state.r


Admin = Annotated[None, Depends(require_admin)]
AckOrAdmin = Annotated[str, Depends(require_ack)]
R = Annotated[redis.Redis, Depends(sync_redis)]
