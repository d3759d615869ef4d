"""Issue 41.9 papercuts of delivery: control characters of event data in a mail's Subject, and
one log line per notification of a profile without a subscriber. Real Redis, a real aiosmtpd
SMTP server on loopback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from notifiers import store
from notifiers.metrics import REGISTRY
from notifiers.worker import DeliveryWorker
from tests.helpers_notifiers import MailSink, drive, fast_config, notification, settled, smtp_server

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)


class RawSink(MailSink):
    """Keeps each message's bytes as they came over the wire, before any parsing."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.raw.append(bytes(envelope.original_content or envelope.content))
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def sink() -> RawSink:
    return RawSink()


@pytest.fixture
def smtp_port(sink: RawSink) -> Iterator[int]:
    with smtp_server(sink) as port:
        yield port


def test_event_data_with_nul_and_line_breaks_never_reaches_the_subject(
    r: redis.Redis, sink: RawSink, smtp_port: int
) -> None:
    """A partition value (an event attribute) with NUL, CR/LF and ESC: the mail goes out with
    a one-line Subject of printable characters, no injected header, one recipient; nor does
    an attribute's NUL reach the body."""
    store.put_subscriber(r, {"id": "s1", "channels": [{"email": "alice@example.org"}]})
    room = "1\x00\r\nBcc: mallory@example.org\x1b[2J\x7f"
    n = notification("n-nul", partition={"room": room})
    n["events"]["a"]["note"] = "x\x00y\x1b"
    store.enqueue(r, n)
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        drive(w, lambda: bool(sink.raw) and settled(r))
    (raw,) = sink.raw
    head = raw.split(b"\r\n\r\n", 1)[0]
    unfolded = head.replace(b"\r\n ", b" ").replace(b"\r\n\t", b" ").split(b"\r\n")
    subject = next(line for line in unfolded if line.startswith(b"Subject:"))
    assert (
        subject
        == b"Subject: [ENS] p4 matched at 2024-03-01 22:10 UTC (room 1 Bcc: mallory@example.org [2J )"
    )
    assert b"\x00" not in raw and b"\x1b" not in raw and b"\x7f" not in raw  # nor in the body
    assert not any(line.lower().startswith(b"bcc:") for line in unfolded)
    assert sink.envelopes == [("ens@example.org", ["alice@example.org"])]
    parsed = sink.messages[0]["Subject"]
    assert not set(parsed) & {"\x00", "\r", "\n", "\x1b"}


def _unsubscribed() -> float:
    return REGISTRY.get_sample_value("ens_notifications_unsubscribed_total") or 0.0


def test_notifications_without_subscriber_log_once_per_profile_and_are_counted(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """60 notifications of two profiles without a subscriber: two INFO lines (one per profile,
    naming it), all 60 counted in ens_notifications_unsubscribed_total, and acknowledged."""
    before = _unsubscribed()
    for i in range(60):
        store.enqueue(r, notification(f"u{i}", subscriber=None, profile=f"quiet{i % 2}"))
    caplog.set_level(logging.INFO, logger="ens.notifiers")
    with DeliveryWorker(r, fast_config()) as w:
        drive(w, lambda: settled(r))
    lines = [rec.getMessage() for rec in caplog.records if "no subscriber" in rec.getMessage()]
    assert len(lines) == 2, lines
    assert any("'quiet0'" in line for line in lines) and any("'quiet1'" in line for line in lines)
    assert _unsubscribed() - before == 60
    assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 0  # all acknowledged
