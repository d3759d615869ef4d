"""Read an event feed into a Spark table of parsed events, in a stable stream order.

The table (`EVENT_SCHEMA`) has one row per input record:

- `arrival`: the tie-breaker among equal `ts` — the 1-based line (JSON lines)
  or row (CSV, Parquet) number, the same number `ens replay` uses for default
  ids (`"#<line>"`) and error messages; for a data set read file by file, the
  file's position in the adapter's merge order (its stream is merged by
  `(ts, file)`, so that is exactly the local tie order);
- `ts`, `route` (the routing key of the `--key` attribute, `plan.route_key`);
- `use`: which engines need the event (bits `USE_KEYED`, `USE_GLOBAL`,
  `USE_STATELESS`; `plan.Relevance`), so each stage reads only its events;
- `blob`: the pickled `(id, attrs)`, so later stages skip JSON parsing;
- `err`: why the record is not an event (then the other columns are null).

Line numbers are computed in the JVM: rows get a monotonically increasing id
per input split, and one small aggregation gives each split's first line.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.spark.session import spread
from profiles.errors import ENSError
from profiles.events import Event, event_from_obj, parse_event_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from adapters.spark.plan import Plan

EVENT_DDL = "arrival long, ts double, route string, use int, blob binary, err string"
USE_KEYED, USE_GLOBAL, USE_STATELESS = 1, 2, 4
FORMATS = ("jsonl", "csv", "parquet")


def feed_format(path: str, given: str | None = None) -> str:
    """jsonl, csv or parquet, from `--input-format` or the file name."""
    if given:
        if given not in FORMATS:
            raise ENSError(f"unknown feed format {given!r} (jsonl, csv or parquet)")
        return given
    name = path.rstrip("/").lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith(".parquet") or Path(path, "_SUCCESS").exists():
        return "parquet"
    return "jsonl"


def to_blob(ev: Event) -> bytes:
    return pickle.dumps((ev.id, ev.attrs), protocol=pickle.HIGHEST_PROTOCOL)


def from_blob(ts: float, blob: bytes) -> Event:
    ev_id, attrs = pickle.loads(blob)  # noqa: S301 - written by this job a moment ago
    return Event(ev_id, ts, attrs)


class Rowifier:
    """Event -> table row; built inside the task (its primitive pools are not shipped)."""

    def __init__(self, key: str, plan: Plan | None) -> None:
        from adapters.spark.plan import Relevance

        self.key = key
        self.rels: list[tuple[int, Relevance]] = []
        if plan is not None:
            for bit, profs in (
                (USE_KEYED, plan.keyed),
                (USE_GLOBAL, plan.global_),
                (USE_STATELESS, plan.stateless),
            ):
                if profs:
                    self.rels.append((bit, Relevance(profs)))

    def flags(self, ev: Event) -> tuple[str | None, int]:
        """(route, use) of an event."""
        from adapters.spark.plan import route_key

        route = route_key(ev.attrs.get(self.key))
        use = 0
        for bit, rel in self.rels:
            if (bit != USE_KEYED or route is not None) and rel(ev.attrs):
                use |= bit
        return route, use

    def row(self, ev: Event, arrival: int) -> tuple[Any, ...]:
        route, use = self.flags(ev)
        return (arrival, ev.ts, route, use, to_blob(ev), None)


def with_arrival(spark: SparkSession, df: DataFrame, path: str) -> DataFrame:
    """Add `arrival` = 1-based record number over the files (in name order), computed in the JVM.

    One file in one split needs no counting job: the row id is the position.
    """
    from pyspark.sql import functions as F

    if Path(path).is_file() and df.rdd.getNumPartitions() == 1:
        return df.withColumn("arrival", F.monotonically_increasing_id() + 1)
    tagged = df.select(
        "*",
        F.col("_metadata.file_path").alias("_f"),
        F.col("_metadata.file_block_start").alias("_b"),
        F.monotonically_increasing_id().alias("_rid"),
    )
    splits = tagged.groupBy("_f", "_b").agg(F.count("*").alias("_n"), F.min("_rid").alias("_r0"))
    rows = sorted(splits.collect(), key=lambda r: (r["_f"], r["_b"]))
    first, offsets = 1, []
    for r in rows:
        offsets.append((r["_f"], r["_b"], first - r["_r0"]))
        first += r["_n"]
    off = spark.createDataFrame(offsets, "_f string, _b long, _off long")
    out = tagged.join(F.broadcast(off), ["_f", "_b"]).withColumn(
        "arrival", F.col("_rid") + F.col("_off")
    )
    return out.drop("_f", "_b", "_rid", "_off")


def read_feed(
    spark: SparkSession, path: str, key: str, plan: Plan | None = None, fmt: str | None = None
) -> DataFrame:
    """A feed file (or directory of part files) as a table of parsed events (`EVENT_DDL`)."""
    if not Path(path).exists():
        raise ENSError(f"no such file: {path}")
    fmt = feed_format(path, fmt)
    if fmt == "jsonl":
        raw = spark.read.text(path)
        return spread(with_arrival(spark, raw, path), path).mapInArrow(
            _parse_lines(key, plan), EVENT_DDL
        )
    if fmt == "csv":
        raw = spark.read.options(header=True, inferSchema=False, mode="FAILFAST").csv(path)
    else:
        raw = spark.read.parquet(path)
    if "ts" not in raw.columns:
        raise ENSError(f"{path}: no 'ts' column (columns: {', '.join(raw.columns)})")
    return spread(with_arrival(spark, raw, path), path).mapInArrow(
        _parse_records(key, plan, fmt == "csv"), EVENT_DDL
    )


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    import pyarrow as pa

    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[]] * 6
    types = [pa.int64(), pa.float64(), pa.string(), pa.int32(), pa.binary(), pa.string()]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, t) for c, t in zip(cols, types, strict=True)],
        names=["arrival", "ts", "route", "use", "blob", "err"],
    )


def _parse_lines(key: str, plan: Plan | None):  # noqa: ANN202 - a mapInArrow function
    """JSON lines -> event rows; exactly `ens replay`'s parser (blank lines skipped)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rw = Rowifier(key, plan)
        for b in batches:
            rows = []
            for line, arrival in zip(
                b.column("value").to_pylist(), b.column("arrival").to_pylist(), strict=True
            ):
                if not line.strip():
                    continue
                try:
                    rows.append(rw.row(parse_event_line(line, arrival), arrival))
                except ENSError as e:
                    rows.append((arrival, None, None, 0, None, str(e)))
            yield _batch(rows)

    return run


def _csv_value(text: str) -> Any:
    """CSV cells are text: numbers and true/false become typed values, empty means absent."""
    if text is None or text == "":
        return None
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
        return f if math.isfinite(f) else text
    except ValueError:
        return text


def _plain(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.timestamp() if v.tzinfo else v.isoformat() + "Z"
    if isinstance(v, date):
        return v.isoformat()
    return v


def _parse_records(key: str, plan: Plan | None, csv: bool):  # noqa: ANN202 - a mapInArrow function
    """CSV / Parquet rows -> event rows (ts and id columns as in JSON; the rest are attributes)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rw = Rowifier(key, plan)
        for b in batches:
            rows = []
            names = [n for n in b.schema.names if n != "arrival"]
            for rec in b.to_pylist():
                arrival = rec.pop("arrival")
                if csv:
                    obj = {
                        n: (rec[n] if n in ("id", "ts") and rec[n] != "" else _csv_value(rec[n]))
                        for n in names
                    }
                    if isinstance(obj.get("ts"), str):
                        obj["ts"] = _csv_value(obj["ts"])
                else:
                    obj = {n: _plain(rec[n]) for n in names}
                try:
                    rows.append(rw.row(event_from_obj(obj, f"#{arrival}"), arrival))
                except ValueError as e:
                    rows.append((arrival, None, None, 0, None, f"row {arrival}: {e}"))
            yield _batch(rows)

    return run


# -------------------------------------------------------------- data sets


def read_dataset(
    spark: SparkSession,
    name: str,
    path: str,
    key: str,
    plan: Plan | None = None,
    rooms: list[str] | None = None,
) -> DataFrame:
    """A data set through `adapters.datasets`: one task per file when the adapter lists files.

    KETI's adapter merges its per-file streams by `(ts, file position)`, so
    `arrival` = file position reproduces the local order without reading
    anything on the driver. Other adapters are read on the driver in order.
    """
    from adapters.datasets import get_adapter

    ad = get_adapter(name)
    select_files = getattr(ad.module, "select_files", None)
    if select_files is None:
        rw = Rowifier(key, plan)
        rows = [
            rw.row(event_from_obj(obj, f"#{i}"), i)
            for i, obj in enumerate(ad.iter_events(path, rooms=rooms), 1)
        ]
        return spark.createDataFrame(rows, EVENT_DDL)
    files = [
        (i, room, sensor)
        for i, (room, sensor, _f) in enumerate(select_files(Path(path), rooms, None))
    ]
    jobs = spark.createDataFrame(files, "i long, room string, sensor string").repartition(
        len(files) or 1
    )
    return jobs.mapInArrow(_read_dataset_files(name, path, key, plan), EVENT_DDL)


def adapter_event(obj: dict[str, Any]) -> Event:
    """An adapter's event dict as an Event, without `event_from_obj`'s checks.

    Adapters emit fresh dicts of flat, finite, typed values with an id and an
    epoch `ts` (adapters.datasets), so the dict itself becomes the attributes;
    re-validating 30 million of them would cost a third of the parse stage.
    """
    ev_id = obj.pop("id")
    ts = float(obj.pop("ts"))
    if None in obj.values():
        obj = {k: v for k, v in obj.items() if v is not None}
    return Event(ev_id, ts, obj)


def _read_dataset_files(name: str, path: str, key: str, plan: Plan | None):  # noqa: ANN202 - a mapInArrow function
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from adapters.datasets import get_adapter

        ad = get_adapter(name)
        rw = Rowifier(key, plan)
        for b in batches:
            for i, room, sensor in zip(
                *(b.column(c).to_pylist() for c in ("i", "room", "sensor")), strict=True
            ):
                rows = []
                for obj in ad.iter_events(path, rooms=[room], kinds=[sensor]):
                    rows.append(rw.row(adapter_event(obj), i))
                    if len(rows) >= 20000:
                        yield _batch(rows)
                        rows = []
                yield _batch(rows)

    return run


def spark_path(uri_scheme: str | None, path: str) -> str:
    """An archive file's path as Spark reads it (``s3`` is ``s3a`` to Hadoop)."""
    if uri_scheme is None:
        return path
    scheme = {"s3": "s3a"}.get(uri_scheme, uri_scheme)
    return f"{scheme}://{path}"


def read_archive(
    spark: SparkSession,
    paths: list[str],
    key: str,
    plan: Plan | None = None,
    start: float | None = None,
    end: float | None = None,
) -> DataFrame:
    """Event archive files (`adapters.archive`) of ``[start, end)`` as a table of parsed
    events: each row's ``event`` is the JSON line `ens replay` reads, its ``seq`` (engine
    order) the arrival, so ties in ``ts`` keep the engine's order, as the local replay does.
    Files the caller found corrupt are left out by it; ``ignoreCorruptFiles`` skips any
    other it could not see."""
    from pyspark.sql import functions as F

    raw = spark.read.option("ignoreCorruptFiles", "true").parquet(*paths)
    if start is not None:
        raw = raw.where(F.col("ts") >= start)
    if end is not None:
        raw = raw.where(F.col("ts") < end)
    lines = raw.select(F.col("event").alias("value"), (F.col("seq") + 1).alias("arrival"))
    return lines.mapInArrow(_parse_lines(key, plan), EVENT_DDL)
