"""Message templates and chat channels (issue 36 item 5): every template against every kind of
message and channel, injection attempts, load-time errors, send-time fallback, the preview.

Real components: a real redis-server, the real delivery worker, a real HTTP receiver and a real
aiosmtpd SMTP server on loopback (tests/helpers_notifiers.py).
"""

from __future__ import annotations

import email
import email.policy
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
from typer.testing import CliRunner

from adapters.service import redis_store as rs
from ens.commands.service import register
from notifiers import store, template_samples, templates
from notifiers.metrics import REGISTRY
from notifiers.store import WebhookChannel
from notifiers.webhook import build_body
from notifiers.worker import DeliveryWorker
from profiles.templates import TEMPLATE_NAMES, template_problems
from tests.helpers_notifiers import SECRET, MailSink, drive, fast_config, settled, smtp_server

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

KINDS = template_samples.KINDS
FORMATS = (None, "slack", "teams")

# a template of every name that uses every part of the context
CUSTOM = {
    "email_subject": "{{ kind }} {{ profile }} {{ transition or '' }} {{ partition|pairs }}"
    "{% for x in notices %} {{ x.labels.room }}{% endfor %}"
    "{% for name, ev in events.items() %} {{ ev.note|default('') }}{% endfor %}",
    "email_text": "{{ kind }}: {{ profile }} at {{ ts|ts }}\n"
    "{% for x in notices %}{{ x.alarm }} {{ x.transition_kind }} {{ x.labels|pairs }}\n"
    "{% endfor %}{% for name, ev in events.items() %}{{ name }} {{ ev|pairs }}\n{% endfor %}",
    "email_html": "<h1>{{ profile }}</h1><ul>{% for x in notices %}<li>{{ x.labels|pairs }}</li>"
    "{% endfor %}{% for name, ev in events.items() %}<li>{{ ev|pairs }}</li>{% endfor %}</ul>",
    "webhook": '{"who": {{ subscriber }}, "kind": {{ kind }}, "labels": '
    '{{ notices|map(attribute=\'labels\')|list }}, "events": {{ events }}, "body": {{ body }}}',
    "slack": "*{{ profile }}* {{ transition or 'match' }}\n"
    "{% for x in notices %}{{ x.labels|pairs }}\n{% endfor %}"
    "{% for name, ev in events.items() %}{{ ev|pairs }}\n{% endfor %}",
    "teams": "**{{ profile }}** {{ transition or 'match' }}\n"
    "{% for x in notices %}{{ x.labels|pairs }}\n{% endfor %}"
    "{% for name, ev in events.items() %}{{ ev|pairs }}\n{% endfor %}",
}

EVIL = (
    "<!channel> <@U024BE7LH> <https://evil.example|click> *bold* _it_ [x](https://evil.example)"
    " </table><script>alert(1)</script> \"q\" 'a' & \r\nBcc: victim@example.org\r\n"
    "X-Injected: 1\n\x00\x1b[31m\x07\x7f\x85 end"
)


def evil(kind: str) -> dict[str, Any]:
    """The sample of ``kind`` with the hostile value in an event attribute and in a label."""
    n = template_samples.sample(kind, "s1")
    for ev in n["events"].values():
        ev["note"] = EVIL
    if "alarm" in n:
        for x in [n["alarm"], *n["alarm"]["notices"]]:
            x["labels"] = {**x["labels"], "room": EVIL}
    return n


def chat_text_of(payload: dict[str, Any], fmt: str) -> str:
    if fmt == "slack":
        assert set(payload) == {"text", "blocks"}
        (block,) = payload["blocks"]
        assert block["type"] == "section" and block["text"]["type"] == "mrkdwn"
        assert payload["text"] and block["text"]["text"].startswith(payload["text"])
        return str(block["text"]["text"])
    assert payload["type"] == "message"
    (att,) = payload["attachments"]
    assert att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] and card["body"]
    assert all(b["type"] == "TextBlock" and b["text"] for b in card["body"])
    return "\n".join(b["text"] for b in card["body"])


def assert_inert(text: str, fmt: str) -> None:
    """No mention, link, markup or control character of the hostile value got through."""
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text), text
    if fmt == "slack":
        assert "<" not in text and ">" not in text  # no <!channel>, <@U..>, <url|text>
        assert "&lt;!channel&gt;" in text and "&lt;@U024BE7LH&gt;" in text
        assert "&amp;" in text
    else:  # teams: markdown punctuation of the value escaped
        assert "\\[x\\]\\(https://evil.example\\)" in text and "\\*bold\\*" in text
        assert re.search(r"(?<!\\)<", text) is None


@pytest.mark.parametrize("kind", KINDS)
def test_default_webhook_template_renders_todays_body_byte_for_byte(kind: str) -> None:
    n = template_samples.sample(kind, "s1")
    channel = WebhookChannel(webhook="http://x")
    assert templates.render("webhook", templates.DEFAULT_TEMPLATES["webhook"], n).encode() == (
        build_body(n)
    )
    assert templates.webhook_body("s1", channel, None, n) == build_body(n)
    assert templates.webhook_body("s1", channel, {"slack": "x"}, n) == build_body(n)


@pytest.mark.parametrize("kind", KINDS)
def test_default_email_templates_render_what_the_builders_build(kind: str) -> None:
    """The e-mail defaults as templates (a starting point) say what delivery sends without
    one: the same subject and text, and the same HTML once entities are read."""
    import html

    from notifiers import email as em

    bare = template_samples.sample(kind, "") | {"partition": None}
    for n in (template_samples.sample(kind, "s1"), evil(kind), bare):
        for name, build in (
            ("email_subject", em.subject_for),
            ("email_text", em.text_section),
            ("email_html", em.html_section),
        ):
            got = templates.render(name, templates.DEFAULT_TEMPLATES[name], n)
            if name == "email_subject":
                got = em.clean_header(got)
            if name == "email_html":  # markupsafe writes &#34; where html.escape writes &quot;
                assert html.unescape(got) == html.unescape(build(n)), (kind, name)
            else:
                assert got == build(n), (kind, name)


def test_samples_have_the_shape_the_alarm_worker_writes() -> None:
    """The preview and these tests use samples: they must be the records the service writes
    (`AlarmPart._alarm_record` of a real message of real notices)."""
    from types import SimpleNamespace

    from adapters.service.alarm_worker import AlarmPart
    from notifiers.alarms.grouping import Message
    from notifiers.alarms.model import Notice

    for kind in KINDS[1:]:
        n = template_samples.sample(kind, "ops")
        notices = tuple(
            Notice.from_json(
                {
                    **{k: v for k, v in x.items() if k not in ("transition_kind", "acknowledge")},
                    "kind": x["transition_kind"],
                }
            )
            for x in n["alarm"]["notices"]
        )
        a = n["alarm"]
        msg = Message(
            a["message"], "ops", n["ts"], a["message_kind"], a["group"], notices, a["overflow"]
        )
        real = AlarmPart._alarm_record(SimpleNamespace(epoch=1), msg)  # type: ignore[arg-type]
        assert real == n, kind
    with pytest.raises(ValueError, match="unknown sample"):
        template_samples.sample("explode")


@pytest.mark.parametrize("custom", [False, True], ids=["default", "custom"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_template_renders_every_message_kind_for_every_channel(
    kind: str, custom: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Each template (default and custom) against each message kind and channel kind: valid
    JSON of the right shape, a valid multipart/alternative mail, hostile data inert."""
    caplog.set_level(logging.WARNING, logger="ens.notifiers")
    temps = CUSTOM if custom else None
    for n, hostile in ((template_samples.sample(kind, "s1"), False), (evil(kind), True)):
        for fmt in FORMATS:
            body = templates.webhook_body(
                "s1", WebhookChannel(webhook="http://x", format=fmt), temps, n
            )
            payload = json.loads(body)  # valid JSON whatever the data holds
            if fmt is None:
                if custom:
                    assert payload["who"] == "s1" and payload["body"] == json.loads(build_body(n))
                else:
                    assert body == build_body(n)
                continue
            text = chat_text_of(payload, fmt)
            assert n["profile"] in text.replace("\\", "")
            if hostile:
                assert_inert(text, fmt)
        msg = templates.email_message("s1", temps, n, "ens@example.org", "a@example.org", "k:0")
        wire = msg.as_bytes()
        back = email.message_from_bytes(wire, policy=email.policy.default)
        assert back.get_content_type() == "multipart/alternative"
        assert [p.get_content_type() for p in back.iter_parts()] == ["text/plain", "text/html"]
        assert "\n" not in back["Subject"] and "\r" not in back["Subject"]
        assert back["Bcc"] is None and back["X-Injected"] is None
        assert set(back.keys()) == {
            "Subject", "From", "To", "Date", "Message-ID", "MIME-Version", "Content-Type"
        }  # fmt: skip
        html = back.get_body(preferencelist=("html",)).get_content()
        assert "<script>" not in html and "</table><script>" not in html
        assert "\x00" not in wire.decode("utf-8", "replace")
    assert "template" not in caplog.text  # nothing fell back: every template rendered


def test_email_digest_sections_use_each_subscribers_templates() -> None:
    ns = [template_samples.sample("notification", "s1"), template_samples.sample("raise", "s1")]
    msg = templates.email_digest(
        lambda n: templates.email_parts("s1", CUSTOM, n), ns, "ens@example.org", "a@example.org"
    )
    text = msg.get_body(preferencelist=("plain",)).get_content()
    assert "--- 1.\nnotification: door-open" in text and "--- 2.\nalarm: door-open" in text


# ----------------------------------------------------------------------------- load time


@pytest.mark.parametrize(
    ("templates_", "expected"),
    [
        ({"email_text": "Hi\n{{ profile }\n"}, "templates.email_text: line 2: unexpected '}'"),
        ({"slack": "{{ profile|shout }}"}, "templates.slack: line 1: No filter named 'shout'."),
        ({"teams": "{% if x %}\nnever closed"}, "templates.teams: line 2: Unexpected end of"),
        ({"sms": "x"}, "templates.sms: unknown key (allowed: email_subject"),
        ({"webhook": 3}, "templates.webhook: must be template text, not int"),
        ({"email_html": "x" * 70_000}, "templates.email_html: is 70,000 characters"),
    ],
)
def test_a_bad_template_is_refused_at_load_time_with_its_name_and_line(
    templates_: dict[str, Any], expected: str, r: redis.Redis
) -> None:
    rec = {"id": "ops", "channels": [{"email": "a@example.org"}], "templates": templates_}
    with pytest.raises(store.ValidationError) as err:
        store.put_subscriber(r, rec)
    assert expected in store.subscriber_error(err.value)
    assert r.hget(store.SUBSCRIBERS, "ops") is None  # nothing stored


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def ens(app: typer.Typer, redis_url: str, *args: str) -> Any:
    return CliRunner(env={rs.ENV_URL: redis_url}).invoke(app, list(args))


def test_cli_refuses_a_bad_template_and_stores_nothing(
    cli: typer.Typer, redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.j2"
    bad.write_text("*{{ severity }}*\n{{ labels.room|nope }}\n")
    res = ens(
        cli,
        redis_url,
        "subscriber",
        "add",
        "ops",
        "--slack",
        "https://h/x",
        "--template",
        f"slack={bad}",
    )
    assert res.exit_code == 2
    assert "error: subscriber 'ops': templates.slack: line 2: No filter named 'nope'." in res.stderr
    assert "Traceback" not in res.output
    assert r.hget(store.SUBSCRIBERS, "ops") is None
    res = ens(cli, redis_url, "subscriber", "add", "ops", "--email", "a@b.c", "--template", "slack")
    assert res.exit_code == 2 and "give NAME=FILE" in res.stderr
    res = ens(
        cli,
        redis_url,
        "subscriber",
        "add",
        "ops",
        "--email",
        "a@b.c",
        "--template",
        f"slack={tmp_path}/none",
    )
    assert res.exit_code == 2 and "--template slack: cannot read" in res.stderr
    assert r.hget(store.SUBSCRIBERS, "ops") is None


def test_ens_check_reports_a_bad_template_at_its_file_line(tmp_path: Path) -> None:
    from ens.cli import app as ens_app

    f = tmp_path / "p.yaml"
    f.write_text(
        "profiles:\n  - {id: p, expr: 'kind = \"door\"', subscriber: ops}\n"
        "subscribers:\n  - id: ops\n    channels: [{webhook: 'https://h/x', format: slack}]\n"
        "    templates:\n      slack: |\n        fine\n        {{ broken\n"
        "  - id: day\n    channels: [{email: a@example.org}]\n"
        "    templates: {email_subject: '{{ x|nope }}'}\n"
    )
    res = CliRunner().invoke(ens_app, ["check", str(f)])
    assert res.exit_code == 2
    assert (
        "file line 9: " in res.stderr and "subscriber 'ops': templates.slack: line 2:" in res.stderr
    )  # the line of the template's line 2 in the file
    assert "file line 12: subscriber 'day': templates.email_subject: line 1: No filter named" in (
        res.stderr
    )


# ----------------------------------------------------------------------------- send time


@pytest.fixture
def sink() -> MailSink:
    return MailSink()


@pytest.fixture
def smtp_port(sink: MailSink) -> Iterator[int]:
    with smtp_server(sink) as port:
        yield port


def errors(name: str) -> float:
    return REGISTRY.get_sample_value("ens_template_errors_total", {"template": name}) or 0.0


def test_a_template_failing_at_send_time_sends_the_default_counts_and_logs_once(
    r: redis.Redis, receiver: Any, sink: MailSink, smtp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ens.notifiers")
    broken = {
        "webhook": '{"room": {{ events.a.no_such_attribute }}}',  # StrictUndefined
        "email_subject": "{{ 1 // 0 }}",  # a runtime error
        "email_text": "{{ events.a.no_such_attribute }}",
    }
    store.put_subscriber(
        r,
        {
            "id": "s1",
            "secret": SECRET,
            "channels": [{"webhook": receiver.url}, {"email": "a@example.org"}],
            "templates": broken,
        },
    )
    before = {name: errors(name) for name in broken}
    ns = [template_samples.sample("notification", "s1") | {"id": f"n{i}"} for i in range(3)]
    for n in ns:
        store.enqueue(r, n)
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        drive(w, lambda: settled(r))
    assert sorted(receiver.accepted) == ["n0", "n1", "n2"]  # nothing lost
    for n in ns:  # the default body, byte for byte
        assert [h.body for h in receiver.hits if h.key == n["id"]] == [build_body(n)]
    assert len(sink.messages) == 3
    assert all(m["Subject"].startswith("[ENS] door-open matched") for m in sink.messages)
    assert {name: errors(name) - before[name] for name in broken} == {
        "webhook": 3, "email_subject": 3, "email_text": 3
    }  # fmt: skip
    for name in broken:  # logged once per template, not once per message
        assert caplog.text.count(f"template {name} of subscriber s1 failed") == 1
    assert "UndefinedError" in caplog.text and "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("fmt", ["slack", "teams"])
def test_chat_messages_go_through_the_webhook_sender_with_its_retries(
    fmt: str, r: redis.Redis, receiver: Any
) -> None:
    """A 503 then 200: retried like any webhook, then the chat payload arrives (raise, ack)."""
    store.put_subscriber(
        r, {"id": "s1", "secret": SECRET, "channels": [{"webhook": receiver.url, "format": fmt}]}
    )
    receiver.script.extend([503])
    for kind in ("raise", "ack"):
        store.enqueue(r, evil(kind))
    with DeliveryWorker(r, fast_config()) as w:
        drive(w, lambda: settled(r))
    assert len(receiver.accepted) == 2 and receiver.hits[0].status == 503
    for payload in receiver.accepted.values():
        assert_inert(chat_text_of(payload, fmt), fmt)
    texts = [chat_text_of(p, fmt) for p in receiver.accepted.values()]
    assert any("raise" in t for t in texts) and any("ack" in t for t in texts)


def test_hostile_attributes_cannot_inject_headers_over_real_smtp(
    r: redis.Redis, sink: MailSink, smtp_port: int
) -> None:
    store.put_subscriber(
        r,
        {
            "id": "s1",
            "channels": [{"email": "a@example.org"}, {"email": "b@example.org"}],
            "templates": {k: v for k, v in CUSTOM.items() if k.startswith("email_")},
        },
    )
    store.put_subscriber(r, {"id": "s2", "channels": [{"email": "c@example.org"}]})
    for kind in KINDS:
        store.enqueue(r, evil(kind) | {"id": f"{kind}-1"})
        store.enqueue(r, evil(kind) | {"id": f"{kind}-2", "subscriber": "s2"})
    with DeliveryWorker(r, fast_config(smtp_port)) as w:
        drive(w, lambda: settled(r), timeout=15)
    assert len(sink.messages) == 3 * len(KINDS)
    assert all(
        rcpts in (["a@example.org"], ["b@example.org"], ["c@example.org"])
        for _, rcpts in sink.envelopes
    )
    for msg in sink.messages:
        assert msg["Bcc"] is None and msg["X-Injected"] is None
        assert msg.get_content_type() == "multipart/alternative"
        html = msg.get_body(preferencelist=("html",)).get_content()
        assert "<script>" not in html and "&lt;script&gt;" in html


# ----------------------------------------------------------------------------- preview


def test_preview_prints_what_each_channel_receives(
    cli: typer.Typer, redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    (tmp_path / "s.j2").write_text(
        "*{{ severity|upper }}* {{ transition }}: {{ notices[0].labels.room }}\n"
    )
    res = ens(
        cli, redis_url, "subscriber", "add", "ops", "--email", "a@example.org",
        "--webhook", "https://h/ens", "--slack", "https://h/slack", "--teams", "https://h/teams",
        "--template", f"slack={tmp_path / 's.j2'}",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    for kind in KINDS:
        res = ens(cli, redis_url, "subscriber", "preview", "ops", "--transition", kind)
        assert res.exit_code == 0, res.output
        assert res.stdout.count("=== channel") == 4
        assert "Subject: [ENS]" in res.stdout and "--- text/html" in res.stdout
        bodies = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        assert len(bodies) == 3
    res = ens(
        cli, redis_url, "subscriber", "preview", "ops", "--transition", "clear", "--channel", "2"
    )
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("{")]
    assert json.loads(line)["text"] == "*MAJOR* clear: 101"
    # the custom slack template needs notices: on a plain notification it falls back, and says so
    res = ens(
        cli,
        redis_url,
        "subscriber",
        "preview",
        "ops",
        "--transition",
        "notification",
        "--channel",
        "2",
    )
    assert (
        res.exit_code == 0
        and "warning: template slack fails on the notification sample" in res.stderr
    )
    assert json.loads([x for x in res.stdout.splitlines() if x.startswith("{")][0])[
        "text"
    ].startswith("*door-open* matched")
    res = ens(cli, redis_url, "subscriber", "preview", "ops", "--transition", "explode")
    assert res.exit_code == 2 and "unknown sample 'explode'" in res.stderr
    res = ens(cli, redis_url, "subscriber", "preview", "nobody")
    assert res.exit_code == 2 and "no subscriber 'nobody'" in res.stderr


def test_template_names_and_problems_agree() -> None:
    assert set(CUSTOM) == set(TEMPLATE_NAMES)
    assert template_problems(CUSTOM) == []
    assert template_problems(templates.DEFAULT_TEMPLATES) == []


def test_a_changed_template_is_a_change_that_needs_replace(
    cli: typer.Typer, redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    one, two = tmp_path / "one.j2", tmp_path / "two.j2"
    one.write_text("{{ profile }}\n")
    two.write_text("{{ profile }} {{ transition }}\n")
    args = ("subscriber", "add", "ops", "--slack", "https://h/s", "--template")
    assert ens(cli, redis_url, *args, f"slack={one}").exit_code == 0
    assert "unchanged" in ens(cli, redis_url, *args, f"slack={one}").stdout
    res = ens(cli, redis_url, *args, f"slack={two}")
    assert res.exit_code == 2 and "(the text of a template changed)" in res.stderr
    assert "templates slack" in res.stderr and "nothing stored" in res.stderr
    res = ens(cli, redis_url, *args, f"slack={two}", "--replace")
    assert res.exit_code == 0 and "replaced" in res.stdout
    sub = store.get_subscriber(r, "ops")
    assert sub is not None and sub.templates == {"slack": two.read_text()}
    assert sub.channels[0].model_dump(exclude_none=True) == {
        "webhook": "https://h/s",
        "format": "slack",
    }
