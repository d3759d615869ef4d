"""What a valid subscriber record and its channels are: the one definition of these rules.

Both ways a subscriber enters ENS apply exactly this: `ens check` (profiles.profile_file),
which reports every problem at its file line, and the stored record
(`notifiers.store.Subscriber`, for the service API and CLI), which raises them as validation
errors. A file that checks clean therefore stores, and the words are the same on both paths.
The module is plain Python in profiles/ because profiles/ must not import notifiers/ (nor
pydantic), while notifiers/ may import profiles/.

A problem is ``(location, message)``; the location is the path inside the record, e.g.
``("channels", 1, "webhook")``, written ``channels.1.webhook`` by `describe`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

CHANNEL_SHAPE = 'a channel is {"email": ADDRESS} or {"webhook": URL}'

# The keys each kind of channel may have: digest (seconds) overrides the subscriber's window,
# secret overrides the subscriber's webhook signing secret, format says what a webhook posts.
CHANNEL_KEYS: dict[str, tuple[str, ...]] = {
    "email": ("email", "digest"),
    "webhook": ("webhook", "secret", "format"),
}

# What a webhook channel posts: the ENS JSON (signed), a Slack-compatible incoming-webhook
# message, or a Microsoft Teams Adaptive Card (notifiers.templates).
WEBHOOK_FORMATS: tuple[str, ...] = ("ens", "slack", "teams")


# The keys of a subscriber record; any other key is a mistake (``chanels:``) that would
# otherwise store a subscriber with no channels.
UNKNOWN_KEY = "unknown key"  # how every such problem starts: the file reports it at the key
SUBSCRIBER_KEYS: tuple[str, ...] = ("id", "channels", "digest", "secret", "templates")


def channel_kind(channel: Any) -> str | None:
    """The kind a channel is meant to be (its first kind key), so problems speak of that one."""
    if isinstance(channel, Mapping):
        return next((kind for kind in CHANNEL_KEYS if kind in channel), None)
    return None


def _email(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not an e-mail address"
    address = value.strip()
    if "\r" in address or "\n" in address:  # would let a record inject mail headers
        return f"must not contain line breaks (got {value!r})"
    if "@" not in address or " " in address:
        return f"{address!r} is not an e-mail address"
    return None


def _webhook(value: Any) -> str | None:
    url = value.strip() if isinstance(value, str) else value
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return None
    return f"{mask_url(url) if isinstance(url, str) else url!r} is not an http(s) URL"


SECRET = "<secret>"  # what a masked part of a URL reads (as Alertmanager shows secrets)


def mask_url(url: str, query: bool = True) -> str:
    """A webhook URL fit to show or log: its password and query values replaced by `SECRET`.

    ``http://ens:PW@host/h?token=T#f`` -> ``http://ens:<secret>@host/h?token=<secret>#<secret>``.
    Credentials often ride in a URL (basic auth, ``?token=``), and a URL is shown by the CLI,
    the API, dead letters and the delivery log. The user name is kept when a password follows
    it (it says which account); user info without a password is masked whole (``TOKEN@host``
    is a token), as is a query item without ``=`` and a fragment. Scheme, host, port and path
    stay, so the URL can still be told apart. The stored URL stays whole: it is what is sent.
    ``query=False`` keeps the query and fragment (a Redis URL's ``?db=1`` is no secret).
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced [ in the host: show nothing of it
        return SECRET
    if not parts.netloc and "@" in parts.path:  # no "//": user info may sit in the path
        return f"{parts.scheme}:{SECRET}" if parts.scheme else SECRET
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{SECRET}@{hostport}" if colon else f"{SECRET}@{hostport}"
    if not query:
        return parts._replace(netloc=netloc).geturl()
    items = "&".join(_mask_item(item) for item in parts.query.split("&"))
    fragment = SECRET if parts.fragment else ""
    return parts._replace(netloc=netloc, query=items, fragment=fragment).geturl()


def _mask_item(item: str) -> str:
    name, eq, value = item.partition("=")
    if eq:
        return f"{name}={SECRET}" if value else item
    return SECRET if item else item


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def mask_urls(text: str) -> str:
    """`mask_url` applied to every URL inside a message (an error text that may quote one)."""
    return _URL.sub(lambda m: mask_url(m.group()), text)


def _seconds(value: Any) -> str | None:
    # bool is an int to Python but never a duration; nan fails >= 0; an int too large for a
    # float (OverflowError) is not one either.
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            if float(value) >= 0:
                return None
        except OverflowError:
            pass
    return f"must be a number of seconds >= 0 (got {value!r})"


def _secret(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    return f"must be a string, not {type(value).__name__}"  # a secret's value is never echoed


def _format(value: Any) -> str | None:
    if value is None or value in WEBHOOK_FORMATS:
        return None
    return f"must be one of {', '.join(WEBHOOK_FORMATS)} (got {value!r})"


_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "email": _email,
    "webhook": _webhook,
    "digest": _seconds,
    "secret": _secret,
    "format": _format,
}


def channel_problems(channel: Any) -> list[Problem]:
    """Every problem of one channel, located inside the channel (``()`` = the channel itself)."""
    kind = channel_kind(channel)
    if kind is None:
        got = f"keys {sorted(map(str, channel))}" if isinstance(channel, Mapping) else repr(channel)
        return [((), f"{CHANNEL_SHAPE}, got {got}")]
    out: list[Problem] = []
    for key, value in channel.items():
        if key not in CHANNEL_KEYS[kind]:
            out.append(((str(key),), f"{UNKNOWN_KEY} (allowed: {', '.join(CHANNEL_KEYS[kind])})"))
        elif (message := _FIELDS[key](value)) is not None:
            out.append(((key,), message))
    return out


def subscriber_problems(sub: Any) -> list[Problem]:
    """Every problem of one subscriber record; ``[]`` means it is valid.

    A key other than id, channels, digest, secret and templates is a problem located at that
    key; a template that does not parse is one located at its name (`profiles.templates`).
    """
    if not isinstance(sub, Mapping):
        return [((), f"a subscriber is a mapping with id and channels, got {sub!r}")]
    out: list[Problem] = []
    sid = sub.get("id")
    if "id" not in sub:
        out.append((("id",), "a subscriber needs a non-empty string id"))
    elif not isinstance(sid, str) or not sid:
        out.append((("id",), f"a subscriber needs a non-empty string id (got {sid!r})"))
    for key in sub:
        if key not in SUBSCRIBER_KEYS:
            out.append(((str(key),), f"{UNKNOWN_KEY} (allowed: {', '.join(SUBSCRIBER_KEYS)})"))
    for key in ("digest", "secret"):
        if (message := _FIELDS[key](sub.get(key))) is not None:
            out.append(((key,), message))
    if sub.get("templates") is not None:  # Jinja2 is loaded only for a record that has some
        from profiles.templates import template_problems

        templates = template_problems(sub["templates"])
        out.extend((("templates", *loc), message) for loc, message in templates)
    channels = sub.get("channels", [])
    if not isinstance(channels, list):
        out.append((("channels",), f"must be a list of channels, not {type(channels).__name__}"))
        return out
    for k, channel in enumerate(channels):
        out.extend((("channels", k, *loc), message) for loc, message in channel_problems(channel))
    return out


def describe(loc: Loc, message: str) -> str:
    """``channels.0.email: 'x' is not an e-mail address``; the message alone for the record."""
    return f"{'.'.join(map(str, loc))}: {message}" if loc else message
