"""KETI / "Smart Building System": 51 rooms of Sutardja Dai Hall (SDH), UC Berkeley, Aug 2013.

Layout as stored: ``<root>/<room>/<sensor>.csv.xz`` with sensor in co2, humidity, light, pir,
temperature; each file is ``<epoch>, <value>`` lines (UTC epoch seconds, 2 decimals, no header),
strictly increasing in time. ``.csv.gz`` and plain ``.csv`` are read too.

Events: ``{"id": "keti:413:co2:1377299107", "ts": 1377299107.0, "building": "SDH",
"room": "413", "sensor": "keti-413-co2", "kind": "co2", "value": 488.0, "unit": "ppm"}``.
The ``pir`` file gives kind ``presence`` with an int value (the PIR count, no unit).

Order: the merged stream is sorted by (ts, room, sensor), room and sensor in name order. Each
file is read lazily in 32 KiB chunks and the per-file streams are combined with
:func:`heapq.merge`, so nothing is loaded whole. Per-row work is kept off the Python level
where possible: a chunk is split with one ``bytes.split`` and converted with ``map(int/float)``;
pandas is avoided (its per-call overhead is far above a 3,000-line chunk's parse time).

Memory: the files were written with ``xz -9``, whose header asks for a 64 MiB window. liblzma
fills that window as it decodes, so each open stream holds about its decompressed size
(≈2.5 MB for a full 5-s sensor file); merging all 255 files peaks at about 0.65 GB RSS, i.e.
≈13 MB per room. Select rooms to stay below that.

Suspect readings (see :mod:`adapters.datasets.common`): temperature outside −30…60 °C (579.27
in rooms 419, 446, 562, 746; 572.59 in 513; 265.73 in 723; −40.1 in 656A), humidity outside
0…100 % (−4 in 656A, −500.96 in 723), light above 20,000 (621E, 717, 723, 724), PIR above 100
(34,456 in 415), CO2 below 0 or above 10,000 ppm.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from itertools import chain, islice, repeat
from pathlib import Path

from adapters.datasets.common import (
    DatasetError,
    Event,
    check_filter,
    normalise_filter,
    open_binary,
    plausible_range,
)

NAME = "keti"
DESCRIPTION = (
    "KETI / Smart Building System: 51 rooms of Sutardja Dai Hall (UC Berkeley), co2, humidity, "
    "light, PIR and temperature every 5-10 s, 23 Aug - 1 Sep 2013 (29.9 M readings)"
)
BUILDING = "SDH"
SENSORS = ("co2", "humidity", "light", "pir", "temperature")
KIND = {
    "co2": "co2",
    "humidity": "humidity",
    "light": "light",
    "pir": "presence",
    "temperature": "temperature",
}
UNIT = {"co2": "ppm", "humidity": "%", "light": "lux", "pir": None, "temperature": "°C"}
KINDS = tuple(sorted(KIND.values()))
SUFFIXES = (".csv.xz", ".csv.gz", ".csv")
CHUNK = 1 << 15


def sensor_file(room_dir: Path, sensor: str) -> Path | None:
    """The stored file of one sensor of one room, whatever its compression."""
    for suffix in SUFFIXES:
        p = room_dir / f"{sensor}{suffix}"
        if p.is_file():
            return p
    return None


def _is_room(d: Path) -> bool:
    return d.is_dir() and any(sensor_file(d, s) for s in SENSORS)


def list_rooms(path: Path) -> dict[str, Path]:
    """Room name -> room directory. `path` is the data-set root or a single room directory."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise DatasetError(f"{path}: not a directory (KETI wants the folder of room folders)")
    if _is_room(path):
        return {path.name: path}
    rooms = {d.name: d for d in sorted(path.iterdir()) if _is_room(d)}
    if not rooms:
        raise DatasetError(f"{path}: no KETI room folders (<room>/<sensor>.csv.xz) found")
    return rooms


def _sensor_filter(kinds: Iterable[str] | None, where: str) -> set[str] | None:
    """Kinds (`presence`) or file names (`pir`) -> sensor file names."""
    given = normalise_filter(kinds)
    if given is None:
        return None
    check_filter(given, set(KIND) | set(KIND.values()), "kind(s)", where)
    return {s for s, k in KIND.items() if s in given or k in given}


def select_files(
    path: Path, rooms: Iterable[str] | None = None, kinds: Iterable[str] | None = None
) -> list[tuple[str, str, Path]]:
    """(room, sensor, file) in stream tie order: room name, then sensor name."""
    all_rooms = list_rooms(path)
    room_set = normalise_filter(rooms)
    check_filter(room_set, all_rooms, "room(s)", str(path))
    sensors = _sensor_filter(kinds, str(path))
    out = []
    for room in sorted(all_rooms):
        if room_set is not None and room not in room_set:
            continue
        for sensor in SENSORS:
            if sensors is not None and sensor not in sensors:
                continue
            f = sensor_file(all_rooms[room], sensor)
            if f is not None:
                out.append((room, sensor, f))
    return out


def _chunks(path: Path, index: int, integer: bool) -> Iterator[list[tuple[int, int, float]]]:
    """Rows ``(epoch, index, value)`` of one file, a list per chunk, checked to be time-sorted.

    `index` is the file's position in tie order, so plain tuple comparison in the merge gives
    (ts, room, sensor) order and never compares values.
    """
    last = -1
    with open_binary(path) as f:
        rest = b""
        while True:
            data = f.read(CHUNK)
            if data:
                data = rest + data
                cut = data.rfind(b"\n") + 1
                block, rest = data[:cut], data[cut:]
            else:
                block, rest = rest, b""
            if not block.strip():
                if data:
                    continue
                return
            parts = block.replace(b",", b" ").split()
            try:
                if len(parts) % 2:
                    raise ValueError("odd number of fields")
                times = list(map(int, parts[0::2]))
                values = map(float, parts[1::2])
                if integer:
                    values = map(int, values)
                rows = list(zip(times, repeat(index), values))
            except ValueError:
                raise DatasetError(
                    f"{path}: not '<epoch>, <value>' lines near {block[:40]!r}"
                ) from None
            if times[0] <= last or times != sorted(times):
                raise DatasetError(f"{path}: timestamps not increasing near {times[0]}")
            last = times[-1]
            yield rows


def iter_events(
    path: Path | str,
    *,
    rooms: Iterable[str] | None = None,
    kinds: Iterable[str] | None = None,
    limit: int | None = None,
) -> Iterator[Event]:
    """Events of the KETI files under `path`, merged in (ts, room, sensor) order.

    Paths and filters are checked before this returns (DatasetError), reading starts lazily.
    """
    files = select_files(Path(path), rooms, kinds)
    events = _merged(files)
    return events if limit is None else islice(events, limit)


def _merged(files: list[tuple[str, str, Path]]) -> Iterator[Event]:
    templates: list[Event] = []
    prefixes: list[str] = []
    ranges: list[tuple[float, float]] = []
    streams = []
    for i, (room, sensor, f) in enumerate(files):
        kind = KIND[sensor]
        tmpl: Event = {
            "id": "",
            "ts": 0.0,
            "building": BUILDING,
            "room": room,
            "sensor": f"keti-{room}-{sensor}",
            "kind": kind,
            "value": 0,
        }
        unit = UNIT[sensor]
        if unit:
            tmpl["unit"] = unit
        templates.append(tmpl)
        prefixes.append(f"keti:{room}:{sensor}:")
        ranges.append(plausible_range(kind, room))
        streams.append(chain.from_iterable(_chunks(f, i, sensor == "pir")))
    for t, i, value in heapq.merge(*streams):
        ev = templates[i].copy()
        ev["id"] = prefixes[i] + str(t)
        ev["ts"] = float(t)
        ev["value"] = value
        lo, hi = ranges[i]
        if not lo <= value <= hi:
            ev["suspect"] = True
        yield ev


def read_manifest(root: Path) -> dict[str, int] | None:
    """``<room>/<sensor>.csv`` -> row count from the data set's MANIFEST.tsv, if present."""
    manifest = Path(root) / "MANIFEST.tsv"
    if not manifest.is_file():
        return None
    lines = manifest.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    fi, ri = header.index("file"), header.index("rows")
    return {cols[fi]: int(cols[ri]) for cols in (ln.split("\t") for ln in lines[1:] if ln)}


def estimate_events(
    path: Path | str,
    *,
    rooms: Iterable[str] | None = None,
    kinds: Iterable[str] | None = None,
) -> int | None:
    """Number of events from MANIFEST.tsv (for progress bars); None when there is none."""
    path = Path(path)
    files = select_files(path, rooms, kinds)
    manifest = read_manifest(path) or read_manifest(path.parent)
    if manifest is None:
        return None
    try:
        return sum(manifest[f"{room}/{sensor}.csv"] for room, sensor, _ in files)
    except KeyError:
        return None
