"""Opening a JSON-lines event file as `ens replay` and `ens archive import` do ('-' for stdin,
.gz allowed; a missing file or directory is a user error), and its lines with progress."""

from __future__ import annotations

import sys
from pathlib import Path

from profiles.errors import ENSError


def open_text(path: str):  # noqa: ANN202 - file-like
    if path == "-":
        return sys.stdin
    import gzip

    p = Path(path)
    if not p.exists():
        raise ENSError(f"no such file: {path}")
    if p.is_dir():
        raise ENSError(f"{path} is a directory, not an event file")
    try:
        if path.endswith(".gz"):
            return gzip.open(p, "rt", encoding="utf-8")
        return p.open(encoding="utf-8")
    except OSError as e:
        raise ENSError(f"cannot read event file {path}: {e.strerror or e}") from None


def tracked(fh, advance):  # noqa: ANN001, ANN202 - file-like, callback
    """The lines of ``fh``, reporting how far into the file (bytes on disk) every 4096 lines."""
    raw = getattr(fh, "buffer", None)
    raw = getattr(raw, "fileobj", None) or getattr(raw, "raw", None)  # gzip: compressed bytes
    for i, line in enumerate(fh):
        if i % 4096 == 0 and raw is not None:
            advance(raw.tell())
        yield line
