"""The `alarm:` block of a profile (docs/alarms.md): severity, how it clears, what is delivered.

A profile with it turns its matches into an alarm with a state (notifiers/alarms); a profile
without it behaves as before. `clear: {on: FILTER}` is compiled into a companion profile
(`clear_companion`) with the same `per`, so the engine detects the clearing event in the same
single step as every profile; `clear: after T` is a timer of the alarm rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from profiles.ast import Absent, Filter, Profile, Seq, is_filter
from profiles.errors import ProfileError
from profiles.parser import parse_duration, parse_profile

SEVERITIES: tuple[str, ...] = ("critical", "major", "minor", "warning", "info")
NOTIFY_KINDS: tuple[str, ...] = ("raise", "repeat", "ack", "clear")
DEFAULT_NOTIFY: tuple[str, ...] = ("raise", "clear")
ALARM_KEYS: tuple[str, ...] = ("severity", "clear", "notify", "labels")
RESERVED_LABELS: tuple[str, ...] = ("profile", "severity", "subscriber")  # the rules' own
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
CLEAR_SUFFIX = "#clear"  # the companion profile's id: `<profile>#clear`

ClearKind = Literal["after", "on", "manual"]


@dataclass(frozen=True, slots=True)
class AlarmSpec:
    """What `alarm:` declares. ``clear_after``: seconds (kind "after"); ``clear_on``: the
    filter's text (kind "on"); ``labels``: fixed labels every alarm of the profile carries
    (name, value) — what silences and routes match beside the partition's (e.g. the
    `comm-fault` class and the place of a sensor-silent fault, docs/assets.md)."""

    severity: str = "warning"
    clear: ClearKind = "manual"
    clear_after: float | None = None
    clear_on: str | None = None
    notify: tuple[str, ...] = DEFAULT_NOTIFY
    labels: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"severity": self.severity, "notify": list(self.notify)}
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.clear == "after":
            out["clear"] = f"after {self.clear_after:g}s"
        elif self.clear == "on":
            out["clear"] = {"on": self.clear_on}
        else:
            out["clear"] = "manual"
        return out


def clear_companion(profile: Profile, spec: AlarmSpec) -> Profile | None:
    """The internal profile `<id>#clear` whose matches clear the alarm, or None.

    Kind "on": a one-component `seq` with the alarm's `per` (a bare filter cannot take
    `per`), so its notifications carry the same partition values as the alarm's key. Kind
    "after": `absent(F) within T per P` when every `F` event is a match of the profile (a bare
    filter, or a one-component `seq` without `where`, `nth` or `once`): the temporal pool's
    terminator then fires T after the last match. Other profiles get None: their matches are
    not events a profile can see, and the rules' own timer (`clear_due`) clears them.
    """
    pid = profile.id + CLEAR_SUFFIX
    if spec.clear == "after" and spec.clear_after is not None:
        f = _single_filter(profile)
        if f is None:
            return None
        text = f"absent(<{profile.id}>) within {spec.clear_after:g}s"
        if profile.per:
            text += " per " + ", ".join(profile.per)
        return Profile(
            pid, Absent(f), spec.clear_after, profile.per, subscriber=profile.subscriber,
            source=text,
        )  # fmt: skip
    if spec.clear != "on" or spec.clear_on is None:
        return None
    if not profile.per:
        return parse_profile(spec.clear_on, pid, profile.subscriber)
    text = f"seq(clear: {spec.clear_on}) per {', '.join(profile.per)}"
    return parse_profile(text, pid, profile.subscriber)


def _single_filter(profile: Profile) -> Filter | None:
    """The filter F when each event matching F is one match of the profile, else None."""
    if profile.once or profile.where is not None or profile.select.kind == "nth":
        return None
    if is_filter(profile.expr):
        return profile.expr  # type: ignore[return-value]  # (is_filter narrows to a Filter)
    expr = profile.expr
    if isinstance(expr, Seq) and len(expr.components) == 1:
        c = expr.components[0]
        if not c.negated and is_filter(c.expr):
            return c.expr  # type: ignore[return-value]
    return None


def _pos(name: str, node: yaml.Node | None) -> str:
    if node is None:
        return name
    return f"{name}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _expr_pos(name: str, node: yaml.Node, e: ProfileError, source: str) -> str:
    """FILE:LINE:COL of a position inside a YAML scalar (the parser's line/column mapped)."""
    line, col = e.line or 1, e.column or 1
    base_line, base_col = node.start_mark.line + 1, node.start_mark.column + 1
    style = getattr(node, "style", None)
    if style in ("|", ">"):  # block scalar: content starts on the next line, indented
        return f"{name}:{base_line + line}:{col + _block_indent(source, base_line + line)}"
    if line > 1:
        return f"{name}:{base_line + line - 1}:{col}"
    quoted = 1 if style in ('"', "'") else 0
    return f"{name}:{base_line}:{base_col + col - 1 + quoted}"


def _block_indent(source: str, line: int) -> int:
    """The indentation of file line ``line`` (1-based): where a block scalar's text starts."""
    lines = source.splitlines()
    body = lines[line - 1] if 0 < line <= len(lines) else ""
    return len(body) - len(body.lstrip(" "))


def _child(node: yaml.Node | None, key: str, *, key_node: bool = False) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                found: yaml.Node = k if key_node else v
                return found
    return None


def parse_alarm(
    data: Any,
    node: yaml.Node | None,
    profile: Profile | None,
    pid: str,
    name: str,
    source: str = "",
) -> tuple[AlarmSpec | None, list[ProfileError]]:
    """The `alarm:` value of profile ``pid`` (``node``: its YAML node, for positions), or every
    problem, each as ``FILE:LINE:COL: profile 'ID': alarm.FIELD: ...``."""
    errors: list[ProfileError] = []

    def bad(at: yaml.Node | None, field: str, msg: str) -> None:
        errors.append(ProfileError(f"{_pos(name, at)}: profile {pid!r}: alarm.{field}: {msg}"))

    if not isinstance(data, dict):
        bad(node, "", "must be a mapping with severity, clear, notify")
        return None, errors
    for key in data:
        if key not in ALARM_KEYS:
            bad(
                _child(node, str(key), key_node=True),
                str(key),
                f"unknown key {str(key)!r} (allowed: {', '.join(ALARM_KEYS)})",
            )
    severity = data.get("severity", "warning")
    if severity not in SEVERITIES:
        bad(
            _child(node, "severity"),
            "severity",
            f"unknown severity {severity!r} (one of {', '.join(SEVERITIES)})",
        )
    notify = data.get("notify", list(DEFAULT_NOTIFY))
    if isinstance(notify, str):
        notify = [notify]
    if not isinstance(notify, list) or any(n not in NOTIFY_KINDS for n in notify):
        bad(
            _child(node, "notify"),
            "notify",
            f"{notify!r}: expected a list of {', '.join(NOTIFY_KINDS)}",
        )
        notify = list(DEFAULT_NOTIFY)
    clear = _parse_clear(
        data.get("clear", "manual"), _child(node, "clear"), profile, pid, name, source
    )
    if isinstance(clear, ProfileError):
        errors.append(clear)
    labels = _parse_labels(data.get("labels", {}), _child(node, "labels"), bad)
    if errors:
        return None, errors
    assert not isinstance(clear, ProfileError)
    kind, after, on = clear
    order = tuple(k for k in NOTIFY_KINDS if k in notify)
    return AlarmSpec(str(severity), kind, after, on, order, labels), []


def _parse_labels(value: Any, node: yaml.Node | None, bad: Any) -> tuple[tuple[str, str], ...]:
    """``labels: {class: comm-fault, building: B1}``: names like attributes, scalar values
    (as strings), none of the rules' own (profile, severity, subscriber); sorted by name."""
    if not isinstance(value, dict):
        bad(node, "labels", f"{value!r}: expected a mapping of label names to values")
        return ()
    out: dict[str, str] = {}
    for k, v in value.items():
        key = str(k)
        if not _LABEL_RE.fullmatch(key):
            bad(_child(node, key, key_node=True), "labels", f"{key!r} is not a label name")
        elif key in RESERVED_LABELS:
            bad(
                _child(node, key, key_node=True),
                "labels",
                f"{key!r} is set by the alarm itself ({', '.join(RESERVED_LABELS)})",
            )
        elif v is None or isinstance(v, (dict, list)):
            bad(_child(node, key), "labels", f"{key}: {v!r}: expected a string or number")
        else:
            out[key] = str(v).lower() if isinstance(v, bool) else str(v)
    return tuple(sorted(out.items()))


def _parse_clear(
    value: Any, node: yaml.Node | None, profile: Profile | None, pid: str, name: str, source: str
) -> tuple[ClearKind, float | None, str | None] | ProfileError:
    where = f"{_pos(name, node)}: profile {pid!r}: alarm.clear"
    forms = "expected 'after DURATION', {on: 'FILTER'} or 'manual'"
    if isinstance(value, str):
        text = value.strip()
        if text == "manual":
            return "manual", None, None
        if text.startswith("after "):
            try:
                seconds = parse_duration(text[len("after ") :])
            except ValueError as e:
                return ProfileError(f"{where}: {e}")
            if seconds <= 0:
                return ProfileError(f"{where}: the duration must be above 0")
            return "after", seconds, None
        return ProfileError(f"{where}: {value!r}: {forms}")
    if isinstance(value, dict):  # YAML 1.1 reads a bare `on` key as true
        value = {("on" if k is True else k): v for k, v in value.items()}
    if isinstance(value, dict) and list(value) == ["on"] and isinstance(value["on"], str):
        return _parse_clear_on(value["on"], _child(node, "on"), profile, pid, name, source)
    return ProfileError(f"{where}: {value!r}: {forms}")


def _parse_clear_on(
    text: str, node: yaml.Node | None, profile: Profile | None, pid: str, name: str, source: str
) -> tuple[ClearKind, float | None, str | None] | ProfileError:
    try:
        parsed = parse_profile(text, pid + CLEAR_SUFFIX)
    except ProfileError as e:
        at = _expr_pos(name, node, e, source) if node is not None and e.line else _pos(name, node)
        detail = e.message + ("; expected " + ", ".join(e.expected) if e.expected else "")
        return ProfileError(f"{at}: profile {pid!r}: alarm.clear.on: {detail}")
    if not is_filter(parsed.expr):
        return ProfileError(
            f"{_pos(name, node)}: profile {pid!r}: alarm.clear.on: must be a filter "
            "(it is checked on each event of the alarm's partition), not a composite"
        )
    spec = AlarmSpec(clear="on", clear_on=text)
    if profile is not None:
        try:
            clear_companion(profile, spec)
        except ProfileError as e:
            return ProfileError(f"{_pos(name, node)}: profile {pid!r}: alarm.clear.on: {e.message}")
    return "on", None, text
