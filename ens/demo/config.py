"""What `ens demo` runs and posts: its settings, the feed (a file, a data set or the
synthetic building), the profiles, the figures of a run."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ens.errors import DemoError
from ens.summary import ProfileRow
from profiles.events import Event, event_from_obj, parse_ts

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUICKSTART = EXAMPLES / "quickstart"
FACILITY_PROFILES = EXAMPLES / "facility" / "profiles.yaml"
DATASET_PROFILES = EXAMPLES / "facility-spark" / "profiles.yaml"
HOST = "127.0.0.1"
GATEWAY = "demo"


@dataclass
class DemoConfig:
    """What `ens demo` runs; every field has the no-argument default."""

    profiles: Path | None = None
    events: Path | None = None
    dataset: str | None = None
    dataset_path: Path | None = None
    days: float = 2.0
    buildings: int = 1
    seed: int = 1
    port: int = 0  # 0: a free port
    batch: int = 500
    reorder_seconds: float = 0.5
    show: int = 15  # print the first N notifications and the first N deliveries
    stall_timeout: float = 60.0  # give up when nothing moves for this long
    keep_running: bool = False


@dataclass
class Feed:
    """The events to post (time order, each with an id) and where they came from."""

    name: str
    events: list[dict[str, Any]]
    parsed: list[Event]
    profiles: Path
    truth: list[dict[str, Any]] | None = None  # injected incidents of the synthetic feed


@dataclass
class DemoResult:
    """The figures of one run (also what the tests assert on)."""

    feed: str
    events: int
    rows: list[ProfileRow]
    notifications: int
    replay_notifications: int
    replay_match: bool
    mails: int
    mails_expected: int
    webhooks_valid: int
    webhooks_invalid: int
    webhooks_expected: int
    dead_letters: int
    incidents: int | None  # injected incidents (synthetic feed with its own profiles), or None
    incidents_found: int
    post_seconds: float = 0.0
    total_seconds: float = 0.0
    service_status: int | None = None  # known once the service was stopped
    data_dir: str = ""  # the temporary directory (removed at the end)
    pids: list[int] = field(default_factory=list)  # processes the demo started
    leftovers: list[int] = field(default_factory=list)  # of those, still running at the end

    @property
    def ok(self) -> bool:
        return (
            self.replay_match
            and self.mails == self.mails_expected
            and self.webhooks_valid == self.webhooks_expected
            and not self.webhooks_invalid
            and not self.dead_letters
            and self.service_status == 0
            and not self.leftovers
            and self.incidents_found == (self.incidents or 0)
        )


# ----------------------------------------------------------------------------- inputs


def _prepare(raw: Iterable[Any], where: Callable[[int], str]) -> tuple[list[dict], list[Event]]:
    """Validate events as the service does, give each an id, sort them by time (stably)."""
    items: list[tuple[float, int, dict[str, Any], Event]] = []
    for i, obj in enumerate(raw):
        if hasattr(obj, "to_json"):
            obj = obj.to_json()
        try:
            ev = event_from_obj(obj, f"demo-{i + 1}")
        except ValueError as exc:
            raise DemoError(f"{where(i)}: {exc}") from None
        if isinstance(obj, dict) and obj.get("id") is None:
            obj = {**obj, "id": ev.id}
        items.append((ev.ts, i, obj, ev))
    items.sort(key=lambda t: (t[0], t[1]))
    return [t[2] for t in items], [t[3] for t in items]


def _read_jsonl(path: Path) -> tuple[list[dict], list[Event]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DemoError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DemoError(f"{path} is not UTF-8 text") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    objs = []
    for n, line in numbered:
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DemoError(f"{path}:{n}: invalid JSON: {exc.msg} at column {exc.colno}") from None
    return _prepare(objs, lambda i: f"{path}:{numbered[i][0]}")


def load_feed(cfg: DemoConfig) -> Feed:
    """The feed the options ask for (default: the synthetic facility feed)."""
    if cfg.events is not None and cfg.dataset is not None:
        raise DemoError("give --events or --dataset, not both")
    if cfg.days <= 0 or cfg.buildings < 1:
        raise DemoError("--days must be > 0 and --buildings >= 1")
    if cfg.events is not None:
        events, parsed = _read_jsonl(cfg.events)
        return Feed(str(cfg.events), events, parsed, cfg.profiles or QUICKSTART / "profiles.yaml")
    if cfg.dataset is not None:
        from adapters.datasets import DatasetError, get_adapter

        try:
            adapter = get_adapter(cfg.dataset)
            path = cfg.dataset_path or EXAMPLES / "data" / adapter.folder
            first: float | None = None
            raw = []
            for ev in adapter.iter_events(path):
                ts = parse_ts(ev["ts"])
                first = ts if first is None else first
                if ts >= first + cfg.days * 86400:
                    break
                raw.append(ev)
        except DatasetError as exc:
            raise DemoError(str(exc)) from None
        events, parsed = _prepare(raw, lambda i: f"{cfg.dataset} event {i + 1}")
        name = f"{cfg.dataset} ({path}), first {cfg.days:g} day(s)"
        return Feed(name, events, parsed, cfg.profiles or DATASET_PROFILES)
    from adapters.generate.facility import generate_facility

    if cfg.days != int(cfg.days):
        raise DemoError("--days must be a whole number for the synthetic facility feed")
    raw, truth = generate_facility(buildings=cfg.buildings, days=int(cfg.days), seed=cfg.seed)
    events, parsed = _prepare(raw, lambda i: f"generated event {i + 1}")
    name = f"synthetic facility feed, {cfg.buildings} building(s) x {cfg.days:g} day(s)"
    return Feed(name, events, parsed, cfg.profiles or FACILITY_PROFILES, truth=truth)


def load_profiles(path: Path) -> Any:
    """The profile file, or DemoError naming its first problem (``ens check`` lists all)."""
    from profiles.profile_file import parse_profile_document

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DemoError(f"cannot read profile file {path}: {exc.strerror}") from None
    pset, errors = parse_profile_document(text, str(path))
    if errors:
        more = f" (and {len(errors) - 1} more; see `ens check {path}`)" if len(errors) > 1 else ""
        raise DemoError(f"{errors[0]}{more}")
    if not pset.profiles:
        raise DemoError(f"{path}: no profiles")
    return pset
