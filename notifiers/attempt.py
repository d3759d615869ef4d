"""The result of one delivery attempt, shared by the webhook and e-mail senders."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Attempt:
    """``ok``, or a failure that is ``retryable`` (maybe after ``retry_after`` seconds) or not."""

    ok: bool
    retryable: bool = False
    error: str = ""
    retry_after: float | None = None
    detail: str = ""
    abandoned: bool = False  # cut short by a shutdown: neither a success nor a failure

    @classmethod
    def success(cls, detail: str = "") -> Attempt:
        return cls(True, detail=detail)

    @classmethod
    def retry(cls, error: str, retry_after: float | None = None) -> Attempt:
        return cls(False, True, error, retry_after)

    @classmethod
    def abandon(cls, error: str) -> Attempt:
        """The send was cut short because the worker stops: its lease brings it back."""
        return cls(False, True, error, abandoned=True)

    @classmethod
    def fatal(cls, error: str) -> Attempt:
        return cls(False, False, error)
