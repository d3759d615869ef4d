"""Operations: `/healthz` (for load balancers), `/metrics` (Prometheus) and `/docs` (Swagger
UI served from the installed package)."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated, Any

import redis
from fastapi import APIRouter, FastAPI, Request, Response, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from adapters.service import known_attrs, late
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.archive_feed import lag as archive_lag
from adapters.service.redis_limits import SAFE_POLICY, evicting_message, memory_state
from adapters.service.routes.base import ApiSettings, R, admin_bearer, require_admin
from notifiers import backlog as backlog_of

log = logging.getLogger("ens.service.api")
router = APIRouter()


class HealthOut(BaseModel):
    status: str = Field(
        description="ok | degraded (worker silent, or Redis over maxmemory or evicting: "
        "see problems) | down (redis unreachable)"
    )
    redis: str
    problems: list[str] | None = Field(
        None, description="why Redis is not healthy for ENS, when it is not (absent when ok)"
    )
    worker: dict[str, Any] | None = Field(
        None, description="heartbeat age; with the admin token also holder, ts and stats"
    )
    ingest_backlog: int | None = None
    ingest_lag_seconds: float | None = None


DOCS_STATIC = "/docs-static"


def offline_docs(app: FastAPI) -> None:
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


@router.get(
    "/healthz",
    response_model=HealthOut,
    tags=["operations"],
    responses={503: {"model": HealthOut, "description": "redis down or worker silent"}},
)
def healthz(
    request: Request,
    r: R,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
) -> JSONResponse:
    """Redis ping and the engine worker's heartbeat age (stale after a few seconds).

    Public, for load balancers: the worker's ``holder`` (host, pid, lock token), its stats
    and Redis error texts only with the admin token (a wrong one is 403).
    """
    settings: ApiSettings = request.app.state.settings
    admin = bearer is not None
    if admin:
        require_admin(request, bearer)
    try:
        r.ping()
        status = rs.worker_status(r)
        backlog, lag = rs.ingest_backlog(r)
        problems = redis_problems(r)
    except redis.RedisError as exc:
        why = str(exc) if admin else "unreachable"
        return JSONResponse(HealthOut(status="down", redis=why).model_dump(), 503)
    ok = status is not None and status["age"] <= settings.heartbeat_stale and not problems
    worker = status if admin or status is None else {"age": round(status["age"], 1)}
    out = HealthOut(
        status="ok" if ok else "degraded",
        redis="; ".join(problems) if problems else "ok",
        problems=problems or None,
        worker=worker,
        ingest_backlog=backlog,
        ingest_lag_seconds=round(lag, 3),
    )
    return JSONResponse(out.model_dump(), 200 if ok else 503)


def redis_problems(r: redis.Redis) -> list[str]:
    """What makes Redis unfit for ENS now (`INFO memory`; it also sets the gauges): an
    evicting maxmemory-policy (issue 41.4), memory over maxmemory (writes refused)."""
    mem = memory_state(r)
    evicting = bool(mem.policy) and mem.policy != SAFE_POLICY
    m.REDIS_EVICTING.set(1 if evicting else 0)
    m.REDIS_OVER_MAXMEMORY.set(1 if mem.over else 0)
    out = []
    if evicting:
        out.append(f"{evicting_message(mem.policy)} (set it to noeviction)")
    if mem.over:
        out.append(
            f"Redis is over its maxmemory ({mem.describe()}): it refuses writes, ingest "
            "answers 503 and the engine cannot commit"
        )
    return out


@router.get("/metrics", tags=["operations"], response_class=Response)
def metrics(
    request: Request,
    r: R,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
) -> Response:
    """Prometheus text: the service's metrics, then the notifiers' ones.

    With ``ENS_METRICS_TOKEN`` set, only for that token or the admin token (Prometheus:
    ``authorization: {credentials: TOKEN}``): the labels name the gateways.
    """
    settings: ApiSettings = request.app.state.settings
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
            hmac.compare_digest(got, want) or hmac.compare_digest(got, settings.admin_token_sha256)
        ):
            raise HTTPException(403, "invalid metrics token")
    try:
        backlog, lag = rs.ingest_backlog(r)
        m.INGEST_BACKLOG.set(backlog)
        m.INGEST_LAG.set(lag)
        delivery = backlog_of.delivery_status(r)
        m.DELIVERY_BACKLOG.set(delivery.backlog)
        m.DELIVERY_LAG.set(delivery.lag)  # what no e-mail digest holds on purpose
        m.DEAD_LETTERS.set(delivery.dead_letters)
        m.DIGEST_HELD.set(delivery.digest_held)
        m.DIGEST_AGE.set(delivery.digest_age)
        archived, archive_age = archive_lag(r)
        m.ARCHIVE_BACKLOG.set(archived)
        m.ARCHIVE_LAG.set(archive_age)
        m.LATE_EVENTS.set(r.xlen(late.LATE))  # type: ignore[arg-type]
        m.KNOWN_ATTRIBUTES.set(r.hlen(known_attrs.KEY))  # type: ignore[arg-type]
        status = rs.worker_status(r)
        m.HEARTBEAT_AGE.set(status["age"] if status else -1)
        redis_problems(r)  # sets the ens_redis_* gauges
        if status:
            m.set_engine_stats(status["stats"], status["stats"].get("buffered", 0))
    except redis.RedisError as exc:
        log.warning("metrics: redis unavailable: %s", exc)
    return Response(m.render(r), media_type=CONTENT_TYPE_LATEST)
