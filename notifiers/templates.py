"""Message bodies from templates: the context a template sees, the default templates, the chat
payloads (Slack, Microsoft Teams) and the fallback when a subscriber's template fails.

A subscriber's ``templates`` override the defaults by name (`profiles.templates` says which
names there are, checks them when the record is stored and runs them in a sandbox). A
template that fails when a message is sent (a missing attribute under ``StrictUndefined``, a
runtime error, a webhook body that is not JSON) must not lose the message: the default is sent
instead, ``ens_template_errors_total{template}`` counts it, and the failure is logged once per
subscriber and template text (not once per message: a broken template would flood the log).

Defaults: ``DEFAULT_TEMPLATES`` has one per name. Delivery renders the e-mail subject, text and
HTML and the ENS webhook JSON with the built-in builders (`notifiers.email`,
`notifiers.webhook.build_body`), which their templates match (tests/test_templates.py): no
template runs on the hot path of a subscriber without its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from email.message import EmailMessage
from functools import lru_cache
from typing import Any

from jinja2 import Template

from notifiers.email import (
    build_digest,
    build_message,
    build_parts,
    clean_header,
    html_section,
    subject_for,
    text_section,
)
from notifiers.metrics import TEMPLATE_ERRORS
from notifiers.store import WebhookChannel, dumps
from notifiers.webhook import build_body, webhook_fields
from profiles.templates import STYLES, environment, fmt_ts

log = logging.getLogger("ens.notifiers")

Templates = Mapping[str, str] | None

SLACK_DEFAULT = """\
{% if kind == "alarm" %}
{% for x in notices %}
*{{ x.severity|upper }}* {{ x.transition_kind }}: alarm {{ x.alarm }} is {{ x.state }}
{{ x.labels|pairs }} | count {{ x.count }}, last seen {{ x.last_seen|ts }}
acknowledge: {{ x.acknowledge.command }}
{% endfor %}
{% if alarm.overflow %}
({{ alarm.overflow }} notices held back by the hourly cap)
{% endif %}
{% else %}
*{{ profile }}* matched at {{ ts|ts }}{% if where %} ({{ where }}){% endif %}

{% for name, ev in events.items() %}
{{ name }}: event {{ ev.id }} at {{ ev.ts|ts }}{% for k, v in ev.items() if k not in ("id", "ts") %}, {{ k }}={{ v }}{% endfor %}

{% endfor %}
{% endif %}
"""

TEAMS_DEFAULT = SLACK_DEFAULT.replace("*{{ x.severity|upper }}*", "**{{ x.severity|upper }}**")
TEAMS_DEFAULT = TEAMS_DEFAULT.replace("*{{ profile }}*", "**{{ profile }}**")

# The e-mail defaults as templates: what `notifiers.email` builds, to start one's own from
# (tests/test_templates.py checks that they render the same as the builders).
EMAIL_SUBJECT_DEFAULT = """\
{% if alarm and notices %}
{% set labels = alarm.get("labels") or {} %}
[ENS] {{ (alarm.get("severity") or "")|string|upper }} {{ profile }} \
{% if notices|length == 1 %}
{{ alarm.get("transition_kind") }} (\
{% for k, v in labels.items() if k not in ("profile", "severity", "subscriber") %}
{{ k }}={{ v }}{% if not loop.last %}, {% endif %}
{% endfor %}
)\
{% else %}
{{ notices|length }} alarms\
{% endif %}
{% else %}
[ENS] {{ profile }} matched at {{ ts|ts(false) }}{% if where %} ({{ where }}){% endif %}
{% endif %}
"""

_ALARM_LINES = """\
{% for x in notices %}
{% set ack = x.get("acknowledge") or {} %}
Alarm {{ x.get("alarm") }} (occurrence {{ x.get("occurrence") }}): \
{{ x.get("transition_kind") }} -> {{ x.get("state") }}, severity {{ x.get("severity") }}
  {{ (x.get("labels") or {})|pairs }}
  count {{ x.get("count") }}, first seen {{ x.get("first_seen")|ts }}, \
last seen {{ x.get("last_seen")|ts }}
  acknowledge: {{ ack.get("command") }}  or  {{ ack.get("http") }}
{% endfor %}
{% if alarm.get("overflow") %}
({{ alarm.overflow }} notices held back by the hourly cap)
{% endif %}
"""

EMAIL_TEXT_DEFAULT = (
    """\
Profile {{ profile }} matched at {{ ts|ts }}.
{% if where %}
Partition: {{ where }}
{% endif %}
{% if subscriber %}
Subscriber: {{ subscriber }}
{% endif %}
Notification id: {{ id }}

{% if alarm and (notices or alarm.get("overflow")) %}
"""
    + _ALARM_LINES
    + """\
{% else %}
Events:
{% for name, ev in events.items() %}
  {{ name }}: event {{ ev.get("id", "?") }} at {{ ev.get("ts")|ts }}
{% for k, v in ev.items() if k not in ("id", "ts") %}
      {{ k }} = {{ v }}
{% endfor %}
{% endfor %}
{% endif %}
"""
)

EMAIL_HTML_DEFAULT = (
    """\
<h2>Profile <code>{{ profile }}</code> matched at {{ ts|ts }}</h2>
<p>
{% if where %}
Partition: <b>{{ where }}</b><br>
{% endif %}
{% if subscriber %}
Subscriber: {{ subscriber }}<br>
{% endif %}
Notification id: <code>{{ id }}</code></p>
{% if alarm and (notices or alarm.get("overflow")) %}
<pre>{% filter trim %}
"""
    + _ALARM_LINES
    + """\
{% endfilter %}</pre>
{% else %}
<table border="1" cellpadding="4" cellspacing="0">
<tr><th>component</th><th>event</th><th>time</th><th>attributes</th></tr>
{% for name, ev in events.items() %}
<tr><td>{{ name }}</td><td>{{ ev.get("id", "?") }}</td><td>{{ ev.get("ts")|ts }}</td><td>\
{% for k, v in ev.items() if k not in ("id", "ts") %}
{{ k }} = {{ v }}{% if not loop.last %}<br>{% endif %}
{% endfor %}
</td></tr>
{% endfor %}
</table>
{% endif %}
"""
)

#: the default of each template name; delivery uses the built-in builders for the e-mail ones
#: and for the webhook body (the same output, without a template on the hot path)
DEFAULT_TEMPLATES: dict[str, str] = {
    "email_subject": EMAIL_SUBJECT_DEFAULT,
    "email_text": EMAIL_TEXT_DEFAULT,
    "email_html": EMAIL_HTML_DEFAULT,
    "webhook": "{{ body }}",
    "slack": SLACK_DEFAULT,
    "teams": TEAMS_DEFAULT,
}

SLACK_SECTION_MAX = 3000  # Slack's limit for a section block's text
ADAPTIVE_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
ADAPTIVE_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"

_logged: set[tuple[str, str, str]] = set()
_logged_lock = threading.Lock()


@lru_cache(maxsize=1024)
def _compiled(name: str, source: str) -> Template:
    """Template ``name`` compiled once per text (subscribers share the defaults)."""
    return environment(STYLES[name], dumps).from_string(source)


def context(n: Mapping[str, Any]) -> dict[str, Any]:
    """What a template sees: the outbox record ``n`` and handy names for its parts."""
    alarm = n.get("alarm") if isinstance(n.get("alarm"), Mapping) else None
    notices = list(alarm.get("notices") or []) if alarm else []
    events = {
        str(name): dict(ev) if isinstance(ev, Mapping) else {"id": ev}
        for name, ev in (n.get("events") or {}).items()
    }
    part = n.get("partition") if isinstance(n.get("partition"), Mapping) else {}
    return {
        "n": n,
        "id": n.get("id"),
        "profile": n.get("profile"),
        "subscriber": n.get("subscriber"),
        "ts": n.get("ts"),
        "events": events,
        "partition": part,
        "where": ", ".join(f"{k} {v}" for k, v in (part or {}).items()),
        "kind": "alarm" if alarm else "notification",
        "alarm": alarm,
        "notices": notices,
        "message_kind": alarm.get("message_kind") if alarm else None,
        "transition": notices[0].get("transition_kind") if notices else None,
        "severity": alarm.get("severity") if alarm else None,
        "body": webhook_fields(n),
    }


def render(name: str, source: str, n: Mapping[str, Any]) -> str:
    """Template ``name`` (text ``source``) rendered for ``n``; raises on any failure."""
    out: str = _compiled(name, source).render(context(n))
    if name in ("email_text", "email_html"):  # a section: the mail adds what follows it
        out = out.rstrip("\n")
    if name == "webhook":
        json.loads(out)  # the receiver parses it: a body that is not JSON is a failure here
    elif not out.strip():
        raise ValueError("the template rendered nothing")
    return out


def _failed(who: str, name: str, source: str, exc: Exception) -> None:
    TEMPLATE_ERRORS.labels(name).inc()
    key = (who, name, hashlib.sha256(source.encode()).hexdigest())
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.warning(
        "template %s of subscriber %s failed (%s: %s): the default is sent instead; "
        "counted in ens_template_errors_total, logged once per template",
        name,
        who,
        type(exc).__name__,
        exc,
    )


def render_or_default(
    who: str, name: str, templates: Templates, n: Mapping[str, Any], default: Callable[[], str]
) -> str:
    """The subscriber's template ``name`` rendered for ``n``, else ``default()``: when it has
    none, or when it fails (counted and logged once)."""
    source = (templates or {}).get(name)
    if source is None:
        return default()
    try:
        return render(name, source, n)
    except Exception as exc:  # a sandboxed template may fail in any way: never lose a message
        _failed(who, name, source, exc)
        return default()


def _chat_default(name: str, n: Mapping[str, Any]) -> str:
    try:
        return render(name, DEFAULT_TEMPLATES[name], n)
    except Exception:  # a record of an unexpected shape: say at least what matched, and when
        return f"ENS: {n.get('profile')} at {fmt_ts(n.get('ts'))} (notification {n.get('id')})"


def chat_text(who: str, name: str, templates: Templates, n: Mapping[str, Any]) -> str:
    """The Slack or Teams text of ``n``: the subscriber's template or the default."""
    return render_or_default(who, name, templates, n, lambda: _chat_default(name, n))


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines() if line.strip()]


def slack_payload(text: str) -> dict[str, Any]:
    """A Slack incoming-webhook message: ``text`` (its first line: the notification fallback)
    and one mrkdwn section block with the whole text."""
    lines = _lines(text) or ["ENS notification"]
    body = "\n".join(lines)
    if len(body) > SLACK_SECTION_MAX:
        body = body[: SLACK_SECTION_MAX - 1] + "…"
    return {
        "text": lines[0],
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": body}}],
    }


def teams_payload(text: str) -> dict[str, Any]:
    """A Microsoft Teams incoming-webhook message: one Adaptive Card attachment whose first
    text block (bold) is the first line, one text block per further line."""
    lines = _lines(text) or ["ENS notification"]
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": lines[0], "weight": "Bolder", "size": "Medium", "wrap": True}
    ]
    body += [
        {"type": "TextBlock", "text": line, "wrap": True, "spacing": "Small"} for line in lines[1:]
    ]
    card = {"$schema": ADAPTIVE_SCHEMA, "type": "AdaptiveCard", "version": "1.4", "body": body}
    return {
        "type": "message",
        "attachments": [
            {"contentType": ADAPTIVE_CONTENT_TYPE, "contentUrl": None, "content": card}
        ],
    }


def webhook_body(
    who: str, channel: WebhookChannel, templates: Templates, n: Mapping[str, Any]
) -> bytes:
    """The POST body for a webhook channel: the ENS JSON (or the subscriber's ``webhook``
    template), or a Slack or Teams message."""
    fmt = channel.format
    if fmt == "slack":
        return dumps(slack_payload(chat_text(who, "slack", templates, n))).encode()
    if fmt == "teams":
        return dumps(teams_payload(chat_text(who, "teams", templates, n))).encode()
    if not templates or "webhook" not in templates:
        return build_body(n)  # the default, without a template on the hot path
    return render_or_default(who, "webhook", templates, n, lambda: build_body(n).decode()).encode()


def email_parts(who: str, templates: Templates, n: Mapping[str, Any]) -> tuple[str, str, str]:
    """(subject, text section, HTML section) of ``n``: the subscriber's templates or defaults."""
    subject = render_or_default(who, "email_subject", templates, n, lambda: subject_for(n))
    subject = clean_header(subject)
    text = render_or_default(who, "email_text", templates, n, lambda: text_section(n))
    html = render_or_default(who, "email_html", templates, n, lambda: html_section(n))
    return subject, text, html


def _has_email(templates: Templates) -> bool:
    return bool(templates) and any(name.startswith("email_") for name in templates or {})


def email_message(
    who: str,
    templates: Templates,
    n: Mapping[str, Any],
    sender: str,
    to: str,
    key: str | None = None,
) -> EmailMessage:
    """The mail of one notification, from the subscriber's templates where it has them."""
    if not _has_email(templates):
        return build_message(n, sender, to, key=key)
    subject, text, html = email_parts(who, templates, n)
    return build_parts(subject, text, html, sender, to, key or str(n.get("id")))


def email_digest(
    sections: Callable[[Mapping[str, Any]], tuple[str, str, str]],
    ns: Sequence[Mapping[str, Any]],
    sender: str,
    to: str,
) -> EmailMessage:
    """A digest whose sections are each notification's (templated) text and HTML."""
    parts = [sections(n) for n in ns]
    return build_digest(ns, sender, to, [p[1] for p in parts], [p[2] for p in parts])
