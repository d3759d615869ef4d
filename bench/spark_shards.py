"""A simulated N-executor `ens spark stream`: the route space in shards, each on one core (not a test).

What the Python workers do per micro-batch (`bench.spark_tasks`: the source's `read_range`
and one `KeyEngine.run` per route, state in dicts), with the routes split into ``--shards``
shards by a hash of the route (as Spark's shuffle splits them) and the ingest range of each
micro-batch into as many source partitions. Each shard is a process pinned to one core
(``taskset -c``) that reads its source partition of every micro-batch (CPU counted) and steps
its own routes (CPU counted; it also reads the other source partitions to find its routes'
events, not counted: in Spark another executor reads them). Then:

1. every shard run alone (one after the other, each on core 0): their CPU summed against the
   unsharded run (one process, every route) on the same core: the overhead of sharding;
2. predicted throughput at N executors from the shards' CPU (the slowest of N equal parts of
   it: events / (sum / N), the route space balanced);
3. real runs at N = 1 (the unsharded process) and N = 2 (two shards at once, on cores 0 and
   1): events / wall seconds (each process's own work, after its warm-up), against the
   prediction.

    python bench/spark_shards.py --events 20000 --profiles 2000 [--shards 4]

The machine is shared: wall seconds (3.) include waiting for a core; CPU seconds (1.) do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.spark_stream import preload, run_worker, setup  # noqa: E402
from tests.helpers_service import redis_server  # noqa: E402


def shard_of(route: str, shards: int) -> int:
    return zlib.crc32(route.encode()) % shards


def child(url: str, shard: int | None, shards: int, batch: int) -> dict[str, Any]:
    """One shard's work (`shard` None: every route, the whole source), CPU seconds counted."""
    from adapters.service import redis_store as rs
    from adapters.spark import live
    from adapters.spark.live import TICK, DictRecords, KeyEngine, ProfileLog, Row, versions
    from adapters.spark.stream import read_range, routers
    from bench.spark_tasks import _step_route

    r = redis.Redis.from_url(url)
    plog = ProfileLog(r).sync()
    ids = [rs.text(e[0]) for e in r.xrange(rs.INGEST)]
    step = max(1, batch // 100)
    chunks = [ids[i] for i in range(step - 1, len(ids), step)]
    if chunks[-1] != ids[-1]:
        chunks.append(ids[-1])
    for cls, _attr, _rel in routers(url, "room", plog):  # warm-up: profiles parsed, compiled
        live.compiled(versions(url, "room"), plog, cls, "UTC", ("eager", None))
    import pandas  # noqa: F401 - imported by the worker before any batch

    live.stateless(versions(url, "room"), plog, "w", [("w", live.Event("w", 0.0, {}))])
    state: dict[str, dict[str, Any]] = {}
    out = {"notifications": 0, "parts_read": 0, "parts_written": 0, "restores": 0, "routes": 0}
    src = run = wall = 0.0  # wall: of its own work only (not the others' source partitions)
    lo, wm = "0-0", None
    pos = {e: i for i, e in enumerate(ids)}
    for hi in chunks:
        a, b = pos.get(lo, -1) + 1, pos[hi] + 1
        n = max(1, shards if shard is not None else 1)
        bounds = [ids[a + (b - a) * (k + 1) // n - 1] for k in range(n)]
        rows: dict[str, list[Any]] = {}
        newest = None
        start = lo
        for k, end in enumerate(bounds):
            mine = shard is None or k == shard
            t, tw = time.process_time(), time.monotonic()
            offset = {"plog": plog, "epoch": "b", "n": 0, "wm": wm}
            if end != start and (pos.get(start, -1) < pos[end]):
                for part in read_range(url, "room", "UTC", start, end, offset, k == 0):
                    d = part.to_pydict()
                    for i, route in enumerate(d["route"]):
                        if route == TICK:
                            if d["ts"][i] is not None:
                                newest = max(newest or d["ts"][i], d["ts"][i])
                            continue
                        if shard is not None and shard_of(route, shards) != shard:
                            continue
                        rows.setdefault(route, []).append(
                            Row(d["key"][i], d["gw"][i], d["ts"][i], d["ev"][i], plog, "b", True)
                        )
            if mine:
                src += time.process_time() - t
                wall += time.monotonic() - tw
            start = end
        t, tw = time.process_time(), time.monotonic()
        vs = versions(url, "room")
        due = {k for k, s in state.items() if s["due"] <= (wm or 0)}
        for route in sorted(set(rows) | due):
            _step_route(live, KeyEngine, DictRecords, vs, state, route, rows, wm, out)
        run += time.process_time() - t
        wall += time.monotonic() - tw
        lo = hi
        wm = newest - 2.0 if newest is not None else wm
    return {
        "shard": shard,
        "source_cpu_s": round(src, 3),
        "steps_cpu_s": round(run, 3),
        "cpu_s": round(src + run, 3),
        "wall_s": round(wall, 3),
        **out,
    }


def spawn(url: str, shard: int | None, shards: int, batch: int, core: int) -> subprocess.Popen:
    cmd = ["taskset", "-c", str(core), sys.executable, __file__, "--child", url]
    cmd += ["--shard", str(-1 if shard is None else shard), "--shards", str(shards)]
    cmd += ["--batch", str(batch)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def result(p: subprocess.Popen) -> dict[str, Any]:
    got, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"a shard failed ({p.returncode})")
    return dict(json.loads(got.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--profiles", type=int, default=2000)
    ap.add_argument("--rooms", type=int, default=50)
    ap.add_argument("--batch", type=int, default=5000, help="events per micro-batch")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="append the row (JSON) here")
    ap.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=-1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        got = child(a.child, None if a.shard < 0 else a.shard, a.shards, a.batch)
        print(json.dumps(got))
        return
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        r = redis.Redis.from_url(url)
        setup(r, a.profiles, a.rooms)
        w = run_worker(r, a.events, a.rooms)
        setup(r, a.profiles, a.rooms)
        preload(r, a.events, a.rooms)
        whole = result(spawn(url, None, 1, a.batch, 0))
        alone = [result(spawn(url, k, a.shards, a.batch, 0)) for k in range(a.shards)]
        pair = [spawn(url, k, 2, a.batch, k % cores) for k in range(2)]
        two = [result(p) for p in pair]
        wall2 = max(s["wall_s"] for s in two)  # (from each one's start after its warm-up)
    total = sum(s["cpu_s"] for s in alone)
    load = os.getloadavg()[0]
    row = {
        "bench": "spark_shards",
        "events": a.events,
        "profiles": a.profiles,
        "shards": a.shards,
        "load_average": round(load, 1),
        "worker_cpu_s": w["cpu_s"]["driver"],
        "unsharded": whole,
        "alone": alone,
        "shards_cpu_sum_s": round(total, 3),
        "shards_vs_unsharded": round(total / whole["cpu_s"], 3),
        "shard_cpu_max_s": max(s["cpu_s"] for s in alone),
        "predicted_ev_s": {str(n): round(a.events / (total / n)) for n in (1, 2, a.shards, 16, 64)},
        "real_ev_s": {
            "1": round(a.events / whole["wall_s"]),
            "2": round(a.events / wall2),
        },
        "two": two,
        "notifications": {
            "unsharded": whole["notifications"],
            "shards": sum(s["notifications"] for s in alone),
        },
    }
    print(json.dumps(row))
    if a.out:
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    print(
        f"CPU: unsharded {whole['cpu_s']:.2f} s, {a.shards} shards alone {total:.2f} s "
        f"({row['shards_vs_unsharded']:.2f}x); predicted ev/s at 1/2/{a.shards}: "
        f"{row['predicted_ev_s']['1']}/{row['predicted_ev_s']['2']}/"
        f"{row['predicted_ev_s'][str(a.shards)]}; real at 1/2: "
        f"{row['real_ev_s']['1']}/{row['real_ev_s']['2']} (load average {load:.1f})"
    )


if __name__ == "__main__":
    main()
