"""The delivery worker's parts, one at a time, against a real redis-server: outbox intake
(`notifiers.outbox_intake`), leases (`notifiers.leases`), sending (`notifiers.sending`) and
digests (`notifiers.digests`). The whole worker is tested in test_notifiers_webhook.py and
test_notifiers_email.py."""

from __future__ import annotations

import time

import pytest
import redis

from notifiers import store
from notifiers.worker import Counts, DeliveryWorker
from tests.helpers_notifiers import SECRET, Receiver, fast_config, notification

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)


def worker(r: redis.Redis, consumer: str = "w1") -> DeliveryWorker:
    return DeliveryWorker(r, fast_config(consumer=consumer))


# ----------------------------------------------------------------------------- outbox intake


def test_intake_schedules_every_channel_and_acks_what_has_nothing_to_deliver(
    r: redis.Redis,
) -> None:
    store.put_subscriber(
        r,
        {
            "id": "s1",
            "channels": [{"webhook": "http://127.0.0.1:9/a"}, {"webhook": "http://127.0.0.1:9/b"}],
            "secret": SECRET,
        },
    )
    store.enqueue(r, notification("n1"))
    store.enqueue(r, notification("n2", subscriber=None))
    r.xadd(store.OUTBOX, {store.OUTBOX_FIELD: "{not json"})
    with worker(r) as w:
        counts = Counts()
        w.intake.poll(counts, 0)
    assert (counts.read, counts.skipped, counts.dead, counts.acked) == (3, 1, 1, 2)
    assert sorted(r.hkeys(store.STATE)) == [
        store.delivery_key("n1", 0),
        store.delivery_key("n1", 1),
    ]
    assert r.zcard(store.RETRY) == 2
    assert r.xlen(store.DEADLETTER) == 1  # the malformed entry, kept for a human
    assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 1  # n1: until both are done


# ----------------------------------------------------------------------------- leases


def test_a_due_delivery_is_leased_to_one_worker_and_its_lease_renewed_while_held(
    r: redis.Redis,
) -> None:
    r.zadd(store.RETRY, {"d1": time.time() - 1})
    cfg = fast_config()
    cfg.worker.lease = 0.3
    with DeliveryWorker(r, cfg) as a, worker(r, "w2") as b:
        assert a.leases.lease_due(store.RETRY, 10) == ["d1"]
        assert b.leases.lease_due(store.RETRY, 10) == []  # its due time is now the lease end
        first_end = r.zscore(store.RETRY, "d1")
        assert first_end is not None and first_end > time.time()
        deadline = time.monotonic() + 10
        while r.zscore(store.RETRY, "d1") == first_end:  # renewed every third of the lease
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.02)
        a.leases.done(store.RETRY, "d1")  # the send is over: no more renewals
        end = r.zscore(store.RETRY, "d1")
        time.sleep(0.5)
        assert r.zscore(store.RETRY, "d1") == end
        assert b.leases.lease_due(store.RETRY, 10) == ["d1"]  # the lease ran out: anyone takes it
    assert a.leases.next_due() > time.time()


# ----------------------------------------------------------------------------- sending


def test_a_delivery_sent_is_remembered_and_its_outbox_entry_acked(
    r: redis.Redis, receiver: Receiver
) -> None:
    store.put_subscriber(r, {"id": "s1", "channels": [{"webhook": receiver.url}], "secret": SECRET})
    store.enqueue(r, notification("n1"))
    with worker(r) as w:
        w.intake.poll(Counts(), 0)
        (dkey,) = w.leases.lease_due(store.RETRY, 10)
        counts = w.sending.deliver(dkey)
    assert (counts.delivered, counts.acked) == (1, 1)
    assert list(receiver.accepted) and r.exists(store.delivered_key("n1", 0))
    assert not r.hlen(store.STATE) and not r.zcard(store.RETRY)
    assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 0


def test_a_failed_delivery_is_rescheduled_then_dead_lettered(
    r: redis.Redis, receiver: Receiver
) -> None:
    receiver.script.extend([500] * 10)
    store.put_subscriber(r, {"id": "s1", "channels": [{"webhook": receiver.url}], "secret": SECRET})
    store.enqueue(r, notification("n1"))
    with DeliveryWorker(r, fast_config(max_attempts=2)) as w:
        w.intake.poll(Counts(), 0)
        (dkey,) = w.leases.lease_due(store.RETRY, 10)
        assert w.sending.deliver(dkey).retried == 1
        assert r.zscore(store.RETRY, dkey) is not None  # back in the schedule, with backoff
        time.sleep(0.2)  # fast_config's backoff is at most 0.1 s
        (again,) = w.leases.lease_due(store.RETRY, 10)
        assert w.sending.deliver(again).dead == 1
    assert r.xlen(store.DEADLETTER) == 1 and r.exists(store.dead_key("n1", 0))
    assert r.xpending(store.OUTBOX, store.GROUP)["pending"] == 0


# ----------------------------------------------------------------------------- digests


def test_a_digest_delivery_is_parked_until_its_window_ends(r: redis.Redis) -> None:
    store.put_subscriber(r, {"id": "s1", "channels": [{"email": "ops@example.org"}], "digest": 60})
    store.enqueue(r, notification("n1"))
    store.enqueue(r, notification("n2"))
    with worker(r) as w:
        w.intake.poll(Counts(), 0)
        counts = Counts()
        for dkey in w.leases.lease_due(store.RETRY, 10):
            counts.merge(w.sending.deliver(dkey))
        assert counts.digested == 2
        assert r.zcard(store.digest_key("ops@example.org")) == 2 and not r.zcard(store.RETRY)
        due = r.zscore(store.DIGESTS, "ops@example.org")
        assert due is not None and 55 < due - time.time() <= 60
        assert w.leases.lease_due(store.DIGESTS, 10) == []  # not before the window ends


def _after_a_tick(c: redis.Redis) -> None:
    """Return just after one of Redis' timer ticks: a blocked read times out on the next."""
    c.xread({"ens:test:tick": "$"}, block=1)


def test_a_wait_shorter_than_a_redis_tick_ends_on_time_and_an_entry_wakes_it_at_once(
    r: redis.Redis,
) -> None:
    """`read_by` waits what it is asked, not up to the timer tick (100 ms at Redis' default hz
    10) on which Redis times out a blocked XREADGROUP; both workers wait through it."""
    from notifiers.stream_wait import read_by

    r.xgroup_create("ens:test:s", "g", id="$", mkstream=True)

    def read(block_ms: int | None) -> object:
        return r.xreadgroup("g", "c", {"ens:test:s": ">"}, count=10, block=block_ms)

    short, blocked = [], []
    for _ in range(5):
        _after_a_tick(r)
        t = time.monotonic()
        deadline = t + 0.03
        while time.monotonic() < deadline:  # the caller's loop: wait again for what is left
            assert not read_by(read, deadline - time.monotonic())
        short.append(time.monotonic() - t)
        _after_a_tick(r)
        t = time.monotonic()
        read(30)  # what a blocked read does with the same 30 ms
        blocked.append(time.monotonic() - t)
    # ~30 ms; a tick late is ~100 ms (the margin is for a busy machine)
    assert sorted(short)[2] < 0.07, [f"{d * 1000:.0f} ms" for d in short]
    assert sorted(blocked)[2] > 0.07  # the tick this works around is there
    # a long wait blocks (no busy polling) and ends before its deadline, not a tick after
    t = time.monotonic()
    assert not read_by(read, 0.35)
    assert 0.15 <= time.monotonic() - t < 0.35
    # an entry ends any wait at once
    _after_a_tick(r)
    r.xadd("ens:test:s", {"k": "v"})
    t = time.monotonic()
    got = read_by(read, 5.0)
    assert got and time.monotonic() - t < 1.0
