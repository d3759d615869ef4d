"""E-mail delivery end to end: real Redis, a real aiosmtpd SMTP server on loopback."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator

import pytest
import redis

from notifiers import store
from notifiers.config import NotifierConfig
from notifiers.email import build_digest, build_message, subject_for
from notifiers.worker import DeliveryWorker
from tests.helpers_notifiers import (
    MailSink,
    drive,
    fast_config,
    free_port,
    notification,
    self_signed_cert,
    settled,
    smtp_server,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)


@pytest.fixture
def sink() -> MailSink:
    return MailSink()


@pytest.fixture
def smtp_port(sink) -> Iterator[int]:
    with smtp_server(sink) as port:
        yield port


def subscribe(r: redis.Redis, address: str = "alice@example.org", **extra) -> None:
    store.put_subscriber(r, {"id": "s1", "channels": [{"email": address}], **extra})


def parts(msg) -> tuple[str, str]:
    return (
        msg.get_body(preferencelist=("plain",)).get_content(),
        msg.get_body(preferencelist=("html",)).get_content(),
    )


# --- rendering -----------------------------------------------------------------------------


def test_subject_names_profile_minute_and_partition():
    assert subject_for(notification("n1")) == "[ENS] p4 matched at 2024-03-01 22:10 UTC (room 101)"
    assert (
        subject_for(notification("n1", partition=None))
        == "[ENS] p4 matched at 2024-03-01 22:10 UTC"
    )
    evil = notification("n1", profile="p\r\nBcc: x@y", partition={"room": "1\n2"})
    assert "\n" not in subject_for(evil) and "\r" not in subject_for(evil)


def test_html_part_escapes_attribute_values():
    n = notification("n1")
    n["events"]["a"]["note"] = "<script>alert('x')</script> & co"
    text, html = parts(build_message(n, "ens@example.org", "a@example.org"))
    assert "note = <script>alert('x')</script> & co" in text
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp; co" in html


def test_message_id_is_stable_per_delivery_key():
    a = build_message(notification("n1"), "ens@example.org", "a@example.org", key="n1:0")
    b = build_message(notification("n1"), "ens@example.org", "a@example.org", key="n1:0")
    c = build_message(notification("n1"), "ens@example.org", "a@example.org", key="n1:1")
    assert a["Message-ID"] == b["Message-ID"] != c["Message-ID"]
    assert a["Message-ID"].endswith("@example.org>")


# --- (e) delivery over SMTP ----------------------------------------------------------------


def test_mail_arrives_with_subject_text_and_html(r, sink, smtp_port):
    subscribe(r)
    store.enqueue(r, notification("n1"))
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        counts = w.run_once()
    assert (counts.delivered, counts.acked) == (1, 1) and settled(r)
    (msg,) = sink.messages
    assert sink.envelopes == [("ens@example.org", ["alice@example.org"])]
    assert msg["Subject"] == "[ENS] p4 matched at 2024-03-01 22:10 UTC (room 101)"
    assert msg["From"] == "ens@example.org" and msg["To"] == "alice@example.org"
    assert msg.get_content_type() == "multipart/alternative"
    text, html = parts(msg)
    assert "Profile p4 matched at 2024-03-01 22:10:05 UTC." in text
    assert "Partition: room 101" in text
    assert "a: event e1 at 2024-03-01 22:09:50 UTC" in text
    assert "kind = door" in text and "level = 3" in text
    assert "<table" in html and "motion" in html and "p4" in html


def test_digest_batches_notifications_into_one_mail_and_survives_restart(r, sink, smtp_port):
    subscribe(r, digest=0.5)
    store.enqueue(r, notification("n1"))
    store.enqueue(r, notification("n2", ts=1709331605.0))
    store.enqueue(r, notification("n3", profile="p7", partition=None))
    cfg = fast_config(smtp_port)
    parked = time.time()
    with DeliveryWorker(r, cfg) as w:
        counts = w.run_once()
    assert counts.digested == 3 and counts.delivered == 0 and counts.acked == 0
    assert not sink.messages
    assert r.zcard(store.digest_key("alice@example.org")) == 3
    # a new worker (after a restart) sends the digest once the oldest is 0.5 s old
    with DeliveryWorker(r, cfg) as w:
        counts = drive(w, lambda: settled(r))
    assert sink.arrivals[0] - parked >= 0.5
    assert counts.delivered == 3 and counts.acked == 3
    (msg,) = sink.messages
    assert msg["Subject"].startswith("[ENS] 3 notifications (p4 ×2, p7)")
    text, html = parts(msg)
    assert all(f"Notification id: {nid}" in text for nid in ("n1", "n2", "n3"))
    assert html.count("<table") == 3
    assert all(r.exists(store.delivered_key(nid, 0)) for nid in ("n1", "n2", "n3"))
    assert not r.exists(store.digest_key("alice@example.org"), store.DIGEST_WINDOW)


def test_global_digest_window_and_late_arrivals_go_into_the_next_digest(r, sink, smtp_port):
    subscribe(r)
    cfg = fast_config(smtp_port)
    cfg.digest = 0.3
    with DeliveryWorker(r, cfg) as w:
        store.enqueue(r, notification("n1"))
        w.run_once()
        drive(w, lambda: len(sink.messages) == 1)
        store.enqueue(r, notification("n2"))
        store.enqueue(r, notification("n3"))
        drive(w, lambda: settled(r))
    first, second = sink.messages
    assert first["Subject"] == subject_for(notification("n1"))  # a digest of one reads as one
    assert second["Subject"].startswith("[ENS] 2 notifications")


def test_smtp_4xx_is_retried_and_5xx_dead_lettered(r, sink, smtp_port):
    subscribe(r)
    sink.script.extend(["451 4.3.0 try again later", "550 5.1.1 no such mailbox"])
    store.enqueue(r, notification("n1"))
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        counts = drive(w, lambda: settled(r))
    assert (counts.retried, counts.dead, counts.delivered) == (1, 1, 0)
    (dl,) = store.list_dead_letters(r)
    assert dl.error.startswith("SMTP 550") and dl.attempts == 2
    assert dl.channel == {"email": "alice@example.org"}


def test_smtp_server_down_is_retried_until_it_comes_up(r, sink):
    port = free_port()
    subscribe(r)
    store.enqueue(r, notification("n1"))
    with DeliveryWorker(r, fast_config(port, max_attempts=100)) as w:
        assert w.run_once().retried == 1
        with smtp_server(sink, port=port):
            drive(w, lambda: settled(r))
    assert len(sink.messages) == 1


def test_digest_send_failure_is_retried(r, sink, smtp_port):
    subscribe(r, digest=0.1)
    sink.script.append("421 4.7.0 busy")
    store.enqueue(r, notification("n1"))
    store.enqueue(r, notification("n2"))
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        counts = drive(w, lambda: settled(r))
    assert counts.retried == 1 and counts.delivered == 2
    (msg,) = sink.messages
    assert msg["Subject"].startswith("[ENS] 2 notifications")


def test_starttls_required_but_not_offered_is_dead_lettered(r, sink, smtp_port):
    subscribe(r)
    store.enqueue(r, notification("n1"))
    cfg = fast_config(smtp_port)
    cfg.smtp.security = "starttls"
    with DeliveryWorker(r, cfg) as w:
        counts = w.run_once()
    assert counts.dead == 1 and not sink.messages  # never falls back to plain text
    assert "STARTTLS" in store.list_dead_letters(r)[0].error


# --- (f) TLS and AUTH ----------------------------------------------------------------------


@pytest.fixture
def cert(tmp_path):
    pair = self_signed_cert(tmp_path)
    if pair is None:
        pytest.skip("neither the `cryptography` package nor an `openssl` binary to make a cert")
    return pair


def server_context(cert) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*map(str, cert))
    return ctx


def tls_config(port: int, security: str, cert, password: str = "s3cret") -> NotifierConfig:
    cfg = fast_config(port, username="ens", password=password, ca_file=str(cert[0]))
    cfg.smtp.security = security  # type: ignore[assignment]
    return cfg


def test_starttls_and_login(r, sink, cert):
    subscribe(r)
    store.enqueue(r, notification("n1"))
    with smtp_server(
        sink,
        tls_context=server_context(cert),
        require_starttls=True,
        authenticator=sink.authenticator,
        auth_require_tls=True,
    ) as port:
        with DeliveryWorker(r, tls_config(port, "starttls", cert)) as w:
            assert w.run_once().delivered == 1
        assert sink.logins == ["ens"] and len(sink.messages) == 1

        store.enqueue(r, notification("n2"))
        with DeliveryWorker(r, tls_config(port, "starttls", cert, "wrong")) as w:
            assert w.run_once().dead == 1  # 535: a config error, not worth retrying
        assert "SMTP 535" in store.list_dead_letters(r)[0].error


def test_untrusted_certificate_is_not_accepted(r, sink, cert, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    other_cert = self_signed_cert(other)
    subscribe(r)
    store.enqueue(r, notification("n1"))
    with smtp_server(sink, tls_context=server_context(cert), require_starttls=True) as port:
        cfg = tls_config(port, "starttls", other_cert)
        cfg.retry.max_attempts = 1
        with DeliveryWorker(r, cfg) as w:
            assert w.run_once().dead == 1
    assert not sink.messages and "CERTIFICATE_VERIFY_FAILED" in store.list_dead_letters(r)[0].error


def test_implicit_tls(r, sink, cert):
    subscribe(r)
    store.enqueue(r, notification("n1"))
    # aiosmtpd does not count implicit TLS as TLS for AUTH, hence auth_require_tls=False
    with smtp_server(
        sink,
        ssl_context=server_context(cert),
        authenticator=sink.authenticator,
        auth_require_tls=False,
    ) as port:
        with DeliveryWorker(r, tls_config(port, "tls", cert)) as w:
            assert w.run_once().delivered == 1
    assert sink.logins == ["ens"] and len(sink.messages) == 1


def test_build_digest_orders_and_counts():
    ns = [notification("n1"), notification("n2", profile="p7")]
    msg = build_digest(ns, "ens@example.org", "a@example.org")
    text = msg.get_body(preferencelist=("plain",)).get_content()
    assert text.index("n1") < text.index("n2") and text.startswith("2 notifications:")


@pytest.mark.parametrize("digest", [None, 0.1])
def test_mail_that_cannot_be_built_is_dead_lettered_at_once(r, sink, smtp_port, digest):
    # ts = 1e12 s is the year 33658: datetime cannot render it, however often it is retried
    subscribe(r, **({"digest": digest} if digest else {}))
    store.enqueue(r, notification("n1", ts=1e12))
    store.enqueue(r, notification("n2"))  # a good one, in the same digest when there is one
    store.enqueue(r, notification("n3", ts=1e12))
    with DeliveryWorker(r, fast_config(smtp_port, max_attempts=100)) as w:
        counts = drive(w, lambda: settled(r))
    assert (counts.dead, counts.retried, counts.delivered) == (2, 0, 1)
    dls = store.list_dead_letters(r)
    assert sorted(d.notification["id"] for d in dls) == ["n1", "n3"]
    assert all("cannot build the mail" in d.error and "out of range" in d.error for d in dls)
    (msg,) = sink.messages
    assert "p4" in msg["Subject"]


def test_alarm_message_mail_names_the_alarm_and_how_to_acknowledge(r, sink, smtp_port):
    """An alarm message (docs/alarms.md) by e-mail: severity and transition in the subject,
    each notice with its state, count and the ack command and HTTP call in the body."""
    notice = {
        "alarm": "a0123456789abcde", "occurrence": 1, "transition": "a0123456789abcde.1.1",
        "transition_kind": "raise", "state": "active-unacknowledged", "severity": "major",
        "count": 1, "first_seen": 1709330990.0, "last_seen": 1709330990.0,
        "labels": {"room": "101", "profile": "p4", "severity": "major", "subscriber": "s1"},
        "acknowledge": {"command": "ens alarms ack a0123456789abcde",
                        "http": "POST /v1/alarms/a0123456789abcde/ack"},
    }  # fmt: skip
    subscribe(r)
    rec = {
        "id": "a0123456789abcde.1.1", "profile": "p4", "subscriber": "s1", "ts": 1709330990.0,
        "events": {},
        "alarm": {**notice, "message": "m1", "message_kind": "single", "group": {},
                  "overflow": 0, "notices": [notice]},
    }  # fmt: skip
    store.enqueue(r, rec)
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        assert w.run_once().delivered == 1
    (msg,) = sink.messages
    assert msg["Subject"] == "[ENS] MAJOR p4 raise (room=101)"
    text, html = parts(msg)
    assert "raise -> active-unacknowledged, severity major" in text
    assert "acknowledge: ens alarms ack a0123456789abcde" in text
    assert "POST /v1/alarms/a0123456789abcde/ack" in html
