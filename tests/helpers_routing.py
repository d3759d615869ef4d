"""The routing file the routing tests share: a day and a night crew on call (Berlin time) and
an escalation policy for critical alarms; the tests add sections of their own."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

BERLIN = ZoneInfo("Europe/Berlin")
CREW_ROUTING = """
tz: Europe/Berlin
schedules:
  - id: crew
    layers:
      - {name: day, participants: [anna], rotation: 1d, handoff: "07:00", start: 2026-11-02,
         restrict: Mon-Sun 07:00-19:00}
      - {name: night, participants: [carla], rotation: 1d, handoff: "19:00", start: 2026-11-02,
         restrict: Mon-Sun 19:00-07:00}
escalation_policies:
  - id: page
    levels: [{receivers: [crew]}, {receivers: [boss], delay: 20m}]
    repeat: 40m
route:
  receivers: [desk]
  routes:
    - {match: [severity=critical], escalation: page}
"""


def at(text: str) -> float:
    """A Berlin wall time (ISO, no zone) as a timestamp."""
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN).timestamp()
