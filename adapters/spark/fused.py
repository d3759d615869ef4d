"""Replay without a shuffle when the source is already partitioned by the key.

A data set stored as one file per room and sensor (KETI) is partitioned by
room on disk. With `--key room` one task per room can merge its own files in
stream order and run the room's keyed engine right away: no parse table, no
pickled events, no shuffle, no sort — the generic path's main costs. Only
events the global or stateless profiles need are written out (for the usual
stages), with the engine state at the end of the room's stream: the end time
(`end_of`) depends on the *whole* feed's last event, known only when every
task is done, so the final timers fire in a small second step from the
pickled engine.

Arrival (the tie order) is the file's position in the adapter's list, as in
`feed.read_dataset`, so notifications merge exactly as in the generic path.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from adapters.spark.plan import Plan

FUSED_DDL = (
    "kind string, arrival long, ts double, route string, use int, blob binary, dkey binary, "
    "profile string, events map<string,string>, partition string, line string, n long, last double"
)
FLUSH = 20_000


def room_files(
    name: str, path: str, rooms: list[str] | None
) -> dict[str, list[tuple[int, str]]] | None:
    """room -> [(file position, sensor)] when the adapter lists per-room files; else None."""
    from pathlib import Path

    from adapters.datasets import get_adapter

    select_files = getattr(get_adapter(name).module, "select_files", None)
    if select_files is None:
        return None
    out: dict[str, list[tuple[int, str]]] = {}
    for i, (room, sensor, _f) in enumerate(select_files(Path(path), rooms, None)):
        out.setdefault(room, []).append((i, sensor))
    return out


def fused_frame(
    spark: SparkSession,
    name: str,
    path: str,
    plan: Plan,
    files: dict[str, list[tuple[int, str]]],
    tz: str,
) -> DataFrame:
    rows = [(room, [{"i": i, "sensor": s} for i, s in fs]) for room, fs in sorted(files.items())]
    jobs = spark.createDataFrame(rows, "room string, files array<struct<i:long, sensor:string>>")
    return jobs.repartition(len(rows) or 1).mapInArrow(_room_task(name, path, plan, tz), FUSED_DDL)


def _schema() -> pa.Schema:
    import pyarrow as pa

    from adapters.spark.session import ddl_fields

    fields = []
    for n, t in ddl_fields(FUSED_DDL.replace("map<string,string>", "string")):
        fields.append((n, pa.map_(pa.string(), pa.string()) if n == "events" else t))
    return pa.schema(fields)


def _room_task(name: str, path: str, plan: Plan, tz: str):  # noqa: ANN202 - a mapInArrow function
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from adapters.datasets import get_adapter
        from adapters.spark.feed import USE_KEYED, Rowifier, adapter_event, to_blob
        from adapters.spark.slices import SliceRunner, note_batch

        ad = get_adapter(name)
        schema = _schema()
        rw = Rowifier(plan.key, plan)
        for b in batches:
            for room, files in zip(
                b.column("room").to_pylist(), b.column("files").to_pylist(), strict=True
            ):
                streams = [_tagged(ad, path, room, f["sensor"], f["i"]) for f in files]
                runner = SliceRunner(plan.keyed, plan.positions, tz, (plan.evaluation, plan.rates))
                out: list[dict[str, Any]] = []
                n, first, last = 0, None, None
                for _ts, i, obj in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
                    ev = adapter_event(obj)
                    n += 1
                    if first is None:
                        first = (ev.ts, i)
                    last = ev.ts
                    row = rw.flags(ev)
                    if row[1] & USE_KEYED:
                        runner.process(ev, i)
                        if runner.engine.pending():
                            out.extend(_note_rows(note_batch(runner.take())))
                    if row[1] & ~USE_KEYED:
                        out.append(
                            {
                                "kind": "event",
                                "arrival": i,
                                "ts": ev.ts,
                                "route": row[0],
                                "use": row[1],
                                "blob": to_blob(ev),
                            }
                        )
                    if len(out) >= FLUSH:
                        yield pa.RecordBatch.from_pylist(out, schema=schema)
                        out = []
                out.append(
                    {
                        "kind": "state",
                        "blob": pickle.dumps(runner, protocol=pickle.HIGHEST_PROTOCOL),
                    }
                )
                if first is not None:
                    out.append(
                        {"kind": "stat", "n": n, "ts": first[0], "arrival": first[1], "last": last}
                    )
                yield pa.RecordBatch.from_pylist(out, schema=schema)

    return run


def _tagged(ad: Any, path: str, room: str, sensor: str, i: int) -> Iterator[tuple[float, int, Any]]:
    """One file's events as (ts, file position, event), the adapter's own merge key."""
    for obj in ad.iter_events(path, rooms=[room], kinds=[sensor]):
        yield obj["ts"], i, obj


def _note_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    rows = batch.to_pylist()
    for r in rows:
        r["kind"] = "note"
    return rows


def finish_task(end: tuple[float, bool]):  # noqa: ANN202 - a mapInArrow function
    """Restore each room's engine and fire what is due by the feed's end."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from adapters.spark.slices import note_batch

        for b in batches:
            for blob in b.column("blob").to_pylist():
                runner = pickle.loads(blob)  # noqa: S301 - pickled by this job's own tasks
                runner.finish(end)
                tagged = runner.take()
                if tagged:
                    yield note_batch(tagged)

    return run
