"""The errors the edges raise (the service, its Redis, the data sets), each under
`profiles.errors.ENSError`: one line, no traceback. Errors that are also a
`ValueError`/`RuntimeError` keep that base so ``except ValueError`` handlers still see them."""

from __future__ import annotations

from typing import Any

from profiles.errors import ENSError


class DatasetError(ENSError, ValueError):
    """A problem with a data-set path, filter or file content."""


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


class EmbeddedError(ENSError):
    """The embedded Redis server cannot be started or reached (a user-facing message)."""


class StoreMissing(ENSError):
    """A read-only command named a data directory that holds no ENS store."""


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


class Refused(ENSError):
    """A management request that cannot be done as asked (`adapters.service.admin`): the CLI
    prints the message (exit status 2), HTTP answers ``status`` (404, 409, 422)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class PostFailed(ENSError):
    """`ens post` (`adapters.service.client`) could not deliver: the service refused a request
    (exit status 2) or could not be reached in time (1)."""

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class AssetError(ENSError, ValueError):
    """An asset registry record or file that is not valid (docs/assets.md); the message names
    the line (``FILE:LINE: ...``) or the field."""


class NeedLogin(ENSError):
    """A console page without a session (or with an expired one): the login page."""


class NotAllowed(ENSError):
    """A console management page or action with an acknowledge-only session: 403."""
