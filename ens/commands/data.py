"""`ens data …`: building sensor data sets as ENS events (list, convert, excerpt)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Annotated

import typer

from adapters.datasets import DATASETS, DatasetError, Event, get_adapter
from adapters.files import atomic_text
from ens.commands import output
from ens.commands.output import Json

app = typer.Typer(
    help="Building sensor data sets (KETI, UCI): list them, convert them to ENS events as JSON "
    "lines, regenerate the examples/data excerpts.",
    no_args_is_help=True,
)

BATCH = 4096  # events per write and per progress update


@app.command("list")
def list_cmd(as_json: Json = False) -> None:
    """The data sets `convert` knows, with the folder they are stored in."""
    from rich.table import Table

    from adapters.datasets.excerpt import DEFAULT_OUT, default_source

    shared = default_source()
    if as_json:
        output.print_json(
            [
                {
                    "name": a.name,
                    "folder": a.folder,
                    "description": a.description,
                    "excerpt": str(DEFAULT_OUT / a.folder)
                    if (DEFAULT_OUT / a.folder).exists()
                    else None,
                }
                for a in DATASETS.values()
            ]
        )
        return
    table = Table("name", "folder", "description", "excerpt")
    for a in DATASETS.values():
        excerpt = DEFAULT_OUT / a.folder
        table.add_row(a.name, a.folder, a.description, str(excerpt) if excerpt.exists() else "-")
    console = output.console()
    console.print(table)
    console.print(f"full data: {shared}" + ("" if shared.is_dir() else " (not present)"))


def _batches(events: Iterator[Event]) -> Iterator[str]:
    """JSON lines in blocks of BATCH events (one write per block keeps I/O cheap).

    A block is encoded as one JSON array and split between objects: the json module's
    per-call set-up costs more than encoding a small event, so this is about twice as fast.
    JSON text never holds a raw newline, so if the line count is off (a string value contained
    ``},{``) the block is simply encoded event by event instead.
    """
    encode = json.JSONEncoder(separators=(",", ":")).encode
    while block := list(islice(events, BATCH)):
        text = encode(block)[1:-1].replace("},{", "}\n{") + "\n"
        if text.count("\n") != len(block):
            text = "".join([encode(ev) + "\n" for ev in block])
        yield text


def _write_stdout(events: Iterator[Event]) -> int:
    n = 0
    try:
        for block in _batches(events):
            sys.stdout.write(block)
            n += block.count("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `ens data convert … | head`: the reader has had enough
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return n


def _write_file(events: Iterator[Event], out: str, total: int | None) -> int:
    """Write to `out`.part with a progress bar on stderr, then rename (no half files left)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    n = 0
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,  # a pipe or a log file gets no bar
    )
    # gzip level 3: on event JSON about 2.5x faster than the default 6, for ~35 % more bytes
    with atomic_text(out, compresslevel=3) as f, progress:
        task = progress.add_task(f"events -> {out}", total=total)
        for block in _batches(events):
            f.write(block)
            k = block.count("\n")
            n += k
            progress.advance(task, k)
    return n


@app.command("convert")
def convert(
    dataset: Annotated[str, typer.Argument(help=f"Data set: {', '.join(DATASETS)}.")],
    path: Annotated[
        Path,
        typer.Argument(help="Its folder (or one file), as stored, e.g. examples/data/keti."),
    ],
    out: Annotated[
        str, typer.Option("--out", "-o", help="Output file (.gz: gzipped) or - for stdout.")
    ] = "-",
    rooms: Annotated[
        list[str] | None,
        typer.Option("--rooms", "-r", help="Keep only these rooms (repeat or comma-separate)."),
    ] = None,
    kinds: Annotated[
        list[str] | None,
        typer.Option("--kinds", "-k", help="Keep only these kinds, e.g. temperature,presence."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=0, help="Stop after N events.")
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option(help="Zone of naive local times (UCI sets; default UTC), e.g. +01:00."),
    ] = None,
) -> None:
    """Convert a data set to ENS events, one JSON object per line, in time order."""
    try:
        adapter = get_adapter(dataset)
        events = adapter.iter_events(path, rooms=rooms, kinds=kinds, limit=limit, tz=tz)
        total = None
        if out != "-":
            total = adapter.estimate_events(path, rooms=rooms, kinds=kinds)
            if limit is not None:
                total = limit if total is None else min(total, limit)
    except DatasetError as e:
        raise output.fail(str(e)) from None
    start = time.perf_counter()
    try:
        if out == "-":
            _write_stdout(events)
            return
        n = _write_file(events, out, total)
    except DatasetError as e:
        raise output.fail(str(e)) from None
    except OSError as e:
        raise output.fail(f"cannot write {out}: {e.strerror or e}") from None
    secs = time.perf_counter() - start
    typer.echo(f"wrote {n} events to {out} in {secs:.1f} s", err=True)


@app.command("excerpt")
def excerpt_cmd(
    src: Annotated[
        Path | None,
        typer.Option(help="Shared data folder (default: $ENS_SHARED_DATA or ../shared/data)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Where to write (default: examples/data).")
    ] = None,
) -> None:
    """Regenerate the small committed excerpts in examples/data from the full data sets."""
    from adapters.datasets.excerpt import make_excerpts

    try:
        written = make_excerpts(src, out)
    except (DatasetError, OSError) as e:
        raise output.fail(str(e)) from None
    total = 0
    for p in written:
        size = p.stat().st_size
        total += size
        typer.echo(f"{size:>8}  {p}")
    typer.echo(f"{len(written)} files, {total} bytes")
