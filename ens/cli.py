"""The `ens` command line."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ens.commands.output import fail
from ens.commands.store import DataDir, RedisUrl
from ens.options import (
    PLAN_HELP,
    STATS_HELP,
    ReplayTz,
    check_tz,
    parse_time_arg,
    tidy_help_metavars,
)
from filters.caps import DEFAULT_NOTIFICATIONS, DEFAULT_PARTITION, DEFAULT_PROFILE, Caps
from profiles.errors import ENSError, ManyErrors

if TYPE_CHECKING:  # (imported where used: `ens --help` stays quick)
    from filters.interface import DetectionEngine
    from filters.plans import Rates
    from profiles.ast import Profile

tidy_help_metavars()
app = typer.Typer(
    help="ENS: event notification service for facility management (single-step composite event filtering).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"ens {version('ens')}")
        except PackageNotFoundError:  # a checkout that was never pip-installed
            typer.echo("ens (not installed: version unknown)")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version of ens and exit.",
        ),
    ] = False,
) -> None:
    pass


def report_errors(err: ENSError) -> typer.Exit:
    if isinstance(err, ManyErrors):
        for e in err.errors:
            typer.echo(f"error: {e}", err=True)
        typer.echo(f"{len(err.errors)} problems", err=True)
        return typer.Exit(2)
    return fail(str(err))


def read_event_file(path: str, progress=None) -> list:  # noqa: ANN001 - list[Event]
    """Every event of a JSON-lines file ('-' for stdin, .gz allowed); unreadable input is a user error.

    ``progress(bytes read)`` is called as the file is read, if given.
    """
    from ens.event_files import open_text, tracked
    from profiles.events import read_events

    try:
        with open_text(path) as fh:
            lines = fh if progress is None else tracked(fh, progress)
            return read_events(lines, source="<stdin>" if path == "-" else path)
    except UnicodeDecodeError:
        raise ENSError(f"{path}: not UTF-8 text (events are JSON lines in UTF-8)") from None
    except (OSError, EOFError) as e:  # a corrupt or truncated .gz
        raise ENSError(
            f"cannot read event file {path}: {getattr(e, 'strerror', None) or e}"
        ) from None


def write_lines(records: list[dict], out: str | None) -> None:
    """Write JSON lines atomically: a failed run never leaves a half-written result."""
    text = "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in records)
    if out is None or out == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from adapters.files import atomic_text

    if Path(out).is_dir():
        raise ENSError(f"--out {out} is a directory; give a file name")
    try:
        with atomic_text(out, gzip_gz=False) as fh:  # as before: JSON lines whatever the name
            fh.write(text)
    except OSError as e:
        raise ENSError(
            f"cannot write --out {out}: {e.strerror or e} ({Path(out).parent})"
        ) from None


@app.command()
def check(
    ctx: typer.Context,
    profiles: Annotated[Path, typer.Argument(help="Profile file (YAML or JSON).")],
    events: Annotated[
        str | None,
        typer.Option(
            help="Warn about attributes no event of this JSON-lines file carries "
            "('-' for stdin, .gz allowed).",
            metavar="FILE",
        ),
    ] = None,
    service: Annotated[
        bool,
        typer.Option(
            "--service",
            help="Warn about attributes no event the service has seen carried (its store: "
            "--redis-url or --data-dir, as for `ens profile add`).",
        ),
    ] = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    stats: Annotated[
        Path | None,
        typer.Option(
            help="An `ens spark stats` file: also warn about `select each` profiles whose "
            "starting components are frequent for their window (partial matches pile up)."
        ),
    ] = None,
    max_partial_matches: Annotated[
        int, typer.Option(min=1, help="--stats: the cap per partition of ens serve.")
    ] = DEFAULT_PARTITION,
    max_notifications_per_event: Annotated[
        int, typer.Option(min=1, help="--stats: the cap of ens serve.")
    ] = DEFAULT_NOTIFICATIONS,
) -> None:
    """Validate a profile file and print every problem, not just the first.

    Valid profiles that will likely never fire get warnings; with --events or --service also
    those that read an attribute no event has carried (a typo such as `knd`).
    """
    from profiles.profile_file import parse_profile_document, read_profile_text

    try:
        pset, errors = parse_profile_document(read_profile_text(profiles), str(profiles))
    except ENSError as e:
        raise fail(str(e)) from None
    for err in errors:
        typer.echo(f"error: {err}", err=True)
    if errors:
        typer.echo(pset.summary(str(profiles), errors), err=True)
        raise typer.Exit(2)
    if not pset.profiles:
        typer.echo(f"warning: {profiles} defines no profiles", err=True)
    from ens.plans import load_stats
    from profiles.lint import start_components, unbounded_matches, warnings

    seen = _known_attributes(
        events, service or _given(ctx, "redis_url", "data_dir"), redis_url, data_dir
    )
    try:
        rates = load_stats(stats)
    except ENSError as e:
        raise report_errors(e) from None
    for p in pset.profiles:
        found = warnings(p, seen)
        starts = start_components(p) if rates is not None else []
        if rates is not None and starts:
            names = [n for n, _ in starts]
            measured = rates.for_profile(p, names, [f for _, f in starts])
            found += unbounded_matches(
                p, measured, max_partial_matches, max_notifications_per_event
            )
        for w in found:
            typer.echo(f"warning: {w}", err=True)
    typer.echo(f"{profiles}: {len(pset.profiles)} profiles OK, {len(pset.subscribers)} subscribers")


def _given(ctx: typer.Context, *params: str) -> bool:
    """Whether any of these options was on the command line (not from its variable)."""
    return any(getattr(ctx.get_parameter_source(p), "name", "") == "COMMANDLINE" for p in params)


def _known_attributes(
    events: str | None, service: bool, redis_url: str | None, data_dir: Path | None
) -> set[str] | None:
    """The attribute names `ens check` checks profiles against (None: no check)."""
    seen: set[str] = set()
    if events is not None:
        try:
            for ev in read_event_file(events):
                seen.update(ev.attrs)
        except ENSError as e:
            raise fail(str(e)) from None
    if service:
        from adapters.service import redis_store as rs
        from ens.commands.store import Store

        seen |= rs.seen_attributes(Store(redis_url, data_dir).r) or set()
    return seen if (events is not None or service) else None


def load_inputs(profiles: Path, events: str | None):  # noqa: ANN201
    """The profile file (all problems at once) and, if given, the events."""
    from profiles.profile_file import load_profile_file

    pset = load_profile_file(profiles)
    if events is None:
        return pset, []
    return pset, read_event_file(events)


def make_engine(
    engine: str,
    profiles: Iterable[Profile],
    tz: str,
    variant: str | None = None,
    plan: str = "eager",
    rates: Rates | None = None,
) -> DetectionEngine:
    if engine == "single-step":
        from filters.engine import Engine

        if variant and variant not in Engine.VARIANTS:
            raise ENSError(f"unknown variant {variant!r} (one of {', '.join(Engine.VARIANTS)})")
        return Engine(
            profiles, tz=tz, variant=variant or Engine.DEFAULT_VARIANT, plan=plan, rates=rates
        )
    if engine == "two-step":
        if variant:
            raise ENSError("--variant applies to the single-step engine only")
        if plan != "eager":
            raise ENSError("--plan applies to the single-step engine only")
        from filters.twostep import TwoStepEngine  # type: ignore[import-not-found]

        return TwoStepEngine(profiles, tz=tz)
    raise ENSError(f"unknown engine {engine!r} (single-step or two-step)")


PROGRESS_BYTES = 1 << 20  # a bar for event files from 1 MiB; smaller ones take a blink


class _ReplayProgress:
    """A transient bar on stderr while `ens replay` reads and runs a large file.

    Only when stderr is a terminal: a pipe or a log file gets nothing, so scripts see the same
    output as before. The bar goes away when the replay ends.
    """

    def __init__(self, events: str) -> None:
        self.bar = None
        size = Path(events).stat().st_size if events != "-" and Path(events).is_file() else 0
        if not sys.stderr.isatty() or size < PROGRESS_BYTES:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description:<15}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.reading = self.bar.add_task("reading events", total=size)

    def read(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.reading, completed=done)

    def replaying(self, total: int):  # noqa: ANN201 - the callback or None
        if self.bar is None:
            return None
        self.bar.update(self.reading, completed=self.bar.tasks[0].total)
        task = self.bar.add_task("replaying", total=total)
        return lambda done: self.bar.update(task, completed=done)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _archive_events(archive: str, start: str | None, to: str | None) -> list:
    """The events of the archive's range, in engine order (corrupt files warned, skipped)."""
    from adapters.archive.layout import open_archive
    from adapters.archive.reader import read_events
    from ens.archive_time import archive_uri, parse_when

    t0, t1 = parse_when("--from", start), parse_when("--to", to or "now")
    evs, sc = read_events(
        open_archive(archive_uri(archive)), t0, t1, lambda m: typer.echo(m, err=True)
    )
    if sc.skipped:
        typer.echo(f"warning: {len(sc.skipped)} corrupt archive files skipped", err=True)
    return evs


def _warn_lint(profiles: list, events: list) -> None:
    """Warnings on stderr for profiles that will likely never fire (profiles.lint), with the
    attribute names the event file carries."""
    from profiles.lint import warnings

    seen: set[str] = set()
    for ev in events:
        seen.update(ev.attrs)
    for p in profiles:
        for w in warnings(p, seen or None):
            typer.echo(f"warning: {w}", err=True)


_ReplayPaths = Annotated[
    list[str],
    typer.Argument(
        help="PROFILES EVENTS: a profile file (YAML or JSON) and a JSON-lines event file "
        "('-' for stdin, .gz allowed); with --index only EVENTS; with --archive only "
        "PROFILES.",
        metavar="[PROFILES] EVENTS",
    ),
]
_ReplayOut = Annotated[
    str | None, typer.Option("--out", "-o", help="Write notifications here (default stdout).")
]
_ReplayUntil = Annotated[
    str | None, typer.Option(help="End time (epoch seconds or RFC 3339); timers up to it fire.")
]
_ReplayIndex = Annotated[
    Path | None,
    typer.Option(help="Load the profiles from an `ens spark index` snapshot instead (no parsing)."),
]
_ReplayEngine = Annotated[str, typer.Option(help="single-step (CompAS) or two-step (baseline).")]
_ReplayVariant = Annotated[
    str | None,
    typer.Option(
        help="Single-step variant (how auxiliary profiles are kept; same output): references "
        "(default: kept in the pool, only their owner references change, lazily), dynamic "
        "(inserted and deleted as partial matches need them), marking (kept in the pool and "
        "marked/unmarked until the partition empties). Not with --engine two-step."
    ),
]
_ReplayArchive = Annotated[
    str | None,
    typer.Option(
        "--archive",
        help="Read the events from the service's event archive (a path or URI; 'on': "
        "$ENS_DATA_DIR/archive) instead of a file, --from/--to (docs/archive.md).",
    ),
]
_ReplayStart = Annotated[
    str | None,
    typer.Option("--from", help="--archive: start (7d back from now, RFC 3339, epoch s)."),
]
_ReplayTo = Annotated[
    str | None, typer.Option("--to", help="--archive: end (exclusive; default now).")
]
_ReplayAlarms = Annotated[
    bool,
    typer.Option(
        "--alarms",
        help="Run the matches through the profiles' alarm rules in event time: write the "
        "alarm transitions (not the notifications) and a summary per subscriber on stderr "
        "(docs/alarms.md).",
    ),
]
_ReplaySilences = Annotated[
    Path | None,
    typer.Option(help="With --alarms: a YAML file of silences (`silences: [...]`)."),
]
_ReplayMessages = Annotated[
    str | None, typer.Option(help="With --alarms: write the messages (JSON lines) here.")
]
_ReplayRouting = Annotated[
    Path | None,
    typer.Option(
        "--routing",
        help="With --alarms: a routing file (docs/routing.md), as `ens serve --routing`: "
        "print who would have been told what and when (stderr; --json: JSON lines on "
        "stdout, the transitions then only to --out).",
    ),
]
_ReplayGroupBy = Annotated[
    str | None,
    typer.Option(
        help="With --alarms: group each subscriber's notices by these labels (comma "
        "separated, e.g. building; '' = one group per subscriber). Default: no grouping."
    ),
]
_ReplayGroupWait = Annotated[
    str, typer.Option(help="With --group-by: a new group waits this long (Alertmanager's).")
]
_ReplayGroupInterval = Annotated[
    str, typer.Option(help="With --group-by: then at most one message per group this often.")
]
_ReplayCap = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="With --alarms: at most N messages per subscriber per hour; the rest "
        "goes into the next digest.",
    ),
]
_ReplaySummary = Annotated[
    bool,
    typer.Option(
        "--summary",
        help="Print a table per profile instead of the notifications (matches, top "
        "partitions, first and last); the notifications go to --out only.",
    ),
]
_ReplayAsJson = Annotated[
    bool,
    typer.Option("--json", help="The summary as one JSON document (implies --summary)."),
]
_ReplayPlot = Annotated[
    Path | None,
    typer.Option(
        help="Also write a PNG of notifications per hour per profile (the --top profiles "
        "with most, the rest as 'other').",
        metavar="FILE.png",
    ),
]
_ReplayTop = Annotated[
    int, typer.Option(help="Profiles with a series of their own in --plot.", min=1)
]


@app.command()
def replay(
    paths: _ReplayPaths,
    out: _ReplayOut = None,
    until: _ReplayUntil = None,
    index: _ReplayIndex = None,
    engine: _ReplayEngine = "single-step",
    variant: _ReplayVariant = None,
    tz: ReplayTz = "UTC",
    plan: Annotated[str, typer.Option(help=PLAN_HELP)] = "eager",
    stats: Annotated[Path | None, typer.Option(help=STATS_HELP)] = None,
    archive: _ReplayArchive = None,
    start: _ReplayStart = None,
    to: _ReplayTo = None,
    alarms: _ReplayAlarms = False,
    silences: _ReplaySilences = None,
    messages: _ReplayMessages = None,
    routing: _ReplayRouting = None,
    group_by: _ReplayGroupBy = None,
    group_wait: _ReplayGroupWait = "30s",
    group_interval: _ReplayGroupInterval = "5m",
    cap: _ReplayCap = None,
    summary: _ReplaySummary = False,
    as_json: _ReplayAsJson = False,
    plot: _ReplayPlot = None,
    top: _ReplayTop = 8,
) -> None:
    """Replay events through profiles and write the notifications as JSON lines (docs/language.md §6).

    With --alarms, write the alarm transitions instead and a summary per subscriber: how many
    messages the alarms would have sent without and with grouping and silences.

    With --summary (or --json) a table per profile instead: how many notifications, the
    partitions with most, the first and last (docs/replay.md).
    """
    from ens.plans import check_plan, load_stats

    try:
        end = parse_time_arg(until)
        check_tz(tz)
        check_plan(plan)
        rates = load_stats(stats)
        alarm_opts = (silences, messages, group_by, cap, routing)
        _check_replay_options(paths, index, archive, (start, to), alarms, alarm_opts, plot)
        if index is not None:
            if alarms:
                raise ENSError("--alarms needs the profile file (an index has no alarm blocks)")
            if len(paths) != 1:
                raise ENSError("with --index give only the EVENTS file")
            from adapters.spark.index import load_index

            profiles = load_index(index)
            events = paths[0]
        else:
            if len(paths) != (1 if archive is not None else 2):
                raise ENSError("give PROFILES and EVENTS (or --index INDEX and EVENTS)")
            pset, _ = load_inputs(Path(paths[0]), None)
            profiles = pset.profiles
            events = paths[1] if archive is None else archive  # the archive: its name
            if alarms:
                _replay_alarms(
                    pset, events, end, tz, (engine, variant, plan, rates), silences,
                    (group_by, group_wait, group_interval, cap), out, messages,
                    _archive_events(archive, start, to) if archive is not None else None,
                    routing, as_json,
                )  # fmt: skip
                return
        evs_of = (lambda _: _archive_events(archive, start, to)) if archive is not None else None
        notes = _replay_events(
            profiles, events, evs_of, index is None, end, (engine, tz, variant, plan, rates)
        )
        _write_replay(
            [n.to_json() for n in notes], out, profiles, events, summary, as_json, plot, top
        )
    except ENSError as e:
        raise report_errors(e) from None


def _check_replay_options(  # noqa: ANN001 - the CLI's options, passed through
    paths: list[str], index, archive, window: tuple, alarms: bool, alarm_opts: tuple, plot
) -> None:
    """`ens replay`'s options that go together (the inputs are read after)."""
    if archive is not None:
        if index is not None or len(paths) != 1:
            raise ENSError("with --archive give only the PROFILES file")
    elif any(w is not None for w in window):
        raise ENSError("--from/--to apply to --archive only")
    if any(o is not None for o in alarm_opts) and not alarms:
        raise ENSError("--silences, --messages, --group-by, --cap and --routing go with --alarms")
    if plot is not None:
        from ens.summary import check_plot_path

        check_plot_path(plot)


def _replay_events(  # noqa: ANN001 - the CLI's parts, passed through
    profiles: list, events: str, archived, lint: bool, end, eng: tuple
) -> list:
    """Read the events (a file, or `archived(events)`), run them through a new engine."""
    from ens.replay import replay as run

    engine, tz, variant, plan, rates = eng
    bar = _ReplayProgress(events if archived is None else "")
    try:
        if archived is not None:
            evs = archived(events)
        else:
            evs = read_event_file(events, bar.read if bar.bar is not None else None)
        if lint:
            _warn_lint(profiles, evs)
        engine_ = make_engine(engine, profiles, tz, variant, plan, rates)
        # The engine and the events live as long as the run: out of the collector's scans
        # (at 10^5 profiles they made every event ~1.7x dearer; docs/benchmarks.md).
        gc.collect()
        gc.freeze()
        return run(profiles, evs, end, engine=engine_, progress=bar.replaying(len(evs)))
    finally:
        gc.unfreeze()
        bar.stop()


def _write_replay(  # noqa: ANN001 - the CLI's options, passed through
    records: list[dict], out, profiles: list, events: str, summary: bool, as_json: bool, plot, top
) -> None:
    """The notifications to --out (or stdout), and the summary table, JSON or plot if asked."""
    if not (summary or as_json) or out is not None:
        write_lines(records, out)
    if summary or as_json or plot is not None:
        from ens.commands.output import console
        from ens.summary import report

        report(
            profiles,
            records,
            events,
            show=summary,
            as_json=as_json,
            plot=plot,
            top=top,
            console=console(),
        )


def _replay_alarms(  # noqa: ANN001 - the CLI's parts, passed through
    pset, events: str, end, tz: str, eng: tuple, silences: Path | None, grouping: tuple,
    out: str | None, messages: str | None, archived: list | None = None,
    routing_file: Path | None = None, as_json: bool = False,
) -> None:  # fmt: skip
    """`ens replay --alarms` (ens/alarm_replay.py): transitions out, a summary on stderr."""
    from rich.console import Console

    from ens.alarm_replay import (
        read_silences,
        replay_alarms,
        run_engine,
        summary_rows,
        summary_table,
    )
    from notifiers.alarms import GroupPolicy
    from profiles.options import parse_duration

    if not pset.alarms:
        typer.echo("warning: no profile has an alarm: block; nothing to do", err=True)
    group_by, wait, interval, cap = grouping
    policy = GroupPolicy(
        tuple(x.strip() for x in group_by.split(",") if x.strip())
        if group_by is not None
        else None,
        parse_duration("--group-wait", wait),
        parse_duration("--group-interval", interval),
        cap,
    )
    routing = None
    if routing_file is not None:  # checked before the replay: nothing half done
        from notifiers.routing import load_routing

        routing = load_routing(routing_file, need_route=False)
    found = read_silences(silences) if silences is not None else []
    evs = read_event_file(events) if archived is None else archived  # --archive: read already
    _warn_lint(pset.profiles, evs)
    notify = run_engine(lambda ps: make_engine(eng[0], ps, tz, *eng[1:]), evs, end)
    result = replay_alarms(
        pset.profiles, pset.alarms, notify, evs, end, silences=found, policy=policy,
        silences_name=str(silences), routing=routing,
    )  # fmt: skip
    if routing is not None and as_json:
        from dataclasses import asdict

        write_lines([asdict(x) for x in result.timeline], None)
        if out is not None:
            write_lines([t.to_json() for t in result.transitions], out)
    else:
        write_lines([t.to_json() for t in result.transitions], out)
    if messages is not None:
        write_lines([m.to_json() for m in result.messages], messages)
    assert result.rules is not None
    console = Console(stderr=True)
    console.width = max(console.width, 130)  # a pipe or a log gets the whole table too
    if routing is not None and not as_json:
        from ens.commands.routing import print_timeline

        print_timeline(routing, result.timeline, console)
    console.print(summary_table(summary_rows(result.rules)))


@app.command()
def explain(
    profiles: Annotated[Path, typer.Argument(help="Profile file.")],
    events: Annotated[str, typer.Argument(help="JSON-lines event file ('-' for stdin).")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="The profile to explain.")],
    until: Annotated[str | None, typer.Option(help="End time (epoch seconds or RFC 3339).")] = None,
    tz: Annotated[
        str,
        typer.Option(
            help="Time zone of clock(...) events and of localtime/weekday (a profile file's tz: wins)."
        ),
    ] = "UTC",
    plan: Annotated[str, typer.Option(help=PLAN_HELP)] = "eager",
    stats: Annotated[Path | None, typer.Option(help=STATS_HELP)] = None,
    max_partial_matches: Annotated[
        int,
        typer.Option(min=1, help="Partial matches per partition of the profile (as ens serve)."),
    ] = DEFAULT_PARTITION,
    max_profile_partial_matches: Annotated[
        int, typer.Option(min=1, help="Partial matches of the profile (as ens serve).")
    ] = DEFAULT_PROFILE,
    max_notifications_per_event: Annotated[
        int, typer.Option(min=1, help="Notifications of the profile per event (as ens serve).")
    ] = DEFAULT_NOTIFICATIONS,
) -> None:
    """Show, event by event, what a profile's partial matches do and why it fired or did not.

    First the profile's evaluation plan (--plan, --stats): which component opens matches,
    the rates it was chosen from, and why. The trace shows what the caps on partial matches
    and notifications per event (those of ens serve) dropped, and a last line says so if
    they were reached.
    """
    from ens.explain import explain as run
    from ens.plans import check_plan, load_stats

    try:
        end = parse_time_arg(until)
        check_tz(tz)
        check_plan(plan)
        rates = load_stats(stats)
        pset, evs = load_inputs(profiles, events)
        if profile not in {p.id for p in pset.profiles}:
            raise ENSError(f"no profile {profile!r} in {profiles}")
        caps = Caps(max_partial_matches, max_profile_partial_matches, max_notifications_per_event)
        run(
            pset.profiles,
            evs,
            profile,
            end,
            tz=tz,
            echo=typer.echo,
            plan=plan,
            rates=rates,
            caps=caps,
        )
    except ENSError as e:
        raise report_errors(e) from None


# ---- sub-commands contributed by other modules (mounted here, one line each)
def _mount() -> None:
    from ens.commands import archive as archive_cli
    from ens.commands import bench, data, demo
    from ens.commands import generate as generate_cli
    from ens.commands import notifications as notifiers_cli
    from ens.commands import spark as spark_cli

    app.command("demo")(demo.demo)
    app.add_typer(bench.app, name="bench")
    app.add_typer(archive_cli.app, name="archive")
    from ens.commands.backtest import backtest

    app.command("backtest")(backtest)
    app.add_typer(data.app, name="data")
    app.add_typer(spark_cli.app, name="spark")
    app.add_typer(generate_cli.app, name="generate")
    from ens.commands import routing as routing_cli

    app.add_typer(routing_cli.schedule_app, name="schedule")
    app.add_typer(routing_cli.route_app, name="route")
    app.add_typer(
        notifiers_cli.app,
        name="notifications",
        help="Outbox, delivery worker, dead letters and late events.",
    )
    from ens.commands.service import register

    register(app)  # serve, post, profile, subscriber, gateway; `notifications tail`
    from ens.commands import alarms as alarms_cli

    alarms_cli.register(app)  # alarms, silence, token
    from ens.commands import assets as assets_cli

    assets_cli.register(app)  # assets


_mount()


def main() -> None:
    try:
        app()
    except ENSError as e:  # last line of defence: user errors never show a traceback
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_status)


if __name__ == "__main__":
    main()
