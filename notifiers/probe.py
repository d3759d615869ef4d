"""Test messages (`ens subscriber test`, ``POST /v1/subscribers/{id}/test``): a real signed
message to a subscriber's channels through the senders the delivery worker uses, answered at
once with what the receiver said (HTTP status, SMTP reply), within a deadline.

Not through the outbox: a person pressing "send test" wants the answer now, not after the
retries and the digest window. No retry, no dead letter, nothing stored; the circuit breaker
of the delivery worker is not consulted either (a test is how one checks a receiver that
came back).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from notifiers.attempt import Attempt
from notifiers.config import NotifierConfig
from notifiers.email import SmtpSender, build_message, compose
from notifiers.store import EmailChannel, Subscriber, WebhookChannel, describe_channel

PROFILE = "ens-test"  # the profile name a test message carries


@dataclass(frozen=True, slots=True)
class Probe:
    """The outcome of one channel's test message."""

    channel: int
    kind: str  # webhook | email
    to: str
    delivered: bool
    answer: str  # "HTTP 204", "SMTP host:port: 250 OK", or the error
    seconds: float
    id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def probe_record(sid: str, now: float) -> dict[str, Any]:
    """The outbox-shaped record of a test message (its id is the Idempotency-Key)."""
    return {
        "id": f"test:{sid}:{secrets.token_hex(6)}",
        "profile": PROFILE,
        "subscriber": sid,
        "ts": now,
        "events": {},
        "partition": {"test": "a test message from ENS: nothing happened"},
    }


def send_test(
    sub: Subscriber,
    config: NotifierConfig,
    channel: int | None = None,
    deadline: float = 10.0,
    now: float | None = None,
) -> list[Probe]:
    """Send a test message to one channel (``channel``, 0-based) or to each; every send ends
    within ``deadline`` seconds. IndexError names a channel the subscriber lacks."""
    if channel is not None and not 0 <= channel < len(sub.channels):
        raise IndexError(
            f"subscriber {sub.id!r} has no channel #{channel} (it has {len(sub.channels)}: "
            f"0 to {len(sub.channels) - 1})"
        )
    chosen = range(len(sub.channels)) if channel is None else [channel]
    out = []
    for i in chosen:
        ch = sub.channels[i]
        n = probe_record(sub.id, time.time() if now is None else now)
        started = time.monotonic()
        result = _send(sub, ch, n, config, deadline)
        kind = "webhook" if isinstance(ch, WebhookChannel) else "email"
        answer = result.detail if result.ok else result.error
        out.append(
            Probe(
                i,
                kind,
                describe_channel(ch.model_dump(exclude_none=True)),
                result.ok,
                answer,
                round(time.monotonic() - started, 3),
                str(n["id"]),
            )  # fmt: skip
        )
    return out


def _send(
    sub: Subscriber,
    ch: WebhookChannel | EmailChannel,
    n: dict[str, Any],
    config: NotifierConfig,
    deadline: float,
) -> Attempt:
    from notifiers.webhook import WebhookSender  # httpx only when a webhook is tested

    if isinstance(ch, WebhookChannel):
        secret = sub.webhook_secret(ch)
        if not secret:
            return Attempt.fatal("no signing secret for this webhook")
        wc = config.webhook.model_copy(update={"timeout": min(config.webhook.timeout, deadline)})
        sender = WebhookSender(wc)
        try:
            return sender.send(ch.webhook, secret, n)
        finally:
            sender.close()
    sc = config.smtp.model_copy(update={"deadline": min(config.smtp.deadline, deadline)})
    msg = compose(build_message, n, sc.sender, ch.email, key=str(n["id"]))
    return msg if isinstance(msg, Attempt) else SmtpSender(sc).send(msg)
