"""UCI Occupancy Detection (Candanedo & Feldheim 2016): one office room, one row a minute, Feb 2015.

Files as stored: ``datatest.txt``, ``datatraining.txt``, ``datatest2.txt`` (plain CSV, LF).
Quirks handled here:

* the header has **7** quoted names but rows have **8** fields: the first field is an R row id
  (``"1"``, or from ``"140"`` in datatest.txt). It is dropped; a row of 7 fields is read too;
* ``date`` is quoted in two files and unquoted in ``datatest2.txt``; the csv module reads both;
* times are local wall-clock times without a zone (the README states none; the office is in
  Mons, Belgium). ``tz`` defaults to UTC; pass ``tz="Europe/Brussels"`` (CET in February) for
  real instants. Event ids use the wall-clock stamp, so they do not depend on ``tz``.

A path that is a directory reads every ``*.txt`` file in it and merges them by time (datatest
is the earliest period, then datatraining, then datatest2; they do not overlap).

Events per row (building ``uci-office``, room ``office``), in this order:

===============  ==============  =======  ==================================================
column           kind            unit     value
===============  ==============  =======  ==================================================
Temperature      temperature     °C       float
Humidity         humidity        %        float (relative humidity)
Light            light           lux      float
CO2              co2             ppm      float
HumidityRatio    humidity_ratio  kg/kg    float (derived from temperature and humidity)
Occupancy        occupancy       –        int 0/1 (ground truth from photos)
===============  ==============  =======  ==================================================

Id ``uci-occupancy:office:co2:20150204T175100``, sensor ``uci-occupancy-office-co2``. Suspect
rules: see :mod:`adapters.datasets.common` (no reading in the published files is suspect).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import tzinfo
from pathlib import Path

from adapters.datasets.common import (
    Channel,
    DatasetError,
    Event,
    WideFormat,
    WideTable,
    csv_rows,
    iso_time,
    open_text,
    read_wide,
)

NAME = "uci-occupancy"
DESCRIPTION = (
    "UCI Occupancy Detection: one office (Mons, BE), temperature, humidity, light, CO2, "
    "humidity ratio and 0/1 occupancy every minute, 2-18 Feb 2015 (20,560 rows)"
)
BUILDING = "uci-office"
ROOM = "office"
SUFFIXES = (".txt", ".txt.gz", ".txt.xz", ".csv", ".csv.gz", ".csv.xz")
CHANNELS = [
    Channel("Temperature", ROOM, "temperature", "temperature", "°C"),
    Channel("Humidity", ROOM, "humidity", "humidity", "%"),
    Channel("Light", ROOM, "light", "light", "lux"),
    Channel("CO2", ROOM, "co2", "co2", "ppm"),
    Channel("HumidityRatio", ROOM, "humidity_ratio", "humidity_ratio", "kg/kg"),
    Channel("Occupancy", ROOM, "occupancy", "occupancy", None, integer=True),
]
ROOMS = (ROOM,)
KINDS = tuple(c.kind for c in CHANNELS)


def _read_file(path: Path, table: WideTable, tz: tzinfo) -> Iterator[Event]:
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or "date" not in header:
            raise DatasetError(f"{path}: not a UCI occupancy file (no 'date' column in header)")
        yield from read_wide(
            path, table, tz, header, csv_rows(reader), ("date",), iso_time, row_id=True
        )


FORMAT = WideFormat(NAME, BUILDING, "UCI occupancy", SUFFIXES, CHANNELS, _read_file)
iter_events = FORMAT.iter_events
estimate_events = FORMAT.estimate_events
