"""`ens backtest PROFILES --from 7d`: the archive's events through a profile file; what it
would have done, per profile (`ens.backtest`). Local for small ranges, Spark above
``--spark-threshold`` bytes of archive (``--spark auto``); the same notifications either way."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ens.archive_time import archive_uri, parse_when
from ens.commands.archive import ArchiveOpt, warn
from ens.commands.output import console, fail
from profiles.errors import ENSError

SPARK_THRESHOLD = 256 << 20  # bytes of archive files: Spark above this with --spark auto


class Progress:
    """A bar on a terminal (rich), plain ``backtest:`` lines in a pipe, nothing with --json."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None
        self.task: Any = None
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self.bar = Progress(
                TextColumn("{task.description:<20}"),
                BarColumn(),
                TaskProgressColumn(),
                console=console(stderr=True),
                transient=True,
            )
            self.bar.start()

    def stage(self, what: str, total: int) -> None:
        if self.bar is not None:
            if self.task is not None:
                self.bar.update(self.task, completed=self.bar.tasks[-1].total)
            self.task = self.bar.add_task(what, total=total or 1)
        else:
            self.line(f"{what} ({total})")

    def advance(self, done: int) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=done)

    def line(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.console.print(f"backtest: {msg}", markup=False)
        elif not self.quiet:
            typer.echo(f"backtest: {msg}", err=True)

    def warn(self, msg: str) -> None:
        """Always shown (also with --json): on stderr, above the bar on a terminal."""
        if self.bar is not None:
            self.bar.console.print(msg, markup=False)
        else:
            typer.echo(msg, err=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _local(
    arc: Any, sc: Any, profiles: list[Any], start: float, end: float, prog: Progress, tz: str
) -> list[dict[str, Any]]:
    from adapters.archive.reader import read_table, to_event
    from ens.replay import replay

    prog.stage("reading archive", len(sc.files))
    rows: list[dict[str, Any]] = []
    for i, f in enumerate(sc.files):
        try:
            table = read_table(arc, f)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped and counted
            sc.skipped.append((f.path, str(exc)))
            prog.warn(f"warning: skipped corrupt archive file {f.path}: {exc}")
            continue
        rows.extend(r for r in table.to_pylist() if start <= r["ts"] < end)
        prog.advance(i + 1)
    rows.sort(key=lambda r: r["seq"])
    events = [to_event(r) for r in rows]
    sc.events = len(events)
    prog.stage("replaying", len(events))
    notes = replay(profiles, events, end, tz=tz, progress=prog.advance)
    return [n.to_json() for n in notes]


def as_lines(notes: list[dict[str, Any]]) -> str:
    """JSON lines exactly as `ens replay --out` writes them."""
    import json

    return "".join(json.dumps(n, separators=(", ", ": ")) + "\n" for n in notes)


def _spark(
    arc: Any,
    sc: Any,
    profiles: list[Any],
    start: float,
    end: float,
    prog: Progress,
    tz: str,
    key: str,
    master: str,
) -> tuple[list[dict[str, Any]], str]:
    import json

    from adapters.archive.reader import check_file
    from adapters.spark.feed import read_archive, spark_path
    from adapters.spark.replay import replay_job
    from ens.commands.spark import _session

    good = []
    for f in sc.files:  # a file Spark cannot read is named and counted, as locally
        try:
            check_file(arc, f)
            good.append(f)
        except Exception as exc:  # noqa: BLE001
            sc.skipped.append((f.path, str(exc)))
            prog.warn(f"warning: skipped corrupt archive file {f.path}: {exc}")
    if not good:
        return [], ""
    scheme = None if arc.local else arc.uri.split("://", 1)[0]
    paths = [spark_path(scheme, f.path) for f in good]
    prog.line(f"replaying {len(paths)} archive files on Spark ({master})")
    with tempfile.TemporaryDirectory(prefix="ens-backtest-") as tmp:
        out = str(Path(tmp) / "notifications.jsonl")
        with _session(master) as spark:

            def source(plan: Any = None) -> Any:
                return read_archive(spark, paths, key, plan, start, end)

            st = replay_job(
                spark,
                profiles,
                source,
                out,
                key=key,
                until=end,
                tz=tz,
                work=tmp,
                log=prog.line,
            )
        sc.events = st.events
        text = Path(out).read_text(encoding="utf-8")  # `ens replay --out`'s bytes
        return [json.loads(line) for line in text.splitlines() if line.strip()], text


def _load(profiles: Path) -> Any:
    from profiles.profile_file import load_profile_file

    return load_profile_file(profiles)


def compute(
    pset: Any,
    t0: float,
    t1: float,
    uri: str,
    prog: Any,
    spark: str = "auto",
    spark_threshold: int = SPARK_THRESHOLD,
    master: str = "local[2]",
    key: str = "building",
    tz: str = "UTC",
) -> tuple[Any, str]:
    """The backtest of a parsed profile file over ``[t0, t1)`` of the archive at ``uri``: its
    report (without plot and time) and the notifications as JSON lines. ``prog`` is told
    the stages (`Progress`'s methods); ENSError for bad input. `ens backtest` and the
    console's backtest button (adapters/service/console) both run this."""
    from adapters.archive.layout import open_archive
    from adapters.archive.reader import scan
    from ens import backtest as bt
    from ens.options import check_tz

    check_tz(tz)
    if t1 <= t0:
        raise ENSError(f"--to {bt.iso(t1)} is not after --from {bt.iso(t0)}")
    arc = open_archive(uri)
    sc = scan(arc, t0, t1)
    use_spark = spark == "on" or (spark == "auto" and sc.bytes > spark_threshold)
    report = bt.Report(t0, t1, arc.uri, "spark" if use_spark else "local")
    report.files, report.bytes = len(sc.files), sc.bytes
    prog.line(
        f"{len(sc.files)} archive files ({sc.bytes} bytes) for {bt.iso(t0)} .. "
        f"{bt.iso(t1)}: {report.engine}"
    )
    run_profiles = pset.profiles
    if pset.alarms:  # and the companions of `clear: {on: ...}` (ens replay --alarms)
        from ens.alarm_replay import with_companions

        run_profiles = with_companions(pset.profiles, pset.alarms)
    if use_spark:
        notes, text = _spark(arc, sc, run_profiles, t0, t1, prog, tz, key, master)
    else:
        notes = _local(arc, sc, run_profiles, t0, t1, prog, tz)
        text = as_lines(notes)
    transitions = None
    if pset.alarms:
        transitions = bt.alarm_transitions(pset.profiles, pset.alarms, notes, t1)
        notes = [n for n in notes if "#" not in n["profile"]]  # companions: no output
        text = as_lines(notes)
    report.events, report.skipped = sc.events, sc.skipped
    bt.build(report, pset.profiles, pset.subscribers, notes, transitions)
    return report, text


def console_backtest(document: str, t0: float, t1: float, uri: str, prog: Any) -> dict[str, Any]:
    """The console's backtest button (`adapters.service.console.backtests.RUNNER`): the
    editor's profile document over the archive, locally (no JVM in an API process); the
    report as `ens backtest --json` prints it (no plot)."""
    from profiles.profile_file import parse_profile_document

    t_start = time.perf_counter()
    pset, errors = parse_profile_document(document, "editor")
    if errors:
        more = f" (and {len(errors) - 1} more: see the editor)" if len(errors) > 1 else ""
        raise ENSError(f"{errors[0]}{more}")
    report, _text = compute(pset, t0, t1, uri, prog, spark="off")
    report.seconds = time.perf_counter() - t_start
    out: dict[str, Any] = report.to_json()
    out["columns"] = report.columns
    return out


def backtest(
    profiles: Annotated[Path, typer.Argument(help="Profile file (YAML or JSON), as `ens check`.")],
    start: Annotated[
        str, typer.Option("--from", help="Start: 7d (back from now), RFC 3339 or epoch seconds.")
    ],
    end: Annotated[str | None, typer.Option("--to", help="End (exclusive); default now.")] = None,
    archive: ArchiveOpt = None,
    spark: Annotated[
        str,
        typer.Option(
            "--spark",
            help="auto: Spark when the range's archive files exceed --spark-threshold; on; off.",
        ),
    ] = "auto",
    spark_threshold: Annotated[
        int,
        typer.Option(
            "--spark-threshold", help="Bytes of archive files from which auto uses Spark."
        ),
    ] = SPARK_THRESHOLD,
    master: Annotated[str, typer.Option("--master", help="Spark master.")] = "local[2]",
    key: Annotated[
        str,
        typer.Option("--key", help="Spark: partition attribute (profiles per key in parallel)."),
    ] = "building",
    plot_out: Annotated[
        str | None,
        typer.Option("--plot", help="Timeline PNG (notifications per hour per profile)."),
    ] = "backtest.png",
    notifications: Annotated[
        str | None,
        typer.Option("--notifications", help="Also write the notifications here (JSON lines)."),
    ] = None,
    tz: Annotated[str, typer.Option(help="Time zone of clock(...) events.")] = "UTC",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Replay the archive's events of a range through PROFILES: per profile its matches and
    the messages each subscriber would have received, a table and a timeline plot."""
    if spark not in ("auto", "on", "off"):
        raise fail(f"--spark must be auto, on or off, not {spark!r}")
    t_start = time.perf_counter()
    prog = Progress(as_json)
    try:
        t0 = parse_when("--from", start)
        t1 = parse_when("--to", end or "now")
        assert t0 is not None and t1 is not None
        pset = _load(profiles)
        report, text = compute(
            pset, t0, t1, archive_uri(archive), prog, spark, spark_threshold, master, key, tz
        )
    except ENSError as e:
        prog.stop()
        raise fail(e) from None
    except BaseException:
        prog.stop()
        raise
    prog.stop()
    from ens import backtest as bt

    if notifications:
        from adapters.files import atomic_text

        with atomic_text(notifications, gzip_gz=False) as fh:
            fh.write(text)
    if plot_out:
        bt.plot(report, plot_out)
        report.plot = plot_out
    report.seconds = time.perf_counter() - t_start
    if as_json:
        import json

        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    _table(report)


def _table(report: Any) -> None:
    from rich.table import Table

    from ens import backtest as bt

    t = Table(
        title=f"backtest {bt.iso(report.start)} .. {bt.iso(report.end)}: {report.events} "
        f"events, {report.engine}, {report.seconds:.1f} s"
    )
    t.add_column("profile")
    for _key, head in report.columns:
        t.add_column(head, justify="left" if _key in ("subscribers", "peak_hour") else "right")
    for row in report.profiles:
        t.add_row(row["id"], *(bt.cell(row, k) for k, _ in report.columns))
    console().print(t)
    if report.skipped:
        warn(f"warning: {len(report.skipped)} corrupt archive files skipped")
    if report.plot:
        typer.echo(f"timeline: {report.plot}", err=True)
