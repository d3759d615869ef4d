"""Issue 41 item 9: delivery status per subscriber, and dead-letter paging that says so."""

from __future__ import annotations

import json

import pytest
import redis
import typer
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from ens.commands.notifications import app as notifications_app
from ens.commands.service import register
from notifiers import store
from notifiers.worker import DeliveryWorker
from tests.helpers_notifiers import (
    SECRET,
    Receiver,
    drive,
    fast_config,
    notification,
    redis_url,
    settled,
)

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)


def cli(r: redis.Redis, app: typer.Typer, *args: str):  # noqa: ANN201
    return CliRunner(env={rs.ENV_URL: redis_url(r), "COLUMNS": "250"}).invoke(app, list(args))


def test_subscriber_status_shows_outcomes_retries_dead_letters_and_breakers(r, receiver):
    """There was no way to see how a subscriber's deliveries fare: `ens subscriber status`
    (and ``GET /v1/subscribers/{id}/status``) shows counts, what is retrying now, dead
    letters, the last success and error, and the circuit of each destination."""
    bad = Receiver().start()
    try:
        for sid, url in (("fine", receiver.url), ("bad", bad.url)):
            store.put_subscriber(r, {"id": sid, "channels": [{"webhook": url}], "secret": SECRET})
        bad.script.extend([500] * 10)
        store.enqueue(r, notification("n-fine", subscriber="fine"))
        store.enqueue(r, notification("n-bad", subscriber="bad"))
        cfg = fast_config(max_attempts=3)
        cfg.webhook.breaker_failures = 3  # the third failure dead-letters and opens it
        cfg.webhook.breaker_cooldown = 60
        with DeliveryWorker(r, cfg) as w:
            drive(w, lambda: settled(r))
            store.enqueue(r, notification("n-bad-2", subscriber="bad"))
            w.run_once()  # taken, deferred: the circuit is open
        app = typer.Typer()
        register(app)
        res = cli(r, app, "subscriber", "status", "--json")
        assert res.exit_code == 0, res.output
        rows = {row["id"]: row for row in json.loads(res.stdout)}
        fine, bad_row = rows["fine"], rows["bad"]
        assert (fine["delivered"], fine["retried"], fine["dead"]) == (1, 0, 0)
        assert fine["last_success"] and fine["last_error"] is None
        assert (bad_row["delivered"], bad_row["retried"], bad_row["dead"]) == (0, 2, 1)
        assert bad_row["dead_letters"] == 1 and bad_row["pending"] == 1
        assert "HTTP 500" in bad_row["last_error"]
        origin = f"http://127.0.0.1:{bad.port}"
        assert bad_row["breakers"][origin]["state"] == "open"
        assert fine["breakers"] == {f"http://127.0.0.1:{receiver.port}": {"state": "closed"}}
        res = cli(r, app, "subscriber", "status", "bad")
        assert res.exit_code == 0 and "HTTP 500" in res.stdout and "open until" in res.stdout
        res = cli(r, app, "subscriber", "status", "nobody")
        assert res.exit_code != 0 and "no subscriber 'nobody'" in res.output
    finally:
        bad.stop()


def test_dead_letter_list_says_when_more_follow_and_pages(r):
    """`dead-letter list` stopped at 100 without a word; it now says "showing 100 of N" with
    the options for the rest, and pages with ``--after``."""
    for i in range(105):
        fields = store.dead_letter_fields(
            notification(f"n{i:03}"), {"webhook": "http://x"}, 0, 1, "1-0", "HTTP 400", 1
        )
        r.xadd(store.DEADLETTER, fields)
    res = cli(r, notifications_app, "dead-letter", "list", "--json")
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    assert len(first) == 100
    last = first[-1]["entry"]
    assert f"showing 100 of 105 dead letters; more follow: --after {last}" in res.stderr
    assert "--all" in res.stderr
    res = cli(r, notifications_app, "dead-letter", "list", "--json", "--after", last)
    rest = json.loads(res.stdout)
    assert [d["id"] for d in rest] == [f"n{i:03}" for i in range(100, 105)]
    assert "showing" not in res.stderr
    res = cli(r, notifications_app, "dead-letter", "list", "--all")
    assert res.exit_code == 0 and "Dead letters (105)" in res.stdout and not res.stderr
    res = cli(r, notifications_app, "dead-letter", "list", "--after", "last-page")
    assert res.exit_code == 2 and "not a dead-letter entry id" in res.output
