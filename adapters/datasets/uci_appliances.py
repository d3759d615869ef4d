"""UCI Appliances energy prediction (Candanedo et al. 2017): a low-energy house, 10-min rows, 2016.

File as stored: ``energydata_complete.csv.gz`` (gzip of the original CSV; plain ``.csv`` works
too). Quirks handled here:

* **CRLF** line endings: the file is opened with ``newline=""`` and parsed by the csv module;
* **every field is double-quoted**, numbers included, with leading spaces and mixed notation
  (``"  60"``, ``" 6.5999999999999996e+00"``): fields are stripped before ``float``;
* times are local wall-clock times without a zone (the README: "presumably local time in
  Belgium"). ``tz`` defaults to UTC. Note the file has rows at 02:00-02:50 on 2016-03-27, which
  do not exist in Europe/Brussels (DST gap); with ``tz="Europe/Brussels"`` they map onto the
  same instants as 03:00-03:50, so ``ts`` then repeats. A fixed offset (``tz="+01:00"``) avoids
  that. Event ids use the wall-clock stamp, so they stay unique and independent of ``tz``.

Events per row (building ``uci-house``), in this order:

=============  =========  ===========  ===========  ======  =====================================
column         room       channel      kind         unit    note
=============  =========  ===========  ===========  ======  =====================================
Appliances     house      appliances   energy       Wh      per 10 min, int
lights         house      lights       energy       Wh      per 10 min, int
T1 / RH_1      kitchen    t1 / rh_1    temperature  °C / %  / humidity
T2 / RH_2      living     t2 / rh_2    ...
T3 / RH_3      laundry    t3 / rh_3
T4 / RH_4      office     t4 / rh_4
T5 / RH_5      bathroom   t5 / rh_5
T6 / RH_6      outside    t6 / rh_6                         north side of the house
T7 / RH_7      ironing    t7 / rh_7
T8 / RH_8      teen2      t8 / rh_8                         teenager room 2
T9 / RH_9      parents    t9 / rh_9
T_out          weather    t_out        temperature  °C      Chièvres weather station
Press_mm_hg    weather    press_mm_hg  pressure     mmHg
RH_out         weather    rh_out       humidity     %
Windspeed      weather    windspeed    wind         m/s
Visibility     weather    visibility   visibility   km
Tdewpoint      weather    tdewpoint    dewpoint     °C
=============  =========  ===========  ===========  ======  =====================================

``rv1``/``rv2`` (random noise added by the authors) are not emitted. Id
``uci-appliances:kitchen:t1:20160111T170000``, sensor ``uci-appliances-kitchen-t1``. Suspect
rules: see :mod:`adapters.datasets.common`; ``outside``/``weather`` use the outdoor ranges.
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

NAME = "uci-appliances"
DESCRIPTION = (
    "UCI Appliances energy: a low-energy house (BE), appliance and light energy plus "
    "temperature/humidity of 9 places and a weather station every 10 min, Jan-May 2016"
)
BUILDING = "uci-house"
SUFFIXES = (".csv", ".csv.gz", ".csv.xz")
ROOM_OF = {
    "1": "kitchen",
    "2": "living",
    "3": "laundry",
    "4": "office",
    "5": "bathroom",
    "6": "outside",
    "7": "ironing",
    "8": "teen2",
    "9": "parents",
}
CHANNELS = [
    Channel("Appliances", "house", "appliances", "energy", "Wh", integer=True),
    Channel("lights", "house", "lights", "energy", "Wh", integer=True),
]
for _n, _room in ROOM_OF.items():
    CHANNELS.append(Channel(f"T{_n}", _room, f"t{_n}", "temperature", "°C"))
    CHANNELS.append(Channel(f"RH_{_n}", _room, f"rh_{_n}", "humidity", "%"))
CHANNELS += [
    Channel("T_out", "weather", "t_out", "temperature", "°C"),
    Channel("Press_mm_hg", "weather", "press_mm_hg", "pressure", "mmHg"),
    Channel("RH_out", "weather", "rh_out", "humidity", "%"),
    Channel("Windspeed", "weather", "windspeed", "wind", "m/s"),
    Channel("Visibility", "weather", "visibility", "visibility", "km"),
    Channel("Tdewpoint", "weather", "tdewpoint", "dewpoint", "°C"),
]
ROOMS = tuple(dict.fromkeys(c.room for c in CHANNELS))
KINDS = tuple(dict.fromkeys(c.kind for c in CHANNELS))


def _read_file(path: Path, table: WideTable, tz: tzinfo) -> Iterator[Event]:
    with open_text(path) as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        if "date" not in header or "Appliances" not in header:
            raise DatasetError(f"{path}: not a UCI appliances file (no date/Appliances header)")
        yield from read_wide(path, table, tz, header, csv_rows(reader), ("date",), iso_time)


FORMAT = WideFormat(NAME, BUILDING, "UCI appliances", SUFFIXES, CHANNELS, _read_file)
iter_events = FORMAT.iter_events
estimate_events = FORMAT.estimate_events
