"""Writing archive files whole: each file is written under a hidden name in its partition
(``.part-<seq>.parquet.tmp``, which neither the reader, pyarrow datasets nor Spark list) and
renamed when complete, so no reader ever sees part of a file. A file that exists already (a
flush redone after a crash) is left as it is: its rows are the same."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from adapters.archive.layout import COMPRESSION, SCHEMA, Archive, file_name, partition


def write_rows(arc: Archive, rows: list[dict[str, Any]], first_seq: int) -> tuple[int, int]:
    """Write ``rows`` (engine order) as one file per partition they fall in, each named by
    ``first_seq`` (the first seq of this flush). Returns (files written, bytes written)."""
    by_part: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_part[partition(row["ts"])].append(row)
    files = size = 0
    name = file_name(first_seq)
    for part, part_rows in by_part.items():
        directory = arc.path(part)
        final = f"{directory}/{name}"
        if arc.fs.get_file_info(final).type == pafs.FileType.File:
            continue  # written before a crash, position not committed: the same rows
        arc.fs.create_dir(directory, recursive=True)
        tmp = f"{directory}/.{name}.tmp"
        table = pa.Table.from_pylist(part_rows, schema=SCHEMA)
        with arc.fs.open_output_stream(tmp) as out:
            pq.write_table(table, out, compression=COMPRESSION)
        if arc.local:  # durable before the position that says so is committed
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        arc.fs.move(tmp, final)
        files += 1
        size += arc.fs.get_file_info(final).size or 0
    return files, size
