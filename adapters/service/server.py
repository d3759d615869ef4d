"""`ens serve`: the HTTP API, the engine worker and the delivery worker.

By default all three run in one process; ``--role`` picks some of them (run the others as
separate `ens serve --role ...` processes on the same Redis), and ``--api-workers N`` forks N
API processes that accept on one pre-bound socket (the engine worker stays single: it holds
``ens:engine:lock``). Each part in this process runs in its own thread (API processes: forked
children); the main thread only waits for SIGTERM/SIGINT (or for a part
to die) and then stops them in order: HTTP first (no new events), then the engine worker
(which writes a final snapshot and releases its lock), then the delivery worker. A part that
dies takes the process down with a non-zero status, so a supervisor restarts the whole
service instead of leaving it half-alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import uvicorn

from adapters.errors import EvictingRedis
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.api import ApiSettings, IngestLimits, create_app
from adapters.service.archive_feed import ArchiverConfig
from adapters.service.connections import uvicorn_options
from adapters.service.embedded import EmbeddedError
from adapters.service.redis_limits import check_policy
from adapters.service.settings import DEFAULTS, ROLES, ServiceSettings
from adapters.service.worker import EngineWorker, WorkerConfig
from profiles.subscribers import mask_url

log = logging.getLogger("ens.service")


@dataclass
class ServeConfig:
    """The process's view of `ServiceSettings` (`from_settings`)."""

    host: str = DEFAULTS.host
    port: int = DEFAULTS.port
    redis_url: str | None = None
    data_dir: Path | None = None
    max_body: int = DEFAULTS.max_body
    max_backlog: int = DEFAULTS.max_backlog
    deliver: bool = DEFAULTS.deliver
    roles: tuple[str, ...] = DEFAULTS.effective_roles  # which parts run in this process
    api_workers: int = DEFAULTS.api_workers  # >1: forked API processes sharing the socket
    keepalive_timeout: float = DEFAULTS.keepalive_timeout  # an idle keep-alive connection
    header_timeout: float = DEFAULTS.header_timeout  # for a request's headers to arrive
    max_connections: int = DEFAULTS.max_connections  # per API process (0: open-file limit)
    log_level: str = DEFAULTS.log_level
    log_format: str = DEFAULTS.log_format
    access_log: bool = DEFAULTS.access_log
    console: bool = DEFAULTS.console
    metrics_label_limit: int = DEFAULTS.metrics_label_limit
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    limits: IngestLimits = field(default_factory=IngestLimits)
    admin_token: str | None = None  # ENS_ADMIN_TOKEN; None: generated at the first start
    metrics_token: str | None = None  # ENS_METRICS_TOKEN; None: /metrics is public
    notifiers_config: Path | None = None  # ENS_NOTIFIERS_CONFIG
    allow_evicting_redis: bool = DEFAULTS.allow_evicting_redis  # else refuse such a Redis
    archive: ArchiverConfig | None = None  # --archive: the archiver role's view

    @classmethod
    def from_settings(cls, s: ServiceSettings, worker: WorkerConfig) -> ServeConfig:
        return cls(
            host=s.host,
            port=s.port,
            redis_url=s.redis_url,
            data_dir=s.data_dir,
            max_body=s.max_body,
            max_backlog=s.max_backlog,
            deliver=s.deliver,
            roles=s.effective_roles,
            api_workers=s.api_workers,
            keepalive_timeout=s.keepalive_timeout,
            header_timeout=s.header_timeout,
            max_connections=s.max_connections,
            log_level=s.log_level,
            log_format=s.log_format,
            access_log=s.access_log,
            console=s.console,
            metrics_label_limit=s.metrics_label_limit,
            worker=worker,
            limits=IngestLimits.from_settings(s),
            admin_token=s.admin_token,
            metrics_token=s.metrics_token,
            notifiers_config=s.notifiers_config,
            allow_evicting_redis=s.allow_evicting_redis,
            archive=archiver_config(s),
        )


def archiver_config(s: ServiceSettings) -> ArchiverConfig | None:
    uri = s.archive_uri()
    if uri is None:
        return None
    return ArchiverConfig(
        uri,
        flush=s.archive_flush,
        retention=s.archive_retention,
        max_bytes=s.archive_max_bytes,
    )


class _Part(threading.Thread):
    """A daemon thread that remembers whether it failed; ``halt`` asks it to stop."""

    def __init__(self, name: str, target: Any, *args: Any, halt: Any = None) -> None:
        super().__init__(name=name, daemon=True)
        self._fn, self._args = target, args
        self.failed: BaseException | None = None
        self.halt = halt or (lambda: None)

    def run(self) -> None:
        try:
            self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.failed = exc
            log.exception("%s failed", self.name)


class _Child:
    """An API process forked from this one, serving the shared listening socket.

    Same interface as `_Part`. The child dies with its parent (PR_SET_PDEATHSIG), so a
    ``kill -9`` of the parent leaves no orphan serving the port.
    """

    def __init__(self, name: str, serve: Any) -> None:
        self.name, self._serve = name, serve
        self.pid = 0
        self.status: int | None = None
        self.failed: BaseException | None = None

    def start(self) -> None:
        pid = os.fork()
        if pid:
            self.pid = pid
            return
        code = 1
        try:
            _die_with_parent()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)  # uvicorn installs its own handlers
            self._serve()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - the parent sees the exit status
            log.exception("%s failed", self.name)
        finally:
            os._exit(code)  # no atexit/finalizers: the embedded Redis belongs to the parent

    def is_alive(self) -> bool:
        if self.status is None:
            done, st = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status is None

    def halt(self) -> None:
        if self.is_alive():
            os.kill(self.pid, signal.SIGTERM)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.is_alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.status = -signal.SIGKILL
        if self.status:
            self.failed = RuntimeError(f"{self.name} exited with status {self.status}")


RESPAWN_GIVE_UP = 5  # API processes dying this many times in a row, each within ...
RESPAWN_QUICK = 2.0  # ... this many seconds of their start: the supervisor gives up


def supervise_api(n: int, serve: Any) -> int:
    """Keep ``n`` API processes serving (forked from this one, which holds no threads).

    Runs in a process of its own, forked from `ens serve` before any thread starts, so its
    children are forked from a single-threaded process with no counts of its own. A child that
    dies is replaced at once (its siblings keep serving); SIGTERM/SIGINT stops them all and
    returns 0 once they have stopped. Children that keep dying right after their start
    (a bug, not a crash) make it give up with status 1.
    """
    stopping = [False]

    def on_signal(_signum: int, _frame: Any) -> None:
        stopping[0] = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    kids: dict[int, tuple[int, float]] = {}  # pid -> (slot, start time)

    def spawn(slot: int) -> None:
        child = _Child(f"http-{slot}", serve)
        child.start()
        kids[child.pid] = (slot, time.monotonic())

    for slot in range(n):
        spawn(slot)
    quick_deaths = 0
    status = 0
    while not stopping[0]:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            time.sleep(0.1)
            continue
        slot, started = kids.pop(pid)
        code = os.waitstatus_to_exitcode(st)
        quick_deaths = quick_deaths + 1 if time.monotonic() - started < RESPAWN_QUICK else 0
        if quick_deaths >= RESPAWN_GIVE_UP:
            log.error(
                "API process http-%d exited with status %d, %d times in a row right "
                "after its start; giving up",
                slot,
                code,
                quick_deaths,
            )
            status = 1
            break
        log.error(
            "API process http-%d (pid %d) exited with status %d; starting a new one",
            slot,
            pid,
            code,
        )
        spawn(slot)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while kids and time.monotonic() < deadline:
        for pid in list(kids):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                del kids[pid]
                # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly
                if os.waitstatus_to_exitcode(st) not in (0, -signal.SIGTERM):
                    status = 1
        time.sleep(0.05)
    for pid in kids:  # did not stop in time
        os.kill(pid, signal.SIGKILL)
        status = 1
    return status


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM still stops it
        pass


def setup_logging(level: str, log_format: str = "text") -> None:
    """One record per line (text or JSON); httpx's per-request INFO lines off (notifiers.logs)."""
    from notifiers.logs import setup_logging as one_line

    one_line(level, force=True, log_format=log_format)


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
    setup_logging(cfg.log_level, cfg.log_format)
    m.set_label_limit(cfg.metrics_label_limit)
    notifier_cfg = None
    if cfg.deliver and "deliver" in cfg.roles:
        from notifiers.config import ConfigError, NotifierConfig

        try:
            notifier_cfg = NotifierConfig.load(cfg.notifiers_config)
        except ConfigError as exc:
            return _startup_error(str(exc))
    if cfg.archive is not None and "archive" in cfg.roles:
        from adapters.archive.layout import open_archive
        from profiles.errors import ENSError

        try:
            open_archive(cfg.archive.uri)
        except ENSError as exc:
            return _startup_error(f"--archive: {exc}")
    sock = None
    if "api" in cfg.roles:
        try:
            sock = listen(cfg.host, cfg.port)
        except OSError as exc:
            return _startup_error(
                f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc} (use --host/--port)"
            )
    conn: rs.Connection | None = None
    try:
        conn = rs.connect(cfg.redis_url, cfg.data_dir)
        # the first command also tells whether Redis is reachable; nothing is written to a
        # Redis that may evict it
        _policy, warning = check_policy(conn.text(), cfg.allow_evicting_redis)
        token_hash, generated = rs.ensure_admin_token(conn.text(), cfg.admin_token)
    except (redis.RedisError, OSError, EmbeddedError, EvictingRedis) as exc:
        if sock is not None:
            sock.close()
        if conn is not None:
            conn.close()
        if isinstance(exc, EvictingRedis):
            return _startup_error(f"refusing to start: {exc}")
        return _startup_error(f"cannot reach Redis: {exc}")
    if warning:
        log.warning("%s", warning)
    try:  # from here on the connection (and an embedded server we started) is closed on any exit
        return _serve(cfg, conn, sock, notifier_cfg, token_hash, generated)
    finally:
        conn.close()


def _serve(
    cfg: ServeConfig,
    conn: rs.Connection,
    sock: socket.socket | None,
    notifier_cfg: Any,
    token_hash: str,
    generated: str | None,
) -> int:
    _announce(cfg, conn, sock, notifier_cfg, generated)
    # Stopped in this order: HTTP first, so no event arrives after the final snapshot was
    # planned (one that does is in the ingest stream for the next start anyway), then the
    # engine worker (final snapshot, lock released), then delivery.
    parts: list[Any] = []
    if sock is not None:
        parts.append(_http_part(cfg, conn, sock, token_hash))
    if "engine" in cfg.roles:
        engine_stop = threading.Event()
        worker = EngineWorker(conn.binary(), cfg.worker)
        parts.append(_Part("engine-worker", worker.run_forever, engine_stop, halt=engine_stop.set))
    delivery = None
    if notifier_cfg is not None:
        from notifiers.worker import DeliveryWorker

        delivery_stop = threading.Event()
        delivery = DeliveryWorker(conn.text(), notifier_cfg)
        parts.append(
            _Part("delivery-worker", delivery.run_forever, delivery_stop, halt=delivery_stop.set)
        )

    archiving = "archive" in cfg.roles and cfg.archive is not None
    if archiving:
        from adapters.service.archiver import Archiver

        archive_stop = threading.Event()
        archiver = Archiver(conn.binary(), cfg.archive)  # type: ignore[arg-type]
        parts.append(_Part("archiver", archiver.run_forever, archive_stop, halt=archive_stop.set))
        log.info("archiving processed events to %s", cfg.archive.uri)  # type: ignore[union-attr]
    if "engine" in cfg.roles or delivery is not None or archiving:  # an API thread would too
        m.Publisher.ensure(conn.url)  # after the fork: children publish their own
    status = _run_parts(parts, conn)
    if delivery is not None:
        delivery.close()
    try:
        m.unpublish(conn.text())
    except redis.RedisError:
        pass
    log.info("stopped")
    return status


def _announce(
    cfg: ServeConfig,
    conn: rs.Connection,
    sock: socket.socket | None,
    notifier_cfg: Any,
    generated: str | None,
) -> None:
    """The start-up lines: a new admin token (once), where the store is, the roles run."""
    if generated:
        # Shown once; only its hash is stored. Lost? `ens serve --reset-admin-token`.
        print(f"admin token (shown once, keep it): {generated}", file=sys.stderr, flush=True)
    shown = mask_url(conn.url, query=False)  # a Redis password must not reach the log
    where = shown if conn.embedded is None else f"embedded redis {shown}"
    if conn.created:
        log.info("new store in %s", conn.embedded.dir if conn.embedded else shown)
    roles = ", ".join(
        r
        for r in ROLES
        if r in cfg.roles
        and (r != "deliver" or notifier_cfg)
        and (r != "archive" or cfg.archive is not None)
    )
    if sock is not None:
        log.info(
            "ENS service on http://%s:%d, %s (%s; %d API process%s)",
            cfg.host,
            cfg.port,
            where,
            roles,
            cfg.api_workers,
            "es" if cfg.api_workers > 1 else "",
        )
    else:
        log.info("ENS service, %s (%s)", where, roles)


def _http_part(cfg: ServeConfig, conn: rs.Connection, sock: socket.socket, token_hash: str) -> Any:
    """The HTTP API on ``sock``: a thread, or with ``--api-workers`` > 1 a forked supervisor of
    that many processes (forked before any thread starts)."""
    metrics_token = cfg.metrics_token
    settings = ApiSettings(
        conn.url,
        token_hash,
        cfg.max_body,
        max_backlog=cfg.max_backlog,
        limits=cfg.limits,
        metrics_token_sha256=rs.sha256(metrics_token) if metrics_token else None,
        access_log=cfg.access_log,
        console=cfg.console,
        archive_uri=cfg.archive.uri if cfg.archive else None,
    )

    def make_server() -> uvicorn.Server:
        return uvicorn.Server(
            uvicorn.Config(
                create_app(settings),
                host=cfg.host,
                port=cfg.port,
                log_level="warning",
                access_log=False,  # ours, with the route and duration: --access-log
                # json: uvicorn's own records go through the root logger's JSON lines
                log_config=None if cfg.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
                lifespan="on",
                timeout_graceful_shutdown=5,
                **uvicorn_options(cfg.keepalive_timeout, cfg.header_timeout, cfg.max_connections),
            )
        )

    if cfg.api_workers > 1:  # forked before any thread starts
        n = cfg.api_workers
        sup = _Child("http", lambda: sys.exit(supervise_api(n, lambda: make_server().run([sock]))))
        sup.start()
        sock.close()  # the supervisor and its children hold it
        return sup
    server = make_server()
    return _Part("http", server.run, [sock], halt=lambda: setattr(server, "should_exit", True))


def _run_parts(parts: list[Any], conn: rs.Connection) -> int:
    """Start the threads, watch them until a signal or one of them dies, stop them in order.
    Exit status 1 when a part died or failed."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    for p in parts:
        if not isinstance(p, _Child):
            p.start()
    status = 0
    while not stop.wait(0.5):
        # A shared embedded Redis that died (killed, out of memory) is started again on its
        # stable socket by whichever role notices first; every role's clients reconnect.
        with contextlib.suppress(Exception):
            if conn.revive():
                log.warning("the embedded Redis had stopped; started it again on %s", conn.url)
        dead = [p for p in parts if not p.is_alive()]
        if dead:
            log.error("%s stopped unexpectedly; shutting down", ", ".join(p.name for p in dead))
            status = 1
            stop.set()
    for p in parts:  # in order; API processes all at once, then waited for
        if isinstance(p, _Child):
            p.halt()
    for p in parts:
        p.halt()
        p.join(timeout=30)
        if p.failed is not None:
            status = 1
    return status
