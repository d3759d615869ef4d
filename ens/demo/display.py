"""What the demo shows while it runs (notifications, mails, webhooks as they arrive) and the
summary at the end."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ens.demo.config import DemoResult
from ens.summary import table as summary_table
from ens.summary import when

# ----------------------------------------------------------------------------- display


class Display:
    """Printed lines (the first ``show`` of each kind) above a progress bar, plus counters."""

    def __init__(self, console: Console, show: int) -> None:
        self.console, self.show = console, show
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.progress = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "[cyan]{task.fields[n]}[/] notifications, [green]{task.fields[m]}[/] "
                "mails, [magenta]{task.fields[w]}[/] webhooks"
            ),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def line(self, kind: str, text: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            n = self.counts[kind]
        try:  # called from the sinks' threads: a closed stdout must not stop a delivery
            if n <= self.show:
                self.console.print(text, highlight=False, no_wrap=True, overflow="ellipsis")
            elif n == self.show + 1:
                self.console.print(f"  [dim]… more {kind}s are counted, not shown (--show N)[/]")
            self.refresh()
        except (OSError, SystemExit):  # rich turns a broken pipe into SystemExit
            self.show = -1

    def refresh(self) -> None:
        c = self.counts
        for task in self.tasks.values():
            self.progress.update(task, n=c["notification"], m=c["mail"], w=c["webhook"])

    def notification(self, rec: dict[str, Any]) -> None:
        part = " ".join(f"{k}={v}" for k, v in (rec.get("partition") or {}).items())
        evs = " ".join(f"{k}={e.get('id')}" for k, e in (rec.get("events") or {}).items())
        self.line(
            "notification",
            f"  [cyan]●[/] {when(rec.get('ts'), True)}  "
            f"[bold]{rec.get('profile')}[/]  {part}  [dim]{evs}[/]",
        )

    def mail(self, rcpt: str, subject: str) -> None:
        self.line("mail", f"  [green]✉[/] mail to {rcpt}: {subject}")

    def webhook(self, sid: str, ok: bool, payload: dict[str, Any]) -> None:
        if ok:
            self.line(
                "webhook",
                f"  [magenta]↪[/] webhook for {sid}: signature verified "
                f"({payload.get('profile')}, {payload.get('notification_id')})",
            )
        else:
            self.line("bad webhook", f"  [red]✗ webhook for {sid}: signature INVALID[/]")


class OutboxWatcher(threading.Thread):
    """Reads the outbox stream from the start and reports each new notification."""

    def __init__(self, r: Any, on_record: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(name="outbox-watcher", daemon=True)
        self.r, self.on_record = r, on_record
        self.records: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from notifiers import store

        cursor = "0-0"
        try:
            while not self.stop_event.is_set():
                resp = self.r.xread({store.OUTBOX: cursor}, block=200, count=500)
                for _, entries in resp or []:
                    for eid, fields in entries:
                        cursor = eid
                        rec = json.loads(fields[store.OUTBOX_FIELD])
                        self.records.append(rec)
                        self.on_record(rec)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            if not self.stop_event.is_set():
                self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def print_summary(console: Console, res: DemoResult) -> None:
    console.print(
        summary_table(res.rows, f"Notifications per profile ({res.feed})", partitions=False)
    )

    def mark(ok: bool) -> str:
        return "[green]✓[/]" if ok else "[red]✗[/]"

    deliveries = Table(title="Deliveries and checks", title_justify="left", show_header=False)
    deliveries.add_column(justify="left")
    deliveries.add_column(justify="right")
    deliveries.add_column()
    deliveries.add_row(
        "mails received by the sink",
        f"{res.mails} / {res.mails_expected}",
        mark(res.mails == res.mails_expected),
    )
    deliveries.add_row(
        "webhooks with a valid signature",
        f"{res.webhooks_valid} / {res.webhooks_expected}",
        mark(res.webhooks_valid == res.webhooks_expected),
    )
    deliveries.add_row(
        "webhooks with a bad signature", str(res.webhooks_invalid), mark(not res.webhooks_invalid)
    )
    deliveries.add_row("dead letters", str(res.dead_letters), mark(not res.dead_letters))
    if res.incidents is not None:
        deliveries.add_row(
            "injected incidents reported",
            f"{res.incidents_found} / {res.incidents}",
            mark(res.incidents_found == res.incidents),
        )
    deliveries.add_row(
        "outbox = offline `ens replay`",
        f"{res.replay_notifications} notifications",
        mark(res.replay_match),
    )
    if res.service_status is not None:
        deliveries.add_row(
            "service stopped (exit status)", str(res.service_status), mark(res.service_status == 0)
        )
        deliveries.add_row(
            "processes left running",
            f"{len(res.leftovers)} of {len(res.pids)}",
            mark(not res.leftovers),
        )
    console.print(deliveries)
    rate = res.events / res.post_seconds if res.post_seconds else 0.0
    console.print(
        f"{res.events} events posted in {res.post_seconds:.1f} s ({rate:,.0f} events/s); "
        f"demo took {res.total_seconds:.1f} s."
    )
