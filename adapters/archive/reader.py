"""Reading the archive: the events of a time range in engine order, a summary per partition.

A file that cannot be read (truncated, not Parquet, another schema) is named in a warning,
skipped and counted (`Scan.skipped`); the rest of the range is read. A range the archive
holds nothing of raises `ENSError` naming the range it does hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from adapters.archive.layout import (
    HOUR,
    SCHEMA,
    Archive,
    ArchiveFile,
    describe_range,
    list_files,
)
from profiles.errors import ENSError
from profiles.events import Event, event_from_obj

Warn = Callable[[str], None]


@dataclass
class Scan:
    """The files of a range and what reading them found."""

    files: list[ArchiveFile]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    events: int = 0

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def held_range(arc: Archive) -> tuple[float, float] | None:
    """The hours the archive holds: (first partition's start, last partition's end)."""
    files = list_files(arc)
    if not files:
        return None
    return min(f.start for f in files), max(f.start for f in files) + HOUR


def scan(arc: Archive, start: float | None, end: float | None) -> Scan:
    """The files whose partitions overlap ``[start, end)``; `ENSError` when there are none."""
    files = list_files(arc, start, end)
    if not files:
        held = held_range(arc)
        holds = (
            f"it holds {describe_range(*held)}"
            if held
            else "it is empty (is the service running with --archive?)"
        )
        raise ENSError(
            f"the archive {arc.uri} has no events in {describe_range(start, end)}: {holds}"
        )
    return Scan(files)


def read_table(arc: Archive, f: ArchiveFile) -> pa.Table:
    """One file, checked against the schema (ValueError/ArrowException when it is not one)."""
    with arc.fs.open_input_file(f.path) as fh:
        table = pq.read_table(fh)
    missing = [n for n in SCHEMA.names if n not in table.column_names]
    if missing:
        raise ValueError(f"not an archive file: no column {', '.join(missing)}")
    return table.select(SCHEMA.names)


def check_file(arc: Archive, f: ArchiveFile) -> None:
    """Its footer and columns (cheap: no data read); raises as `read_table` does."""
    with arc.fs.open_input_file(f.path) as fh:
        names = pq.ParquetFile(fh).schema_arrow.names
    missing = [n for n in SCHEMA.names if n not in names]
    if missing:
        raise ValueError(f"not an archive file: no column {', '.join(missing)}")


def rows(
    arc: Archive, sc: Scan, start: float | None, end: float | None, warn: Warn
) -> Iterator[dict[str, Any]]:
    """The rows of the scan's files within ``[start, end)``, in engine order (``seq``)."""
    out: list[dict[str, Any]] = []
    for f in sc.files:
        try:
            table = read_table(arc, f)
        except (OSError, ValueError, pa.ArrowException) as exc:
            sc.skipped.append((f.path, str(exc)))
            warn(f"warning: skipped corrupt archive file {f.path}: {exc}")
            continue
        for row in table.to_pylist():
            ts = row["ts"]
            if (start is None or ts >= start) and (end is None or ts < end):
                out.append(row)
    out.sort(key=lambda r: r["seq"])
    sc.events = len(out)
    return iter(out)


def to_event(row: dict[str, Any]) -> Event:
    return event_from_obj(json.loads(row["event"]), row["key"])


def read_events(
    arc: Archive, start: float | None, end: float | None, warn: Warn
) -> tuple[list[Event], Scan]:
    """The events of ``[start, end)`` in engine order, and the scan (skipped files)."""
    sc = scan(arc, start, end)
    return [to_event(r) for r in rows(arc, sc, start, end, warn)], sc


def summary(arc: Archive) -> dict[str, Any]:
    """Per partition: files, events, bytes, first and last event time; unreadable files."""
    parts: dict[str, dict[str, Any]] = {}
    corrupt: list[dict[str, str]] = []
    for f in list_files(arc):
        p = parts.setdefault(
            f.partition,
            {
                "partition": f.partition,
                "files": 0,
                "events": 0,
                "bytes": 0,
                "first": None,
                "last": None,
            },
        )
        p["files"] += 1
        p["bytes"] += f.size
        try:
            with arc.fs.open_input_file(f.path) as fh:
                meta = pq.ParquetFile(fh).metadata
            p["events"] += meta.num_rows
            col = meta.schema.names.index("ts")
            for g in range(meta.num_row_groups):
                st = meta.row_group(g).column(col).statistics
                if st is not None and st.has_min_max:
                    p["first"] = st.min if p["first"] is None else min(p["first"], st.min)
                    p["last"] = st.max if p["last"] is None else max(p["last"], st.max)
        except (OSError, ValueError, pa.ArrowException) as exc:
            corrupt.append({"path": f.path, "error": str(exc)})
    listed = sorted(parts.values(), key=lambda p: p["partition"])
    return {
        "uri": arc.uri,
        "partitions": listed,
        "files": sum(p["files"] for p in listed),
        "events": sum(p["events"] for p in listed),
        "bytes": sum(p["bytes"] for p in listed),
        "corrupt": corrupt,
    }
