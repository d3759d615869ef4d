"""Option values checked the same way by every command group (`ens`, `ens serve`, `ens spark`).

Kept apart from `ens.cli`, which mounts the other groups and so cannot be imported by them.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from profiles.errors import ENSError


def lazy_module(name: str) -> ModuleType:
    """``name``, imported at its first attribute access instead of now.

    The CLI mounts every command group at start, and their modules need Redis, pydantic or
    Spark only when a command runs: `ens --help` and `ens check` took 1.1 s mostly importing
    the redis client (asyncio included) for nothing.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def check_tz(tz: str) -> str:
    """The --tz option: an IANA time zone name, or a user error."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ENSError(f"--tz: unknown time zone {tz!r} (an IANA name such as UTC or Europe/Berlin)") from None
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
