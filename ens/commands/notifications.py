"""``ens notifications ...``: run the delivery worker, inspect and retry dead letters, list and
export the late output (events too late to be matched in ``ts`` order).

Mounted by the main CLI as ``app.add_typer(ens.commands.notifications.app, name="notifications")``.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ens.commands import output
from ens.commands.output import Json
from ens.commands.store import DataDir, NotifierConfig, RedisUrl, Store
from ens.options import lazy_module

if TYPE_CHECKING:
    from rich.console import Console

store = lazy_module("notifiers.store")  # redis and pydantic: only when a command runs
late = lazy_module("adapters.service.late")

app = typer.Typer(
    help="Deliver notifications (webhooks, e-mail) and manage dead letters.", no_args_is_help=True
)
dead_letter_app = typer.Typer(
    help="Notifications that could not be delivered.", no_args_is_help=True
)
app.add_typer(dead_letter_app, name="dead-letter")
late_app = typer.Typer(
    help="Events that arrived too late to be matched in ts order (older than the engine's "
    "time when read): kept out of the engine, in the late output (ens:late). Export them "
    "for `ens replay`.",
    no_args_is_help=True,
)
app.add_typer(late_app, name="late")
Gateway = Annotated[str | None, typer.Option("--gateway", help="Only this gateway's.")]


def _console() -> Console:
    return output.console()


@dead_letter_app.command("list")
def dead_letter_list(
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many (oldest first).")] = 100,
    all_: Annotated[bool, typer.Option("--all", help="Show every dead letter.")] = False,
    after: Annotated[
        str | None,
        typer.Option(help="Start after this dead-letter entry id (the next page)."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Show dead letters: notification id, profile, channel, error, attempts.

    A page at a time: the first ``--limit`` (100), then ``--after`` the last entry shown;
    ``--all`` shows them all. When more are left, a note on stderr says so.
    """
    if after is not None and not re.fullmatch(r"\d+(-\d+)?", after.strip()):
        raise typer.BadParameter(
            f"{after!r} is not a dead-letter entry id (like 1709331005000-0: the entry column)",
            param_hint="--after",
        )
    st = Store(redis_url, data_dir)  # held while used: it keeps an embedded server alive
    total = int(st.r.xlen(store.DEADLETTER))
    letters = store.list_dead_letters(st.r, count=None if all_ else limit, after=after)
    more = bool(letters) and bool(
        st.r.xrange(store.DEADLETTER, min=f"({letters[-1].entry}", count=1)
    )
    if more:
        typer.echo(
            f"showing {len(letters)} of {total} dead letters; more follow: "
            f"--after {letters[-1].entry} for the next page, --limit N for more at once, "
            "--all for all",
            err=True,
        )
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

    title = f"Dead letters ({len(letters)} of {total})" if len(letters) < total else None
    table = Table(title=title or f"Dead letters ({total})")
    for col in ("id", "entry", "profile", "channel", "error", "attempts", "when"):
        table.add_column(col, overflow="fold")
    for dl in letters:
        when = datetime.fromtimestamp(dl.ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
        channel = store.describe_channel(dl.channel)
        if dl.ch >= 0:
            channel = f"#{dl.ch} {channel}"
        table.add_row(
            dl.nid,
            dl.entry,
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
    config: NotifierConfig = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ...")] = "INFO",
    log_format: Annotated[
        str,
        typer.Option(
            envvar="ENS_LOG_FORMAT",
            help="text, or json: one JSON object per line (as ens serve --log-format).",
        ),
    ] = "text",
) -> None:
    """Run the delivery worker in the foreground until Ctrl-C (or SIGTERM).

    On a stop, sends in flight get ENS_WORKER_SHUTDOWN_GRACE seconds (default 5); the rest are
    abandoned and delivered again, by any worker, once their lease runs out.
    """
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


@late_app.command("list")
def late_list(
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    gateway: Gateway = None,
    limit: Annotated[
        int, typer.Option(min=1, help="Show at most the newest N (oldest first).")
    ] = 100,
    as_json: Json = False,
) -> None:
    """Show late events: when, gateway, event id, its ts, how far behind the engine it was."""
    st = Store(redis_url, data_dir)
    recs, more = late.list_late(st.r, gateway, limit)
    if more:
        typer.echo(
            f"note: showing the newest {limit} late events; more are stored (--limit)", err=True
        )
    if as_json:
        output.print_json([rec.to_json() for rec in recs])
        return
    from rich.table import Table

    table = Table(title=f"Late events ({len(recs)}{'+' if more else ''})")
    for col in ("written", "gateway", "id", "ts", "behind", "event"):
        table.add_column(col, overflow="fold")
    for rec in recs:
        attrs = {k: v for k, v in rec.event.items() if k not in ("id", "ts")}
        table.add_row(
            _utc(rec.written),
            rec.gateway,
            str(rec.event.get("id", rec.key)),
            _utc(float(rec.event["ts"]), ms=True),
            f"{rec.behind:.3f} s",
            " ".join(f"{k}={v}" for k, v in attrs.items()),
        )
    _console().print(table)


@late_app.command("export")
def late_export(
    out: Annotated[
        str, typer.Option("--out", "-o", help="JSON-lines file to write ('-': stdout).")
    ],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    gateway: Gateway = None,
) -> None:
    """Write the late events as an `ens replay` event file (JSON lines sorted by ts).

    Replay them offline with `ens replay profiles.yaml late.jsonl`, or merge them into a
    historical event file first (replay sorts by ts).
    """
    import json

    st = Store(redis_url, data_dir)
    recs, _ = late.list_late(st.r, gateway)
    events = sorted((rec.event for rec in recs), key=lambda e: e["ts"])
    text = "".join(json.dumps(ev) + "\n" for ev in events)
    if out == "-":
        typer.echo(text, nl=False)
        return
    from adapters.files import atomic_text

    if Path(out).is_dir():
        typer.echo(f"error: --out {out} is a directory; give a file name", err=True)
        raise typer.Exit(2)
    try:
        with atomic_text(out, gzip_gz=False) as fh:
            fh.write(text)
    except OSError as exc:
        typer.echo(f"error: cannot write --out {out}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{len(events)} late event(s) written to {out}", err=True)


def _utc(t: float, ms: bool = False) -> str:
    fmt = "%Y-%m-%d %H:%M:%S.%f" if ms else "%Y-%m-%d %H:%M:%S"
    s = datetime.fromtimestamp(t, UTC).strftime(fmt)
    return s[:-3] if ms else s
