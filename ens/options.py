"""Option values checked the same way by every command group (`ens`, `ens serve`, `ens spark`).

Kept apart from `ens.cli`, which mounts the other groups and so cannot be imported by them.
"""

from __future__ import annotations

from profiles.errors import ENSError


def check_tz(tz: str) -> str:
    """The --tz option: an IANA time zone name, or a user error."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ENSError(f"--tz: unknown time zone {tz!r} (an IANA name such as UTC or Europe/Berlin)") from None
    return tz
