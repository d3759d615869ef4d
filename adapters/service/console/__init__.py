"""The operator console at ``/console`` (docs/console.md): server-rendered pages on the API's
FastAPI app, htmx for partial updates, server-sent events for live changes.

Every asset is in this package (``static/``: htmx and its SSE extension vendored, VENDORED.md
names their versions); nothing comes from a CDN. Pages are Jinja2 templates with autoescape,
so an event attribute ``<script>`` shows as text. Every answer under ``/console`` carries a
Content-Security-Policy without inline scripts or styles. Actions call the HTTP API's own
functions (`adapters.service.routes`), so the console and the API follow one set of rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from adapters.service.console import (
    alarm_pages,
    login,
    manage_pages,
    silence_pages,
    web,
)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def mount(app: FastAPI) -> None:
    """Add the console's routes, its static files and its headers to the API's app."""
    app.mount("/console/static", StaticFiles(directory=web.HERE / "static"), name="console-static")
    for module in (login, alarm_pages, silence_pages, manage_pages):
        app.include_router(module.router, include_in_schema=False)

    @app.middleware("http")
    async def _headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        resp = await call_next(request)
        if request.url.path.startswith("/console"):
            for k, v in HEADERS.items():
                resp.headers.setdefault(k, v)
            if not request.url.path.startswith("/console/static"):
                resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    @app.exception_handler(web.NeedLogin)
    async def _login(request: Request, exc: web.NeedLogin) -> Response:
        if request.url.path == "/console/live":  # 204: the browser's EventSource stops
            return Response(status_code=204)
        if web.is_htmx(request):  # a partial request: the whole page goes to the login
            return Response(status_code=401, headers={"HX-Redirect": "/console/login"})
        return RedirectResponse("/console/login", 303)

    @app.exception_handler(web.NotAllowed)
    async def _refused(request: Request, exc: web.NotAllowed) -> HTMLResponse:
        return web.page(
            request,
            "message.html",
            403,
            title="Not allowed",
            message="This page or action needs the management token; this session may see "
            "the alarms and acknowledge them (or its form was stale: reload the page).",
        )
