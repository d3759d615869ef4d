"""``ens notifications ...``: run the delivery worker, inspect and retry dead letters.

Mounted by the main CLI as ``app.add_typer(ens.commands.notifications.app, name="notifications")``.
"""

from __future__ import annotations

import logging
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ens.commands import output
from ens.commands.output import Json
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module

if TYPE_CHECKING:
    from rich.console import Console

store = lazy_module("notifiers.store")  # redis and pydantic: only when a command runs

app = typer.Typer(
    help="Deliver notifications (webhooks, e-mail) and manage dead letters.", no_args_is_help=True
)
dead_letter_app = typer.Typer(
    help="Notifications that could not be delivered.", no_args_is_help=True
)
app.add_typer(dead_letter_app, name="dead-letter")


def _console() -> Console:
    return output.console()


@dead_letter_app.command("list")
def dead_letter_list(
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (oldest first).")] = 100,
    as_json: Json = False,
) -> None:
    """Show dead letters: notification id, profile, channel, error, attempts."""
    st = Store(redis_url, data_dir)  # held while used: it keeps an embedded server alive
    letters = store.list_dead_letters(st.r, count=limit)
    if as_json:
        output.print_json(
            [
                {
                    "id": dl.nid,
                    "entry": dl.entry,
                    "profile": dl.notification.get("profile"),
                    "channel": store.describe_channel(dl.channel),
                    "ch": dl.ch,
                    "error": dl.error,
                    "attempts": dl.attempts,
                    "ts": dl.ts,
                }
                for dl in letters
            ]
        )
        return
    from rich.table import Table

    table = Table(title=f"Dead letters ({len(letters)})")
    for col in ("id", "profile", "channel", "error", "attempts", "when"):
        table.add_column(col, overflow="fold")
    for dl in letters:
        when = datetime.fromtimestamp(dl.ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
        channel = store.describe_channel(dl.channel)
        if dl.ch >= 0:
            channel = f"#{dl.ch} {channel}"
        table.add_row(
            dl.nid,
            str(dl.notification.get("profile", "")),
            channel,
            dl.error,
            str(dl.attempts),
            when,
        )
    _console().print(table)


@dead_letter_app.command("retry")
def dead_letter_retry(
    ids: Annotated[
        list[str] | None,
        typer.Argument(help="Notification ids (or dead-letter entry ids) to retry."),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Retry every dead letter.")] = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Put dead letters back on the retry schedule with their attempts reset."""
    if bool(ids) == all_:
        raise typer.BadParameter("give notification ids or --all (not both)")
    st = Store(redis_url, data_dir)
    unknown: list[str] = []
    if ids:
        known = {k for dl in store.list_dead_letters(st.r) for k in (dl.nid, dl.entry)}
        unknown = [i for i in ids if i not in known]
    moved = store.retry_dead_letters(st.r, None if all_ else ids)
    if unknown and moved:
        typer.echo(f"warning: no dead letter matches {', '.join(unknown)}", err=True)
    if ids and not moved:
        typer.echo(
            f"error: no dead letter matches {', '.join(ids)} "
            "(see ens notifications dead-letter list)",
            err=True,
        )
        raise typer.Exit(2)
    typer.echo(f"{moved} dead letter(s) scheduled for delivery")


@app.command("deliver")
def deliver(
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="ENS_NOTIFIERS_CONFIG",
            exists=True,
            dir_okay=False,
            help="YAML/JSON notifier config; ENS_SMTP_* etc. env vars override it.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ...")] = "INFO",
    log_format: Annotated[
        str,
        typer.Option(
            envvar="ENS_LOG_FORMAT",
            help="text, or json: one JSON object per line (as ens serve --log-format).",
        ),
    ] = "text",
) -> None:
    """Run the delivery worker in the foreground until Ctrl-C (or SIGTERM)."""
    from notifiers.config import ConfigError, NotifierConfig
    from notifiers.logs import setup_logging
    from notifiers.worker import DeliveryWorker

    if log_format not in ("text", "json"):
        raise typer.BadParameter(f"--log-format must be text or json, not {log_format!r}")
    setup_logging(log_level, log_format=log_format)
    try:
        cfg = NotifierConfig.load(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("ens.notifiers").info(
        "delivery worker %r on %s (stop with Ctrl-C)", cfg.worker.consumer, redis_url
    )
    st = Store(redis_url, data_dir)
    with DeliveryWorker(st.r, cfg) as worker:
        total = worker.run_forever(stop)
    typer.echo("stopped: " + ", ".join(f"{k}={v}" for k, v in total.as_dict().items()))
