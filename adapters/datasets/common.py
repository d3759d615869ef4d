"""Helpers shared by the data-set adapters: file discovery, decompression, time zones, events.

Plausibility ("suspect") rules
------------------------------
Real sensor files contain sensor-error values (KETI temperature 579.27 °C, humidity −500.96 %,
light spikes of 30,551, a PIR count of 34,456). The adapters never drop or change such a reading:
dropping would hide a failing sensor from the very service that should report it. Instead a
reading outside the physically plausible range of its kind gets the extra attribute
``suspect: true``; plausible readings carry no ``suspect`` key at all (absent = not suspect),
which keeps the 30 million KETI events small. Ranges are inclusive:

=================  ==================  ===================  ====================================
kind               indoor              outdoor              why
=================  ==================  ===================  ====================================
temperature        −30 … 60 °C         −60 … 60 °C          rooms are heated/cooled; no weather
                                                            on record beyond these
humidity           0 … 100 %           0 … 100 %            relative humidity is a percentage
light              0 … 20,000 lux      0 … 150,000 lux      indoor lamps + window light stay far
                                                            below 20 klx; full sun ≈ 120 klx
co2                0 … 10,000 ppm      0 … 10,000 ppm       negative is impossible; 10,000 ppm is
                                                            the top of NDIR sensor ranges
presence           0 … 100             –                    KETI PIR counts are 0–30 per sample
occupancy          0 … 1               –                    ground truth is a 0/1 flag
energy             ≥ 0 Wh              –                    metered energy cannot be negative
humidity_ratio     0 … 0.05 kg/kg      –                    saturated air at 40 °C is ≈ 0.049
pressure           –                   600 … 820 mmHg       sea-level records ≈ 650 … 815 mmHg
wind               –                   0 … 75 m/s           above any recorded gust in Europe
visibility         –                   ≥ 0 km
dewpoint           –                   −60 … 40 °C
rain               –                   0 … 1                share of the interval with rain
irradiance         –                   −50 … 1,500 W/m²     pyranometers read slightly below 0
                                                            at night; the solar constant is 1,361
=================  ==================  ===================  ====================================

Rooms named ``outside``, ``weather`` or ``forecast`` use the outdoor column. A stuck sensor
(KETI 668 light, always ≈2,000 lux even at night) is *not* flagged: each of its readings is
plausible on its own, and spotting it needs history, which is the filters' job, not an adapter's.
"""

from __future__ import annotations

import gzip
import heapq
import lzma
import math
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from itertools import islice
from pathlib import Path
from typing import IO, Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from adapters.errors import DatasetError as DatasetError  # its old import path

Event = dict[str, str | int | float | bool]

INF = math.inf
OUTDOOR_ROOMS = frozenset({"outside", "weather", "forecast"})

#: kind -> (low, high) plausible range indoors (inclusive).
INDOOR_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (-30.0, 60.0),
    "humidity": (0.0, 100.0),
    "light": (0.0, 20000.0),
    "co2": (0.0, 10000.0),
    "presence": (0.0, 100.0),
    "occupancy": (0.0, 1.0),
    "energy": (0.0, INF),
    "humidity_ratio": (0.0, 0.05),
}
#: kind -> (low, high) plausible range outdoors (inclusive); falls back to INDOOR_RANGES.
OUTDOOR_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (-60.0, 60.0),
    "light": (0.0, 150000.0),
    "pressure": (600.0, 820.0),
    "wind": (0.0, 75.0),
    "visibility": (0.0, INF),
    "dewpoint": (-60.0, 40.0),
    "rain": (0.0, 1.0),
    "irradiance": (-50.0, 1500.0),
}


def plausible_range(kind: str, room: str) -> tuple[float, float]:
    """Inclusive plausible range of a reading of `kind` in `room` (unknown kinds: anything)."""
    if room in OUTDOOR_ROOMS and kind in OUTDOOR_RANGES:
        return OUTDOOR_RANGES[kind]
    return INDOOR_RANGES.get(kind, OUTDOOR_RANGES.get(kind, (-INF, INF)))


def is_suspect(kind: str, room: str, value: float) -> bool:
    """True when `value` is physically implausible for `kind` (see the module docstring)."""
    lo, hi = plausible_range(kind, room)
    return not lo <= value <= hi


def open_text(path: Path) -> IO[str]:
    """Open a data file as stored: `.xz` and `.gz` are decompressed on the fly, never unpacked.

    `newline=""` keeps CR/LF handling to the csv module (the appliances file is CRLF).
    """
    name = path.name
    if name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8", newline="")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def open_binary(path: Path) -> IO[bytes]:
    """Binary counterpart of :func:`open_text` (the KETI hot path parses bytes)."""
    name = path.name
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is a binary IO
    return path.open("rb")


def resolve_files(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """`path` itself if it is a file, else the files in the directory ending in one of `suffixes`."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise DatasetError(f"{path}: not a file or directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(suffixes))
    if not files:
        raise DatasetError(f"{path}: no {what} files ({', '.join('*' + s for s in suffixes)})")
    return files


_OFFSET = re.compile(r"^(?:UTC|GMT)?([+-])(\d{1,2})(?::?(\d{2}))?$")


def resolve_tz(tz: str | tzinfo) -> tzinfo:
    """`UTC`, a fixed offset (`+01:00`, `UTC-7`) or an IANA zone name (`Europe/Brussels`)."""
    if isinstance(tz, tzinfo):
        return tz
    text = tz.strip()
    if text.upper() in {"UTC", "Z", "GMT"}:
        return UTC
    m = _OFFSET.match(text.upper())
    if m:
        sign = -1 if m.group(1) == "-" else 1
        delta = timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
        if delta >= timedelta(hours=24):
            raise DatasetError(f"time zone offset {tz!r} is out of range")
        return timezone(sign * delta)
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise DatasetError(
            f"unknown time zone {tz!r} (use UTC, an offset like +01:00, or e.g. Europe/Brussels)"
        ) from None


def stamp(dt: datetime) -> str:
    """Wall-clock stamp for event ids; independent of the `tz` chosen, so ids stay stable."""
    return dt.strftime("%Y%m%dT%H%M%S")


def normalise_filter(values: Iterable[str] | None) -> set[str] | None:
    """A room/kind filter as a set; comma-separated items are split (`--rooms 413,419`)."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out = {part.strip() for v in values for part in str(v).split(",") if part.strip()}
    return out or None


def check_filter(given: set[str] | None, known: Iterable[str], what: str, where: str) -> None:
    """Reject filter values that match nothing, so a typo is an error, not an empty stream."""
    if given is None:
        return
    known = sorted(set(known))
    unknown = sorted(given - set(known))
    if unknown:
        raise DatasetError(
            f"unknown {what} {', '.join(unknown)} in {where} (known: {', '.join(known)})"
        )


class Channel(NamedTuple):
    """One column of a wide UCI table mapped to ENS event attributes."""

    column: str  # header name in the file
    room: str
    channel: str  # short name, unique within the room; used in sensor and event ids
    kind: str
    unit: str | None
    integer: bool = False  # emit int values (counts, 0/1 flags, whole Wh)


def parse_number(text: str, integer: bool) -> int | float | None:
    """A numeric field; leading spaces are fine (`"  60"`). Missing/NaN values give None."""
    text = text.strip()
    if not text or text.upper() in {"NA", "NAN", "?"}:
        return None
    value = float(text)
    if not math.isfinite(value):
        return None
    if integer and value.is_integer():
        return int(value)
    return value


class WideTable:
    """Turns rows of a wide table (one row = one time, one column per sensor) into events.

    Events of one row share `ts` and come out in the order of `channels`.
    """

    def __init__(self, dataset: str, building: str, channels: list[Channel]) -> None:
        self.channels = channels
        self.templates: list[Event] = []
        self.prefixes: list[str] = []
        self.ranges: list[tuple[float, float]] = []
        for ch in channels:
            tmpl: Event = {
                "id": "",
                "ts": 0.0,
                "building": building,
                "room": ch.room,
                "sensor": f"{dataset}-{ch.room}-{ch.channel}",
                "kind": ch.kind,
                "value": 0,
            }
            if ch.unit:
                tmpl["unit"] = ch.unit
            self.templates.append(tmpl)
            self.prefixes.append(f"{dataset}:{ch.room}:{ch.channel}:")
            self.ranges.append(plausible_range(ch.kind, ch.room))

    def events(self, ts: float, wall: str, values: list[str]) -> Iterator[Event]:
        """Events of one row; `values[i]` is the raw field of `channels[i]`."""
        for i, ch in enumerate(self.channels):
            value = parse_number(values[i], ch.integer)
            if value is None:
                continue
            ev = self.templates[i].copy()
            ev["id"] = self.prefixes[i] + wall
            ev["ts"] = ts
            ev["value"] = value
            lo, hi = self.ranges[i]
            if not lo <= value <= hi:
                ev["suspect"] = True
            yield ev


def select_channels(
    channels: list[Channel],
    rooms: Iterable[str] | None,
    kinds: Iterable[str] | None,
    where: str,
) -> list[Channel]:
    """Channels matching the room/kind filters (unknown filter values raise DatasetError)."""
    room_set = normalise_filter(rooms)
    kind_set = normalise_filter(kinds)
    check_filter(room_set, (c.room for c in channels), "room(s)", where)
    check_filter(kind_set, (c.kind for c in channels), "kind(s)", where)
    return [
        c
        for c in channels
        if (room_set is None or c.room in room_set) and (kind_set is None or c.kind in kind_set)
    ]


def local_ts(dt: datetime, tz: tzinfo) -> float:
    """Epoch seconds of a naive local time in `tz` (nonexistent DST times use the earlier offset)."""
    return dt.replace(tzinfo=tz).timestamp()


def read_wide(
    path: Path,
    table: WideTable,
    tz: tzinfo,
    header: list[str],
    rows: Iterable[tuple[int, list[str]]],
    time_columns: tuple[str, ...],
    parse_time: Callable[..., datetime],
    row_id: bool = False,
) -> Iterator[Event]:
    """The one loop of the wide (UCI) loaders: the header must name every channel's column;
    each row (line number, fields; empty: skipped) must have its width (``row_id``: or one
    more, a leading row id), its time read from ``time_columns`` by ``parse_time``. A problem
    is a `DatasetError` naming FILE:LINE."""
    missing = [c.column for c in table.channels if c.column not in header]
    if missing:
        raise DatasetError(f"{path}: header lacks column(s) {', '.join(missing)}")
    width = len(header)
    times = [header.index(c) for c in time_columns]
    cols = [header.index(c.column) for c in table.channels]
    for lineno, row in rows:
        if not row:
            continue
        if row_id and len(row) == width + 1:  # the header names one column fewer
            row = row[1:]
        elif len(row) != width:
            expected = f"{width} or {width + 1}" if row_id else str(width)
            raise DatasetError(f"{path}:{lineno}: {len(row)} fields, expected {expected}")
        try:
            dt = parse_time(*(row[i] for i in times))
            yield from table.events(local_ts(dt, tz), stamp(dt), [row[i] for i in cols])
        except ValueError as e:
            raise DatasetError(f"{path}:{lineno}: {e}") from None


def csv_rows(reader: Any) -> Iterator[tuple[int, list[str]]]:
    """A `csv.reader`'s rows with the line each ends on (``reader.line_num``)."""
    for row in reader:
        yield reader.line_num, row


def iso_time(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


def count_lines(path: Path) -> int:
    """Line count of a (possibly compressed) file; used for progress-bar totals."""
    with open_binary(path) as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


class WideFormat(NamedTuple):
    """A data set stored as wide tables (one row per time, one column per channel): the UCI files."""

    name: str
    building: str
    label: str  # in error messages: "UCI occupancy", ...
    suffixes: tuple[str, ...]
    channels: list[Channel]
    read_file: Callable[[Path, WideTable, tzinfo], Iterator[Event]]

    def iter_events(
        self,
        path: Path | str,
        *,
        rooms: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        tz: str | tzinfo = "UTC",
    ) -> Iterator[Event]:
        """Events of one file, or of every file in a directory merged by time."""
        files = resolve_files(Path(path), self.suffixes, self.label)
        table = WideTable(
            self.name, self.building, select_channels(self.channels, rooms, kinds, str(path))
        )
        zone = resolve_tz(tz)
        events = heapq.merge(
            *(self.read_file(f, table, zone) for f in files), key=lambda e: e["ts"]
        )
        return events if limit is None else islice(events, limit)

    def estimate_events(
        self,
        path: Path | str,
        *,
        rooms: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> int:
        """Rows × selected columns (for progress bars)."""
        files = resolve_files(Path(path), self.suffixes, self.label)
        channels = select_channels(self.channels, rooms, kinds, str(path))
        return sum(max(count_lines(f) - 1, 0) for f in files) * len(channels)
