"""`ens archive list|export`: what the service's event archive holds (docs/archive.md), and a
time range of it as JSON lines (what `ens replay` reads) or Parquet."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from ens.archive_time import archive_uri, parse_when
from ens.commands import output
from ens.commands.output import Json, console, print_json
from profiles.errors import ENSError

app = typer.Typer(
    help="The event archive of `ens serve --archive` (docs/archive.md).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ArchiveOpt = Annotated[
    str | None,
    typer.Option(
        "--archive",
        envvar="ENS_ARCHIVE_URI",
        help="The archive: a path or URI (default: the data directory's, "
        "$ENS_DATA_DIR/archive, which `ens serve --archive on` writes).",
    ),
]
FromOpt = Annotated[
    str | None,
    typer.Option("--from", help="Start (inclusive): 7d (back from now), RFC 3339 or epoch s."),
]
ToOpt = Annotated[str | None, typer.Option("--to", help="End (exclusive); default now.")]


def warn(msg: str) -> None:
    typer.echo(msg, err=True)


def open_uri(uri: str | None) -> Any:
    from adapters.archive.layout import open_archive

    return open_archive(archive_uri(uri))


@app.command("list")
def list_cmd(archive: ArchiveOpt = None, as_json: Json = False) -> None:
    """The archive's hour partitions: files, events, bytes, first and last event time."""
    from adapters.archive.reader import summary
    from ens.backtest import iso

    try:
        s = summary(open_uri(archive))
    except ENSError as e:
        raise output.fail(e) from None
    if as_json:
        print_json([s])
        return
    from rich.table import Table

    t = Table(title=f"{s['uri']}: {s['events']} events, {s['files']} files, {s['bytes']} bytes")
    for col in ("partition", "files", "events", "bytes", "first", "last"):
        t.add_column(col, justify="right" if col in ("files", "events", "bytes") else "left")
    for p in s["partitions"]:
        t.add_row(
            p["partition"],
            str(p["files"]),
            str(p["events"]),
            str(p["bytes"]),
            iso(p["first"]) if p["first"] is not None else "",
            iso(p["last"]) if p["last"] is not None else "",
        )
    console().print(t)
    for c in s["corrupt"]:
        warn(f"warning: unreadable archive file {c['path']}: {c['error']}")


@app.command()
def export(
    out: Annotated[str, typer.Option("--out", "-o", help="FILE.jsonl (.gz ok) or FILE.parquet.")],
    start: FromOpt = None,
    end: ToOpt = None,
    archive: ArchiveOpt = None,
) -> None:
    """Write the events of a range in engine order: JSON lines (`ens replay` reads them) or
    Parquet (the archive's columns)."""
    from adapters.archive.reader import rows, scan

    try:
        t0, t1 = parse_when("--from", start), parse_when("--to", end or "now")
        if out.endswith((".parquet", ".jsonl", ".jsonl.gz", ".json")) is False:
            raise ENSError(f"--out {out}: give a .jsonl, .jsonl.gz or .parquet file name")
        arc = open_uri(archive)
        sc = scan(arc, t0, t1)
        got = list(rows(arc, sc, t0, t1, warn))
        if out.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            from adapters.archive.layout import SCHEMA, WRITE_OPTIONS

            part = out + ".part"
            pq.write_table(pa.Table.from_pylist(got, schema=SCHEMA), part, **WRITE_OPTIONS)
            os.replace(part, out)
        else:
            from adapters.files import atomic_text

            with atomic_text(out) as fh:
                for r in got:
                    fh.write(r["event"] + "\n")
    except ENSError as e:
        raise output.fail(e) from None
    except OSError as e:
        raise output.fail(ENSError(f"cannot write --out {out}: {e.strerror or e}")) from None
    skipped = f", {len(sc.skipped)} corrupt files skipped" if sc.skipped else ""
    typer.echo(f"{out}: {len(got)} events from {len(sc.files)} files{skipped}", err=True)


@app.command("import")
def import_cmd(
    events: Annotated[
        str,
        typer.Argument(
            help="JSON-lines event file (.gz allowed), e.g. `ens data convert` output; its "
            "order is the engine order."
        ),
    ],
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway",
            help="Stamp this gateway on every event (as the service does for the posting "
            "key); default: each event keeps its own `gateway` attribute, if any.",
        ),
    ] = None,
    append: Annotated[
        bool,
        typer.Option(
            "--append",
            help="Add to an archive that holds files already (after its last seq); not one a "
            "running service writes.",
        ),
    ] = False,
    archive: ArchiveOpt = None,
) -> None:
    """Write historical events into the archive, as the service's archiver writes them (hour
    partitions, zstd, whole files), to backtest data recorded before ENS ran. Every line is
    checked first: a file with bad lines (not JSON, no ts, no kind) is refused whole, each bad
    line named, nothing written."""
    from adapters.archive import importer
    from ens.event_files import open_text

    try:
        if events == "-":
            raise ENSError("import reads the file twice (check, then write): give a file, not -")
        arc = open_uri(archive)
        prog = _ImportProgress(events)
        try:
            with open_text(events) as fh:
                checked = importer.check(prog.lines(fh, "checking"), events)
            if checked.bad_lines:
                prog.stop()
                for e in checked.errors:
                    typer.echo(f"error: {e}", err=True)
                more = checked.bad_lines - len(checked.errors)
                tail = f" ({more} more not shown)" if more else ""
                typer.echo(
                    f"{checked.bad_lines} bad lines{tail}: nothing imported into {arc.uri}",
                    err=True,
                )
                raise typer.Exit(2)
            if not checked.events:
                raise ENSError(f"{events}: no events to import")
            seq0 = importer.next_seq(arc)
            if seq0 and not append:
                raise ENSError(
                    f"the archive {arc.uri} holds events already (up to seq {seq0 - 1}): import "
                    "into a new archive directory, or give --append to add after them"
                )
            with open_text(events) as fh:
                res = importer.write(
                    arc, prog.lines(fh, "importing"), events, gateway, seq0, progress=None
                )
        finally:
            prog.stop()
    except ENSError as e:
        raise output.fail(e) from None
    except UnicodeDecodeError:
        raise output.fail(ENSError(f"{events}: not UTF-8 text (events are JSON lines)")) from None
    except OSError as e:
        raise output.fail(ENSError(f"cannot import {events}: {e.strerror or e}")) from None
    late = f", {res.late} out of ts order (late)" if res.late else ""
    typer.echo(
        f"{arc.uri}: imported {res.events} events (seq {res.first_seq}..{res.first_seq + res.events - 1})"
        f" in {res.files} files, {res.bytes} bytes{late}",
        err=True,
    )


class _ImportProgress:
    """A bar over the file's bytes on a terminal; plain ``import:`` lines in a pipe."""

    def __init__(self, path: str) -> None:
        import sys

        self.path = path
        self.size = os.path.getsize(path) if os.path.isfile(path) else 0
        self.bar: Any = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self.bar = Progress(
                TextColumn("{task.description:<12}"),
                BarColumn(),
                TaskProgressColumn(),
                console=console(stderr=True),
                transient=True,
            )
            self.bar.start()

    def lines(self, fh: Any, what: str) -> Any:
        from ens.event_files import tracked

        if self.bar is None:
            typer.echo(f"import: {what} {self.path}", err=True)
            return fh
        task = self.bar.add_task(what, total=self.size or None)
        return tracked(fh, lambda done: self.bar.update(task, completed=done))

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
