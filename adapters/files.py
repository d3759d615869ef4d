"""Writing result files: whole or not at all."""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_text(out: str, compresslevel: int = 6, *, gzip_gz: bool = True) -> Iterator[IO[str]]:
    """A text file `out` (gzip if it ends in .gz, unless `gzip_gz` is off) written as `out.part`
    and renamed when the block ends without error, so a failed or interrupted run never leaves
    half a file."""
    part = out + ".part"
    if gzip_gz and out.endswith(".gz"):
        fh: IO[str] = gzip.open(part, "wt", encoding="utf-8", compresslevel=compresslevel)
    else:
        fh = open(part, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        with fh:
            yield fh
        os.replace(part, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
