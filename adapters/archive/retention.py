"""Retention: whole hour partitions go, oldest first, once past the age bound (by event time)
or while the archive is over its size bound."""

from __future__ import annotations

from collections import defaultdict

import pyarrow.fs as pafs

from adapters.archive.layout import HOUR, Archive, list_files


def prune(arc: Archive, now: float, max_age: float | None = None, max_bytes: int = 0) -> list[str]:
    """Delete the partitions beyond the bounds; returns the partitions deleted."""
    sizes: dict[str, int] = defaultdict(int)
    starts: dict[str, float] = {}
    for f in list_files(arc):
        sizes[f.partition] += f.size
        starts[f.partition] = f.start
    order = sorted(sizes, key=lambda p: starts[p])
    total = sum(sizes.values())
    gone: list[str] = []
    for part in order:
        old = max_age is not None and starts[part] + HOUR <= now - max_age
        big = max_bytes > 0 and total > max_bytes
        if not (old or big):
            break
        arc.fs.delete_dir(arc.path(part))
        total -= sizes[part]
        gone.append(part)
    for day in sorted({arc.path(p.split("/", 1)[0]) for p in gone}):  # an emptied date=
        if arc.fs.get_file_info(day).type == pafs.FileType.Directory and not arc.fs.get_file_info(
            pafs.FileSelector(day, allow_not_found=True)
        ):
            arc.fs.delete_dir(day)
    return gone
