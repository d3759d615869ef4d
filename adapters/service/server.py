"""`ens serve`: the HTTP API, the engine worker and the delivery worker in one process.

Each part runs in its own thread; the main thread only waits for SIGTERM/SIGINT (or for a part
to die) and then stops them in order: HTTP first (no new events), then the engine worker
(which writes a final snapshot and releases its lock), then the delivery worker. A part that
dies takes the process down with a non-zero status, so a supervisor restarts the whole
service instead of leaving it half-alive.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import uvicorn

from adapters.service import redis_store as rs
from adapters.service.api import ApiSettings, IngestLimits, create_app
from adapters.service.worker import EngineWorker, WorkerConfig

log = logging.getLogger("ens.service")


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    redis_url: str | None = None
    data_dir: Path | None = None
    max_body: int = 1 << 20
    deliver: bool = True
    log_level: str = "INFO"
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    limits: IngestLimits = field(default_factory=IngestLimits)


class _Part(threading.Thread):
    """A daemon thread that remembers whether it failed."""

    def __init__(self, name: str, target: Any, *args: Any) -> None:
        super().__init__(name=name, daemon=True)
        self._fn, self._args = target, args
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.failed = exc
            log.exception("%s failed", self.name)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def listen(host: str, port: int) -> socket.socket:
    """The bound HTTP socket (as uvicorn would bind it), so a busy port is found before start.

    Created with proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections of
    such a socket, and without it a keep-alive client waited ~40 ms per request (Nagle vs the
    client's delayed ACK; 84 single-event POSTs/s instead of 500+ in bench/service_load.py).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _startup_error(message: str) -> int:
    """A user error at start-up (bad notifier config, busy port, Redis unreachable): one line, no traceback."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def run(cfg: ServeConfig) -> int:
    """Run until a signal; returns the exit status (0 after a clean stop, 2 if it cannot start)."""
    setup_logging(cfg.log_level)
    notifier_cfg = None
    if cfg.deliver:
        from notifiers.config import ConfigError, NotifierConfig

        try:
            notifier_cfg = NotifierConfig.load()
        except ConfigError as exc:
            return _startup_error(str(exc))
    try:
        sock = listen(cfg.host, cfg.port)
    except OSError as exc:
        return _startup_error(f"cannot listen on {cfg.host}:{cfg.port}: "
                              f"{exc.strerror or exc} (use --host/--port)")
    conn: rs.Connection | None = None
    try:
        conn = rs.connect(cfg.redis_url, cfg.data_dir)
        # the first command also tells whether Redis is reachable
        token_hash, generated = rs.ensure_admin_token(conn.text(), os.environ.get(rs.ENV_ADMIN_TOKEN))
    except (redis.RedisError, OSError) as exc:
        sock.close()
        if conn is not None:
            conn.close()
        return _startup_error(f"cannot reach Redis: {exc}")
    try:  # from here on the connection (and an embedded server we started) is closed on any exit
        return _serve(cfg, conn, sock, notifier_cfg, token_hash, generated)
    finally:
        conn.close()


def _serve(
    cfg: ServeConfig, conn: rs.Connection, sock: socket.socket, notifier_cfg: Any,
    token_hash: str, generated: str | None,
) -> int:
    if generated:
        # Shown once; only its hash is stored. Lost? `ens serve --reset-admin-token`.
        print(f"admin token (shown once, keep it): {generated}", file=sys.stderr, flush=True)
    where = conn.url if conn.embedded is None else f"embedded redis {conn.url}"
    log.info("ENS service on http://%s:%d, %s", cfg.host, cfg.port, where)

    app = create_app(ApiSettings(conn.url, token_hash, cfg.max_body, limits=cfg.limits))
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False,
            lifespan="on", timeout_graceful_shutdown=5,
        )
    )
    stop = threading.Event()
    worker = EngineWorker(conn.binary(), cfg.worker)
    # Joined in this order on the way out: HTTP first, so no event arrives after the final
    # snapshot was planned (one that does is in the ingest stream for the next start anyway).
    parts = [_Part("http", server.run, [sock]), _Part("engine-worker", worker.run_forever, stop)]
    delivery = None
    if notifier_cfg is not None:
        from notifiers.worker import DeliveryWorker

        delivery = DeliveryWorker(conn.text(), notifier_cfg)
        parts.append(_Part("delivery-worker", delivery.run_forever, stop))

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    for p in parts:
        p.start()
    status = 0
    while not stop.wait(0.5):
        dead = [p for p in parts if not p.is_alive()]
        if dead:
            log.error("%s stopped unexpectedly; shutting down", ", ".join(p.name for p in dead))
            status = 1
            stop.set()
    server.should_exit = True
    for p in parts:
        p.join(timeout=30)
        if p.failed is not None:
            status = 1
    if delivery is not None:
        delivery.close()
    log.info("stopped")
    return status
