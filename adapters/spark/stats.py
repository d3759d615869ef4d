"""`ens spark stats`: how often each profile component's filter matches over a feed's history.

Selectivities let an engine (or a person) order predicates and size indexes
from real traffic instead of guesses. Output (`STATS.json`, version 1):

```json
{"version": 1, "source": "...", "events": 1200, "first_ts": 1377299107.0,
 "last_ts": 1377385507.0, "hours": 24.0,
 "filters": {"kind = \\"co2\\" and value > 1000": {"matches": 12, "rate_per_hour": 0.5,
                                                 "selectivity": 0.01}},
 "profiles": {"p2": {"c": {"filter": "kind = \\"co2\\" and value > 1000", "negated": false,
                            "matches": 12, "rate_per_hour": 0.5, "selectivity": 0.01}}}}
```

`filters` is keyed by the canonical filter text (`canon.filter_key`), so a
filter shared by many profiles is counted once; `profiles` maps every
profile's leaf components (bare filter: `e`; `absent(F)`: `last`) to it.
`matches` counts events the filter accepts, whatever the profile's `per`
(an event lacking a `per` attribute still counts). `rate_per_hour` is
matches / (last_ts - first_ts) in hours (null for a zero-length history);
`selectivity` is matches / events (null without events).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiles.ast import Profile

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

VERSION = 1
Log = Callable[[str], None]


def distinct_filters(profiles: list[Profile]) -> tuple[list[Any], dict[str, int]]:
    """The distinct leaf filters (by canonical key) and key -> position."""
    from adapters.spark.canon import filter_key
    from adapters.spark.plan import leaves

    filters: list[Any] = []
    pos: dict[str, int] = {}
    for p in profiles:
        for lf in leaves(p):
            k = filter_key(lf.filter)
            if k not in pos:
                pos[k] = len(filters)
                filters.append(lf.filter)
    return filters, pos


class Counter:
    """Counts matches of many filters per event: a primitive pool, exact evaluation on collisions.

    The pool (and the compile cache) treat dataclass-equal filters as one,
    and `x = 1` equals `x = true` as a dataclass; such second filters are
    evaluated on their own so every count is exact.
    """

    def __init__(self, filters: list[Any]) -> None:
        from filters.pool.primitive import PrimitivePool

        self.pool = PrimitivePool()
        self.direct: list[tuple[int, Any]] = []
        seen: dict[Any, int] = {}
        for i, f in enumerate(filters):
            if f in seen:
                self.direct.append((i, f))
            else:
                seen[f] = i
                self.pool.add(f, i)
        self.counts: list[int] = [0] * len(filters)

    def add(self, attrs: dict[str, Any]) -> None:
        from filters.compile import evaluate

        counts = self.counts
        for entry in self.pool.match(attrs):
            for i in entry.owners:  # the filter indexes given to pool.add
                counts[i] += 1  # type: ignore[call-overload,index]
        for i, f in self.direct:
            if evaluate(f, attrs):
                counts[i] += 1


def _count_task(filters: list[Any]):  # noqa: ANN202 - a mapInArrow function
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pickle

        import pyarrow as pa

        c = Counter(filters)
        for b in batches:
            for blob in b.column("blob").to_pylist():
                c.add(pickle.loads(blob)[1])  # noqa: S301 - written by this job
        hits = [(i, n) for i, n in enumerate(c.counts) if n]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([i for i, _ in hits], pa.int32()),
                pa.array([n for _, n in hits], pa.int64()),
            ],
            names=["fid", "n"],
        )

    return run


def rates_of(n: int, events: int, hours: float | None) -> dict[str, Any]:
    return {
        "matches": n,
        "rate_per_hour": round(n / hours, 6) if hours else None,
        "selectivity": round(n / events, 9) if events else None,
    }


def stats_job(
    spark: SparkSession,
    profiles: list[Profile],
    source: Callable[[], DataFrame],
    out: str,
    *,
    name: str = "",
    work: str | None = None,
    log: Log = lambda _m: None,
) -> dict[str, Any]:
    """Count, write `out` atomically, return the document."""
    import shutil
    import tempfile

    from pyspark.sql import functions as F

    from adapters.spark.canon import filter_key
    from adapters.spark.plan import leaves
    from adapters.spark.replay import check_events

    filters, pos = distinct_filters(profiles)
    log(f"{len(profiles)} profiles, {len(filters)} distinct leaf filters")
    target = Path(out)
    work_dir = Path(
        tempfile.mkdtemp(
            prefix=".ens-stats-", dir=work or (target.parent if str(target.parent) else ".")
        )
    )
    try:
        t = time.perf_counter()
        parsed_path = str(work_dir / "events")
        source().write.option("compression", "zstd").parquet(parsed_path)
        parsed = spark.read.parquet(parsed_path)
        events, first, last, _keys = check_events(parsed)
        log(f"parsed {events} events in {time.perf_counter() - t:.1f}s")
        rows = (
            parsed.where("err is null")
            .select("blob")
            .mapInArrow(_count_task(filters), "fid int, n long")
        )
        counts = [0] * len(filters)
        for r in rows.groupBy("fid").agg(F.sum("n").alias("n")).collect():
            counts[r["fid"]] = int(r["n"])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    first_ts = first[0] if first else None
    hours = (last - first_ts) / 3600.0 if first_ts is not None and last is not None else None
    keys = sorted(pos, key=pos.__getitem__)
    doc: dict[str, Any] = {
        "version": VERSION,
        "source": name,
        "events": events,
        "first_ts": first_ts,
        "last_ts": last,
        "hours": round(hours, 6) if hours is not None else None,
        "filters": {k: rates_of(counts[pos[k]], events, hours) for k in keys},
        "profiles": {},
    }
    for p in profiles:
        comps = {}
        for lf in leaves(p):
            k = filter_key(lf.filter)
            comps[lf.name] = {
                "filter": k,
                "negated": lf.negated,
                **rates_of(counts[pos[k]], events, hours),
            }
        doc["profiles"][p.id] = comps
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, target)
    log(
        f"wrote {out}: {len(filters)} filters over {events} events ({time.perf_counter() - t:.1f}s)"
    )
    return doc
