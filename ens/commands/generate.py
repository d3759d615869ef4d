"""`ens generate …`: synthetic feeds with ground truth (mounted by ens/cli.py as `generate`).

Output is JSON lines sorted by ts, ready for `ens replay`; a file is written to `<out>.part`
and renamed at the end, so a failed run never leaves a half feed. Bad options exit with
status 2 and a one-line message.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from typing import Annotated

import typer

from adapters.files import atomic_text
from adapters.generate.facility import INCIDENT_TYPES, generate_facility
from ens.commands import output

app = typer.Typer(
    help="Synthetic event feeds with injected incidents and their ground truth.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

BATCH = 4096  # lines per write and per progress update


@app.callback()
def _group() -> None:
    """Synthetic event feeds with injected incidents and their ground truth."""
    # A callback keeps `generate` a group even with one command (`ens generate facility`).


def _blocks(records: list[dict]) -> Iterator[tuple[str, int]]:
    encode = json.JSONEncoder(separators=(",", ":")).encode
    it = iter(records)
    while block := list(islice(it, BATCH)):
        yield "".join(encode(r) + "\n" for r in block), len(block)


def write_jsonl(records: list[dict], out: str, progress: bool = False) -> None:
    """JSON lines to `out` ('-': stdout); files atomically, with a progress bar on stderr."""
    if out == "-":
        with contextlib.suppress(BrokenPipeError):  # `… | head` has had enough
            for text, _ in _blocks(records):
                sys.stdout.write(text)
            sys.stdout.flush()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        disable=not progress or not console.is_terminal,  # a pipe or a log file gets no bar
    )
    with atomic_text(out) as fh, bar:
        task = bar.add_task(f"events -> {out}", total=len(records))
        for text, n in _blocks(records):
            fh.write(text)
            bar.advance(task, n)


@app.command("facility")
def facility(
    buildings: Annotated[
        int, typer.Option("--buildings", "-b", min=1, help="Buildings B1, B2, …")
    ] = 2,
    days: Annotated[
        int, typer.Option("--days", "-d", min=1, help="Days of data from --start.")
    ] = 1,
    rooms: Annotated[
        int, typer.Option("--rooms", "-r", min=2, help="Rooms per building (a quarter are labs).")
    ] = 8,
    seed: Annotated[int, typer.Option("--seed", "-s", help="Same seed, same feed.")] = 0,
    start: Annotated[str, typer.Option(help="First day (ISO date, UTC midnight).")] = "2024-03-04",
    step: Annotated[
        int, typer.Option(help="Seconds between two readings of a sensor (60..300).")
    ] = 300,
    incidents: Annotated[
        int,
        typer.Option(min=0, help="Incidents of each type per building and day (P1: per night)."),
    ] = 1,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Event file (.gz: gzipped) or - for stdout.")
    ] = "-",
    truth: Annotated[
        str | None, typer.Option(help="Write the ground truth here (JSON lines, one per incident).")
    ] = None,
) -> None:
    """A building-sensor feed for examples/facility/profiles.yaml with injected incidents.

    Every incident must cause exactly one notification (profile, partition, time and bound
    events as in the truth file) and the background none; see docs/facility.md.
    """
    try:
        events, records = generate_facility(
            buildings=buildings,
            days=days,
            rooms_per_building=rooms,
            seed=seed,
            start=start,
            step_s=step,
            incidents=incidents,
        )
    except ValueError as e:
        raise output.fail(str(e)) from None
    try:
        write_jsonl(events, out, progress=True)
        if truth is not None:
            write_jsonl(records, truth)
    except OSError as e:
        raise output.fail(f"cannot write: {e}") from None
    by_type = Counter(r["incident"] for r in records)
    kinds = ", ".join(f"{k} {by_type[k]}" for k in INCIDENT_TYPES if by_type[k])
    where = "" if out == "-" else f" to {out}"
    typer.echo(
        f"generated {len(events)} events{where}; {len(records)} incidents ({kinds})"
        + (f"; truth in {truth}" if truth else ""),
        err=True,
    )
