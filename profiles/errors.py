"""Every error a user can see, in one hierarchy under `ENSError`.

They name what is wrong and where, and never carry a traceback. This module is the lowest
layer, so every package can raise them; the modules that raise them re-export them under
their old names. Errors that are also a `ValueError`/`RuntimeError` keep that base so
existing ``except ValueError`` handlers still see them.
"""

from __future__ import annotations

from typing import Any


class ENSError(Exception):
    """Base of every error a user can see: one line, no traceback.

    `exit_status` is the command's exit status when it ends the command: 2 for bad input
    (a file, an option, a busy port), 1 for a run that could not finish.
    """

    exit_status = 2


class ProfileError(ENSError):
    """A profile that does not parse or validate.

    `line`/`column` are 1-based positions inside the profile expression;
    `file_line` is the line in the profile file when known.
    """

    def __init__(
        self,
        message: str,
        profile_id: str | None = None,
        line: int | None = None,
        column: int | None = None,
        expected: list[str] | None = None,
        file_line: int | None = None,
    ) -> None:
        self.message = message
        self.profile_id = profile_id
        self.line = line
        self.column = column
        self.expected = expected or []
        self.file_line = file_line
        super().__init__(str(self))

    def located(self, profile_id: str | None = None, file_line: int | None = None) -> ProfileError:
        return ProfileError(
            self.message,
            profile_id or self.profile_id,
            self.line,
            self.column,
            self.expected,
            file_line if file_line is not None else self.file_line,
        )

    def __str__(self) -> str:
        where = []
        if self.profile_id is not None:
            where.append(f"profile {self.profile_id!r}")
        if self.line is not None:
            pos = f"line {self.line}, column {self.column}"
            if self.file_line is not None:
                pos += f" (file line {self.file_line + self.line - 1})"
            where.append(pos)
        elif self.file_line is not None:
            where.append(f"file line {self.file_line}")
        text = self.message
        if self.expected:
            text += "; expected " + ", ".join(self.expected)
        return (": ".join(where) + ": " + text) if where else text


class ManyErrors(ENSError):
    """Every problem found (a profile file, an event file), not just the first."""

    def __init__(self, errors: list[ENSError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class EventError(ENSError):
    """A bad event; `where` names its line (files) or index (HTTP batches)."""

    def __init__(self, message: str, where: str | None = None) -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class ConfigError(ENSError):
    """A notifier configuration (SMTP, webhooks, limits) that cannot work."""


class OptionError(ENSError, ValueError):
    """An option's value (a flag, an ``ENS_*`` variable) that is not valid; names the option."""


class DatasetError(ENSError, ValueError):
    """A problem with a data-set path, filter or file content."""


class DemoError(ENSError):
    """A user error in `ens demo` (bad file, busy port): one line, exit status 2."""


class DemoFailure(ENSError):
    """The demo could not finish (the service died, a timeout): exit status 1."""

    exit_status = 1


class LockLost(ENSError, RuntimeError):
    """Another worker holds the engine lock: this one must stop without committing."""


class BadEvent(ENSError, ValueError):
    """An event rejected while parsing (it stands in the batch in its place); keeps its id."""

    def __init__(self, message: str, obj: dict[str, Any]) -> None:
        super().__init__(message)
        self.obj = obj


class TsOutOfWindow(ENSError, ValueError):
    """An event ts too far from the wall clock; ``bound`` is "future" or "past"."""

    def __init__(self, message: str, bound: str) -> None:
        super().__init__(message)
        self.bound = bound


class StateError(ENSError):
    """An engine snapshot that this release cannot read (and why, and what to do)."""


class EmbeddedError(ENSError):
    """The embedded Redis server cannot be started or reached (a user-facing message)."""


class StoreMissing(ENSError):
    """A read-only command named a data directory that holds no ENS store."""


class AlarmNotFound(ENSError):
    """No alarm (or occurrence) with this id (notifiers/alarms): the HTTP layer answers 404."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"no alarm {ref!r}")


class AlarmStateConflict(ENSError):
    """The alarm is already in the state an operation asks for (or superseded): 409, with
    ``state``."""

    def __init__(self, ref: str, state: str, operation: str) -> None:
        self.ref, self.state, self.operation = ref, state, operation
        super().__init__(f"cannot {operation} alarm {ref!r}: it is {state}")


class SilenceError(ENSError):
    """A silence that cannot work; ``field`` names the part that is wrong."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"silence {field}: {message}")


class SilenceNotFound(SilenceError):
    """No silence with this id."""

    def __init__(self, sid: str) -> None:
        super().__init__("id", f"no silence {sid!r}")


class WorkerUnavailable(ENSError):
    """The engine worker did not answer an alarm command in time (not running, or far
    behind): HTTP 503, CLI exit 1."""


class EvictingRedis(ENSError):
    """Redis may evict ENS' keys (its maxmemory-policy is not noeviction)."""


class ForeignGateway(ENSError, ValueError):
    """An event names another gateway than the one of its API key (`check_gateway`)."""

    def __init__(self, message: str, named: Any) -> None:
        super().__init__(message)
        self.named = named


class RoutingError(ENSError):
    """A schedule, route, escalation policy or quiet-hours entry that cannot work.

    ``loc`` is the path of keys/indexes inside the entry (``layers.0.handoff``); the
    configuration loader turns it into ``FILE:LINE:COL``.
    """

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        self.message, self.loc = message, loc
        super().__init__(f"{'.'.join(map(str, loc))}: {message}" if loc else message)

    def under(self, *prefix: str | int) -> RoutingError:
        """The same problem, one level further out (``layers`` + ``0.handoff``)."""
        return RoutingError(self.message, (*prefix, *self.loc))


class AssetError(ENSError, ValueError):
    """An asset registry record or file that is not valid (docs/assets.md); the message names
    the line (``FILE:LINE: ...``) or the field."""
