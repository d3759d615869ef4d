"""How commands print: a table for people, or JSON (``--json``) for scripts; an error line.

A table printed into a pipe or a file is laid out at its natural width: rich assumes 80
columns there and cut long cells ("394…").
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from profiles.errors import ENSError, ManyErrors

if TYPE_CHECKING:
    from rich.console import Console

Json = Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")]

_UNBOUNDED = 10_000  # columns: wide enough for any cell; a table still takes only what it needs


def console(stderr: bool = False) -> Console:
    from rich.console import Console  # rich is loaded by the commands that print with it

    c = Console(soft_wrap=False, stderr=stderr)
    if not c.is_terminal:
        c = Console(soft_wrap=False, stderr=stderr, width=_UNBOUNDED)
    return c


def print_json(rows: list[dict[str, Any]]) -> None:
    typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))


def fail(message: str | ENSError, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; the caller raises the returned exit (status 2: the
    input was refused)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def fail_all(err: ENSError | str, summary: str = "problems") -> typer.Exit:
    """`fail` with each error of a `ManyErrors` on a line of its own, then how many there
    were (``N SUMMARY``) when more than one."""
    errors = err.errors if isinstance(err, ManyErrors) else [err]
    for e in errors:
        typer.echo(f"error: {e}", err=True)
    if len(errors) > 1:
        typer.echo(f"{len(errors)} {summary}", err=True)
    return typer.Exit(2)


def when(ts: float | None) -> str:
    """A stored timestamp as UTC wall time, ``-`` when unset."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
