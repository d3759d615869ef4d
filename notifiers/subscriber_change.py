"""Adding a subscriber whose id is stored: the one rule of the CLI and the HTTP API.

`ens subscriber add`, `ens profile add FILE` (its subscribers) and ``POST``/``PUT
/v1/subscribers`` all `plan` first and `apply` after: an id stored with the same definition
is left alone (``unchanged``), one stored with another definition is replaced only when the
caller says so (``--replace``, ``PUT``), and the change is shown as ``-`` old / ``+`` new lines
(webhook URLs masked). The webhook signing secret is kept on a replace — the receivers verify
with it — unless a rotation is asked for (a new secret, shown once) or a secret is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from notifiers.store import (
    EmailChannel,
    Subscriber,
    describe_channel,
    get_subscriber,
    new_secret,
    put_subscriber,
)


@dataclass(frozen=True)
class SubscriberChange:
    """What storing ``new`` over ``old`` does; ``lines`` is empty when nothing but a rotation
    (or nothing at all) changes."""

    new: Subscriber
    old: Subscriber | None
    lines: list[str] = field(default_factory=list)
    rotate: bool = False

    @property
    def id(self) -> str:
        return self.new.id

    @property
    def status(self) -> str:
        """``new``, ``unchanged``, ``rotated`` (the secret only) or ``changed``."""
        if self.old is None:
            return "new"
        if self.lines:
            return "changed"
        return "rotated" if self.rotate else "unchanged"

    @property
    def needs_replace(self) -> bool:
        """The stored definition would change (a rotation alone is asked for by itself)."""
        return self.status == "changed"

    def refusal(self, how: str = "--replace replaces it") -> str:
        return f"subscriber {self.id} is stored with another definition ({how})"


def _channel(c: Any) -> str:
    text = describe_channel(c.model_dump())
    if isinstance(c, EmailChannel) and c.digest is not None:
        text += f" (digest {c.digest:g} s)"
    return text


def _shown(s: Subscriber) -> str:
    templates = f"; templates {', '.join(sorted(s.templates))}" if s.templates else ""
    digest = f"; digest {s.digest:g} s" if s.digest else ""
    return ", ".join(_channel(c) for c in s.channels) + digest + templates


def _urls(s: Subscriber) -> list[str | None]:
    return [getattr(c, "webhook", None) for c in s.channels]


def _compared(s: Subscriber) -> Any:
    """What a change is: channels (URLs, addresses, formats, their digests and own secrets),
    digest and templates."""
    return ([c.model_dump(exclude_none=True) for c in s.channels], s.digest, s.templates or {})


def plan(
    r: redis.Redis, sub: Subscriber | Mapping[str, Any], rotate: bool = False
) -> SubscriberChange:
    """The change storing ``sub`` makes; ``sub`` is validated (`ValidationError` if invalid).

    The record planned keeps the stored secret unless ``sub`` gives one or ``rotate`` asks for
    a new one (then generated here and shown once by the caller).
    """
    new = sub if isinstance(sub, Subscriber) else Subscriber.model_validate(sub)
    old = get_subscriber(r, new.id)
    lines: list[str] = []
    if old is not None:
        if _compared(old) != _compared(new):
            lines = [f"- {_shown(old)}", f"+ {_shown(new)}"]
            if lines[0][1:] == lines[1][1:]:  # the change is in what masking hides
                urls = [_urls(old), _urls(new)]
                if (old.templates or {}) != (new.templates or {}):
                    lines.append("  (the text of a template changed)")
                elif urls[0] != urls[1]:
                    lines.append("  (credentials or query values of a webhook URL changed)")
                else:
                    lines.append("  (a channel's own signing secret changed)")
        if new.secret and new.secret != old.secret:
            lines.append("  (a new signing secret is given)")
        elif not new.secret and old.secret:
            new = new.model_copy(update={"secret": old.secret})
    if rotate:
        new = new.model_copy(update={"secret": new_secret()})
    return SubscriberChange(new, old, lines, rotate)


def apply(r: redis.Redis, change: SubscriberChange) -> tuple[Subscriber, str | None]:
    """Store the planned record (nothing if unchanged); returns it and the signing secret to
    show once: a generated one (new subscriber, rotation), else None."""
    if change.status == "unchanged":
        return change.new, None
    had = change.new.secret
    saved = put_subscriber(r, change.new)
    generated = saved.secret if saved.secret and (change.rotate or not had) else None
    return saved, generated
