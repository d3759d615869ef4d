"""A total deadline per request, for the webhook sender's httpx client.

Why: httpx's timeouts are per operation (each read may wait ``read`` seconds), so a receiver
that trickles its headers or body a byte every few seconds holds a request, and a delivery
thread, for ever. httpx has no total timeout (encode/httpx#1450), so the bound is put where
every byte passes: an httpcore network backend whose streams give each connect, read and write
at most the time left before the deadline of the request in progress (`within`), and fail with
a timeout once it has passed. The deadline lives in a context variable: a pooled keep-alive
connection serves several requests, each with its own deadline.

The backend also remembers its open sockets, so `DeadlineBackend.abort` can end every send in
flight at once (a worker shutting down): a blocked read returns at once instead of waiting for
its deadline.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

_DEADLINE: ContextVar[float | None] = ContextVar("ens_request_deadline", default=None)


class _Aborted(httpcore.ReadError):
    """The send was cut short by `DeadlineBackend.abort` (the worker is stopping)."""


def is_abort(exc: BaseException | None) -> bool:
    """Was this network error the worker's own abort (`DeadlineBackend.abort`)?"""
    return isinstance(exc, _Aborted)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[float]:
    """Run the block's network operations under a deadline ``seconds`` from now (monotonic)."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield seconds
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the current deadline; None when there is none."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def expired() -> bool:
    left = remaining()
    return left is not None and left <= 0


def _bounded(timeout: float | None, exc: type[Exception]) -> float | None:
    """``timeout`` cut to the time left; raises ``exc`` when none is left."""
    left = remaining()
    if left is None:
        return timeout
    if left <= 0:
        raise exc("deadline exceeded")
    return left if timeout is None else min(timeout, left)


def shutdown_socket(sock: socket.socket | None) -> None:
    """Wake any thread blocked on ``sock`` (its read returns EOF or fails); safe to repeat.

    ``socket.socket.shutdown`` itself, not an `ssl.SSLSocket`'s override, which would also
    drop the TLS state another thread is using.
    """
    if sock is None:
        return
    with contextlib.suppress(OSError, ValueError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class DeadlineStream(httpcore.NetworkStream):
    """A stream whose every operation ends by the current deadline."""

    def __init__(self, inner: httpcore.NetworkStream, backend: DeadlineBackend) -> None:
        self._inner = inner
        self._backend = backend
        backend._track(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._backend._check()
        data = self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))
        self._backend._check()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._backend._check()
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._backend._untrack(self)
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        self._backend._untrack(self)
        inner = self._inner.start_tls(
            ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout)
        )
        return DeadlineStream(inner, self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def shutdown(self) -> None:
        shutdown_socket(self._inner.get_extra_info("socket"))


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend with `DeadlineStream` streams and `abort`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._streams: weakref.WeakSet[DeadlineStream] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._aborted = False

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        self._check()
        stream = self._inner.connect_tcp(
            host,
            port,
            _bounded(timeout, httpcore.ConnectTimeout),
            local_address,
            socket_options,
        )
        return DeadlineStream(stream, self)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        self._check()
        stream = self._inner.connect_unix_socket(
            path, _bounded(timeout, httpcore.ConnectTimeout), socket_options
        )
        return DeadlineStream(stream, self)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def abort(self) -> int:
        """End every send in flight now, and refuse new ones; returns the sockets shut."""
        with self._lock:
            self._aborted = True
            streams = list(self._streams)
        for s in streams:
            s.shutdown()
        return len(streams)

    @property
    def aborted(self) -> bool:
        return self._aborted

    def _check(self) -> None:
        if self._aborted:
            raise _Aborted("the sender is shutting down")

    def _track(self, stream: DeadlineStream) -> None:
        with self._lock:
            self._streams.add(stream)
        if self._aborted:  # raced with abort: shut it like the others
            stream.shutdown()

    def _untrack(self, stream: DeadlineStream) -> None:
        with self._lock:
            self._streams.discard(stream)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport (through ``proxy``, if given) on a `DeadlineBackend`.

    httpx 0.28 cannot be given a network backend (encode/httpx#3180), so the connection pool it
    builds is replaced by the same one on ours.
    """

    def __init__(
        self, ssl_context: ssl.SSLContext, backend: DeadlineBackend, proxy: str | None = None
    ) -> None:
        super().__init__(verify=ssl_context)
        limits = httpx.Limits()
        via = None
        if proxy is not None:
            p = httpx.Proxy(proxy)
            target = httpcore.URL(
                scheme=p.url.raw_scheme, host=p.url.raw_host, port=p.url.port, target=b"/"
            )
            via = httpcore.Proxy(target, auth=p.raw_auth, headers=p.headers.raw)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            proxy=via,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )


def environment_mounts(
    ssl_context: ssl.SSLContext, backend: DeadlineBackend
) -> dict[str, httpx.BaseTransport | None]:
    """The proxies of ``HTTP(S)_PROXY``/``ALL_PROXY``/``NO_PROXY`` as httpx mounts on ``backend``:
    a client given its own transport no longer reads them, as a default client did."""
    try:
        from httpx._utils import get_environment_proxies
    except ImportError:  # a later httpx: no proxies from the environment then
        return {}
    return {
        pattern: None if url is None else DeadlineTransport(ssl_context, backend, url)
        for pattern, url in get_environment_proxies().items()
    }
