"""The errors of delivery and alarms (routing's: `notifiers.routing.errors`), each under `profiles.errors.ENSError`: one line
that names what is wrong and where."""

from __future__ import annotations

from profiles.errors import ENSError


class ConfigError(ENSError):
    """A notifier configuration (SMTP, webhooks, limits) that cannot work."""


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
