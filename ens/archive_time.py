"""Times of `ens archive`, `ens backtest` and `--archive` replays: ``--from 7d`` (that long
before now), ``now``, epoch seconds or RFC 3339."""

from __future__ import annotations

import time

from profiles.errors import ENSError
from profiles.events import parse_ts
from profiles.options import OptionError, parse_duration


def parse_when(flag: str, text: str | None, now: float | None = None) -> float | None:
    """A point in time: a duration back from now (``7d``, ``90m``), ``now``, epoch seconds or
    RFC 3339; None for None."""
    if text is None:
        return None
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    try:
        return parse_ts(float(value))
    except ValueError:
        pass
    if value[-1:] in ("s", "m", "h", "d") and value[:-1].replace(".", "", 1).isdigit():
        try:
            return now - parse_duration(flag, value)
        except OptionError as exc:
            raise ENSError(str(exc)) from None
    try:
        return parse_ts(value)
    except ValueError as exc:
        raise ENSError(
            f"{flag} {text!r}: expected a duration back from now (7d, 12h), 'now', epoch "
            f"seconds or an RFC 3339 time ({exc})"
        ) from None


def archive_uri(value: str | None) -> str:
    """``--archive`` as given, or the data directory's archive (``on`` or empty), the one
    ``ens serve --archive on`` writes."""
    if value in (None, "", "on"):
        from adapters.service.redis_store import default_data_dir

        return str(default_data_dir() / "archive")
    return value  # type: ignore[return-value]
