"""Every HTTP request timed (`ens_http_request_duration_seconds`) and, with ``--access-log``,
logged: a plain ASGI middleware, cheap enough for the ingest path.

The histogram is labelled by the *route template* (``/v1/profiles/{pid}``), which Starlette
puts in the request's scope when it routes, not by the raw path: a path per profile id — or a
scanner's thousand 404 paths — would be a series each. A path no route serves is
``unmatched``. The access log line has the raw path (no query string) and the same fields as
extras, which ``--log-format json`` writes as keys.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.service import metrics as m

access_log = logging.getLogger("ens.service.access")
UNMATCHED = "unmatched"


def route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class AccessMiddleware:
    """Times each HTTP request by method, route template and status; logs it if asked."""

    def __init__(self, app: ASGIApp, log_requests: bool = False) -> None:
        self.app = app
        self.log_requests = log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]  # what the server answers if the app raises before it starts one

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self._done(scope, status[0], time.perf_counter() - started)

    def _done(self, scope: Scope, status: int, elapsed: float) -> None:
        method, route = scope.get("method", "-"), route_of(scope)
        m.HTTP_SECONDS.labels(method, route, str(status)).observe(elapsed)
        if self.log_requests:
            client: Any = scope.get("client") or ("-", 0)
            fields = {
                "client": client[0],
                "method": method,
                "path": scope.get("path", ""),
                "route": route,
                "status": status,
                "duration_ms": round(elapsed * 1000, 2),
            }
            access_log.info(
                "%s %s %s %d %.1fms",
                fields["client"],
                method,
                fields["path"],
                status,
                fields["duration_ms"],
                extra=fields,
            )
