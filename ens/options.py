"""Option values checked the same way by every command group (`ens`, `ens serve`, `ens spark`).

Kept apart from `ens.cli`, which mounts the other groups and so cannot be imported by them.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from typing import Any, Literal, overload

from profiles.errors import ENSError

# --plan / --stats, on every command that builds engines (docs/plans.md)
PLAN_HELP = (
    "Evaluation plan (same output): eager (matches opened by the first component), rare-first "
    "(every seq that allows it is driven by its last component, earlier ones buffered), auto "
    "(from --stats: select each driven by its rarest component, select first tracked online). "
    "docs/plans.md."
)
STATS_HELP = "`ens spark stats` output (STATS.json): the component rates --plan auto decides from."


class _LazyModule:
    """Stands for a module; imports it (the normal, thread-safe way) at the first attribute."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """``name``, imported at its first attribute access instead of now.

    The CLI mounts every command group at start, and their modules need Redis, pydantic or
    Spark only when a command runs: `ens --help` and `ens check` took 1.1 s mostly importing
    the redis client (asyncio included) for nothing. Only the caller holds the stand-in;
    ``sys.modules`` and other importers see the real module (importlib's LazyLoader would put a
    half-loaded module there, which Python 3.11 does not guard against threads).
    """
    return sys.modules.get(name) or _LazyModule(name)


def check_tz(tz: str) -> str:
    """The --tz option: an IANA time zone name, or a user error."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ENSError(
            f"--tz: unknown time zone {tz!r} (an IANA name such as UTC or Europe/Berlin)"
        ) from None
    return tz


def tidy_help_metavars() -> None:
    """Help names an option's value (``--role ROLE``) and shows no type for switches.

    Typer 0.2x prints Python annotations in the type column (``--deliver <bool>``, ``--role
    <list[str]>``, even ``--help <bool>``), which read as code rather than as a command line.
    An explicit ``metavar`` and choice lists (``single-step|two-step``) are kept; arguments
    show their name only. Applied once by each CLI entry point (it patches typer's classes).
    """
    from typer import core

    def display(self: core.TyperOption | core.TyperArgument, ctx: object) -> str | None:
        if isinstance(self, core.TyperArgument):
            return None
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        desc = getattr(self, "type_descriptor", None)
        if desc is not None and desc.is_choice:
            return self.display_type(ctx).strip("<>")  # type: ignore[arg-type]
        long = next((o for o in self.opts if o.startswith("--")), None)  # the name users type
        return (long[2:] if long else self.name or "value").upper().replace("-", "_")

    for cls in (core.TyperOption, core.TyperArgument):
        if hasattr(cls, "display_type_rich"):  # typer versions without it print click's names
            cls.display_type_rich = display  # type: ignore[method-assign,assignment]


# ----------------------------------------------------------------------------- numbers and durations

_DURATION = re.compile(r"(-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*(ms|s|m|h|d)?", re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
DURATION_HELP = "500ms, 2s, 30m, 1h, 1d or seconds"


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
    """A duration option in seconds: ``500ms``, ``2s``, ``30m``, ``1h``, ``1d`` or plain seconds.

    The one parser of every time option of `ens serve` and `ens post`, so each accepts the
    same forms. Only ASCII digits (NaN and infinities never match), within the range. ``off``:
    the word ``off`` (or ``none``) is allowed and gives None (no limit). ``above``: the value
    must exceed ``minimum`` rather than reach it. Raises ENSError naming ``flag``.
    """
    text = str(value).strip().lower()
    if off and text in ("off", "none"):
        return None
    m = _DURATION.fullmatch(text)
    forms = DURATION_HELP + (", or 'off'" if off else "")
    if not m:
        raise ENSError(f"{flag} {value!r}: expected a duration ({forms})")
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
        raise ENSError(
            f"{flag} {value!r}: expected {'an integer' if integer else 'a number'}"
        ) from None
    if not math.isfinite(number):
        raise ENSError(f"{flag} {value!r}: expected a finite number")
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
        raise ENSError(
            f"{flag} {value!r}: must be {'above' if above else 'at least'} {minimum:g}{unit}"
        )
    if maximum is not None and number > maximum:
        raise ENSError(f"{flag} {value!r}: must be at most {maximum:g}{unit}")


def parse_time_arg(text: str | None) -> float | None:
    """The --until option: epoch seconds or an RFC 3339 time (ens replay, explain, spark)."""
    if text is None:
        return None
    from profiles.events import parse_ts

    try:
        return parse_ts(float(text))
    except ValueError:
        pass
    try:
        return parse_ts(text)
    except ValueError as e:
        raise ENSError(f"--until: {e}") from None
