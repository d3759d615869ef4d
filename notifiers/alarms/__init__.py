"""Alarms: a match becomes an alarm with a state that people acknowledge, clear and silence.

A pure package (no I/O, no clock: time is passed in), so a replay in event time and the
service in wall time run the same rules. docs/alarms.md describes the model; `AlarmRules`
is the entry point.
"""

from notifiers.alarms.contract import Effects, StatefulOperator
from notifiers.alarms.grouping import GroupPolicy, Message
from notifiers.alarms.history import History
from notifiers.alarms.intervals import WeeklyWindow
from notifiers.alarms.model import (
    STATES,
    Alarm,
    Notice,
    State,
    Transition,
    alarm_id,
)
from notifiers.alarms.rules import VERSION, AlarmRules
from notifiers.alarms.silences import Matcher, Silence, parse_silence
from notifiers.errors import AlarmNotFound, AlarmStateConflict, SilenceError, SilenceNotFound

__all__ = [
    "STATES",
    "VERSION",
    "Alarm",
    "AlarmNotFound",
    "AlarmRules",
    "AlarmStateConflict",
    "Effects",
    "GroupPolicy",
    "History",
    "Matcher",
    "Message",
    "Notice",
    "Silence",
    "SilenceError",
    "SilenceNotFound",
    "State",
    "StatefulOperator",
    "Transition",
    "WeeklyWindow",
    "alarm_id",
    "parse_silence",
]
