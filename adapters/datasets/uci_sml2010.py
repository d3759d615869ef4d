"""UCI SML2010 (Zamora-Martínez et al. 2014): a domotic house near Valencia, 15-min means, 2012.

Files as stored: ``NEW-DATA-1.T15.txt`` and ``NEW-DATA-2.T15.txt`` (plain text, LF). Quirks
handled here:

* the header is a **comment**: ``#  1:Date 2:Time 3:Temperature_Comedor_Sensor ...``; the
  ``N:Name`` tokens give the column names (a header without the ``#`` is accepted too);
* fields are separated by single spaces; the date is **dd/mm/yyyy** and the time ``HH:MM``;
* a time stamp marks the **end** of its 15-min averaging interval (``00:00`` rows still carry
  the previous day's ``Day_Of_Week``); ``ts`` is that stamp, unchanged;
* ``tz`` defaults to UTC, which is what UCI states for this data set (per the README, from
  memory). File 2 lacks the rows 2012-05-02 03:00 and 04:45; gaps are left as they are.

A directory reads every ``*.txt`` file in it, merged by time.

Events per row (building ``sml2010``), in this order (column -> room/channel, kind, unit):

* Temperature_Comedor_Sensor -> dining/temperature, temperature, °C (comedor = dining room)
* Temperature_Habitacion_Sensor -> room/temperature, temperature, °C (habitación = room)
* Weather_Temperature -> forecast/temperature, temperature, °C (weather forecast)
* CO2_Comedor_Sensor, CO2_Habitacion_Sensor -> dining|room/co2, co2, ppm
* Humedad_Comedor_Sensor, Humedad_Habitacion_Sensor -> dining|room/humidity, humidity, %
* Lighting_Comedor_Sensor, Lighting_Habitacion_Sensor -> dining|room/light, light, lux
* Precipitacion -> outside/rain, rain, no unit (share of the 15 min with rain, 0-1)
* Meteo_Exterior_Crepusculo -> outside/twilight, light, lux (dusk sensor)
* Meteo_Exterior_Viento -> outside/wind, wind, m/s
* Meteo_Exterior_Sol_Oest, _Est, _Sud -> outside/sun_west, sun_east, sun_south, light, lux
* Meteo_Exterior_Piranometro -> outside/irradiance, irradiance, W/m²
* Temperature_Exterior_Sensor -> outside/temperature, temperature, °C
* Humedad_Exterior_Sensor -> outside/humidity, humidity, %

Not emitted: ``Exterior_Entalpic_1/_2/_turbo`` (0 in every row) and ``Day_Of_Week`` (derived).
Id ``uci-sml2010:dining:co2:20120313T114500``, sensor ``uci-sml2010-dining-co2``. Suspect
rules: see :mod:`adapters.datasets.common`; ``outside``/``forecast`` use the outdoor ranges.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, tzinfo
from pathlib import Path

from adapters.datasets.common import (
    Channel,
    DatasetError,
    Event,
    WideFormat,
    WideTable,
    open_text,
    read_wide,
)

NAME = "uci-sml2010"
DESCRIPTION = (
    "UCI SML2010: a domotic house (Valencia, ES), dining room, room, outdoor and weather "
    "sensors as 15-min means, Mar-May 2012 (4,137 rows)"
)
BUILDING = "sml2010"
SUFFIXES = (".txt", ".txt.gz", ".txt.xz")
CHANNELS = [
    Channel("Temperature_Comedor_Sensor", "dining", "temperature", "temperature", "°C"),
    Channel("Temperature_Habitacion_Sensor", "room", "temperature", "temperature", "°C"),
    Channel("Weather_Temperature", "forecast", "temperature", "temperature", "°C"),
    Channel("CO2_Comedor_Sensor", "dining", "co2", "co2", "ppm"),
    Channel("CO2_Habitacion_Sensor", "room", "co2", "co2", "ppm"),
    Channel("Humedad_Comedor_Sensor", "dining", "humidity", "humidity", "%"),
    Channel("Humedad_Habitacion_Sensor", "room", "humidity", "humidity", "%"),
    Channel("Lighting_Comedor_Sensor", "dining", "light", "light", "lux"),
    Channel("Lighting_Habitacion_Sensor", "room", "light", "light", "lux"),
    Channel("Precipitacion", "outside", "rain", "rain", None),
    Channel("Meteo_Exterior_Crepusculo", "outside", "twilight", "light", "lux"),
    Channel("Meteo_Exterior_Viento", "outside", "wind", "wind", "m/s"),
    Channel("Meteo_Exterior_Sol_Oest", "outside", "sun_west", "light", "lux"),
    Channel("Meteo_Exterior_Sol_Est", "outside", "sun_east", "light", "lux"),
    Channel("Meteo_Exterior_Sol_Sud", "outside", "sun_south", "light", "lux"),
    Channel("Meteo_Exterior_Piranometro", "outside", "irradiance", "irradiance", "W/m²"),
    Channel("Temperature_Exterior_Sensor", "outside", "temperature", "temperature", "°C"),
    Channel("Humedad_Exterior_Sensor", "outside", "humidity", "humidity", "%"),
]
ROOMS = tuple(dict.fromkeys(c.room for c in CHANNELS))
KINDS = tuple(dict.fromkeys(c.kind for c in CHANNELS))


def parse_header(line: str) -> list[str]:
    """Column names from ``#  1:Date 2:Time ...`` (numbered tokens, checked to run 1, 2, ...)."""
    tokens = line.lstrip("#").split()
    names = []
    for n, token in enumerate(tokens, 1):
        num, sep, name = token.partition(":")
        if not sep or num != str(n) or not name:
            raise ValueError(f"header token {token!r} is not '{n}:<name>'")
        names.append(name)
    return names


def parse_datetime(date: str, time: str) -> datetime:
    """``13/03/2012`` + ``11:45`` (dd/mm/yyyy, HH:MM) -> naive datetime."""
    day, month, year = date.split("/")
    hour, minute = time.split(":")
    return datetime(int(year), int(month), int(day), int(hour), int(minute))


def _read_file(path: Path, table: WideTable, tz: tzinfo) -> Iterator[Event]:
    with open_text(path) as f:
        try:
            names = parse_header(f.readline())
        except ValueError as e:
            raise DatasetError(f"{path}:1: not an SML2010 header: {e}") from None
        if "Date" not in names or "Time" not in names:
            raise DatasetError(f"{path}:1: not an SML2010 header (no Date/Time column)")
        rows = ((n, _fields(line)) for n, line in enumerate(f, 2))
        yield from read_wide(path, table, tz, names, rows, ("Date", "Time"), parse_datetime)


def _fields(line: str) -> list[str]:
    """A line's whitespace-separated fields; none for a comment."""
    fields = line.split()
    return [] if fields and fields[0].startswith("#") else fields


FORMAT = WideFormat(NAME, BUILDING, "SML2010", SUFFIXES, CHANNELS, _read_file)
iter_events = FORMAT.iter_events
estimate_events = FORMAT.estimate_events
