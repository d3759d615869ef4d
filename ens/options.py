"""Option values checked the same way by every command group (`ens`, `ens serve`, `ens spark`).

Kept apart from `ens.cli`, which mounts the other groups and so cannot be imported by them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer

from profiles.errors import ENSError

# numbers and durations: one implementation for flags, ENS_* variables and config files
from profiles.options import DURATION_HELP as DURATION_HELP
from profiles.options import PLAN_HELP as PLAN_HELP
from profiles.options import STATS_HELP as STATS_HELP
from profiles.options import check_tz as check_tz
from profiles.options import parse_duration as parse_duration
from profiles.options import parse_number as parse_number


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


# the time zone option of `ens replay` and `ens spark replay` (the same meaning in both)
ReplayTz = Annotated[
    str,
    typer.Option(
        help="Time zone of clock(...) events and of localtime/weekday (a profile file's tz: wins)."
    ),
]
