"""The HTTP API: event ingestion for gateways, profile and subscriber management, health, metrics.

An accepted event is durable when it is answered: the batch is appended to ``ens:ingest`` in
one MULTI/EXEC before the 202/422 goes out, and the engine worker takes it from there. A batch
is validated event by event; the valid ones are accepted even when others are not (the 422
body says how many), so a gateway must resend only the events listed in ``errors``.

`create_app` assembles the routers of `adapters.service.routes` (ingest, profiles and
subscribers, gateways' keys, operations, the late output) and the answers every route shares (errors as
``{"error"}``, 503 when Redis is down).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from adapters.errors import BadEvent as BadEvent  # raised by the ingest route's parsing
from adapters.errors import TsOutOfWindow as TsOutOfWindow
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.access import AccessMiddleware
from adapters.service.enrich import AssetCache
from adapters.service.routes import admin, ingest, manage, operations
from adapters.service.routes import alarms as alarm_routes
from adapters.service.routes import assets as asset_routes
from adapters.service.routes import late as late_routes
from adapters.service.routes import probe as probe_routes
from adapters.service.routes.base import ApiSettings as ApiSettings
from adapters.service.routes.base import IngestLimits as IngestLimits
from adapters.service.routes.base import async_redis, store_unavailable
from adapters.service.routes.bodies import normalized_json as normalized_json
from adapters.service.routes.gateways import KeyCache
from notifiers import store
from notifiers.config import describe_errors


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
        version=m.package_version(),
        description=(
            "Event ingestion for sensor gateways (`POST /v1/events`, API key); profiles, "
            "subscribers, gateways, the outbox (read-only) and dead letters (admin token); "
            "health and Prometheus metrics. "
            "See docs/service.md."
        ),
        lifespan=lifespan,
        # no 307 to the client's Host header for `/v1/events/`: a POST is not redirected
        redirect_slashes=False,
        docs_url=None,  # served below from the package's own Swagger UI files
    )
    operations.offline_docs(app)
    app.add_middleware(AccessMiddleware, log_requests=settings.access_log)
    app.state.settings = settings
    app.state.key_cache = KeyCache()
    app.state.assets = AssetCache()  # the asset registry, for enrichment (adapters.service.enrich)
    m.INGEST_BACKLOG_MAX.set(settings.max_backlog)
    app.state.backlog_seen = [0.0, 0]  # (monotonic time read, backlog) for this process
    app.state.store_errors = [float("-inf"), 0]  # (last logged, 503s since) of ingest writes
    app.state.memory_seen = [float("-inf"), None]  # (time read, MemoryState) for this process

    _error_answers(app)
    app.include_router(ingest.router)
    app.include_router(manage.router)
    app.include_router(admin.router)
    app.include_router(asset_routes.router)
    app.include_router(operations.router)
    app.include_router(late_routes.router)
    app.include_router(alarm_routes.router)
    app.include_router(probe_routes.router)
    if settings.console:
        from adapters.service import console

        console.mount(app)
    return app


def _error_answers(app: FastAPI) -> None:
    """Every error as one JSON `error`: HTTP errors, Redis unavailable (503), bad bodies."""

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
