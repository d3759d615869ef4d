"""`ens spark ...`: the batch jobs on the command line (mounted by ens/cli.py as `spark`).

Every command prints what it did as `spark: ...` lines on stderr and exits
with status 2 and one-line messages for bad input (profiles, events, paths),
without leaving partial output.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ens.options import PLAN_HELP, STATS_HELP, ReplayTz, check_tz, parse_duration, parse_time_arg
from profiles.errors import ENSError, ManyErrors

app = typer.Typer(
    help="Spark batch jobs: index large profile sets, replay feeds in parallel, filter statistics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

Master = Annotated[
    str, typer.Option("--master", help="Spark master (local[2], local[*], spark://...).")
]
Work = Annotated[
    str | None,
    typer.Option("--work", help="Directory for intermediate tables (default: next to --out)."),
]
ProfilesOpt = Annotated[
    Path | None, typer.Option("--profiles", "-p", help="Profile file (YAML or JSON).")
]
PlanOpt = Annotated[str, typer.Option(help=PLAN_HELP)]
StatsOpt = Annotated[str | None, typer.Option("--stats", help=STATS_HELP)]
IndexOpt = Annotated[Path | None, typer.Option("--index", help="Index snapshot (ens spark index).")]
DatasetOpt = Annotated[
    str | None, typer.Option("--dataset", help="Read FEED with a data-set adapter (keti, ...).")
]
RoomsOpt = Annotated[
    str | None, typer.Option("--rooms", help="Data set: only these rooms (comma-separated).")
]
InputFormatOpt = Annotated[
    str | None, typer.Option("--input-format", help="jsonl, csv or parquet (default: by name).")
]


def _logger() -> Callable[[str], None]:
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        typer.echo(f"spark: [{time.perf_counter() - t0:6.1f}s] {msg}", err=True)

    return log


def _user_error(e: BaseException) -> str | None:
    """The message of a user error, also when it was raised inside a Spark task."""
    if isinstance(e, ENSError):
        return str(e)
    text = str(e)
    for name in ("DatasetError", "ENSError", "EventError", "ProfileError"):
        marker = f"{name}: "
        if marker in text:
            return text.split(marker)[-1].strip().splitlines()[0]
    return None


@contextmanager
def _errors() -> Iterator[None]:
    """User errors (also from inside Spark tasks) become `error:` lines and exit status 2."""
    try:
        yield
    except typer.Exit:
        raise
    except ManyErrors as e:
        for err in e.errors:
            typer.echo(f"error: {err}", err=True)
        typer.echo(f"{len(e.errors)} problems", err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # noqa: BLE001 - sorted into user errors and failures below
        msg = _user_error(e)
        if msg is None:
            raise
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def _session(master: str, jit: str | None = None) -> Iterator[Any]:
    """The active session (tests share one), or a new one that is stopped afterwards."""
    from pyspark.sql import SparkSession

    from adapters.spark.session import get_spark

    existing = SparkSession.getActiveSession()
    spark = existing or get_spark(master, jit=jit)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def _load_profiles(
    profiles: Path | None, index: Path | None, log: Callable[[str], None]
) -> list[Any]:
    from profiles.profile_file import load_profile_file

    if (profiles is None) == (index is None):
        raise ENSError("give the profiles as --profiles FILE or --index INDEX (one of them)")
    if index is not None:
        from adapters.spark.index import load_index

        t = time.perf_counter()
        indexed = load_index(index)
        log(f"loaded {len(indexed)} profiles from index {index} in {time.perf_counter() - t:.2f}s")
        return indexed
    ps = load_profile_file(profiles)  # type: ignore[arg-type]
    log(f"{len(ps.profiles)} profiles from {profiles}")
    return ps.profiles


def _check_feed(
    feed: str,
    fmt: str | None,
    formats: tuple[str, ...],
    dataset: str | None = None,
    rooms: str | None = None,
) -> None:
    """Fail before Spark starts (~10 s) when the arguments cannot work."""
    if dataset is not None:
        from adapters.datasets import get_adapter

        get_adapter(dataset)  # an unknown name is a DatasetError listing the known ones
    elif rooms:
        raise ENSError("--rooms applies to --dataset only")
    if not Path(feed).exists():
        raise ENSError(f"no such file: {feed}")
    if fmt is not None and fmt not in formats:
        raise ENSError(f"unknown output format {fmt!r} ({' or '.join(formats)})")


def _source(
    spark: Any, feed: str, key: str, dataset: str | None, rooms: str | None, fmt: str | None
):  # noqa: ANN202
    from adapters.spark.feed import read_dataset, read_feed

    if dataset is not None:
        room_list = [r for r in rooms.split(",") if r] if rooms else None
        return lambda plan=None: read_dataset(spark, dataset, feed, key, plan, room_list)
    if rooms:
        raise ENSError("--rooms applies to --dataset only")
    return lambda plan=None: read_feed(spark, feed, key, plan, fmt)


@app.command()
def index(
    profiles: Annotated[
        str, typer.Argument(help="Profiles: JSON lines {id, expr, subscriber}, Parquet, or YAML.")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Index snapshot directory to write.")],
    errors: Annotated[
        str | None,
        typer.Option(
            "--errors", help="Write bad profiles here (JSON lines {id, error, line, column})."
        ),
    ] = None,
    master: Master = "local[2]",
) -> None:
    """Parse and validate a large profile set in parallel into an index snapshot (loads without parsing)."""
    from adapters.spark.index import index_job

    log = _logger()
    with _errors():
        if not Path(profiles).exists():
            raise ENSError(f"no such file: {profiles}")
        with _session(master) as spark:
            log(f"indexing {profiles} on {master}")
            m = index_job(spark, profiles, out, errors=errors, log=log)
    c = m["counts"]
    if c["errors"]:
        where = f"; see {errors}" if errors else "; use --errors FILE to see them"
        log(f"{c['errors']} bad profile(s) not indexed{where}")
    typer.echo(f"{out}: {c['profiles']} profiles indexed, {c['errors']} rejected")


_ReplayOut = Annotated[
    str, typer.Option("--out", "-o", help="Notifications file (jsonl) or directory (parquet).")
]
_ReplayFeed = Annotated[
    str | None,
    typer.Argument(
        help="Events: JSON lines, CSV or Parquet (.gz ok); with --dataset its path; "
        "none with --archive."
    ),
]
_ReplayKey = Annotated[
    str, typer.Option("--key", help="Partition attribute: per-key profiles run in parallel.")
]
_ReplayUntil = Annotated[
    str | None, typer.Option(help="End time (epoch seconds or RFC 3339); timers up to it fire.")
]
_ReplayArchive = Annotated[
    str | None,
    typer.Option(
        "--archive",
        help="Read the events from the service's event archive (path or URI; 'on': "
        "$ENS_DATA_DIR/archive), --from/--to, instead of FEED.",
    ),
]
_ReplayStart = Annotated[
    str | None, typer.Option("--from", help="--archive: start (7d, RFC 3339).")
]


@app.command()
def replay(
    out: _ReplayOut,
    feed: _ReplayFeed = None,
    profiles: ProfilesOpt = None,
    index: IndexOpt = None,
    key: _ReplayKey = "building",
    fmt: Annotated[str, typer.Option("--format", help="Output: jsonl or parquet.")] = "jsonl",
    until: _ReplayUntil = None,
    tz: ReplayTz = "UTC",
    dataset: DatasetOpt = None,
    rooms: RoomsOpt = None,
    input_format: InputFormatOpt = None,
    master: Master = "local[2]",
    work: Work = None,
    plan: PlanOpt = "eager",
    stats_file: StatsOpt = None,
    archive: _ReplayArchive = None,
    start: _ReplayStart = None,
    to: Annotated[str | None, typer.Option("--to", help="--archive: end (default now).")] = None,
) -> None:
    """Replay a feed through the profiles; output identical to `ens replay` (same order)."""
    from adapters.spark.replay import replay_job
    from ens.plans import check_plan, load_stats

    log = _logger()
    with _errors():
        check_tz(tz)
        check_plan(plan)
        rates = load_stats(stats_file)
        ps = _load_profiles(profiles, index, log)
        end = parse_time_arg(until)
        if archive is not None:
            if feed is not None or dataset is not None:
                raise ENSError("with --archive give no FEED (nor --dataset)")
            paths, t0, t1 = _archive_paths(archive, start, to, log)
            feed = archive
        elif feed is None:
            raise ENSError("give the FEED (or --archive URI)")
        else:
            _check_feed(feed, fmt, ("jsonl", "parquet"), dataset, rooms)
        with _session(master) as spark:
            if archive is not None:
                from adapters.spark.feed import read_archive

                def src(plan: Any = None) -> Any:
                    return read_archive(spark, paths, key, plan, t0, t1)
            else:
                src = _source(spark, feed, key, dataset, rooms, input_format)
            log(f"replaying {feed} by {key} on {master}")
            ds = None
            if dataset is not None:
                ds = (dataset, feed, [r for r in rooms.split(",") if r] if rooms else None)
            st = replay_job(
                spark,
                ps,
                src,
                out,
                key=key,
                fmt=fmt,
                until=end,
                tz=tz,
                work=work,
                dataset=ds,
                log=log,
                evaluation=plan,
                rates=rates,
            )
    typer.echo(f"{out}: {st.notifications} notifications from {st.events} events")


def _archive_paths(
    archive: str, start: str | None, to: str | None, log: Callable[[str], None]
) -> tuple[list[str], float | None, float | None]:
    """The readable archive files of the range (corrupt ones named and skipped), as Spark
    paths, and the range."""
    from adapters.archive.layout import open_archive
    from adapters.archive.reader import check_file, scan
    from adapters.spark.feed import spark_path
    from ens.archive_time import archive_uri, parse_when

    t0, t1 = parse_when("--from", start), parse_when("--to", to or "now")
    arc = open_archive(archive_uri(archive))
    sc = scan(arc, t0, t1)
    scheme = None if arc.local else arc.uri.split("://", 1)[0]
    paths = []
    for f in sc.files:
        try:
            check_file(arc, f)
        except Exception as exc:  # noqa: BLE001 - skipped and counted, never a crash
            log(f"warning: skipped corrupt archive file {f.path}: {exc}")
            continue
        paths.append(spark_path(scheme, f.path))
    if not paths:
        raise ENSError(f"no readable archive file in {archive} for the range")
    log(f"{len(paths)} archive files ({len(sc.files) - len(paths)} corrupt skipped)")
    return paths, t0, t1


@app.command()
def stats(
    feed: Annotated[
        str, typer.Argument(help="Events: JSON lines, CSV or Parquet; with --dataset its path.")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Statistics JSON to write.")],
    profiles: ProfilesOpt = None,
    index: IndexOpt = None,
    dataset: DatasetOpt = None,
    rooms: RoomsOpt = None,
    input_format: InputFormatOpt = None,
    master: Master = "local[2]",
    work: Work = None,
) -> None:
    """Count, per profile component, the matching events: number, rate per hour, selectivity."""
    from adapters.spark.stats import stats_job

    log = _logger()
    with _errors():
        ps = _load_profiles(profiles, index, log)
        _check_feed(feed, None, (), dataset, rooms)
        with _session(master) as spark:
            src = _source(spark, feed, "building", dataset, rooms, input_format)
            name = f"{dataset}:{feed}" if dataset else feed
            doc = stats_job(spark, ps, src, out, name=name, work=work, log=log)
    typer.echo(f"{out}: {len(doc['filters'])} filters over {doc['events']} events")


def main() -> None:  # pragma: no cover - `python -m ens.commands.spark`
    try:
        app()
    except ENSError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()


def _interval(flag: str, text: str) -> float:
    """'500ms', '1s', '2m', '1.5' (seconds) -> seconds: the one duration type."""
    return parse_duration(flag, text)


def _check_stream_options(
    clock: str,
    partitions: int,
    late_events: str,
    late_max: int,
    state_api: str | None = None,
    jit: str = "c1",
) -> None:
    if clock not in ("wall", "event"):
        raise ENSError(f"--clock must be wall or event, not {clock!r}")
    if partitions < 0:
        raise ENSError(f"--partitions must be >= 0, not {partitions}")
    if late_events not in ("output", "feed"):
        raise ENSError(f"--late-events must be output or feed, not {late_events!r}")
    if late_max < 1:
        raise ENSError(f"--late-max must be >= 1, not {late_max}")
    if state_api is not None and state_api not in ("pandas", "rows"):
        raise ENSError(f"--state-api must be pandas or rows, not {state_api!r}")
    from adapters.spark.session import JIT_MODES

    if jit not in JIT_MODES:
        raise ENSError(f"--jit must be {' or '.join(sorted(JIT_MODES))}, not {jit!r}")


def _reach_redis(redis_url: str) -> str:
    """Ping the Redis the executors will use; its URL as shown (no password)."""
    import redis

    from profiles.subscribers import mask_url

    shown = mask_url(redis_url, query=False)  # a Redis password is not shown
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=5).ping()
    except (redis.RedisError, ValueError) as e:
        raise ENSError(f"cannot reach Redis at {shown}: {e}") from None
    return shown


_StreamRedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="ENS_REDIS_URL",
        help="The service's Redis (reachable from every executor).",
    ),
]
_StreamKey = Annotated[
    str, typer.Option("--key", help="Partition attribute: one engine per value, in parallel.")
]
_StreamCheckpoint = Annotated[
    str,
    typer.Option(
        help="Spark checkpoint directory (offsets, engine states); a restart "
        "with the same one resumes exactly where the query stopped."
    ),
]
_StreamLateness = Annotated[
    str,
    typer.Option(
        help="How far out of ts order events may arrive (the watermark's "
        "delay; `ens serve --default-lateness`)."
    ),
]
_StreamIdleTimeout = Annotated[
    str,
    typer.Option(
        help="A gateway silent this long holds no event back (`ens serve --idle-timeout`)."
    ),
]
_StreamClock = Annotated[
    str,
    typer.Option(
        help="wall: timers also fire by the wall clock minus the largest "
        "active lateness; event: only by event time."
    ),
]
_StreamTz = Annotated[
    str,
    typer.Option(
        help="Time zone of clock(...) events and of localtime/weekday (a profile file's tz: wins)."
    ),
]
_StreamPartitions = Annotated[
    int, typer.Option(help="Source partitions per micro-batch (0: 2 x cores).")
]
_StreamRunFor = Annotated[
    float | None,
    typer.Option(
        "--run-for",
        help="Stop after this many seconds (tests, benchmarks); default: until Ctrl-C.",
    ),
]
_StreamLateEvents = Annotated[
    str,
    typer.Option(
        "--late-events",
        help="An event older than its engine's time when read: output: kept out of the "
        "engine, in the service's late output (ens notifications late); feed: fed at "
        "once, in arrival order (`ens serve --late-events`).",
    ),
]
_StreamLateMax = Annotated[
    int,
    typer.Option(
        "--late-max",
        help="Keep about this many late events in the late output (ens:late; the oldest "
        "go first; `ens serve --late-max`).",
    ),
]
_StreamStateApi = Annotated[
    str | None,
    typer.Option(
        "--state-api",
        envvar="ENS_SPARK_STATE_API",
        help="Advanced: the per-route operator's PySpark API, pandas "
        "(transformWithStateInPandas) or rows (transformWithState); same state, same "
        "output (docs/spark.md). Default: rows.",
    ),
]
_StreamJit = Annotated[
    str,
    typer.Option(
        "--jit",
        envvar="ENS_SPARK_JIT",
        help="Advanced: the JVM's JIT compilers, c1 (C1 only: far less compile CPU on "
        "small micro-batches) or full (C1 then C2, the JVM's default: faster code after "
        "minutes of warm-up); docs/spark.md.",
    ),
]


@app.command()
def stream(
    redis_url: _StreamRedisUrl = None,
    key: _StreamKey = "building",
    master: Master = "local[2]",
    checkpoint: _StreamCheckpoint = ".ens-spark-stream",
    trigger: Annotated[str, typer.Option(help="Micro-batch interval (500ms, 1s, ...).")] = "1s",
    lateness: _StreamLateness = "2s",
    idle_timeout: _StreamIdleTimeout = "500ms",
    clock: _StreamClock = "wall",
    tz: _StreamTz = "UTC",
    partitions: _StreamPartitions = 0,
    run_for: _StreamRunFor = None,
    late_events: _StreamLateEvents = "output",
    late_max: _StreamLateMax = 10_000,
    state_api: _StreamStateApi = None,
    jit: _StreamJit = "c1",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ...")] = "INFO",
    plan: PlanOpt = "eager",
    stats_file: StatsOpt = None,
) -> None:
    """Live detection on Spark Structured Streaming: ens:ingest -> engines per key -> ens:outbox.

    Run the service with `ens serve --engine spark` (API and delivery, no engine thread).
    """
    from ens.plans import check_plan, load_stats

    log = _logger()
    with _errors():
        check_tz(tz)
        check_plan(plan)
        rates = load_stats(stats_file)
        if not redis_url:
            raise ENSError("--redis-url (or ENS_REDIS_URL) is required: executors connect to it")
        _check_stream_options(clock, partitions, late_events, late_max, state_api, jit)
        trig = _interval("--trigger", trigger)
        late = _interval("--lateness", lateness)
        idle = _interval("--idle-timeout", idle_timeout)
        from adapters.spark.keyed import check_checkpoint

        why = check_checkpoint(checkpoint)
        if why:
            raise ENSError(why)
        shown = _reach_redis(redis_url)
        from notifiers.logs import setup_logging

        setup_logging(log_level)
        from adapters.spark.stream import StreamConfig, start_query

        cfg = StreamConfig(
            redis_url,
            key=key,
            checkpoint=checkpoint,
            trigger=f"{int(round(trig * 1000))} milliseconds",
            lateness=late,
            idle_timeout=idle,
            clock=clock,
            tz=tz,
            partitions=partitions,
            plan=plan,
            rates=rates,
            late_events=late_events,
            late_max=late_max,
        )
        if state_api:
            cfg = replace(cfg, state_api=state_api)
        stop = _stop_on_signals()
        with _session(master, jit) as spark:
            q = start_query(spark, cfg)
            log(f"streaming {shown} by {key} on {master}, checkpoint {checkpoint}")
            _run_until_stopped(q, stop, run_for)
            log("stopped")


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set (a graceful stop from then on, the JVM's start too)."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _run_until_stopped(q: Any, stop: threading.Event, run_for: float | None) -> None:
    """Wait for `stop`, `run_for` seconds or the query's end; stop the query; raise its error."""
    deadline = None if run_for is None else time.monotonic() + run_for
    while not stop.is_set() and q.isActive:
        if deadline is not None and time.monotonic() >= deadline:
            break
        stop.wait(0.5)
    err = q.exception()
    q.stop()
    if err is not None:
        raise RuntimeError(f"the streaming query failed: {err}")
