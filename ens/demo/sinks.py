"""The demo's receivers: a local mail sink (aiosmtpd) and a webhook sink that checks every
request's signature with `notifiers.webhook.verify`."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ens.demo.config import HOST
from ens.errors import DemoError

# ----------------------------------------------------------------------------- sinks


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise DemoError(
                f"port {port} on {HOST} is busy ({exc.strerror}); choose another --port "
                "(0 picks a free one)"
            ) from None


class MailSink:
    """An SMTP server on loopback that keeps (recipient, subject) of every mail."""

    def __init__(self, on_mail: Callable[[str, str], None]) -> None:
        self.on_mail = on_mail
        self.received: list[tuple[str, str]] = []
        self.port = free_port()
        self._lock = threading.Lock()
        self._controller: Any = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        subject = " ".join(str(msg.get("Subject", "")).split())
        for rcpt in envelope.rcpt_tos:
            with self._lock:
                self.received.append((rcpt, subject))
            self.on_mail(rcpt, subject)
        return "250 OK"

    def start(self) -> None:
        from aiosmtpd.controller import Controller

        self._controller = Controller(self, hostname=HOST, port=self.port)
        self._controller.start()

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


class WebhookSink:
    """An HTTP server on loopback: ``POST /hook/<subscriber>/<channel>``, signatures checked.

    ``keys`` holds (path, Idempotency-Key) of valid requests, so a redelivery counts once.
    """

    def __init__(self, on_hook: Callable[[str, bool, dict[str, Any]], None]) -> None:
        self.secrets: dict[str, str] = {}
        self.invalid = 0
        self.keys: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                from notifiers.webhook import verify

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sid = self.path.split("/")[2] if self.path.count("/") >= 2 else ""
                secret = sink.secrets.get(sid)
                ok = secret is not None and verify(secret, dict(self.headers.items()), body)
                with sink._lock:
                    if ok:
                        sink.keys.add((self.path, self.headers.get("Idempotency-Key", "")))
                    else:
                        sink.invalid += 1
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                try:
                    payload = json.loads(body) if ok else {}
                except ValueError:
                    payload = {}
                on_hook(sid, ok, payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="webhook-sink", daemon=True
        )

    def url(self, sid: str, ch: int) -> str:
        return f"http://{HOST}:{self.port}/hook/{sid}/{ch}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
