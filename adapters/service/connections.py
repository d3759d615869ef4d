"""HTTP connection limits uvicorn lacks: a header timeout and a cap on open connections.

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` after an answer, but a
connection that never sends a request, or sends its headers a byte at a time, stays open for
ever; with the default limit of 1,024 open files, 1,100 such connections made every POST fail
(issue 24.5). `guarded_protocol` closes a connection whose request headers are not complete
within ``header_timeout`` of its opening (or of its last answer), and keeps at most
``max_connections`` open per process: a new connection beyond that closes the longest idle
one (no request in progress), or, when every one is busy, gets a 503 and is closed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("ens.service")

_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 47\r\n\r\n"
    b'{"error": "too many connections; retry later"}\n'
)


def connection_cap(requested: int) -> int:
    """Connections per process: ``requested``, or (0) what the open-file limit leaves after a
    quarter of it (at most 256) for Redis connections and the rest. Raises the soft limit to
    the hard one first, so the cap is as high as the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    fits = max(soft - min(256, soft // 4), 16)
    if requested:
        if requested > fits:
            log.warning(
                "--max-connections %d exceeds what the open-file limit (%d) leaves; using %d",
                requested,
                soft,
                fits,
            )
        return min(requested, fits)
    return min(fits, 10_000)


def guarded_protocol(header_timeout: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header timeout and a connection cap."""

    class GuardedHttp(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _since = 0.0  # monotonic time it last turned idle (opened, or answered)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._since = time.monotonic()
            self._arm()
            if len(self.connections) > max_connections:
                self._make_room()

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _make_room(self) -> None:
            idle = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedHttp)
                and c._idle()
                and not c.transport.is_closing()
            ]
            if idle:
                min(idle, key=lambda c: c._since).transport.close()
            else:
                self.transport.write(_FULL)
                self.transport.close()

        def _arm(self) -> None:
            if self._timer is None:
                self._timer = self.loop.call_later(header_timeout, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self._idle() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._idle():  # the start of a request: its headers must come in time
                self._arm()
            super().data_received(data)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._since = time.monotonic()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttp


def uvicorn_options(
    keepalive: float, header_timeout: float, max_connections: int
) -> dict[str, Any]:
    """The `uvicorn.Config` options of these limits."""
    return {
        "timeout_keep_alive": keepalive,
        "http": guarded_protocol(header_timeout, connection_cap(max_connections)),
    }
