"""What `ens spark stream`'s Python workers do per event, without Spark (not a test).

The source (`stream.read_range`) over ``--events`` events of `bench.spark_stream`'s workload,
then per micro-batch of ``--batch`` events one `KeyEngine.run` per route with its state in
dicts (as `keyed.processor` keeps it in Spark's state store: the header, the held list and
the engine header pickled, the partition records in a `DictRecords`), the watermark at the
previous batch's newest ts minus 2 s. CPU seconds of the source and of the steps, per event,
against the in-process worker (`EngineWorker`) on the same events in the same run. With
``--profile`` a cProfile of the steps (top 25 by cumulative time).

    python bench/spark_tasks.py --events 20000 --profiles 2000 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pickle
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.spark_stream import preload, run_worker, setup  # noqa: E402
from tests.helpers_service import redis_server  # noqa: E402


def _step_route(
    live: Any,
    key_engine: Any,
    dict_records: Any,
    vs: Any,
    state: dict[str, dict[str, Any]],
    route: str,
    rows: dict[str, list[Any]],
    wm: float | None,
    out: dict[str, int],
) -> None:
    """One `KeyEngine.run` of a route, its state kept as the operator keeps it (pickled)."""
    s = state.setdefault(route, {"hdr": None, "held": [], "eng": None, "parts": dict_records()})
    hdr = pickle.loads(s["hdr"]) if s["hdr"] else None  # noqa: S301
    ke = key_engine(route, vs)
    got = ke.run(
        hdr,
        rows.get(route, []),
        wm,
        lambda s=s: [(*h[:4], live.Event(*pickle.loads(h[4]))) for h in s["held"]],  # noqa: S301
        lambda s=s: (s["eng"][0], pickle.loads(s["eng"][1])),  # noqa: S301
        s["parts"],
    )
    ser = [(*h[:4], pickle.dumps((h[4].id, h[4].ts, h[4].attrs))) for h in got.append]
    if got.held_list is not None:
        s["held"] = [(*h[:4], pickle.dumps((h[4].id, h[4].ts, h[4].attrs))) for h in got.held_list]
    s["held"] += ser
    if got.eng is not None:
        s["eng"] = (got.eng[0], pickle.dumps(got.eng[1], pickle.HIGHEST_PROTOCOL))
    s["hdr"] = pickle.dumps(got.hdr, pickle.HIGHEST_PROTOCOL)
    s["due"] = got.due
    out["notifications"] += len(got.records)
    out["parts_read"] += got.parts_read
    out["parts_written"] += got.parts_written
    out["restores"] += got.restores
    out["routes"] += 1


def steps(
    url: str, n: int, batch: int, prof: cProfile.Profile | None, what: str = "steps"
) -> dict[str, Any]:
    from adapters.service import redis_store as rs
    from adapters.spark import live
    from adapters.spark.live import TICK, DictRecords, KeyEngine, ProfileLog, Row, versions
    from adapters.spark.stream import read_range

    r = redis.Redis.from_url(url)
    plog = ProfileLog(r).sync()
    ids = [rs.text(e[0]) for e in r.xrange(rs.INGEST)]
    chunks = [ids[i] for i in range(batch // 100 - 1, len(ids), batch // 100)]
    if chunks[-1] != ids[-1]:
        chunks.append(ids[-1])
    state: dict[str, dict[str, Any]] = {}
    from adapters.spark.stream import routers

    for cls, _attr, _rel in routers(url, "room", plog):  # warm-up: profiles parsed, compiled
        live.compiled(versions(url, "room"), plog, cls, "UTC", ("eager", None))
    import pandas  # noqa: F401 - imported by the worker before any batch

    live.stateless(versions(url, "room"), plog, "w", [("w", live.Event("w", 0.0, {}))])

    src = run = 0.0
    out = {"notifications": 0, "parts_read": 0, "parts_written": 0, "restores": 0, "routes": 0}
    lo, wm = "0-0", None
    for bi, hi in enumerate(chunks):
        t = time.process_time()
        if prof and what == "source":
            prof.enable()
        offset = {"plog": plog, "epoch": "b", "n": 0, "wm": wm}
        rows: dict[str, list[Any]] = {}
        newest = None
        for b in read_range(url, "room", "UTC", lo, hi, offset, bi == 0):
            d = b.to_pydict()
            for i, route in enumerate(d["route"]):
                if route == TICK:
                    if d["ts"][i] is not None:
                        newest = max(newest or d["ts"][i], d["ts"][i])
                    continue
                rows.setdefault(route, []).append(
                    Row(d["key"][i], d["gw"][i], d["ts"][i], d["ev"][i], plog, "b", d["counted"][i])
                )
        if prof and what == "source":
            prof.disable()
        src += time.process_time() - t
        t = time.process_time()
        if prof and what == "steps":
            prof.enable()
        vs = versions(url, "room")
        for route in sorted(set(rows) | {k for k, s in state.items() if s["due"] <= (wm or 0)}):
            _step_route(live, KeyEngine, DictRecords, vs, state, route, rows, wm, out)
        if prof and what == "steps":
            prof.disable()
        run += time.process_time() - t
        lo = hi
        wm = newest - 2.0 if newest is not None else wm
    return {"source_cpu_s": round(src, 2), "steps_cpu_s": round(run, 2), **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--profiles", type=int, default=2000)
    ap.add_argument("--rooms", type=int, default=50)
    ap.add_argument("--batch", type=int, default=5000, help="events per micro-batch")
    ap.add_argument("--profile", choices=["steps", "source"], help="cProfile this part")
    ap.add_argument("--out", type=Path, default=None, help="append the row (JSON) here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        r = redis.Redis.from_url(url)
        setup(r, a.profiles, a.rooms)
        w = run_worker(r, a.events, a.rooms)
        setup(r, a.profiles, a.rooms)
        preload(r, a.events, a.rooms)
        prof = cProfile.Profile() if a.profile else None
        t = steps(url, a.events, a.batch, prof, a.profile or "steps")
    wcpu = w["cpu_s"]["driver"]
    row = {
        "bench": "spark_tasks",
        "events": a.events,
        "profiles": a.profiles,
        "batch": a.batch,
        "worker_cpu_s": wcpu,
        "worker_notifications": w["notifications"],
        **t,
        "source_x": round(t["source_cpu_s"] / wcpu, 2),
        "steps_x": round(t["steps_cpu_s"] / wcpu, 2),
        "tasks_x": round((t["source_cpu_s"] + t["steps_cpu_s"]) / wcpu, 2),
    }
    print(json.dumps(row))
    if a.out:
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
