"""Signed webhook delivery, and the verification receivers use.

Scheme (Stripe-like, so receivers know it): ``X-ENS-Signature: v1=<hex HMAC-SHA256>`` over
``f"{X-ENS-Timestamp}.{raw body}"``. Signing the timestamp with the body lets a receiver reject
replays of an old, validly signed request (`verify`'s ``tolerance``). Several ``v1=`` values,
comma separated, are accepted so a secret can be rotated without downtime.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from notifiers.attempt import Attempt
from notifiers.config import WebhookConfig
from notifiers.deadline import (
    DeadlineBackend,
    DeadlineTransport,
    environment_mounts,
    expired,
    is_abort,
    within,
)
from notifiers.metrics import DEADLINES
from notifiers.store import dumps
from profiles.subscribers import mask_urls

SIGNATURE_HEADER = "X-ENS-Signature"
TIMESTAMP_HEADER = "X-ENS-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRYABLE_STATUS = frozenset({408, 429})
MAX_RESPONSE_BYTES = 4096
"""The most of a response body read: the status says how it went; a receiver that answers a
huge (or endless) body must not cost the worker its memory or a thread."""


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def sign(secret: str | bytes, timestamp: int | str, body: str | bytes) -> str:
    """The ``X-ENS-Signature`` value: ``v1=`` + hex HMAC-SHA256 of ``f"{timestamp}.{body}"``."""
    msg = _bytes(str(timestamp)) + b"." + _bytes(body)
    return "v1=" + hmac.new(_bytes(secret), msg, hashlib.sha256).hexdigest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # plain dicts are case-sensitive; HTTP header names are not
        lname = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lname), None)
    return value


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: str | bytes,
    tolerance: float = 300,
    now: float | None = None,
) -> bool:
    """True iff a ``v1`` signature matches and the timestamp is within ``tolerance`` seconds.

    ``body`` must be the raw request bytes (re-serialising parsed JSON changes them).
    """
    ts_raw, sig = _header(headers, TIMESTAMP_HEADER), _header(headers, SIGNATURE_HEADER)
    if not ts_raw or not sig:
        return False
    ts_raw = ts_raw.strip()
    # ASCII digits only: int() also reads "٣", "+5" and "1_0"; a timestamp is plain digits
    if not (ts_raw.isascii() and ts_raw.isdigit()) or len(ts_raw) > 15:
        return False
    ts = int(ts_raw)
    if abs((time.time() if now is None else now) - ts) > tolerance:
        return False
    expected = _bytes(sign(secret, ts_raw, body))
    ok = False
    for part in sig.split(","):
        # no early exit: the time taken does not depend on which candidate matched
        ok |= hmac.compare_digest(_bytes(part.strip()), expected)
    return ok


def build_body(n: Mapping[str, Any]) -> bytes:
    """The POST body: the outbox record under webhook-friendly names (with ``alarm`` for an
    alarm message: docs/alarms.md)."""
    return dumps(webhook_fields(n)).encode()


def webhook_fields(n: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the default POST body (`build_body`; ``body`` in a template)."""
    body = {
        "notification_id": n.get("id"),
        "profile": n.get("profile"),
        "subscriber": n.get("subscriber"),
        "ts": n.get("ts"),
        "events": n.get("events", {}),
        "partition": n.get("partition"),
    }
    if "alarm" in n:
        body["alarm"] = n["alarm"]
    return body


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delta-seconds or an HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now_dt = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return max((when - now_dt).total_seconds(), 0.0)


def classify(resp: httpx.Response) -> Attempt:
    """2xx ok; 408/429/5xx retry (429/503 with their Retry-After); any other status is final."""
    code = resp.status_code
    detail = f"HTTP {code}"
    if 200 <= code < 300:
        return Attempt.success(detail)
    reason = f"{detail} {resp.reason_phrase}".strip()
    if code in RETRYABLE_STATUS or code >= 500:
        after = parse_retry_after(resp.headers.get("Retry-After")) if code in (429, 503) else None
        return Attempt.retry(reason, after)
    # 3xx included: following a redirect with a signed POST is not something to do silently
    return Attempt.fatal(reason)


def destination(url: str) -> str:
    """The origin ``scheme://host:port`` a webhook URL is sent to.

    Limits and circuit breakers key on it rather than on the URL: two subscribers' paths on one
    host share one server, and it is the server that hangs or fails.
    """
    try:
        u = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError):
        return url
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return f"{u.scheme}://{u.host}:{port}" if u.host else url


class WebhookSender:
    """One pooled, thread-safe httpx client for all webhook deliveries of a worker.

    Each request has a total deadline, ``config.timeout``: connecting, sending, the headers and
    the first `MAX_RESPONSE_BYTES` of the body (the rest is not read) all end by then
    (`notifiers.deadline`), however slowly the receiver trickles its answer.
    """

    def __init__(self, config: WebhookConfig | None = None) -> None:
        self.config = config or WebhookConfig()
        self._backend = DeadlineBackend()
        total = self.config.timeout
        ctx = self.config.ssl_context()
        self._client = httpx.Client(
            transport=DeadlineTransport(ctx, self._backend),
            mounts=environment_mounts(ctx, self._backend),
            timeout=httpx.Timeout(total, connect=min(self.config.connect_timeout, total)),
            headers={"User-Agent": self.config.user_agent},
            follow_redirects=False,
        )

    def close(self) -> None:
        self._client.close()

    def abort(self) -> int:
        """End the requests in flight now (the worker is stopping); returns how many sockets."""
        return self._backend.abort()

    def send(
        self, url: str, secret: str, n: Mapping[str, Any], body: bytes | None = None
    ) -> Attempt:
        """POST ``body`` (default: `build_body` of ``n``), signed with ``secret``."""
        body = build_body(n) if body is None else body
        ts = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            IDEMPOTENCY_HEADER: str(n.get("id")),
            TIMESTAMP_HEADER: ts,
            SIGNATURE_HEADER: sign(secret, ts, body),
        }
        total = self.config.timeout
        started = time.monotonic()
        with within(total):
            try:
                with self._client.stream("POST", url, content=body, headers=headers) as resp:
                    _read_some(resp, MAX_RESPONSE_BYTES)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:  # may quote the URL
                return Attempt.fatal(f"bad URL: {mask_urls(str(exc))}")
            except httpx.TransportError as exc:
                if is_abort(exc.__cause__ or exc.__context__) or self._backend.aborted:
                    return Attempt.abandon("abandoned: the worker is shutting down")
                if expired():
                    DEADLINES.labels("webhook", "request").inc()
                    return Attempt.retry(
                        f"timeout: deadline exceeded after {time.monotonic() - started:.1f} s "
                        f"(ENS_WEBHOOK_TIMEOUT={total:g}): {type(exc).__name__}"
                    )
                if isinstance(exc, httpx.TimeoutException):
                    return Attempt.retry(f"timeout: {type(exc).__name__}")
                return Attempt.retry(f"network error: {type(exc).__name__}: {mask_urls(str(exc))}")
        return classify(resp)


def _read_some(resp: httpx.Response, limit: int) -> int:
    """Read at most about ``limit`` bytes of the body, then stop; returns the bytes read.

    A short body is read to its end, so the connection can be kept alive; a longer one is
    left unread and the connection closed with the response.
    """
    got = 0
    for chunk in resp.iter_raw():
        got += len(chunk)
        if got >= limit:
            break
    return got
