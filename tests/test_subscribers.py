"""One definition of a valid subscriber (profiles.subscribers) for both ways one comes in:
`ens check` on a profile file and storing the record (`notifiers.store.put_subscriber`, what
the service API and CLI call). The same channels must get the same verdict and the same words.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import ValidationError
from typer.testing import CliRunner

from ens.cli import app
from notifiers import store

pytestmark = pytest.mark.redis  # real redis-server processes (tests/helpers_*.py)

GOOD: list[Any] = [
    {"email": "ops@example.org"},
    {"email": "  ops@example.org "},  # trimmed when stored
    {"email": "ops@example.org", "digest": 900},
    {"email": "ops@example.org", "digest": 0.5},
    {"email": "ops@example.org", "digest": None},
    {"webhook": "https://hooks.example.org/ens"},
    {"webhook": "http://127.0.0.1:9000/ens", "secret": "s3cret"},
]

# channel -> what both paths say about it (after `ens check`'s "subscriber 'sN': ")
BAD: list[tuple[Any, str]] = [
    ({"email": "a b@c"}, "channels.0.email: 'a b@c' is not an e-mail address"),
    ({"email": "nobody"}, "channels.0.email: 'nobody' is not an e-mail address"),
    ({"email": 42}, "channels.0.email: 42 is not an e-mail address"),
    (
        {"email": "a@b.org\r\nBcc: evil@x"},
        "channels.0.email: must not contain line breaks (got 'a@b.org\\r\\nBcc: evil@x')",
    ),
    (
        {"email": "a@b.org", "digest": -1},
        "channels.0.digest: must be a number of seconds >= 0 (got -1)",
    ),
    (
        {"email": "a@b.org", "digest": "60"},
        "channels.0.digest: must be a number of seconds >= 0 (got '60')",
    ),
    (
        {"email": "a@b.org", "digest": True},
        "channels.0.digest: must be a number of seconds >= 0 (got True)",
    ),
    (
        {"email": "a@b.org", "secret": "x"},
        "channels.0.secret: unknown key (allowed: email, digest)",
    ),
    (
        {"email": "a@b.org", "webhook": "https://x"},
        "channels.0.webhook: unknown key (allowed: email, digest)",
    ),
    ({"webhook": "ftp://x"}, "channels.0.webhook: 'ftp://x' is not an http(s) URL"),
    ({"webhook": None}, "channels.0.webhook: None is not an http(s) URL"),
    (
        {"webhook": "https://x", "extra": 1},
        "channels.0.extra: unknown key (allowed: webhook, secret, format)",
    ),
    (
        {"webhook": "https://x", "digest": 60},
        "channels.0.digest: unknown key (allowed: webhook, secret, format)",
    ),
    ({"webhook": "https://x", "secret": 5}, "channels.0.secret: must be a string, not int"),
    (
        {"sms": "+1"},
        """channels.0: a channel is {"email": ADDRESS} or {"webhook": URL}, got keys ['sms']""",
    ),
    ({}, """channels.0: a channel is {"email": ADDRESS} or {"webhook": URL}, got keys []"""),
    (
        "ops@example.org",
        """channels.0: a channel is {"email": ADDRESS} or {"webhook": URL}, got 'ops@example.org'""",
    ),
    (
        {"email": "nobody", "x": 1},
        "channels.0.email: 'nobody' is not an e-mail address; "
        "channels.0.x: unknown key (allowed: email, digest)",
    ),
]


def check_verdicts(channels: list[Any], tmp_path: Path) -> dict[str, str]:
    """`ens check` on a file with subscriber sN holding channel N: sN -> its problems ("" = ok)."""
    f = tmp_path / "subs.json"  # JSON (a profile file may be JSON) keeps every value exact
    f.write_text(
        json.dumps(
            {"subscribers": [{"id": f"s{n}", "channels": [ch]} for n, ch in enumerate(channels)]},
            indent=1,
        )
    )
    res = CliRunner().invoke(app, ["check", str(f)])
    out: dict[str, list[str]] = {f"s{n}": [] for n in range(len(channels))}
    for line in res.stderr.splitlines():
        if line.startswith("error: "):
            # a bad key is located FILE:LINE:COL at the key, any other problem at its line
            m = re.fullmatch(
                r"error: (?:file line \d+|\S+:\d+:\d+): subscriber '(s\d+)': (.*)", line
            )
            assert m, line
            out[m[1]].append(m[2])
    assert res.exit_code == (2 if any(out.values()) else 0), res.output
    return {sid: "; ".join(problems) for sid, problems in out.items()}


def store_verdict(r: redis.Redis, channel: Any) -> str:
    """Store a subscriber holding the channel: its problems as the API/CLI word them ("" = ok)."""
    try:
        store.put_subscriber(r, {"id": "s", "channels": [channel]})
    except ValidationError as exc:
        return store.subscriber_error(exc)
    return ""


def test_check_and_store_agree_on_every_channel(r: redis.Redis, tmp_path: Path) -> None:
    channels = GOOD + [ch for ch, _ in BAD]
    checked = check_verdicts(channels, tmp_path)
    for n, ch in enumerate(channels):
        assert checked[f"s{n}"] == store_verdict(r, ch), ch
    for n, (ch, expected) in enumerate(BAD, len(GOOD)):
        assert checked[f"s{n}"] == expected, ch
    assert not any(checked[f"s{n}"] for n in range(len(GOOD)))


def test_good_channels_are_stored_as_given(r: redis.Redis) -> None:
    for ch in GOOD:
        saved = store.put_subscriber(r, {"id": "s", "channels": [ch]})
        got = store.get_subscriber(r, "s")
        assert got is not None and got.channels == saved.channels
        kind = "email" if "email" in ch else "webhook"
        assert getattr(got.channels[0], kind) == ch[kind].strip()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"channels": []}, "id: a subscriber needs a non-empty string id"),
        ({"id": "", "channels": []}, "id: a subscriber needs a non-empty string id (got '')"),
        (
            {"id": "s", "channels": {"email": "a@b"}},
            "channels: must be a list of channels, not dict",
        ),
        ({"id": "s", "digest": -5}, "digest: must be a number of seconds >= 0 (got -5)"),
        ({"id": "s", "secret": 7}, "secret: must be a string, not int"),
        (
            {"id": "s", "chanels": [{"email": "a@b.c"}]},
            "chanels: unknown key (allowed: id, channels, digest, secret, templates)",
        ),
    ],
)
def test_subscriber_level_rules_are_shared(
    record: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError) as err:
        store.Subscriber.model_validate(record)
    assert store.subscriber_error(err.value) == message
    f = tmp_path / "one.json"
    f.write_text(json.dumps({"subscribers": [record]}))
    res = CliRunner().invoke(app, ["check", str(f)])
    assert res.exit_code == 2
    who = f"subscriber {record['id']!r}" if record.get("id") else "subscriber #1"
    where = f"{f}:1:30" if "chanels" in record else "file line 1"  # a bad key: at the key
    assert f"{where}: {who}: {message}" in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://ens:PW@host/h?token=T", "http://ens:<secret>@host/h?token=<secret>"),
        ("https://TOKEN@api.example.org/in", "https://<secret>@api.example.org/in"),
        ("http://h:8080/p?a=1&b=&flag#frag", "http://h:8080/p?a=<secret>&b=&<secret>#<secret>"),
        ("http://u:p@w@h/", "http://u:<secret>@h/"),  # the last @ ends the user info
        ("https://hooks.example.org/ens", "https://hooks.example.org/ens"),
        ("http://[::1/x?t=1", "<secret>"),  # unparseable: nothing of it
        ("user:PW@host/x", "user:<secret>"),  # no "//": not a URL, shown as little as may be
    ],
)
def test_mask_url_hides_passwords_and_query_values(url: str, shown: str) -> None:
    from profiles.subscribers import mask_url, mask_urls

    assert mask_url(url) == shown
    if "://" in url:  # inside a message, as an error quotes it
        assert mask_urls(f"error: '{url}' refused") == f"error: '{shown}' refused"
    assert mask_url("redis://:PW@h:6379/0?db=1", query=False) == "redis://:<secret>@h:6379/0?db=1"
