"""Message templates of a subscriber: their names, the sandbox they run in, and the load check.

A subscriber may override how its messages read (``templates: {email_subject: ..., slack:
...}``). Templates are Jinja2 run in an immutable sandbox (no attribute of Python internals, no
mutation of the data), with ``StrictUndefined`` so a misspelt name fails instead of printing
nothing. Each name has a *style* that decides what ``{{ value }}`` emits, so that event data
(attributes come from sensors and users) cannot break the message whatever the template says:

- ``text`` (e-mail subject and text): the value as it is; the mail builder removes control
  characters (a subject becomes one line, so no header can be injected).
- ``html`` (e-mail HTML): HTML-escaped (autoescape).
- ``json`` (webhook body): the value as compact JSON, so ``{"room": {{ partition.room }}}`` is
  valid JSON for any value.
- ``slack`` (mrkdwn): ``&``, ``<`` and ``>`` as Slack's entities (no ``<!channel>``, no
  ``<@U..>`` mention, no link can be injected), control characters and line breaks as spaces.
- ``teams`` (Adaptive Card markdown): markdown punctuation backslash-escaped, control
  characters and line breaks as spaces.

``{{ value|safe }}`` bypasses the escaping (for a value the template builds itself).

This module is plain Python in profiles/ so that `ens check` (profiles.profile_file) and the
stored record (notifiers.store) reject the same templates with the same words; rendering and
the default templates are `notifiers.templates`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

#: template name -> style (see the module docstring)
STYLES: dict[str, str] = {
    "email_subject": "text",
    "email_text": "text",
    "email_html": "html",
    "webhook": "json",
    "slack": "slack",
    "teams": "teams",
}
TEMPLATE_NAMES: tuple[str, ...] = tuple(STYLES)
MAX_TEMPLATE_CHARS = 64_000  # a template is a message layout, not a data store

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SLACK = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_TEAMS_MARKUP = re.compile(r"([\\`*_\[\]()#<>~|])")
_TEAMS_BLOCK = re.compile(r"^(\s*)([-+]|\d+)(\.?)")  # a list item where the value starts


def one_line(value: Any) -> str:
    """``value`` as text with every control character (CR, LF, NUL, ESC, ...) a space."""
    return _CONTROL.sub(" ", str(value))


def slack_escape(value: Any) -> str:
    """Slack's three control characters as entities, on one line (api.slack.com: formatting)."""
    if isinstance(value, Markup):
        return str(value)
    return "".join(_SLACK.get(c, c) for c in one_line(value))


def teams_escape(value: Any) -> str:
    """Markdown punctuation backslash-escaped (CommonMark), on one line: no link, emphasis,
    list or heading can come from the data."""
    if isinstance(value, Markup):
        return str(value)
    text = _TEAMS_MARKUP.sub(r"\\\1", one_line(value))
    return _TEAMS_BLOCK.sub(_unlisted, text)


def _unlisted(m: re.Match[str]) -> str:
    """``- x`` -> ``\\- x``, ``1. x`` -> ``1\\. x`` (a backslash escapes punctuation only)."""
    if m[2][0].isdigit():
        return f"{m[1]}{m[2]}\\{m[3]}" if m[3] else m[0]
    return f"{m[1]}\\{m[2]}{m[3]}"


def fmt_ts(ts: Any, seconds: bool = True) -> str:
    """Epoch seconds as ``2024-03-01 22:10:05 UTC`` (``seconds=False``: to the minute)."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        fmt = "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC"
        return datetime.fromtimestamp(ts, UTC).strftime(fmt)
    return "?" if ts is None else str(ts)


def pairs(labels: Any) -> str:
    """``{"room": "101", "floor": "1"}`` -> ``room=101, floor=1`` (labels, a partition)."""
    if isinstance(labels, Mapping):
        return ", ".join(f"{k}={v}" for k, v in labels.items())
    return str(labels)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


@cache
def environment(style: str, dumps: Callable[[Any], str] = _json) -> ImmutableSandboxedEnvironment:
    """The sandboxed environment of one style; ``dumps`` writes JSON (the service passes its
    own, so a default webhook body is byte for byte the one `notifiers.webhook` builds)."""

    def as_json(value: Any) -> Any:
        return value if isinstance(value, Markup) else dumps(value)

    finalize: dict[str, Callable[[Any], Any]] = {
        "json": as_json,
        "slack": slack_escape,
        "teams": teams_escape,
    }
    env = ImmutableSandboxedEnvironment(
        autoescape=style == "html",
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=finalize.get(style),
    )
    env.filters["ts"] = fmt_ts
    env.filters["json"] = lambda v: Markup(dumps(v))  # already JSON: not encoded again
    env.filters["one_line"] = one_line
    env.filters["pairs"] = pairs
    return env


@cache
def compile_template(name: str, source: str) -> Template:
    """The compiled template (cached by its text); `TemplateSyntaxError` if it does not parse
    or uses an unknown filter or test."""
    return environment(STYLES[name]).from_string(source)


def _syntax(exc: TemplateSyntaxError) -> str:
    return f"line {exc.lineno}: {exc.message}" if exc.lineno else str(exc.message)


def template_problems(templates: Any) -> list[Problem]:
    """Every problem of a subscriber's ``templates`` mapping, located inside it: an unknown
    name, a value that is not text, a template that does not parse (``line N: ...``)."""
    if templates is None:
        return []
    if not isinstance(templates, Mapping):
        return [((), f"must be a mapping of template name to text, not {type(templates).__name__}")]
    out: list[Problem] = []
    for name, source in templates.items():
        if name not in STYLES:
            allowed = ", ".join(TEMPLATE_NAMES)
            out.append(((str(name),), f"unknown key (allowed: {allowed})"))
        elif not isinstance(source, str):
            out.append(((name,), f"must be template text, not {type(source).__name__}"))
        elif len(source) > MAX_TEMPLATE_CHARS:
            out.append(((name,), f"is {len(source):,} characters (at most {MAX_TEMPLATE_CHARS:,})"))
        else:
            try:
                compile_template(name, source)
            except TemplateSyntaxError as exc:
                out.append(((name,), _syntax(exc)))
    return out
