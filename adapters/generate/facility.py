"""A synthetic facility feed with injected incidents and their ground truth.

Why synthetic: the real data sets (adapters/datasets) carry no labelled incidents, so they cannot
tell whether ENS missed one or raised a false alarm. Here the *background* is built so that no
profile of examples/facility/profiles.yaml can fire on it, and every *incident* is shaped so that
exactly one notification follows, which its truth record predicts (profile, partition, time,
bound events). The background stays clear because:

- temperatures stay within 16-24.5 °C (labs >= 15.5 °C), humidity <= 65 %, CO2 <= 950 ppm;
- temperature changes by < 2 °C per hour (incidents ramp at <= 3.5 °C/h, except temp-rise);
- every polled sensor reports every step, except during injected outages;
- no window ever breaks, every lab door opening follows a badge swipe by seconds, and
  every alarm is acknowledged within 7 minutes;
- nobody is in the building at night (occupants come on weekdays, 07:45-18:45).

Events follow the data-set adapters' conventions (building, room, sensor, kind, value, unit);
event-driven devices (alarm panel, operator console, badge readers) carry `device`, not
`sensor`: they are not polled, so the silent-sensor profile must not supervise them.
Times are UTC (the engine's default clock zone), `ts` is float epoch seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

Event = dict[str, str | int | float | bool]
Truth = dict[str, object]

#: incident type -> the profile of examples/facility/profiles.yaml that must report it.
PROFILES: dict[str, str] = {
    "night-overheat": "p1-night-overheat",
    "silent-sensor": "p2-silent-sensor",
    "lab-cold-humid": "p3-lab-cold-humid",
    "break-in": "p4-break-in",
    "co2-stuffy": "co2-stuffy",
    "alarm-unacked": "alarm-unacked",
    "door-forced": "door-forced",
    "temp-rise": "temp-rise",
}
INCIDENT_TYPES = tuple(PROFILES)

# Thresholds of the profiles (kept in one place so background and incidents agree with them).
HOT, COLD, HUMID, CO2_HIGH, SILENCE, ACK_WITHIN = 26.0, 15.0, 70.0, 1000.0, 1800.0, 600.0

HOUR, DAY = 3600.0, 86400.0
UNITS = {"temperature": "°C", "humidity": "%", "co2": "ppm"}


@dataclass
class Room:
    """One room's series, one value per step; incidents overwrite slices of them."""

    building: str
    name: str
    lab: bool
    offset: int  # the room's gateway polls `offset` seconds after each step
    temp: list[float] = field(default_factory=list)
    hum: list[float] = field(default_factory=list)
    co2: list[float] = field(default_factory=list)
    occ: list[int] = field(default_factory=list)
    window: list[str] = field(default_factory=list)
    busy: list[tuple[float, float]] = field(default_factory=list)  # reserved for incidents

    def sensor(self, suffix: str) -> str:
        return f"{self.building}-{self.name}-{suffix}"

    @property
    def suffixes(self) -> tuple[str, ...]:
        """t(emperature), h(umidity), c(o2), p(resence), then w(indow) or d(oor)."""
        return ("t", "h", "c", "p", "d" if self.lab else "w")


def _parse_start(start: str | date) -> float:
    if isinstance(start, datetime):
        start = start.date()
    if isinstance(start, str):
        try:
            start = date.fromisoformat(start)
        except ValueError:
            raise ValueError(f"start {start!r} is not an ISO date (YYYY-MM-DD)") from None
    return datetime(start.year, start.month, start.day, tzinfo=UTC).timestamp()


def _counts(incidents: int | Mapping[str, int], buildings: int, days: int) -> dict[str, int]:
    """Incidents per type: an int is per building and day (P1: per night, site-wide)."""
    if isinstance(incidents, int):
        if incidents < 0:
            raise ValueError("incidents must be >= 0")
        n = incidents * buildings * days
        return {k: min(n, days) if k == "night-overheat" else n for k in INCIDENT_TYPES}
    unknown = set(incidents) - set(INCIDENT_TYPES)
    if unknown:
        raise ValueError(f"unknown incident types {sorted(unknown)} (known: {INCIDENT_TYPES})")
    out = {k: int(incidents.get(k, 0)) for k in INCIDENT_TYPES}
    if any(v < 0 for v in out.values()):
        raise ValueError("incident counts must be >= 0")
    if out["night-overheat"] > days:
        raise ValueError("at most one night-overheat per night (P1 fires once per night)")
    return out


class _Feed:
    """The feed being built: rooms, the background series, event-driven events and truth
    resolvers; the incident functions below inject into it, `emit` writes it out."""

    def __init__(
        self, buildings: int, days: int, rooms: int, seed: int, t0: float, step: int
    ) -> None:
        self.seed, self.t0, self.step, self.days = seed, t0, step, days
        self.n = int(days * DAY) // step
        self.t_end = t0 + days * DAY
        self.rng = random.Random(f"{seed}:incidents")
        self.rooms: list[Room] = []
        for b in range(1, buildings + 1):
            labs = max(1, rooms // 4)
            names = [f"lab-{i}" for i in range(1, labs + 1)]
            names += [f"office-{i}" for i in range(1, rooms - labs + 1)]
            for name in names:
                rng = random.Random(f"{seed}:room:B{b}:{name}")
                self.rooms.append(Room(f"B{b}", name, name.startswith("lab"), rng.randrange(60)))
        self.extra: list[Event] = []  # event-driven events (badges, doors, alarms, acks)
        self.silent: list[tuple[str, float, float]] = []  # (sensor, from, to): nothing sent
        self.alarm_no: dict[str, int] = {}
        self.resolvers: list[Callable[[], Truth]] = []
        self.at: dict[tuple[str, int], Event] = {}  # (sensor, step) -> reading
        self.by_sensor: dict[str, list[Event]] = {}  # sensor -> its events, in time order
        self.serial: dict[str, int] = {}

    def uid(self, prefix: str) -> str:
        """Ids of event-driven events: `<device>:<n>` (two can share a second)."""
        n = self.serial[prefix] = self.serial.get(prefix, 0) + 1
        return f"{prefix}:{n}"

    # ---- time helpers
    def ts(self, room: Room, k: int) -> float:
        return self.t0 + k * self.step + room.offset

    def k_of(self, t: float) -> int:
        return round((t - self.t0) / self.step)

    def steps(self, seconds: float) -> int:
        return max(1, math.ceil(seconds / self.step))

    # ---- background
    def background(self) -> None:
        for room in self.rooms:
            rng = random.Random(f"{self.seed}:background:{room.building}:{room.name}")
            self._occupancy(room, rng)
            self._climate(room, rng)
            self._alarms(room, rng)
            room.window = ["ok"] * self.n

    def _occupancy(self, room: Room, rng: random.Random) -> None:
        """Weekday occupants; lab occupants badge in and out through the lab door."""
        occ = [0] * self.n
        for d in range(self.days):
            day0 = self.t0 + d * DAY
            weekday = datetime.fromtimestamp(day0, UTC).weekday() < 5
            for _ in range(rng.randint(1, 3 if room.lab else 4)):
                arrive = day0 + rng.uniform(7.75, 9.5) * HOUR
                leave = day0 + rng.uniform(16.5, 18.5) * HOUR
                lunch = day0 + rng.uniform(12.0, 12.5) * HOUR
                back = lunch + rng.uniform(0.5, 1.0) * HOUR
                spans = (
                    [(arrive, lunch), (back, leave)] if rng.random() < 0.6 else [(arrive, leave)]
                )
                if not weekday:
                    continue
                for a, b in spans:
                    for k in range(max(0, self.k_of(a)), min(self.n, self.k_of(b))):
                        occ[k] += 1
                    if room.lab:
                        self._badge_door(room, rng, a)
                        self._badge_door(room, rng, b)
        room.occ = occ

    def _badge_door(self, room: Room, rng: random.Random, t: float) -> None:
        t = float(int(t))
        opened = t + rng.randint(3, 15)
        self.extra.append(
            self._device(
                room, t, "badge", room.sensor("reader"), badge=f"U{rng.randrange(10000):04d}"
            )
        )
        self._door(room, opened, "open")
        self._door(room, opened + rng.randint(5, 12), "closed")

    def _door(self, room: Room, t: float, state: str) -> Event:
        ev: Event = {
            "id": self.uid(room.sensor("d")),
            "ts": float(int(t)),
            "building": room.building,
            "room": room.name,
            "sensor": room.sensor("d"),
            "kind": "door",
            "state": state,
        }
        self.extra.append(ev)
        return ev

    def _device(self, room: Room, t: float, kind: str, device: str, **attrs: str) -> Event:
        ev: Event = {
            "id": self.uid(device),
            "ts": float(int(t)),
            "building": room.building,
            "room": room.name,
            "device": device,
            "kind": kind,
        }
        ev.update(attrs)
        return ev

    def _climate(self, room: Room, rng: random.Random) -> None:
        """Day/night sinusoids (+ per-room offsets and noise); CO2 relaxes towards occupancy."""
        base_t = rng.uniform(18.5, 19.5) if room.lab else rng.uniform(20.5, 21.5)
        amp_t = 1.0 if room.lab else 1.5
        base_h = rng.uniform(48, 54) if room.lab else rng.uniform(40, 46)
        lo_t, hi_t = (15.5, 22.0) if room.lab else (16.0, 24.5)
        relax = 1 - math.exp(-self.step / 1200)  # CO2 and body heat: ~20-minute time constant
        co2, heat = 430.0, 0.0
        for k in range(self.n):
            hour = ((k * self.step + room.offset) % DAY) / HOUR
            wave = math.sin(2 * math.pi * (hour - 10) / 24)  # peak 16:00, low 04:00
            heat += (0.12 * room.occ[k] - heat) * relax
            t = base_t + amp_t * wave + heat + rng.uniform(-0.3, 0.3)
            room.temp.append(round(min(hi_t, max(lo_t, t)), 1))
            h = base_h - 6 * wave + rng.uniform(-1.5, 1.5)
            room.hum.append(round(min(65.0, max(25.0, h)), 1))
            target = 420 + (90 if room.lab else 110) * room.occ[k]
            co2 += (target - co2) * relax
            room.co2.append(float(round(min(950.0, max(400.0, co2 + rng.uniform(-8, 8))))))

    def _alarms(self, room: Room, rng: random.Random) -> None:
        """Lab alarm panel: up to two alarms a day, each acknowledged within 1-7 minutes."""
        if not room.lab:
            return
        for d in range(self.days):
            for _ in range(rng.choice((0, 1, 1, 2))):
                t = self.t0 + d * DAY + rng.uniform(0.5, 23.0) * HOUR
                alarm = self._alarm(room, t, rng.choice(("fume-hood", "fridge-temp", "gas")))
                self._ack(room, t + rng.uniform(60, 420), str(alarm["alarm"]))

    def _alarm(self, room: Room, t: float, code: str) -> Event:
        n = self.alarm_no[room.building] = self.alarm_no.get(room.building, 0) + 1
        alarm_id = f"{room.building}-A{n:04d}"
        ev = self._device(
            room, t, "alarm", f"{room.building}-alarm-panel", alarm=alarm_id, code=code
        )
        ev["id"] = alarm_id
        self.extra.append(ev)
        return ev

    def _ack(self, room: Room, t: float, alarm_id: str) -> None:
        ev = self._device(
            room,
            t,
            "ack",
            f"{room.building}-console",
            alarm=alarm_id,
            operator=f"op-{1 + int(t) % 3}",
        )
        ev["id"] = f"{alarm_id}:ack"
        self.extra.append(ev)

    # ---- incident placement
    def slot(
        self,
        kind: str,
        rooms: list[Room],
        hours: list[tuple[float, float]],
        before: float,
        after: float,
        day: int | None = None,
        overrun: bool = False,
    ) -> tuple[Room, int]:
        """A room and a step in one of the `hours` ranges whose [-before, +after] is free.

        `overrun`: the incident may go on past the end of the feed (P1 on the last night).
        """
        for _ in range(1000):
            room = self.rng.choice(rooms)
            d = self.rng.randrange(self.days) if day is None else day
            lo_h, hi_h = self.rng.choice(hours)
            k = self.k_of(self.t0 + d * DAY + self.rng.uniform(lo_h, hi_h) * HOUR)
            t = self.ts(room, k)
            a, b = t - before, t + after
            if a < self.t0 + 0.5 * HOUR or (b > self.t_end - 0.5 * HOUR and not overrun):
                continue
            if all(b <= x or y <= a for x, y in room.busy):
                room.busy.append((a, b))
                return room, k
        raise ValueError(
            f"no room left for a {kind} incident: use more rooms or days, or fewer incidents"
        )

    def offices(self) -> list[Room]:
        return [r for r in self.rooms if not r.lab]

    def labs(self) -> list[Room]:
        return [r for r in self.rooms if r.lab]

    def record(
        self,
        kind: str,
        room: Room | None,
        partition: dict | None,
        events: dict,
        ts_min: float,
        ts_max: float,
        note: str,
    ) -> Truth:
        """A truth record; `events` maps component names to the event dicts allowed there."""
        out: Truth = {
            "incident": kind,
            "profile": PROFILES[kind],
            "partition": partition,
            "ts_min": ts_min,
            "ts_max": ts_max,
            "events": {
                c: [e if isinstance(e, str) else e["id"] for e in evs] for c, evs in events.items()
            },
        }
        if room is not None:
            out.update(building=room.building, room=room.name)
        out["note"] = note
        return out

    def per_room(self, room: Room) -> dict[str, str]:
        return {"building": room.building, "room": room.name}

    # ---- output
    def emit(self) -> list[Event]:
        """All events in time order (stable: a room's readings keep their t,h,c,p,w/d order)."""
        silent: dict[str, list[tuple[float, float]]] = {}
        for sensor, a, b in self.silent:
            silent.setdefault(sensor, []).append((a, b))

        def quiet(sensor: str, t: float) -> bool:
            return any(a < t < b for a, b in silent.get(sensor, ()))

        events: list[Event] = []
        for k in range(self.n):
            for room in self.rooms:
                t = self.ts(room, k)
                for suffix in room.suffixes:
                    sensor = room.sensor(suffix)
                    if sensor in silent and quiet(sensor, t):
                        continue
                    ev: Event = {
                        "id": f"{sensor}@{int(t)}",
                        "ts": t,
                        "building": room.building,
                        "room": room.name,
                        "sensor": sensor,
                    }
                    if suffix == "w":
                        ev.update(kind="window", state=room.window[k])
                    elif suffix == "d":
                        ev.update(kind="door", state="closed")
                    elif suffix == "p":
                        ev.update(kind="presence", value=1 if room.occ[k] > 0 else 0)
                    else:
                        kind = {"t": "temperature", "h": "humidity", "c": "co2"}[suffix]
                        series = {"t": room.temp, "h": room.hum, "c": room.co2}[suffix]
                        ev.update(kind=kind, value=series[k], unit=UNITS[kind])
                    events.append(ev)
                    self.at[sensor, k] = ev
        events += [
            e
            for e in self.extra
            if not (e.get("sensor") in silent and quiet(str(e["sensor"]), float(e["ts"])))
            and self.t0 <= float(e["ts"]) < self.t_end
        ]
        events.sort(key=lambda e: e["ts"])
        for e in events:
            if "sensor" in e:
                self.by_sensor.setdefault(str(e["sensor"]), []).append(e)
        ids = {e["id"] for e in events}
        assert len(ids) == len(events), "duplicate event ids"
        return events


# ---- incidents: each mutates the feed's series, then registers how to resolve its truth


def night_overheat(feed: _Feed, day: int) -> None:
    """P1: the air conditioning fails at night; the office warms at 3.5 °C/h past 26 °C."""
    room, k0 = feed.slot(
        "night-overheat",
        feed.offices(),
        [(21.5, 22.0)],
        0.5 * HOUR,
        5 * HOUR,
        day,
        overrun=True,
    )
    peak, up = feed.rng.uniform(27.3, 28.3), 3.5 * feed.step / HOUR
    hold, down = feed.steps(feed.rng.uniform(30, 45) * 60), 6.0 * feed.step / HOUR
    k, bump = k0, 0.0
    while k < feed.n and room.temp[k] + bump < peak:
        bump += up
        room.temp[k] = round(min(peak, room.temp[k] + bump), 1)
        k += 1
    for _ in range(hold):
        if k < feed.n:
            room.temp[k] = round(peak + feed.rng.uniform(-0.1, 0.1), 1)
        k += 1
    v = peak - down
    while k < feed.n and v > room.temp[k]:  # falling: harmless for every profile
        room.temp[k] = round(v, 1)
        k, v = k + 1, v - down
    night = feed.t0 + day * DAY + 22 * HOUR

    def truth() -> Truth:
        hi = next(
            feed.at[room.sensor("t"), k]
            for k in range(feed.k_of(night), feed.n)
            if (room.sensor("t"), k) in feed.at
            and float(feed.at[room.sensor("t"), k]["value"]) > HOT
            and feed.ts(room, k) >= night
        )
        assert float(hi["ts"]) < night + 8 * HOUR, "P1 incident outside the night"
        clock = "clock:" + datetime.fromtimestamp(night, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return feed.record(
            "night-overheat",
            room,
            None,
            {"n": [clock], "hi": [hi]},
            float(hi["ts"]),
            float(hi["ts"]),
            f"office above {HOT} °C at night (AC failure, +3.5 °C/h)",
        )

    feed.resolvers.append(truth)


def silent_sensor(feed: _Feed) -> None:
    """P2: a sensor fails and sends nothing for 40-150 minutes, then comes back."""
    span = feed.rng.uniform(40, 150) * 60
    room, k0 = feed.slot("silent-sensor", feed.rooms, [(0.5, 22.0)], HOUR, span + 2 * HOUR)
    sensor = room.sensor(feed.rng.choice(room.suffixes))
    m = feed.steps(span)
    # (previous reading, next reading): open interval, also drops door events in between
    feed.silent.append((sensor, feed.ts(room, k0 - 1), feed.ts(room, k0 + m)))

    def truth() -> Truth:  # the sensor's last event before the gap (a door event may tie)
        last = [e for e in feed.by_sensor[sensor] if float(e["ts"]) < feed.ts(room, k0)][-1]
        t = float(last["ts"]) + SILENCE
        return feed.record(
            "silent-sensor",
            room,
            {"sensor": sensor},
            {"last": [last]},
            t,
            t,
            f"sensor silent for {m * feed.step / 60:.0f} min",
        )

    feed.resolvers.append(truth)


def lab_cold_humid(feed: _Feed) -> None:
    """P3: a lab's climate unit fails: humid air first (0-15 min), then cold for a while."""
    room, kc = feed.slot("lab-cold-humid", feed.labs(), [(1.0, 19.0)], HOUR, 5 * HOUR)
    n_down, cold = feed.steps(1800), feed.steps(feed.rng.uniform(30, 75) * 60)
    lead = feed.steps(feed.rng.choice((0, 5, 10, 15)) * 60) if feed.rng.random() < 0.75 else 0
    start = room.temp[kc - n_down - 1]
    for j in range(1, n_down + 1):  # fall to just above the threshold in 30 min
        room.temp[kc - n_down - 1 + j] = round(start + (COLD + 0.6 - start) * j / n_down, 1)
    for k in range(kc, kc + cold):
        room.temp[k] = round(feed.rng.uniform(12.0, 14.2), 1)
    v, k = room.temp[kc + cold - 1], kc + cold
    while k < feed.n and (v := v + 3.0 * feed.step / HOUR) < room.temp[k]:
        room.temp[k] = round(v, 1)  # recover at 3 °C/h: no temp-rise
        k += 1
    for k in range(kc - lead, kc + cold):
        room.hum[k] = round(feed.rng.uniform(72.0, 80.0), 1)
    n_dry = feed.steps(HOUR)
    for j in range(n_dry):
        k = kc + cold + j
        if k < feed.n:
            room.hum[k] = round(min(69.0, 69.0 + (room.hum[k] - 69.0) * j / n_dry), 1)

    def truth() -> Truth:  # `select last`: h is the latest humid reading, t the first cold
        t, h = feed.at[room.sensor("t"), kc], feed.at[room.sensor("h"), kc - min(lead, 1)]
        assert float(t["value"]) < COLD and float(h["value"]) > HUMID
        ts = float(t["ts"])
        return feed.record(
            "lab-cold-humid",
            room,
            feed.per_room(room),
            {"t": [t], "h": [h]},
            ts,
            ts,
            f"humid {lead * feed.step // 60} min before cold, "
            f"cold for {cold * feed.step // 60} min",
        )

    feed.resolvers.append(truth)


def break_in(feed: _Feed) -> None:
    """P4: an office window is broken at night; the intruder is seen 5-20 minutes later."""
    broken = feed.steps(feed.rng.uniform(45, 75) * 60)
    room, k = feed.slot("break-in", feed.offices(), [(0.5, 4.5)], HOUR, broken * feed.step + HOUR)
    j = feed.steps(feed.rng.uniform(5, 20) * 60)
    for i in range(k, k + broken):  # security resets the glass-break sensor after its visit
        room.window[i] = "broken"
    room.occ[k + j] = 1
    assert not any(room.occ[i] for i in range(k - 6, k + broken + 6) if i != k + j)

    def truth() -> Truth:
        w, p = feed.at[room.sensor("w"), k], feed.at[room.sensor("p"), k + j]
        return feed.record(
            "break-in",
            room,
            feed.per_room(room),
            {"w": [w], "p": [p]},
            float(p["ts"]),
            float(p["ts"]),
            f"window broken, presence {j * feed.step // 60} min later",
        )

    feed.resolvers.append(truth)


def co2_stuffy(feed: _Feed) -> None:
    """CO2: a crowded meeting; exactly three readings above 1000 ppm, then ventilation."""
    room, k = feed.slot("co2-stuffy", feed.offices(), [(9.5, 16.0)], 1.5 * HOUR, 1.5 * HOUR)
    n_up = n_dn = max(3, feed.steps(1800))
    start = room.co2[k - n_up - 1]
    for j in range(1, n_up + 1):
        room.co2[k - n_up - 1 + j] = float(round(start + (960 - start) * j / n_up))
    for i in range(k, k + 3):
        room.co2[i] = float(feed.rng.randint(1015, 1150))
    end = room.co2[k + 3 + n_dn]
    for j in range(n_dn):
        room.co2[k + 3 + j] = float(round(950 + (end - 950) * j / n_dn))
    for i in range(k - n_up, k + 3):
        room.occ[i] = max(room.occ[i], 6)

    def truth() -> Truth:
        r = [feed.at[room.sensor("c"), i] for i in range(k, k + 3)]
        t = float(r[2]["ts"])
        return feed.record(
            "co2-stuffy",
            room,
            feed.per_room(room),
            {"r1": [r[0]], "r2": [r[1]], "r3": [r[2]]},
            t,
            t,
            "meeting: three CO2 readings above 1000 ppm",
        )

    feed.resolvers.append(truth)


def alarm_unacked(feed: _Feed) -> None:
    """Trailing negation: an alarm nobody acknowledges (or only after 12-25 minutes)."""
    room = feed.rng.choice(feed.labs())
    t = feed.t0 + feed.rng.randrange(feed.days) * DAY + feed.rng.uniform(0.5, 22.5) * HOUR
    alarm = feed._alarm(room, t, feed.rng.choice(("fume-hood", "fridge-temp", "gas")))
    late = feed.rng.random() < 0.5
    if late:
        feed._ack(room, t + feed.rng.uniform(12, 25) * 60, str(alarm["alarm"]))
    due = float(alarm["ts"]) + ACK_WITHIN
    feed.resolvers.append(
        lambda: feed.record(
            "alarm-unacked",
            room,
            {"alarm": alarm["alarm"]},
            {"a": [alarm]},
            due,
            due,
            "acknowledged too late" if late else "never acknowledged",
        )
    )


def door_forced(feed: _Feed) -> None:
    """Leading negation: a lab door opens at night (nobody badges then) without a badge."""
    room, k = feed.slot("door-forced", feed.labs(), [(0.5, 5.5), (19.5, 23.0)], HOUR, HOUR)
    t = feed.ts(room, k) + feed.rng.randint(20, feed.step - 20)
    door = feed._door(room, t, "open")
    feed._door(room, t + feed.rng.randint(20, 60), "closed")
    for i in (k + 1, k + 2):
        room.occ[i] = 1
    feed.resolvers.append(
        lambda: feed.record(
            "door-forced",
            room,
            feed.per_room(room),
            {"d": [door]},
            float(door["ts"]),
            float(door["ts"]),
            "lab door opened at night, no badge",
        )
    )


def temp_rise(feed: _Feed) -> None:
    """`where`: a heater sticks on; +7.5 °C in each of two readings, then back to normal.

    With `select first` the 1-hour windows of a sensor follow each other, so the rise is
    seen at the first jump (the window's first reading is still low) or, when a window
    happens to start at the first jump, at the second: the truth allows both readings.
    """
    room, k = feed.slot("temp-rise", feed.rooms, [(9.5, 15.0)], 1.5 * HOUR, 2 * HOUR)
    room.temp[k] = round(room.temp[k] + 7.5 + feed.rng.uniform(0, 0.5), 1)
    room.temp[k + 1] = round(room.temp[k] + 7.5 + feed.rng.uniform(0, 0.5), 1)
    for i in range(k + 2, k + 1 + feed.steps(feed.rng.uniform(10, 20) * 60)):
        room.temp[i] = round(room.temp[k + 1] + feed.rng.uniform(-0.2, 0.2), 1)

    def truth() -> Truth:
        b = [feed.at[room.sensor("t"), i] for i in (k, k + 1)]
        return feed.record(
            "temp-rise",
            room,
            {"sensor": room.sensor("t")},
            {"b": b},
            float(b[0]["ts"]),
            float(b[1]["ts"]),
            "temperature +7.5 °C in each of two readings",
        )

    feed.resolvers.append(truth)


def generate_facility(
    buildings: int = 2,
    days: int = 1,
    rooms_per_building: int = 8,
    seed: int = 0,
    start: str | date = "2024-03-04",
    step_s: int = 300,
    incidents: int | Mapping[str, int] = 1,
) -> tuple[list[Event], list[Truth]]:
    """A feed of `buildings` x `rooms_per_building` rooms over `days` days, and its truth.

    A quarter of the rooms (at least one) are labs ("lab-1", ...), the rest offices
    ("office-1", ...). `incidents` is an int (of each type, per building and day; P1 at most
    one per night, site-wide) or a mapping incident type -> total count. Deterministic for a
    seed. Returns the events (dicts, sorted by ts) and one truth record per incident (sorted
    by ts_min): incident type, profile, partition, [ts_min, ts_max] of the notification, and
    for each named component the event ids it may bind.
    """
    if buildings < 1 or days < 1 or rooms_per_building < 2:
        raise ValueError("need at least 1 building, 1 day and 2 rooms per building")
    if not 60 <= step_s <= 300:
        raise ValueError("step_s must be 60..300 (three CO2 readings must fit in 10 minutes)")
    counts = _counts(incidents, buildings, days)
    feed = _Feed(buildings, days, rooms_per_building, seed, _parse_start(start), step_s)
    feed.background()
    nights = sorted(feed.rng.sample(range(days), counts["night-overheat"]))
    for d in nights:
        night_overheat(feed, d)
    # most constrained first: night-only incidents, then daytime ones, then anywhere
    makers = {
        "break-in": break_in,
        "door-forced": door_forced,
        "lab-cold-humid": lab_cold_humid,
        "co2-stuffy": co2_stuffy,
        "temp-rise": temp_rise,
        "silent-sensor": silent_sensor,
        "alarm-unacked": alarm_unacked,
    }
    for kind, make in makers.items():
        for _ in range(counts[kind]):
            make(feed)
    events = feed.emit()
    truth = sorted((r() for r in feed.resolvers), key=lambda r: (r["ts_min"], r["profile"]))
    return events, truth
