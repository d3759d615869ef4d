"""Every error a user can see derives from `ENSError` (here, in the lowest layer); this module
holds the base and the errors of the profile language. Each other error lives in the `errors`
module of the layer that raises it (`filters.errors`, `notifiers.errors`, `adapters.errors`,
`ens.errors`). They name what is wrong and where, and never carry a traceback. Errors that
are also a `ValueError`/`RuntimeError` keep that base so existing ``except ValueError``
handlers still see them.
"""

from __future__ import annotations


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


class OptionError(ENSError, ValueError):
    """An option's value (a flag, an ``ENS_*`` variable) that is not valid; names the option."""
