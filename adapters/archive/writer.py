"""Writing archive files whole: each file is written under a hidden name in its partition
(``.part-<seq>.parquet.tmp``, which neither the reader, pyarrow datasets nor Spark list),
fsynced (local) and renamed when complete, so no reader ever sees part of a file. A file that
exists already (a flush redone after a crash) is left as it is: its rows are the same."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from adapters.archive.layout import HOUR, SCHEMA, WRITE_OPTIONS, Archive, file_name, partition


def write_columns(arc: Archive, cols: dict[str, list[Any]], first_seq: int) -> tuple[int, int]:
    """Write the rows of ``cols`` (`SCHEMA`'s columns, engine order) as one file per hour
    partition they fall in, each named by ``first_seq`` (the first seq of this flush).
    Returns (files written, bytes written)."""
    table = pa.Table.from_pydict(cols, schema=SCHEMA)
    hours = [int(t // HOUR) for t in cols["ts"]]
    distinct = sorted(set(hours))
    files = size = 0
    for h in distinct:
        part = table
        if len(distinct) > 1:
            part = table.filter(pa.array([x == h for x in hours]))
        written = _write(arc, partition(h * HOUR), file_name(first_seq), part)
        files += written > 0
        size += written
    return files, size


def write_rows(arc: Archive, rows: list[dict[str, Any]], first_seq: int) -> tuple[int, int]:
    """`write_columns` of row dicts."""
    return write_columns(arc, {n: [r[n] for r in rows] for n in SCHEMA.names}, first_seq)


def _write(arc: Archive, part: str, name: str, table: pa.Table) -> int:
    """One file, whole; 0 if it exists already."""
    directory = arc.path(part)
    final = f"{directory}/{name}"
    if arc.fs.get_file_info(final).type == pafs.FileType.File:
        return 0  # written before a crash, position not committed: the same rows
    arc.fs.create_dir(directory, recursive=True)
    tmp = f"{directory}/.{name}.tmp"
    with arc.fs.open_output_stream(tmp) as out:
        pq.write_table(table, out, **WRITE_OPTIONS)
    if arc.local:  # durable before the position that says so is committed
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    arc.fs.move(tmp, final)
    return int(arc.fs.get_file_info(final).size or 0)
