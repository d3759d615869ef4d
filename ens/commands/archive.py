"""`ens archive list|export`: what the service's event archive holds (docs/archive.md), and a
time range of it as JSON lines (what `ens replay` reads) or Parquet."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from ens.archive_time import archive_uri, parse_when
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


def _fail(e: ENSError) -> typer.Exit:
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(2)


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
        raise _fail(e) from None
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
        raise _fail(e) from None
    except OSError as e:
        raise _fail(ENSError(f"cannot write --out {out}: {e.strerror or e}")) from None
    skipped = f", {len(sc.skipped)} corrupt files skipped" if sc.skipped else ""
    typer.echo(f"{out}: {len(got)} events from {len(sc.files)} files{skipped}", err=True)
