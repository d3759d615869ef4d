"""Option values checked the same way everywhere, and the one duration type.

A duration is ``500ms``, ``2s``, ``30m``, ``1h``, ``1d`` or plain seconds. Every time option
reads its value here, whether it comes from a command-line flag (`ens serve`, `ens post`,
`ens gateway --lateness`, `ens spark stream`), an ``ENS_*`` variable or a notifier config file,
so each accepts the same forms and refuses bad ones with the same message. This is the lowest
layer, so that the service's settings (`adapters.service.settings`) and the CLI (`ens.options`,
which re-exports these) share one implementation.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, overload

from profiles.errors import OptionError as OptionError  # raised here; one hierarchy there

_DURATION = re.compile(r"(-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*(ms|s|m|h|d)?", re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
DURATION_HELP = "500ms, 2s, 30m, 1h, 1d or seconds"

# --plan / --stats, on every command that builds engines (docs/plans.md)
PLAN_HELP = (
    "Evaluation plan (same output): eager (matches opened by the first component), rare-first "
    "(every seq that allows it is driven by its last component, earlier ones buffered), auto "
    "(from --stats: select each driven by its rarest component, select first tracked online). "
    "docs/plans.md."
)
STATS_HELP = "`ens spark stats` output (STATS.json): the component rates --plan auto decides from."


@overload
def parse_duration(
    flag: str,
    value: str | float,
    *,
    minimum: float = 0.0,
    above: bool = False,
    maximum: float | None = None,
    off: Literal[False] = False,
) -> float: ...


@overload
def parse_duration(
    flag: str,
    value: str | float,
    *,
    minimum: float = 0.0,
    above: bool = False,
    maximum: float | None = None,
    off: bool,
) -> float | None: ...


def parse_duration(
    flag: str,
    value: str | float,
    *,
    minimum: float = 0.0,
    above: bool = False,
    maximum: float | None = None,
    off: bool = False,
) -> float | None:
    """A duration in seconds: ``500ms``, ``2s``, ``30m``, ``1h``, ``1d`` or plain seconds.

    Only ASCII digits (NaN and infinities never match), within the range. ``off``: the word
    ``off`` (or ``none``) is allowed and gives None (no limit). ``above``: the value must
    exceed ``minimum`` rather than reach it. Raises `OptionError` naming ``flag``.
    """
    text = str(value).strip().lower()
    if off and text in ("off", "none"):
        return None
    m = _DURATION.fullmatch(text)
    forms = DURATION_HELP + (", or 'off'" if off else "")
    if not m:
        raise OptionError(f"{flag} {value!r}: expected a duration ({forms})")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    _check_range(flag, value, seconds, minimum, above, maximum, "s")
    return seconds


def parse_number(
    flag: str,
    value: str | float,
    *,
    minimum: float = 0.0,
    above: bool = False,
    maximum: float | None = None,
    integer: bool = False,
) -> float:
    """A finite number option within its range (NaN and infinities refused), naming ``flag``."""
    text = str(value).strip()
    try:
        number = int(text) if integer else float(text)
    except ValueError:
        raise OptionError(
            f"{flag} {value!r}: expected {'an integer' if integer else 'a number'}"
        ) from None
    if not math.isfinite(number):
        raise OptionError(f"{flag} {value!r}: expected a finite number")
    _check_range(flag, value, float(number), minimum, above, maximum, "")
    return number


def _check_range(
    flag: str,
    value: object,
    number: float,
    minimum: float,
    above: bool,
    maximum: float | None,
    unit: str,
) -> None:
    if number < minimum or (above and number == minimum):
        raise OptionError(
            f"{flag} {value!r}: must be {'above' if above else 'at least'} {minimum:g}{unit}"
        )
    if maximum is not None and number > maximum:
        raise OptionError(f"{flag} {value!r}: must be at most {maximum:g}{unit}")


def check_tz(tz: str) -> str:
    """The --tz option: an IANA time zone name, or a user error."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise OptionError(
            f"--tz: unknown time zone {tz!r} (an IANA name such as UTC or Europe/Berlin)"
        ) from None
    return tz


def duration_value(value: Any) -> Any:
    """A config file's or variable's duration for a pydantic field (`notifiers.config.Seconds`):
    a string is parsed here (ValueError if it is not a duration), a number passes on to the
    field's range checks, another type fails there with pydantic's message."""
    if isinstance(value, str):
        m = _DURATION.fullmatch(value.strip().lower())
        if not m:
            raise ValueError(f"expected a duration ({DURATION_HELP})")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return value
