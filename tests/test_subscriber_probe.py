"""Test messages (`ens subscriber test`, ``POST /v1/subscribers/{id}/test``): real signed
messages to a real webhook receiver and a real SMTP server on loopback, each reported with the
receiver's answer, within a deadline."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from ens.cli import app
from notifiers import store
from notifiers.probe import send_test
from tests.helpers_notifiers import SECRET, MailSink, Receiver, fast_config, smtp_server
from tests.helpers_service import Service, redis_server

pytestmark = pytest.mark.redis


@pytest.fixture
def sink() -> Iterator[tuple[MailSink, int]]:
    s = MailSink()
    with smtp_server(s) as port:
        yield s, port


def subscriber(hook: str) -> store.Subscriber:
    return store.Subscriber.model_validate(
        {"id": "tech", "secret": SECRET, "channels": [{"webhook": hook}, {"email": "t@x.org"}]}
    )


def test_each_channel_answers_with_the_receivers_reply(
    receiver: Receiver, sink: tuple[MailSink, int]
) -> None:
    mails, port = sink
    probes = send_test(subscriber(receiver.url), fast_config(port))
    assert [(p.kind, p.delivered) for p in probes] == [("webhook", True), ("email", True)]
    assert probes[0].answer == "HTTP 200" and probes[1].answer.endswith(": 250 OK")
    (hit,) = receiver.hits
    assert hit.valid and hit.key == probes[0].id  # signed; its Idempotency-Key is the id
    body = json.loads(hit.body)
    assert body["profile"] == "ens-test" and body["subscriber"] == "tech"
    (mail,) = mails.messages
    assert mail["To"] == "t@x.org" and "ens-test" in mail["Subject"]


def test_failures_say_what_the_receiver_answered(
    receiver: Receiver, sink: tuple[MailSink, int]
) -> None:
    mails, port = sink
    receiver.script.append(503)
    mails.script.append("550 5.1.1 mailbox unavailable")
    probes = send_test(subscriber(receiver.url), fast_config(port))
    assert not any(p.delivered for p in probes)
    assert probes[0].answer == "HTTP 503 Service Unavailable"
    assert probes[1].answer.startswith("SMTP 550") and "mailbox unavailable" in probes[1].answer


def test_a_hanging_receiver_is_cut_at_the_deadline(receiver: Receiver) -> None:
    receiver.script.append((200, {}, 5.0))  # answers after 5 s
    started = time.monotonic()
    (probe,) = send_test(subscriber(receiver.url), fast_config(), channel=0, deadline=0.5)
    assert not probe.delivered and "timeout" in probe.answer
    assert time.monotonic() - started < 3


def test_an_unknown_channel_is_an_error_naming_the_channels(receiver: Receiver) -> None:
    with pytest.raises(IndexError, match="no channel #5 .*0 to 1"):
        send_test(subscriber(receiver.url), fast_config(), channel=5)


def test_the_cli_reports_and_exits_1_on_a_failure(
    redis_url: str, r: redis.Redis, receiver: Receiver, sink: tuple[MailSink, int]
) -> None:
    _, port = sink
    store.put_subscriber(r, subscriber(receiver.url))
    env = {rs.ENV_URL: redis_url, "ENS_SMTP_HOST": "127.0.0.1", "ENS_SMTP_PORT": str(port),
           "ENS_SMTP_SECURITY": "none"}  # fmt: skip
    runner = CliRunner(env=env)
    ok = runner.invoke(app, ["subscriber", "test", "tech"])
    assert ok.exit_code == 0, ok.output
    assert "#0 " in ok.output and "delivered (HTTP 200" in ok.output and "250 OK" in ok.output
    receiver.script.append(500)
    bad = runner.invoke(app, ["subscriber", "test", "tech", "--channel", "0", "--json"])
    assert bad.exit_code == 1, bad.output
    (got,) = json.loads(bad.output)
    assert got["delivered"] is False and got["answer"] == "HTTP 500 Internal Server Error"
    missing = runner.invoke(app, ["subscriber", "test", "nobody"])
    assert missing.exit_code == 3 and "no subscriber 'nobody'" in missing.output
    wrong = runner.invoke(app, ["subscriber", "test", "tech", "--channel", "2"])
    assert wrong.exit_code == 2 and "--channel" in wrong.output and "no channel #2" in wrong.output


def test_http_test_message(tmp_path: Path, receiver: Receiver, sink: tuple[MailSink, int]) -> None:
    _, port = sink
    env = {"ENS_SMTP_HOST": "127.0.0.1", "ENS_SMTP_PORT": str(port), "ENS_SMTP_SECURITY": "none"}
    with redis_server(tmp_path) as url:
        svc = Service(url, tmp_path / "serve.log", env=env).start()
        try:
            with svc.client(admin=True) as admin:
                sub = {"id": "tech", "secret": SECRET,
                       "channels": [{"webhook": receiver.url}, {"email": "t@x.org"}]}  # fmt: skip
                assert admin.post("/v1/subscribers", json=sub).status_code in (200, 201)
                got: Any = admin.post("/v1/subscribers/tech/test").json()
                assert got["delivered"] is True, got
                assert [x["answer"][:8] for x in got["results"]] == ["HTTP 200", "SMTP 127"]
                receiver.script.append(410)
                one = admin.post("/v1/subscribers/tech/test", json={"channel": 0}).json()
                assert one["delivered"] is False and one["results"][0]["answer"] == "HTTP 410 Gone"
                assert admin.post("/v1/subscribers/nobody/test").status_code == 404
                bad = admin.post("/v1/subscribers/tech/test", json={"channel": 9})
                assert bad.status_code == 422 and "no channel #9" in bad.text
                assert svc.client().post("/v1/subscribers/tech/test").status_code == 401
        finally:
            assert svc.stop() == 0
