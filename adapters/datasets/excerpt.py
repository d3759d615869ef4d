"""Small, byte-faithful excerpts of the shared data sets for examples/data (tests and demos).

A clean clone has no ``../shared``, so the tests run on excerpts committed to the repository.
Each excerpt keeps the original *format* exactly: the selected lines are copied byte for byte
(headers, quoting, CRLF, '#' comments included) and recompressed the way the originals are
stored (KETI: xz per file; appliances: gzip -9 without name or time stamp; the others plain).
Output is deterministic, so regenerating gives identical files and a clean ``git diff``.

KETI excerpt: rooms 419 (temperature 579.27 sensor errors, PIR activity), 621 and 621A (PIR
activity; a room name with a letter), 668 (stuck light sensor), 723 (humidity −500.96, light
30,551 and temperature 265.73 at 16:12:54 UTC) and 752 (the most PIR activity), all five
sensors each, 2013-08-30 10:00-17:00 UTC (03:00-10:00 PDT: end of the night into Friday
morning). A MANIFEST.tsv in the original's format describes the excerpt files.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import lzma
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from adapters.datasets.common import DatasetError, open_binary
from adapters.datasets.keti import SENSORS, sensor_file

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "examples" / "data"

KETI_ROOMS = ("419", "621", "621A", "668", "723", "752")
KETI_START = 1377856800  # 2013-08-30 10:00:00 UTC
KETI_END = 1377882000  # 2013-08-30 17:00:00 UTC (exclusive)
OCCUPANCY_ROWS = {"datatest.txt": 60, "datatraining.txt": 90, "datatest2.txt": 60}
APPLIANCES_FILE = "energydata_complete.csv.gz"
APPLIANCES_ROWS = 144  # one day of 10-min rows
SML_FILE1, SML_FILE1_HEAD = "NEW-DATA-1.T15.txt", 60  # crosses midnight 13/03 -> 14/03
SML_FILE2, SML_FILE2_TAIL = "NEW-DATA-2.T15.txt", 36  # includes the missing 03:00 and 04:45
FOLDERS = ("keti", "uci-occupancy", "uci-appliances-energy", "uci-sml2010")


def default_source() -> Path:
    """``$ENS_SHARED_DATA``, else ``shared/data`` beside the repository checkout."""
    env = os.environ.get("ENS_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def _xz(data: bytes) -> bytes:
    """xz -9 settings with a 1 MiB window: same output size for these small files, but a
    fraction of -9's 674 MiB encoder memory, and readers need only 1 MiB each."""
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 20}]
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=filters)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    with open_binary(path) as f:
        return f.read()


def _epoch(line: bytes) -> int:
    return int(line.split(b",", 1)[0])


def _utc(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def keti_excerpt(src: Path, dst: Path) -> list[Path]:
    """Rows of KETI_ROOMS in [KETI_START, KETI_END), as <dst>/<room>/<sensor>.csv.xz."""
    manifest = [
        "file\traw_bytes\traw_sha256\tgit_blob_sha1\trows\tfirst_utc\tlast_utc\txz_bytes\txz_sha256"
    ]
    written = []
    for room in KETI_ROOMS:
        for sensor in SENSORS:
            f = sensor_file(src / room, sensor)
            if f is None:
                raise DatasetError(f"{src / room}: no {sensor} file")
            all_lines = _read(f).splitlines(keepends=True)  # sorted by time (README)
            lo = bisect.bisect_left(all_lines, KETI_START, key=_epoch)
            hi = bisect.bisect_left(all_lines, KETI_END, key=_epoch)
            lines = all_lines[lo:hi]
            raw = b"".join(lines)
            packed = _xz(raw)
            out = dst / room / f"{sensor}.csv.xz"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(packed)
            written.append(out)
            blob = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
            first = int(lines[0].split(b",")[0]) if lines else 0
            last = int(lines[-1].split(b",")[0]) if lines else 0
            manifest.append(
                "\t".join(
                    [
                        f"{room}/{sensor}.csv",
                        str(len(raw)),
                        hashlib.sha256(raw).hexdigest(),
                        blob,
                        str(len(lines)),
                        _utc(first),
                        _utc(last),
                        str(len(packed)),
                        hashlib.sha256(packed).hexdigest(),
                    ]
                )
            )
    (dst / "MANIFEST.tsv").write_text("\n".join(manifest) + "\n", encoding="utf-8")
    written.append(dst / "MANIFEST.tsv")
    return written


def _head(data: bytes, rows: int) -> bytes:
    """Header line plus the first `rows` data lines, line endings untouched."""
    return b"".join(data.splitlines(keepends=True)[: rows + 1])


def _header_and_tail(data: bytes, rows: int) -> bytes:
    lines = data.splitlines(keepends=True)
    return b"".join(lines[:1] + lines[-rows:])


def uci_excerpts(src: Path, dst: Path) -> list[Path]:
    """Heads/tails of the three UCI data sets, in their original formats and file names."""
    written = []
    for name, rows in OCCUPANCY_ROWS.items():
        out = dst / "uci-occupancy" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(_head(_read(src / "uci-occupancy" / name), rows))
        written.append(out)
    out = dst / "uci-appliances-energy" / APPLIANCES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        _gz(_head(_read(src / "uci-appliances-energy" / APPLIANCES_FILE), APPLIANCES_ROWS))
    )
    written.append(out)
    sml = dst / "uci-sml2010"
    sml.mkdir(parents=True, exist_ok=True)
    (sml / SML_FILE1).write_bytes(_head(_read(src / "uci-sml2010" / SML_FILE1), SML_FILE1_HEAD))
    (sml / SML_FILE2).write_bytes(
        _header_and_tail(_read(src / "uci-sml2010" / SML_FILE2), SML_FILE2_TAIL)
    )
    written += [sml / SML_FILE1, sml / SML_FILE2]
    return written


def make_excerpts(src: Path | None = None, dst: Path | None = None) -> list[Path]:
    """Regenerate all excerpts from `src` (the shared data folder) into `dst`.

    The four data-set folders under `dst` are replaced, so stale files do not linger.
    """
    src = Path(src) if src is not None else default_source()
    dst = Path(dst) if dst is not None else DEFAULT_OUT
    if not (src / "keti").is_dir():
        raise DatasetError(f"{src}: not the shared data folder (no keti/ inside)")
    needed = [src / "uci-occupancy" / n for n in OCCUPANCY_ROWS]
    needed += [src / "uci-appliances-energy" / APPLIANCES_FILE]
    needed += [src / "uci-sml2010" / SML_FILE1, src / "uci-sml2010" / SML_FILE2]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise DatasetError(f"missing source file(s): {', '.join(missing)}")
    for folder in FOLDERS:
        if (dst / folder).is_dir():
            shutil.rmtree(dst / folder)
    written = keti_excerpt(src / "keti", dst / "keti")
    written += uci_excerpts(src, dst)
    return written
