"""Importing historical events (e.g. `ens data convert` output) into an archive, so that events
recorded before ENS ran can be backtested: the same files the service's archiver writes
(`adapters.archive.writer`: hour partitions, zstd, each file whole), in the same order.

The file's order is the engine order (``seq`` from the archive's next one, dense), as `ens
replay` of the file would feed them; ``late`` marks an event older than the newest one before
it (the engine's time, as in the service). Rows are written in flushes of ``max_rows`` (the
archiver's own bound), one file per hour partition a flush touches, named by its first seq.

Nothing is written for a file with a bad line: `check` reads it all first and names every bad
line (``FILE, line N``) before `write` starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from adapters.archive.layout import SCHEMA, Archive, list_files
from adapters.archive.writer import write_columns
from notifiers.records import encode
from profiles.errors import EventError
from profiles.events import Event, parse_event_line

MAX_ROWS = 100_000  # rows per flush: the archiver's default (`ArchiverConfig.max_rows`)
REQUIRED = ("kind",)  # attributes an archived event must have, besides ts


@dataclass
class Imported:
    """What an import wrote."""

    events: int = 0
    late: int = 0
    files: int = 0
    bytes: int = 0
    first_seq: int = 0
    errors: list[EventError] = field(default_factory=list)
    bad_lines: int = 0


def parse_line(line: str, lineno: int, source: str) -> Event:
    """One line as an event with ``ts`` and the `REQUIRED` attributes; `EventError` naming
    ``SOURCE, line N`` when it is not one."""
    ev = parse_event_line(line, lineno, source)
    for name in REQUIRED:
        if name not in ev.attrs:
            raise EventError(f"missing required key {name!r}", f"{source}, line {lineno}")
    return ev


def check(lines: Iterable[str], source: str, max_errors: int = 20) -> Imported:
    """Read every line: the count of good events, the first ``max_errors`` bad lines and how
    many there are in all."""
    res = Imported()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            parse_line(line, lineno, source)
            res.events += 1
        except EventError as e:
            res.bad_lines += 1
            if len(res.errors) < max_errors:
                res.errors.append(e)
    return res


def next_seq(arc: Archive) -> int:
    """The seq after the archive's last event (0 for an empty archive)."""
    files = list_files(arc)
    if not files:
        return 0
    top = max(f.first_seq for f in files)
    last = top
    for f in files:
        if f.first_seq == top:  # one flush's files (one per hour it touched)
            with arc.fs.open_input_file(f.path) as fh:
                seqs = pq.read_table(fh, columns=["seq"]).column("seq").to_pylist()
            last = max([last, *seqs])
    return last + 1


def write(
    arc: Archive,
    lines: Iterable[str],
    source: str,
    gateway: str | None,
    first_seq: int,
    max_rows: int = MAX_ROWS,
    progress: Callable[[int], None] | None = None,
) -> Imported:
    """Write the events of ``lines`` (checked by `check` before) from ``first_seq`` on.
    ``gateway`` stamps each event's ``gateway`` attribute (as the service does for the key
    that posted it); without it an event keeps its own, which also fills the column."""
    res = Imported(first_seq=first_seq)
    cols: dict[str, list[Any]] = {n: [] for n in SCHEMA.names}
    seq = first_seq
    newest = float("-inf")

    def flush() -> None:
        nonlocal cols
        if not cols["seq"]:
            return
        files, size = write_columns(arc, cols, cols["seq"][0])
        res.files += files
        res.bytes += size
        cols = {n: [] for n in SCHEMA.names}

    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        ev = parse_line(line, lineno, source)
        if gateway is not None:
            ev.attrs["gateway"] = gateway
        gw = ev.attrs.get("gateway")
        late = ev.ts < newest
        newest = max(newest, ev.ts)
        cols["seq"].append(seq)
        cols["key"].append(f"{source}:{lineno}")
        cols["id"].append(ev.id)
        cols["ts"].append(ev.ts)
        cols["gateway"].append(gw if isinstance(gw, str) else "")
        cols["ingest_ts"].append(None)  # not accepted by an API: recorded elsewhere
        cols["late"].append(late)
        cols["event"].append(encode(ev.to_json())[0])
        seq += 1
        res.events += 1
        res.late += late
        if len(cols["seq"]) >= max_rows:
            flush()
            if progress is not None:
                progress(res.events)
    flush()
    if progress is not None:
        progress(res.events)
    return res
