"""The asset registry's records and files (docs/assets.md): sensor or gateway -> point type,
room, floor, building, time zone, expected reporting interval.

A registry file is CSV (a header row naming the columns) or YAML (``assets:`` a list of
mappings, optional ``defaults:`` applied to every asset and ``fault:`` for the sensor-silent
alarms). `read_registry` checks the whole file and raises `AssetError` listing every problem
as ``FILE:LINE: ...`` (duplicate ids, unknown columns, bad intervals, unknown time zones):
a file with one problem stores nothing. Pure: no Redis (`asset_store` writes it).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from adapters.errors import AssetError as AssetError  # with the registry's functions
from profiles.alarm import SEVERITIES
from profiles.errors import ENSError, ManyErrors
from profiles.options import OptionError, parse_duration

KINDS = ("sensor", "gateway")
# what an event gains from its asset (the registry's own words: `point` is the point type)
ATTRIBUTES = ("point", "room", "floor", "building", "tz")
COLUMNS = ("id", "kind", *ATTRIBUTES, "interval", "severity")
FAULT_KEYS = ("severity", "subscriber")
# `comm-fault:` + id stays a profile id (at most 128 characters, redis_store.check_id)
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,116}")
MIN_INTERVAL = 1.0  # s: a shorter expected interval is a typo (ms for s), not a sensor


@dataclass(frozen=True, slots=True)
class Asset:
    """One registered sensor or gateway. ``interval``: seconds between its reports (None: no
    sensor-silent fault); ``severity``: of its fault alarm (None: the import's default)."""

    id: str
    kind: str = "sensor"
    point: str | None = None
    room: str | None = None
    floor: str | None = None
    building: str | None = None
    tz: str | None = None
    interval: float | None = None
    severity: str | None = None

    def attributes(self) -> dict[str, str]:
        """What an event of this asset gains (the fields it has)."""
        out = {}
        for name in ATTRIBUTES:
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, **self.attributes()}
        if self.interval is not None:
            out["interval"] = self.interval
        if self.severity is not None:
            out["severity"] = self.severity
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Asset:
        fields: dict[str, Any] = {k: d[k] for k in COLUMNS if k in d}
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class Registry:
    """A registry file's content: its assets, and the `fault:` settings it names."""

    assets: tuple[Asset, ...]
    fault_severity: str | None = None
    fault_subscriber: str | None = None


def check_tz(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise AssetError(f"unknown time zone {name!r} (an IANA name: Europe/Berlin)") from None
    return name


def parse_asset(data: dict[str, Any]) -> Asset:
    """One asset from its fields (strings from CSV, scalars from YAML or JSON); AssetError
    naming the first bad field."""
    unknown = [str(k) for k in data if k not in COLUMNS]
    if unknown:
        raise AssetError(
            f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(allowed: {', '.join(COLUMNS)})"
        )
    vals = {k: _text(v) for k, v in data.items()}
    aid = vals.get("id")
    if aid is None:
        raise AssetError("id: missing")
    if not ID_RE.fullmatch(aid):
        raise AssetError(
            f"id {aid!r}: 1-117 characters: letters, digits, _ . : @ - (starting with a "
            "letter or digit)"
        )
    kind = vals.get("kind") or "sensor"
    if kind not in KINDS:
        raise AssetError(f"kind {kind!r}: expected {' or '.join(KINDS)}")
    if kind == "gateway" and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", aid):
        raise AssetError(f"id {aid!r}: a gateway name has letters, digits, _ and - only")
    tz = vals.get("tz")
    if tz is not None:
        check_tz(tz)
    interval = None
    if vals.get("interval") is not None:
        try:
            interval = parse_duration("interval", str(vals["interval"]), minimum=MIN_INTERVAL)
        except OptionError as exc:
            raise AssetError(str(exc)) from None
    severity = vals.get("severity")
    if severity is not None and severity not in SEVERITIES:
        raise AssetError(f"severity {severity!r}: one of {', '.join(SEVERITIES)}")
    attrs = {k: vals.get(k) for k in ATTRIBUTES}
    return Asset(aid, kind, interval=interval, severity=severity, **attrs)


def _text(v: Any) -> str | None:
    """A field's value as text; empty and null are "not given"."""
    if v is None:
        return None
    if isinstance(v, (dict, list)):
        raise AssetError(f"{v!r}: expected a single value")
    if isinstance(v, bool):
        v = str(v).lower()
    text = str(v).strip()
    return text or None


def read_registry(path: str | Path) -> Registry:
    """A registry file (``.csv``, or ``.yaml``/``.yml``/``.json``), checked whole."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8-sig")  # a BOM (spreadsheets) is not a column name
    except (OSError, UnicodeDecodeError) as exc:
        raise AssetError(f"{p}: cannot read: {exc}") from None
    return parse_registry(raw, str(p), csv_format=p.suffix.lower() == ".csv")


def parse_registry(text: str, name: str, csv_format: bool) -> Registry:
    """The registry in ``text`` (``name`` for messages); ManyErrors listing every problem."""
    rows, fault, errors = (_csv_rows if csv_format else _yaml_rows)(text, name)
    assets: list[Asset] = []
    first: dict[tuple[str, str], int] = {}
    for line, data in rows:
        try:
            a = parse_asset(data)
        except AssetError as exc:
            errors.append(AssetError(f"{name}:{line}: {exc}"))
            continue
        key = (a.kind, a.id)
        if key in first:
            errors.append(
                AssetError(
                    f"{name}:{line}: duplicate {a.kind} id {a.id!r} (first on line {first[key]})"
                )  # fmt: skip
            )
            continue
        first[key] = line
        assets.append(a)
    if not assets and not errors:
        errors.append(AssetError(f"{name}: no assets"))
    if errors:
        errors.sort(key=lambda e: _line_of(str(e), name))
        raise errors[0] if len(errors) == 1 else ManyErrors(list(errors))
    return Registry(tuple(assets), fault.get("severity"), fault.get("subscriber"))


def _line_of(message: str, name: str) -> int:
    m = re.match(re.escape(name) + r":(\d+):", message)
    return int(m.group(1)) if m else 0


_Rows = tuple[list[tuple[int, dict[str, Any]]], dict[str, str], list[ENSError]]


def _csv_rows(text: str, name: str) -> _Rows:
    errors: list[ENSError] = []
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        return [], {}, [AssetError(f"{name}:1: empty file: expected a header row")]
    except csv.Error as exc:
        return [], {}, [AssetError(f"{name}:1: {exc}")]
    header = [h.strip() for h in header]
    bad = [h for h in header if h not in COLUMNS]
    if bad:
        errors.append(
            AssetError(
                f"{name}:1: unknown column{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(repr, bad))} (allowed: {', '.join(COLUMNS)})"
            )  # fmt: skip
        )
    if "id" not in header:
        errors.append(AssetError(f"{name}:1: no 'id' column"))
    if len(set(header)) != len(header):
        errors.append(AssetError(f"{name}:1: a column is named twice"))
    if errors:
        return [], {}, errors
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        for cells in reader:
            if not any(c.strip() for c in cells) or cells[0].lstrip().startswith("#"):
                continue
            if len(cells) != len(header):
                errors.append(
                    AssetError(
                        f"{name}:{reader.line_num}: {len(cells)} fields, the header has "
                        f"{len(header)}"
                    )  # fmt: skip
                )
                continue
            rows.append((reader.line_num, dict(zip(header, cells, strict=True))))
    except csv.Error as exc:
        errors.append(AssetError(f"{name}:{reader.line_num}: {exc}"))
    return rows, {}, errors


def _yaml_rows(text: str, name: str) -> _Rows:
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        return [], {}, [AssetError(f"{where}: not valid YAML: {exc}")]
    if isinstance(data, list):
        data, node = {"assets": data}, yaml.MappingNode("", [(yaml.ScalarNode("", "assets"), node)])
    if not isinstance(data, dict) or not isinstance(data.get("assets"), list):
        return [], {}, [AssetError(f"{name}:1: expected 'assets:' with a list of assets")]
    errors: list[ENSError] = []
    nodes = {k.value: v for k, v in node.value}
    for key in data:
        if key not in ("assets", "defaults", "fault"):
            line = next((k.start_mark.line + 1 for k, _ in node.value if k.value == key), 1)
            errors.append(
                AssetError(f"{name}:{line}: unknown key {key!r} (allowed: assets, defaults, fault)")
            )
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or "id" in defaults:
        line = nodes["defaults"].start_mark.line + 1 if "defaults" in nodes else 1
        errors.append(AssetError(f"{name}:{line}: defaults: a mapping of columns (not id)"))
        defaults = {}
    fault = data.get("fault") or {}
    fault_out: dict[str, str] = {}
    fline = nodes["fault"].start_mark.line + 1 if "fault" in nodes else 1
    if not isinstance(fault, dict):
        errors.append(AssetError(f"{name}:{fline}: fault: a mapping with {', '.join(FAULT_KEYS)}"))
        fault = {}
    for k, v in fault.items():
        if k not in FAULT_KEYS:
            errors.append(
                AssetError(
                    f"{name}:{fline}: fault: unknown key {k!r} (allowed: {', '.join(FAULT_KEYS)})"
                )  # fmt: skip
            )
        elif k == "severity" and v not in SEVERITIES:
            errors.append(
                AssetError(f"{name}:{fline}: fault.severity {v!r}: one of {', '.join(SEVERITIES)}")
            )
        else:
            fault_out[k] = str(v)
    rows: list[tuple[int, dict[str, Any]]] = []
    for item, inode in zip(data["assets"], nodes["assets"].value, strict=True):
        line = inode.start_mark.line + 1
        if not isinstance(item, dict):
            errors.append(AssetError(f"{name}:{line}: an asset is a mapping (id, kind, ...)"))
            continue
        rows.append((line, {**defaults, **item}))
    return rows, fault_out, errors
