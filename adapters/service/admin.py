"""Profile and gateway management: the one set of rules `ens profile|gateway` and the HTTP
routes (`routes/manage.py`, `routes/admin.py`) both apply, so that the two cannot differ.

Profiles, like subscribers (`notifiers.subscriber_change`, the rule for those), are planned
first and stored after: an id stored with the same definition is left alone (``unchanged``:
its partial matches stay), one stored with another definition is replaced only when the caller
says so (``--replace``; ``POST /v1/profiles`` replaces, as it always has), and the change is
shown as ``-`` old / ``+`` new lines. Rules that need no Redis come first, so that a refused
input creates nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from adapters.errors import Refused
from adapters.service import redis_store as rs
from profiles.ast import Profile
from profiles.errors import ENSError, ProfileError


def one_line(text: str) -> str:
    return " ".join(text.split())


def alarm_options(
    severity: str | None, clear: str | None, notify: list[str] | None
) -> dict[str, Any] | None:
    """The `alarm:` that --severity/--clear/--notify describe (None: not an alarm)."""
    if severity is None and clear is None and not notify:
        return None
    out: dict[str, Any] = {"severity": severity or "warning"}
    if clear is not None:
        text = clear.strip()
        is_form = text == "manual" or text.startswith("after ")
        out["clear"] = text if is_form else {"on": text}
    if notify:
        out["notify"] = [n.strip() for item in notify for n in item.split(",") if n.strip()]
    return out


def zoned_profiles(pset: Any) -> list[ENSError]:
    """The service stores a profile's expression only: a file's `tz:` cannot travel with it, so
    a profile that reads localtime/weekday in it is refused (the service reads them in its
    --tz) rather than stored with another meaning."""
    from profiles.lint import local_zones

    out: list[ENSError] = []
    for p in pset.profiles:
        if local_zones(p) - {None}:
            out.append(
                ProfileError(
                    f"reads localtime/weekday in the file's tz: {pset.tz}, which the service "
                    "does not store; remove tz: from the file and start ens serve with "
                    f"--tz {pset.tz}",
                    p.id,
                )
            )
    return out


def check_ids(parsed: Iterable[Profile], subs: Iterable[dict[str, Any]]) -> list[ENSError]:
    """The problems of ids and subscriber definitions, found without Redis."""
    from notifiers import store

    errors: list[ENSError] = []
    for sub in subs:
        try:
            rs.check_id(sub["id"], "subscriber id")
            store.Subscriber.model_validate(sub)
        except store.ValidationError as exc:
            errors.append(ENSError(f"subscriber {sub.get('id')!r}: {store.subscriber_error(exc)}"))
        except (ProfileError, ValueError) as exc:
            errors.append(ENSError(f"subscriber {sub.get('id')!r}: {exc}"))
    for prof in parsed:
        try:
            rs.check_id(prof.id)
        except ProfileError as exc:
            errors.append(exc)
    return errors


def unknown_subscribers(r: redis.Redis, parsed: Iterable[Profile], known: set[str]) -> list[str]:
    """Ids of the profiles whose subscriber is neither stored nor in ``known`` (added with them)."""
    from notifiers import store

    return [
        p.id
        for p in parsed
        if p.subscriber is not None
        and p.subscriber not in known
        and not r.hexists(store.SUBSCRIBERS, p.subscriber)
    ]


def unknown_subscriber_error(prof: Profile) -> ProfileError:
    return ProfileError(f"unknown subscriber {prof.subscriber!r} (add it first)", prof.id)


@dataclass(frozen=True)
class ProfileChange:
    """What storing ``profile`` (with ``alarm``) over the stored record ``old`` does."""

    profile: Profile
    alarm: dict[str, Any] | None
    old: dict[str, Any] | None
    lines: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.profile.id

    @property
    def status(self) -> str:
        """``new``, ``unchanged`` or ``changed``."""
        if self.old is None:
            return "new"
        return "changed" if self.lines else "unchanged"

    @property
    def needs_replace(self) -> bool:
        return self.status == "changed"


def plan_profile(r: redis.Redis, prof: Profile, alarm: dict[str, Any] | None) -> ProfileChange:
    """The change storing ``prof`` makes (its expression compared on one line)."""
    old = rs.get_profile(r, prof.id)
    lines: list[str] = []
    if old is not None:
        if old.get("alarm") != alarm:
            lines += [f"- alarm: {json.dumps(old.get('alarm'))}", f"+ alarm: {json.dumps(alarm)}"]
        if one_line(old["expr"]) != one_line(prof.source):
            lines += [f"- expr: {one_line(old['expr'])}", f"+ expr: {one_line(prof.source)}"]
        if old.get("subscriber") != prof.subscriber:
            lines += [
                f"- subscriber: {old.get('subscriber') or '-'}",
                f"+ subscriber: {prof.subscriber or '-'}",
            ]
    return ProfileChange(prof, alarm, old, lines)


def apply_profile(r: redis.Redis, change: ProfileChange) -> dict[str, Any]:
    """Store the planned profile (nothing if unchanged); returns the stored record."""
    if change.status == "unchanged":
        assert change.old is not None
        return change.old
    p = change.profile
    rec, _ = rs.put_profile(r, p.id, p.source, p.subscriber, change.alarm)
    return rec


def profile_warnings(
    r: redis.Redis, prof: Profile, recent: list[dict[str, Any]] | None = None
) -> list[str]:
    """What looks wrong but is valid: lint against the attributes seen, the rates of recent
    events, and no subscriber."""
    from adapters.service.profile_lint import profile_warnings as lint

    out = lint(r, prof, recent)
    if prof.subscriber is None:
        out.append(
            f"profile {prof.id!r} has no subscriber: its notifications go to the outbox only "
            "(ens notifications tail)"
        )
    return out


# ----------------------------------------------------------------------------- gateways


def parse_lateness(text: str | None, name: str = "--lateness") -> float | None:
    """A gateway's lateness (a duration or ``default``); `Refused` (422) naming ``name``."""
    try:
        return None if text is None else rs.parse_lateness(text)
    except ValueError as exc:
        raise Refused(str(exc).replace("--lateness", name), 422) from None


def add_gateway(r: redis.Redis, name: str, lateness: float | None) -> str:
    """Create a gateway; returns its API key (shown once: only its hash is stored). `Refused`:
    a bad name (422), or a gateway of that name whose key is not revoked (409)."""
    try:
        rs.check_gateway_name(name)
    except ValueError as exc:
        raise Refused(str(exc), 422) from None
    try:
        return rs.add_gateway(r, name, lateness)
    except ValueError as exc:
        raise Refused(str(exc), 409) from None


def set_gateway(r: redis.Redis, name: str, lateness: float | None) -> None:
    """Change a gateway's lateness (a running engine applies it at once); `Refused` (404)."""
    if not rs.set_gateway_lateness(r, name, lateness):
        raise Refused(f"no gateway {name!r}", 404)


def revoke_gateway(r: redis.Redis, name: str) -> None:
    """Revoke a gateway's API key; `Refused` (404) if there is no such gateway."""
    if not rs.revoke_gateway(r, name):
        raise Refused(f"no gateway {name!r}", 404)
