"""`ens spark replay`: a sensor feed through the profiles, one engine per key value, in parallel.

Stages (each a Spark job; see `plan` for who runs where, `slices` for the order):

1. *parse*: the feed (or a data set, file by file) becomes a Parquet table of
   parsed events in a work directory; bad records stop the job here, before
   any output exists (exit 2, like `ens replay`);
2. *engines*: keyed profiles run in tasks partitioned by the key attribute,
   rows sorted by (key, ts, arrival), one engine per key value; global
   profiles run in one task over the (filtered) stream sorted by (ts,
   arrival); bare filters run without a shuffle. Every notification carries
   its detection key;
3. *merge*: notifications sorted by detection key and written as JSON lines
   (one file, byte-identical to `ens replay --out`) or Parquet.

A data set stored per room, replayed `--key room`, skips stage 1 for the
keyed profiles: each room's engine runs where its files are read (`fused`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiles.ast import Profile
from profiles.errors import ENSError, EventError, ManyErrors

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from adapters.spark.plan import Plan
    from adapters.spark.slices import Tagged

NOTE_DDL = "dkey binary, ts double, profile string, events map<string,string>, partition string, line string"
BATCH = 10_000
MAX_ERRORS = 20  # as many bad records as `ens replay` lists

Log = Callable[[str], None]
Source = Callable[["Plan"], "DataFrame"]


def _batched(tagged: Iterable[Tagged]) -> Iterator[pa.RecordBatch]:
    from adapters.spark.slices import note_batch

    buf: list[Tagged] = []
    for t in tagged:
        buf.append(t)
        if len(buf) >= BATCH:
            yield note_batch(buf)
            buf = []
    if buf:
        yield note_batch(buf)


def _events(batches: Iterator[pa.RecordBatch], with_route: bool = False) -> Iterator[Any]:
    """(arrival, Event) — or (route, (arrival, Event)) — from rows of the parsed-event table."""
    from adapters.spark.feed import from_blob

    for b in batches:
        cols = [b.column(c).to_pylist() for c in ("arrival", "ts", "blob")]
        if with_route:
            for route, a, ts, blob in zip(b.column("route").to_pylist(), *cols, strict=True):
                yield route, (a, from_blob(ts, blob))
        else:
            for a, ts, blob in zip(*cols, strict=True):
                yield a, from_blob(ts, blob)


def _stateless_task(plan: Plan, tz: str):  # noqa: ANN202 - a mapInArrow function
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from adapters.spark.slices import run_stateless

        yield from _batched(run_stateless(plan.stateless, plan.positions, _events(batches), tz))

    return run


def _keyed_task(plan: Plan, end: tuple[float, bool], tz: str):  # noqa: ANN202 - a mapInArrow function
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from itertools import groupby

        from adapters.spark.slices import run_stream

        def all_keys() -> Iterator[Tagged]:
            for _route, rows in groupby(_events(batches, with_route=True), key=lambda r: r[0]):
                yield from run_stream(
                    plan.keyed,
                    plan.positions,
                    (ev for _, ev in rows),
                    end,
                    None,
                    tz,
                    (plan.evaluation, plan.rates),
                )

        yield from _batched(all_keys())

    return run


def _global_task(plan: Plan, end: tuple[float, bool], start: tuple[float, int], tz: str):  # noqa: ANN202
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from adapters.spark.slices import run_stream

        yield from _batched(
            run_stream(
                plan.global_,
                plan.positions,
                _events(batches),
                end,
                start,
                tz,
                (plan.evaluation, plan.rates),
            )
        )

    return run


@dataclass
class ReplayStats:
    events: int = 0
    notifications: int = 0
    keys: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def _timed(stats: ReplayStats, stage: str, t0: float) -> float:
    now = time.perf_counter()
    stats.seconds[stage] = round(now - t0, 3)
    return now


def check_events(parsed: DataFrame) -> tuple[int, tuple[float, int] | None, float | None, int]:
    """Raise on bad records (the first `MAX_ERRORS`, by position).

    Else (events, (ts, arrival) of the first, last ts, key values of keyed events), in one job.
    """
    from pyspark.sql import functions as F

    from adapters.spark.feed import USE_KEYED

    keyed = F.when(F.col("use").bitwiseAND(USE_KEYED) != 0, F.col("route"))
    row = parsed.agg(
        F.count("*").alias("n"),
        F.count("err").alias("bad"),
        F.min(F.when(F.col("err").isNull(), F.struct("ts", "arrival"))).alias("first"),
        F.max("ts").alias("last"),
        F.count_distinct(keyed).alias("keys"),
    ).collect()[0]
    if row["bad"]:
        bad = (
            parsed.where("err is not null")
            .orderBy("arrival")
            .select("err")
            .limit(MAX_ERRORS)
            .collect()
        )
        errs: list[ENSError] = [EventError(r["err"]) for r in bad]
        if len(errs) == 1:
            raise errs[0]
        raise ManyErrors(errs)
    first = (row["first"]["ts"], row["first"]["arrival"]) if row["first"] is not None else None
    return row["n"], first, row["last"], row["keys"]


def replay_job(
    spark: SparkSession,
    profiles: list[Profile],
    source: Source,
    out: str,
    *,
    key: str = "building",
    fmt: str = "jsonl",
    until: float | None = None,
    tz: str = "UTC",
    work: str | None = None,
    dataset: tuple[str, str, list[str] | None] | None = None,
    log: Log = lambda _m: None,
    evaluation: str = "eager",
    rates: Any = None,
) -> ReplayStats:
    """Run the three stages; the output appears (atomically renamed) only if all succeed.

    `dataset` = (name, path, rooms) of the data set `source` reads: with
    `key="room"` and per-room files the keyed engines run where the files are
    read (`fused`), skipping the parse table and the shuffle.
    """
    from adapters.spark.plan import make_plan

    if fmt not in ("jsonl", "parquet"):
        raise ENSError(f"unknown output format {fmt!r} (jsonl or parquet)")
    stats = ReplayStats()
    plan = make_plan(profiles, key)
    plan.evaluation, plan.rates = evaluation, rates  # travels with the plan to every task
    log(f"plan: {plan.summary()}")
    target = Path(out)
    parent = work or (target.parent if str(target.parent) else ".")
    work_dir = Path(tempfile.mkdtemp(prefix=".ens-spark-", dir=parent))
    try:
        files = None
        if dataset is not None and key == "room" and plan.keyed:
            from adapters.spark.fused import room_files

            files = room_files(*dataset)
        if files is not None:
            stages = _fused_stages(spark, plan, dataset, files, work_dir, until, tz, stats, log)  # type: ignore[arg-type]
        else:
            stages = _generic_stages(spark, plan, source, work_dir, until, tz, stats, log)
        t = time.perf_counter()
        notes_path = str(work_dir / "notes")
        if stages:
            notes = stages[0]
            for st in stages[1:]:
                notes = notes.unionByName(st)
            notes.write.parquet(notes_path)
        else:
            spark.createDataFrame([], NOTE_DDL).write.parquet(notes_path)
        t = _timed(stats, "engines", t)
        log(f"engines: {stats.keys} {key} value(s) in parallel, {stats.seconds['engines']:.1f}s")

        # one sorted partition: no sampling job, and the JSON lines come out as one part file
        ordered = spark.read.parquet(notes_path).repartition(1).sortWithinPartitions("dkey")
        stats.notifications = _write(ordered, target, fmt, work_dir)
        _timed(stats, "merge", t)
        log(
            f"wrote {stats.notifications} notifications to {out} ({fmt}) in {stats.seconds['merge']:.1f}s"
        )
        return stats
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _end(until: float | None, last: float | None) -> tuple[float, bool] | None:
    from adapters.spark.slices import end_of

    if last is not None:
        return end_of(until, last)
    return (until, True) if until is not None else None


def _shared_stages(
    spark: SparkSession,
    plan: Plan,
    ev: DataFrame,
    first: tuple[float, int] | None,
    end: tuple[float, bool] | None,
    tz: str,
    keyed: bool,
) -> list[DataFrame]:
    """Stateless, (generic) keyed and global stages over a table of parsed events."""
    from pyspark.sql import functions as F

    from adapters.spark.feed import USE_GLOBAL, USE_KEYED, USE_STATELESS
    from adapters.spark.slices import run_stream

    def use(bit: int) -> DataFrame:
        return ev.where(F.col("use").bitwiseAND(bit) != 0)

    stages: list[DataFrame] = []
    if plan.stateless:
        rows = use(USE_STATELESS).select("arrival", "ts", "blob")
        stages.append(rows.mapInArrow(_stateless_task(plan, tz), NOTE_DDL))
    if keyed and plan.keyed and end is not None:
        rows = use(USE_KEYED).select("route", "arrival", "ts", "blob")
        rows = rows.repartition("route").sortWithinPartitions("route", "ts", "arrival")
        stages.append(rows.mapInArrow(_keyed_task(plan, end, tz), NOTE_DDL))
    if plan.global_ and first is not None:
        rows = use(USE_GLOBAL).select("arrival", "ts", "blob")
        rows = rows.repartition(1).sortWithinPartitions("ts", "arrival")
        stages.append(rows.mapInArrow(_global_task(plan, end, first, tz), NOTE_DDL))  # type: ignore[arg-type]
    elif plan.global_ and end is not None:  # no events, only --until: timers of an empty stream
        tagged = list(
            run_stream(
                plan.global_, plan.positions, [], end, None, tz, (plan.evaluation, plan.rates)
            )
        )
        if tagged:
            from adapters.spark.slices import note_batch

            stages.append(spark.createDataFrame(note_batch(tagged).to_pylist(), NOTE_DDL))
    return stages


def _generic_stages(
    spark: SparkSession,
    plan: Plan,
    source: Source,
    work_dir: Path,
    until: float | None,
    tz: str,
    stats: ReplayStats,
    log: Log,
) -> list[DataFrame]:
    t = time.perf_counter()
    parsed_path = str(work_dir / "events")
    source(plan).write.option("compression", "zstd").parquet(parsed_path)
    parsed = spark.read.parquet(parsed_path)
    stats.events, first, last, stats.keys = check_events(parsed)
    _timed(stats, "parse", t)
    log(f"parsed {stats.events} events in {stats.seconds['parse']:.1f}s")
    return _shared_stages(
        spark, plan, parsed.where("err is null"), first, _end(until, last), tz, keyed=True
    )


def _fused_stages(
    spark: SparkSession,
    plan: Plan,
    dataset: tuple[str, str, list[str] | None],
    files: dict[str, list[tuple[int, str]]],
    work_dir: Path,
    until: float | None,
    tz: str,
    stats: ReplayStats,
    log: Log,
) -> list[DataFrame]:
    import pyarrow.parquet as pq

    from adapters.spark.feed import EVENT_DDL
    from adapters.spark.fused import finish_task, fused_frame

    t = time.perf_counter()
    path = work_dir / "fused"
    fused_frame(spark, dataset[0], dataset[1], plan, files, tz).write.partitionBy("kind").parquet(
        str(path)
    )

    def part(kind: str, ddl: str) -> DataFrame:
        p = path / f"kind={kind}"
        return spark.read.parquet(str(p)) if p.exists() else spark.createDataFrame([], ddl)

    st = pq.read_table(path / "kind=stat").to_pylist() if (path / "kind=stat").exists() else []
    stats.events = sum(r["n"] for r in st)
    stats.keys = len(files)
    first = min(((r["ts"], r["arrival"]) for r in st), default=None)
    last = max((r["last"] for r in st), default=None)
    _timed(stats, "parse", t)
    log(
        f"read {stats.events} events, keyed engines ran per {plan.key} while reading ({stats.seconds['parse']:.1f}s)"
    )
    end = _end(until, last)
    ev = part("event", EVENT_DDL)
    stages = _shared_stages(spark, plan, ev, first, end, tz, keyed=False)
    notes = part("note", NOTE_DDL).select(*[c.split()[0] for c in NOTE_DDL.split(", ")])
    stages.append(notes)
    if end is not None:
        stages.append(
            part("state", "blob binary").select("blob").mapInArrow(finish_task(end), NOTE_DDL)
        )
    return stages


def _write(ordered: DataFrame, target: Path, fmt: str, work_dir: Path) -> int:
    """Write sorted notifications; JSON lines become one file, concatenating the ordered parts."""
    import pyarrow.parquet as pq

    tmp = work_dir / "out"
    if fmt == "parquet":
        ordered.select(
            "profile", "ts", "events", "partition", ordered["dkey"].alias("detection")
        ).write.parquet(str(tmp))
        n = sum(pq.ParquetFile(f).metadata.num_rows for f in tmp.glob("*.parquet"))
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(tmp, target)
        return n
    ordered.select("line").write.text(str(tmp))
    n = 0
    joined = work_dir / "out.jsonl"
    with joined.open("wb") as dst:
        for part in sorted(tmp.glob("part-*")):
            with part.open("rb") as src:
                for chunk in iter(lambda s=src: s.read(1 << 20), b""):  # type: ignore[misc]
                    n += chunk.count(b"\n")
                    dst.write(chunk)
    os.replace(joined, target)
    return n
