"""`ens spark index`: parse a large profile set once, in parallel, into a snapshot that loads fast.

Parsing is the expensive part of starting a service with 10^6 profiles (lark
builds a tree per profile). The snapshot stores the parsed `Profile` objects,
so `load_index` only unpickles them; equal AST subtrees are stored once per
chunk, which also makes the loaded profiles share them.

Snapshot layout (`INDEX/`):

- `manifest.json`: version, counts, source, created, chunk size;
- `profiles/`: Parquet, one row per chunk (`first` input position, `count`,
  `blob` = pickled list of profiles in input order);
- `filters/`: Parquet, one row per distinct leaf filter (canonical key, uses,
  profiles) — identical filters across profiles counted once;
- `predicates/`: Parquet, one row per distinct predicate (key, attr, uses);
- `boundaries/`: Parquet, per attribute and operator the distinct values the
  predicates compare with (sorted: numbers, then strings, then booleans) —
  the data a pool needs to pre-size its sorted indexes;
- `subscribers.json` (YAML input with subscribers).

Bad profiles never vanish: each becomes a JSON line `{id, error, line, column,
record}` in `--errors` (`line`/`column` inside the expression, `record` the
input line or row), and their number is in the manifest.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.spark.session import ddl_fields
from profiles.ast import Profile
from profiles.errors import ENSError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

VERSION = 1
CHUNK = 10_000
RECORD_DDL = "record long, id string, expr string, subscriber string, problem string"
# one table for everything a parse task produces, split by `kind` when written:
# chunk (first, count, blob), error (record, id, error, line, column),
# filter (key, uses), predicate (key, attr, uses), bound (attr, op, num|str|bool, uses)
PARSED_DDL = (
    "kind string, record long, id string, count int, blob binary, error string, line int, "
    "column int, key string, attr string, op string, num double, str string, bool boolean, "
    "uses long"
)
Log = Callable[[str], None]


# ----------------------------------------------------------------- inputs


def _record(obj: Any, rec: int) -> dict[str, Any]:
    """A profile record {id, expr, subscriber} checked for shape (the expression is parsed later)."""
    if not isinstance(obj, dict):
        return {"record": rec, "problem": "a profile record must be an object with id and expr"}
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or pid == "":
        return {"record": rec, "problem": "profile has no id"}
    out: dict[str, Any] = {"record": rec, "id": str(pid)}
    expr = obj.get("expr")
    sub = obj.get("subscriber")
    extra = set(obj) - {"id", "expr", "subscriber", "description"}
    if extra:
        out["problem"] = f"unknown keys {sorted(extra)}"
    elif not isinstance(expr, str) or not expr.strip():
        out["problem"] = "missing expr"
    else:
        out["expr"] = expr
        out["subscriber"] = str(sub) if sub is not None else None
    return out


def _json_record(line: str, rec: int) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        return _record(json.loads(line), rec)
    except json.JSONDecodeError as e:
        return {"record": rec, "problem": f"invalid JSON: {e.msg} at column {e.colno}"}


def _records_parquet(spark: SparkSession, path: str) -> DataFrame:
    from pyspark.sql import functions as F

    from adapters.spark.feed import with_arrival

    raw = spark.read.parquet(path)
    missing = {"id", "expr"} - set(raw.columns)
    if missing:
        raise ENSError(f"{path}: no column(s) {sorted(missing)} (want id, expr[, subscriber])")
    sub = F.col("subscriber") if "subscriber" in raw.columns else F.lit(None)
    raw = raw.select(
        F.col("id").cast("string").alias("id"),
        F.col("expr").cast("string").alias("expr"),
        sub.cast("string").alias("subscriber"),
    )
    df = with_arrival(spark, raw, path)
    bad = F.when(F.col("id").isNull() | (F.col("id") == ""), "profile has no id").when(
        F.col("expr").isNull() | (F.trim("expr") == ""), "missing expr"
    )
    return df.select(
        F.col("arrival").alias("record"), "id", "expr", "subscriber", bad.alias("problem")
    )


def _records_yaml(spark: SparkSession, path: str) -> tuple[DataFrame, list[dict[str, Any]]]:
    """A profile file read on the driver (YAML keeps positions only in one stream)."""
    import yaml

    from profiles.profile_file import read_profile_text, validate_subscriber

    text = read_profile_text(path)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as e:
        raise ENSError(f"{path}: not valid YAML/JSON: {getattr(e, 'problem', e)}") from None
    items = root.value if isinstance(root, yaml.SequenceNode) else None
    subs: list[dict[str, Any]] = []
    if isinstance(root, yaml.MappingNode):
        for k, v in root.value:
            if k.value == "profiles" and isinstance(v, yaml.SequenceNode):
                items = v.value
            elif k.value == "subscribers":
                loaded = yaml.load(yaml.serialize(v), Loader=loader) or []  # noqa: S506 - safe
                for n, sub in enumerate(loaded, 1):
                    subs.append(validate_subscriber(sub, path, n))
    if items is None:
        raise ENSError(f"{path}: expected a mapping with 'profiles' (or a list of profiles)")
    rows = []
    for node in items:
        obj = yaml.load(yaml.serialize(node), Loader=loader)  # noqa: S506 - safe loader
        rows.append(_record(obj, node.start_mark.line + 1))
    return spark.createDataFrame(rows, RECORD_DDL), subs


def read_records(
    spark: SparkSession, path: str
) -> tuple[DataFrame, DataFrame, str, list[dict[str, Any]]]:
    """(input rows, (id, record) rows, format, subscribers) of a profile source, by file name.

    JSON lines stay raw text (`value`, `arrival`) until the parse task; their
    ids are read in the JVM for the duplicate check.
    """
    from pyspark.sql import functions as F

    from adapters.spark.feed import with_arrival

    p = Path(path)
    if not p.exists():
        raise ENSError(f"no such file: {path}")
    name = p.name.lower()
    if name.endswith((".yaml", ".yml", ".json")):
        df, subs = _records_yaml(spark, path)
        return df, df.select("id", "record"), "yaml", subs
    if name.endswith(".parquet") or p.is_dir():
        df = _records_parquet(spark, path)
        return df, df.select("id", "record"), "parquet", []
    raw = with_arrival(spark, spark.read.text(path), path)
    ids = raw.select(
        F.get_json_object("value", "$.id").alias("id"), F.col("arrival").alias("record")
    )
    return raw, ids, "jsonl", []


# ---------------------------------------------------------------- parsing


def parse_record(
    rec: int, pid: str | None, expr: str | None, sub: str | None, problem: str | None
) -> Profile | dict[str, Any]:
    """One record -> its Profile, or an error row {record, id, error, line, column}."""
    from profiles.errors import ProfileError
    from profiles.parser import parse_profile

    if problem:
        return {"kind": "error", "record": rec, "id": pid, "error": problem}
    try:
        return parse_profile(expr or "", pid or "?", sub)
    except ProfileError as e:
        msg = e.message + ("; expected " + ", ".join(e.expected) if e.expected else "")
        return {
            "kind": "error",
            "record": rec,
            "id": pid,
            "error": msg,
            "line": e.line,
            "column": e.column,
        }


class _Parts:
    """Per-task counts of distinct filters, predicates and boundary values."""

    def __init__(self) -> None:
        self.filters: dict[str, int] = {}
        self.preds: dict[tuple[str, str], int] = {}
        self.bounds: dict[tuple[str, str, str, Any], int] = {}

    def add(self, p: Profile) -> None:
        from adapters.spark.canon import boundaries, filter_key, predicates
        from adapters.spark.plan import leaves

        seen: set[str] = set()
        for lf in leaves(p):
            fk = filter_key(lf.filter)
            self.filters[fk] = self.filters.get(fk, 0) + 1
            for pr in predicates(lf.filter):
                k = filter_key(pr)
                if k in seen:
                    continue
                seen.add(k)
                self.preds[(k, pr.attr)] = self.preds.get((k, pr.attr), 0) + 1
                for attr, op, v in boundaries(pr):
                    t = (
                        "bool"
                        if v.__class__ is bool
                        else "num"
                        if isinstance(v, (int, float))
                        else "str"
                    )
                    bk = (attr, op, t, float(v) if t == "num" else v)  # type: ignore[arg-type]
                    self.bounds[bk] = self.bounds.get(bk, 0) + 1

    def rows(self) -> Iterator[dict[str, Any]]:
        for k, n in self.filters.items():
            yield {"kind": "filter", "key": k, "uses": n}
        for (k, a), n in self.preds.items():
            yield {"kind": "predicate", "key": k, "attr": a, "uses": n}
        for (a, op, t, v), n in self.bounds.items():
            row = {"kind": "bound", "attr": a, "op": op, "uses": n}
            if v is not None:
                row[t] = v
            yield row


def _parse_task(jsonl: bool, dups: dict[str, int] | None, subscribers: list[str] | None):  # noqa: ANN202
    """Parse records in input order; good profiles leave as chunks of `CHUNK` (one pickle each).

    `dups`: id -> record that keeps it; None when this task sees every record
    (one partition) and can tell repeats itself.
    """
    known = set(subscribers) if subscribers else None
    seen: set[str] = set()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from adapters.spark.canon import dump_profiles

        schema = _parsed_schema()
        parts = _Parts()
        chunk: list[Profile] = []
        first = 0
        for b in batches:
            if jsonl:
                raw = zip(
                    b.column("value").to_pylist(), b.column("arrival").to_pylist(), strict=True
                )
                recs = [r for r in (_json_record(v, a) for v, a in raw) if r is not None]
            else:
                recs = b.to_pylist()
            out: list[dict[str, Any]] = []
            for r in recs:
                rec, pid, sub = r["record"], r.get("id"), r.get("subscriber")
                problem = r.get("problem")
                if dups is None and pid is not None:
                    if pid in seen and r.get("problem") != "profile has no id":
                        problem = "duplicate profile id"
                    seen.add(pid)
                elif dups and not problem and pid in dups and dups[pid] != rec:
                    problem = "duplicate profile id"
                if not problem and known is not None and sub is not None and sub not in known:
                    problem = f"unknown subscriber {sub!r}"
                got = parse_record(rec, pid, r.get("expr"), sub, problem)
                if isinstance(got, dict):
                    out.append(got)
                    continue
                parts.add(got)
                if not chunk:
                    first = rec
                chunk.append(got)
                if len(chunk) >= CHUNK:
                    out.append(
                        {
                            "kind": "chunk",
                            "record": first,
                            "count": len(chunk),
                            "blob": dump_profiles(chunk),
                        }
                    )
                    chunk = []
            yield pa.RecordBatch.from_pylist(out, schema=schema)
        tail = list(parts.rows())
        if chunk:
            tail.append(
                {
                    "kind": "chunk",
                    "record": first,
                    "count": len(chunk),
                    "blob": dump_profiles(chunk),
                }
            )
        yield pa.RecordBatch.from_pylist(tail, schema=schema)

    return run


def _parsed_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(ddl_fields(PARSED_DDL))


# ------------------------------------------------------------------- job


def _sorted_table(path: Path, keys: list[str], sums: list[str], order: list[str]) -> pa.Table:
    """Sum partial counts (one row per task and key) by `keys`, sorted — on the driver, in Arrow."""
    import pyarrow.parquet as pq

    t = pq.read_table(path) if path.exists() else None
    if t is None or t.num_rows == 0:
        import pyarrow as pa

        return pa.table(
            {c: pa.array([], typ) for c, typ in ddl_fields(PARSED_DDL) if c in keys + sums}
        )
    t = (
        t.select(keys + sums)
        .group_by(keys, use_threads=False)
        .aggregate([(c, "sum") for c in sums])
    )
    t = t.rename_columns(keys + sums)
    return t.sort_by([(c, "ascending") for c in order])  # nulls last


def index_job(
    spark: SparkSession,
    source: str,
    out: str,
    *,
    errors: str | None = None,
    log: Log = lambda _m: None,
) -> dict[str, Any]:
    """Build the snapshot directory `out` (replaced atomically); return the manifest.

    Spark parses (the expensive part, in parallel); the per-task partial counts
    are small and are summed on the driver with Arrow, which saves a Spark job
    per table.
    """
    t0 = time.perf_counter()
    records, ids, fmt, subs = read_records(spark, source)
    target = Path(out)
    parent = target.parent if str(target.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".ens-index-", dir=parent))
    try:
        parsed = work / "parsed"
        _parse(records, ids, fmt, subs, parsed)
        t1 = time.perf_counter()
        log(f"parsed in Spark ({t1 - t0:.1f}s)")

        snap = work / "snapshot"
        snap.mkdir()
        chunks, tables = _write_tables(parsed, snap)
        err_path = parsed / "kind=error"
        errs = _read_errors(err_path)
        manifest = _manifest(source, fmt, chunks, tables, len(errs))
        c = manifest["counts"]
        log(f"{c['records']} records: {c['profiles']} profiles, {c['errors']} errors")
        if subs:
            (snap / "subscribers.json").write_text(json.dumps(subs, indent=1))
        (snap / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if errors is not None:
            _write_errors(errs, Path(errors))
        if target.exists():
            shutil.rmtree(target)
        snap.rename(target)
        log(
            f"index {out}: {c['profiles']} profiles in {c['chunks']} chunk(s), {c['filters']} distinct filters "
            f"({c['filter_uses']} uses), {c['predicates']} predicates on {c['attributes']} attributes "
            f"({time.perf_counter() - t1:.1f}s)"
        )
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parse(records: Any, ids: Any, fmt: str, subs: list[Any], parsed: Path) -> None:
    """Parse the records in Spark into `parsed` (Parquet, partitioned by row kind)."""
    from pyspark.sql import functions as F

    dups: dict[str, int] | None = None
    if records.rdd.getNumPartitions() > 1:
        # a repeated id: the first record keeps it, later ones are errors (as in `ens check`)
        agg = (
            ids.where("id is not null")
            .groupBy("id")
            .agg(F.count("*").alias("n"), F.min("record").alias("r"))
        )
        dups = {r["id"]: r["r"] for r in agg.where("n > 1").collect()}
    task = _parse_task(fmt == "jsonl", dups, [x["id"] for x in subs] or None)
    records.mapInArrow(task, PARSED_DDL).write.partitionBy("kind").parquet(str(parsed))


def _write_tables(parsed: Path, snap: Path) -> tuple[Any, dict[str, Any]]:
    """The snapshot's tables, summed on the driver: the profile chunks and the counts."""
    import pyarrow.parquet as pq

    chunks = _sorted_table(parsed / "kind=chunk", ["record", "count", "blob"], [], ["record"])
    chunks = chunks.rename_columns(["first", "count", "blob"])
    (snap / "profiles").mkdir()
    pq.write_table(chunks, snap / "profiles" / "part-0.parquet")
    tables = {
        "filters": _sorted_table(parsed / "kind=filter", ["key"], ["uses"], ["key"]),
        "predicates": _sorted_table(
            parsed / "kind=predicate", ["key", "attr"], ["uses"], ["attr", "key"]
        ),
        "boundaries": _sorted_table(
            parsed / "kind=bound",
            ["attr", "op", "num", "str", "bool"],
            ["uses"],
            ["attr", "op", "num", "str", "bool"],
        ),
    }
    for name, table in tables.items():
        (snap / name).mkdir()
        pq.write_table(table, snap / name / "part-0.parquet")
    return chunks, tables


def _read_errors(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    return pq.read_table(path).sort_by("record").to_pylist() if path.exists() else []


def _manifest(
    source: str, fmt: str, chunks: Any, tables: dict[str, Any], n_errors: int
) -> dict[str, Any]:
    import pyarrow.compute as pc

    n_profiles = sum(chunks.column("count").to_pylist())
    preds = tables["predicates"]
    return {
        "version": VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": str(Path(source).resolve()),
        "format": fmt,
        "chunk_size": CHUNK,
        "counts": {
            "records": n_profiles + n_errors,
            "profiles": n_profiles,
            "errors": n_errors,
            "chunks": chunks.num_rows,
            "filters": tables["filters"].num_rows,
            "filter_uses": pc.sum(tables["filters"].column("uses")).as_py() or 0,
            "predicates": preds.num_rows,
            "predicate_uses": pc.sum(preds.column("uses")).as_py() or 0,
            "attributes": len(set(preds.column("attr").to_pylist())),
            "boundaries": tables["boundaries"].num_rows,
        },
    }


def _write_errors(rows: list[Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        for r in rows:
            rec = {
                "id": r["id"],
                "error": r["error"],
                "line": r["line"],
                "column": r["column"],
                "record": r["record"],
            }
            fh.write(json.dumps(rec) + "\n")
    tmp.replace(path)


# ------------------------------------------------------------------ load


def read_manifest(path: str | Path) -> dict[str, Any]:
    p = Path(path) / "manifest.json"
    try:
        manifest = json.loads(p.read_text())
    except OSError:
        raise ENSError(f"{path}: not an index snapshot (no manifest.json)") from None
    if manifest.get("version") != VERSION:
        raise ENSError(
            f"{path}: index version {manifest.get('version')} (this ENS reads {VERSION}); rebuild it"
        )
    return manifest


def load_index(path: str | Path) -> list[Profile]:
    """The profiles of a snapshot, in input order, without parsing (no Spark needed)."""
    import pyarrow.parquet as pq

    from adapters.spark.canon import load_profiles

    manifest = read_manifest(path)
    table = pq.read_table(Path(path) / "profiles", columns=["first", "blob"])
    order = sorted(range(table.num_rows), key=table.column("first").to_pylist().__getitem__)
    blobs = table.column("blob")
    out: list[Profile] = []
    for i in order:
        out.extend(load_profiles(blobs[i].as_py()))
    if len(out) != manifest["counts"]["profiles"]:
        raise ENSError(
            f"{path}: {len(out)} profiles, the manifest says {manifest['counts']['profiles']}"
        )
    return out


def index_stats(path: str | Path) -> dict[str, Any]:
    """Counts of a snapshot (manifest) — for `ens serve` start-up lines."""
    return read_manifest(path)["counts"]


def load_subscribers(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path) / "subscribers.json"
    return json.loads(p.read_text()) if p.exists() else []
