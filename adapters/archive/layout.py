"""Where and how archived events are stored: the row schema, the partition paths, the file
names, and the file system of an archive URI (local path, or any URI pyarrow or fsspec
opens: ``s3://``, ``hdfs://``, ``gs://``, ...).

One row per event, in engine order: ``seq`` numbers the archive's events densely in the order
the engine processed them (the archiver assigns it, so a file's name, ``part-<first seq>``,
sorts with it). ``event`` is the event as JSON, exactly the line `ens replay` reads.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from profiles.errors import ENSError

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),  # engine order over the whole archive (dense, from 0)
        ("key", pa.string()),  # the ingest key (entry id . index): the event's identity
        ("id", pa.string()),
        ("ts", pa.float64()),  # event time, epoch seconds
        ("gateway", pa.string()),
        ("ingest_ts", pa.float64()),  # when the API accepted it (its ingest entry's time)
        ("late", pa.bool_()),  # older than the engine's time when read (docs/archive.md)
        ("event", pa.string()),  # the event as JSON: {"id", "ts", **attributes}
    ]
)
COMPRESSION = "zstd"
# how files are written: a dictionary only for the gateway (the other strings are all
# distinct: a dictionary attempt doubled the size), statistics only where readers prune
WRITE_OPTIONS: dict[str, object] = {
    "compression": COMPRESSION,
    "use_dictionary": ["gateway"],
    "write_statistics": ["seq", "ts"],
}
FILE_RE = re.compile(r"^part-(\d{20})\.parquet$")
PART_RE = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})$")
HOUR = 3600.0


def partition(ts: float) -> str:
    """The partition directory of an event time (UTC): ``date=2026-11-28/hour=00``."""
    t = time.gmtime(ts)
    return f"date={time.strftime('%Y-%m-%d', t)}/hour={t.tm_hour:02d}"


def partition_start(path: str) -> float | None:
    """The first second of a partition directory (``.../date=D/hour=H``), or None."""
    m = PART_RE.search(path.rstrip("/"))
    if m is None:
        return None
    import calendar

    day = time.strptime(m.group(1), "%Y-%m-%d")
    return float(calendar.timegm(day)) + int(m.group(2)) * HOUR


def file_name(first_seq: int) -> str:
    return f"part-{first_seq:020d}.parquet"


@dataclass(frozen=True)
class Archive:
    """An archive location: its file system and the base path on it."""

    uri: str
    fs: pafs.FileSystem
    base: str
    local: bool

    def path(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])


def open_archive(uri: str) -> Archive:
    """The file system of ``uri``: a local path, a URI pyarrow knows (file, s3, gs, hdfs), or
    any other fsspec protocol (needs the ``fsspec`` package)."""
    if "://" not in uri:
        p = Path(uri).expanduser().absolute()
        return Archive(str(p), pafs.LocalFileSystem(), str(p), True)
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
        return Archive(uri, fs, base, isinstance(fs, pafs.LocalFileSystem))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        first = exc
    try:
        import fsspec  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ENSError(
            f"archive {uri}: {first}; other file systems go through fsspec (pip install fsspec "
            "and the protocol's package)"
        ) from None
    ffs, base = fsspec.core.url_to_fs(uri)
    return Archive(uri, pafs.PyFileSystem(pafs.FSSpecHandler(ffs)), base, False)


@dataclass(frozen=True)
class ArchiveFile:
    """One complete archive file."""

    path: str  # on the archive's file system
    partition: str  # date=.../hour=...
    start: float  # the partition's first second
    first_seq: int
    size: int


def list_files(
    arc: Archive, start: float | None = None, end: float | None = None
) -> list[ArchiveFile]:
    """The archive's complete files (hidden names being written are not listed), in engine
    order; only the partitions that overlap ``[start, end)`` when given."""
    info = arc.fs.get_file_info(arc.base)
    if info.type == pafs.FileType.NotFound:
        return []
    out: list[ArchiveFile] = []
    sel = pafs.FileSelector(arc.base, recursive=True, allow_not_found=True)
    for f in arc.fs.get_file_info(sel):
        if f.type != pafs.FileType.File:
            continue
        parent, _, name = f.path.rpartition("/")
        m = FILE_RE.match(name)
        p0 = partition_start(parent)
        if m is None or p0 is None:
            continue
        if start is not None and p0 + HOUR <= start:
            continue
        if end is not None and p0 >= end:
            continue
        part = parent[-len("date=YYYY-MM-DD/hour=HH") :]
        out.append(ArchiveFile(f.path, part, p0, int(m.group(1)), int(f.size or 0)))
    out.sort(key=lambda a: (a.first_seq, a.partition))
    return out


def describe_range(start: float | None, end: float | None) -> str:
    def fmt(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    return f"{fmt(start) if start is not None else '(start)'} .. {fmt(end) if end is not None else '(end)'}"


def ingest_times(keys: list[str]) -> list[float | None]:
    """When the API accepted the events of ingest keys (``<ms>-<n>.<i>``), epoch seconds
    (the events of one request share it: computed once per entry)."""
    seen: dict[str, float | None] = {}
    out: list[float | None] = []
    for key in keys:
        ms = key.split("-", 1)[0]
        t = seen.get(ms, -1.0)
        if t == -1.0:
            try:
                t = seen[ms] = int(ms) / 1000
            except ValueError:
                t = seen[ms] = None
        out.append(t)
    return out
