"""Benchmark of `ens spark stream` against the in-process engine worker (not a test).

One redis-server; per engine a fresh database state: 10^4 generated profiles over 50 rooms
(`adapters.spark.generate`, run `--key room`: `per room` profiles keyed, `absent ... per
sensor` global, filters stateless) are stored, then:

1. *throughput*: ``--events`` events (100 per ingest entry, as the API writes them) are
   appended to ``ens:ingest`` at once, followed by a flush event far in the future; the time
   from the first append until the engine has fed every event (status ``total_read`` and no
   event held back) gives the sustained events/s from ingest stream to outbox;
2. *latency* (Spark engines): ``--paced`` seconds of events at ``--rate`` events/s, each
   POST-sized entry carrying a probe matched by a bare filter; latency is from the XADD to
   the probe's outbox entry (both Redis clocks).

Engines (``--engines``): the worker (`EngineWorker`, event clock, lateness 2 s), then the
query (`adapters.spark.stream.start_query`, what `ens spark stream` runs) on each Spark
master given: local[1], local[2], local-cluster[2,1,2048] (two executor JVMs of one core;
a new SparkSession each; trigger ``--trigger``); a master suffixed ``@rows`` or ``@pandas``
runs on that state API (`keyed.processor`), the others on ``--state-api`` (rows unless
given: what `ens spark stream` runs; rows before 2026-11-28 without a state API in the
engine name were pandas). ``<master>@floor``: the same query with a processor that does no
engine work and keeps no state (`floor_processor`): Spark's own cost; ``<master>@floor-shard``:
that with one group per shard of routes (`shard_groups`). Engine ``source``: the
query's source code alone, in this process (`run_source`). CPU per event against the
worker's, same run: ``python_workers_cpu_x``, ``jvm_cpu_x``, ``job_cpu_x`` (driver + JVM +
Python workers), ``source_cpu_x``; with ``--intervals K`` also ``steady_*_cpu_x`` (intervals
2..K: the marginal cost once the query is warm). ``--jit``: the JVM's JIT (`session.JIT_MODES`).
Results as JSON lines in ``--out``; a table on stdout.

State work (Spark engines): the operator's counters per micro-batch (`adapters.spark.keyed`:
whole-engine restores, engine records and state bytes read and written, state calls, timers
fired, task CPU), from ``ens:spark:batches``: ``restores`` (timed interval) and
``restores_warmup`` in the row, means per batch with work in ``state_per_batch``.

3. *idle keys* (``--idle-keys 50,5000``, on the first Spark master): ``--profiles`` profiles
   over 50 rooms; N rooms get one ``ack`` event each (a route each, nothing due after), then
   ``--idle-seconds`` of paced load on rooms r0..r49 only: the state bytes per micro-batch
   should not grow with N.

    python bench/spark_stream.py                        # 50k events, 10^4 profiles
    python bench/spark_stream.py --events 20000 --profiles 1000 --paced 10
    python bench/spark_stream.py --engines "local[2]" --events 0 --profiles 200 \
        --idle-keys 50,5000
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.service import redis_store as rs  # noqa: E402
from adapters.spark.generate import generate  # noqa: E402
from notifiers import store  # noqa: E402
from tests.helpers_service import redis_server  # noqa: E402

KINDS = ["temperature", "humidity", "co2", "light", "presence", "window", "ack"]
T0 = 1_700_000_000.0
NORMAL = {"temperature": (22, 2), "humidity": (45, 7), "co2": (600, 120), "light": (300, 100)}


def event(rnd: random.Random, i: int, ts: float, rooms: int) -> dict[str, Any]:
    room = rnd.randrange(rooms)
    kind = rnd.choice(KINDS)
    ev: dict[str, Any] = {
        "id": f"e{i}",
        "ts": round(ts, 3),
        "kind": kind,
        "room": f"r{room}",
        "building": f"b{room % 20}",
        "sensor": f"s{room}-{rnd.randrange(4)}",
    }
    if kind == "window":
        ev["state"] = rnd.choices(["open", "closed", "broken"], weights=[10, 10, 1])[0]
    elif kind == "presence":
        ev["value"] = int(rnd.random() < 0.3)
    elif kind in NORMAL:  # readings are mostly normal: a few % cross a profile's threshold
        mu, sigma = NORMAL[kind]
        ev["value"] = round(rnd.gauss(mu, sigma), 1)
    return ev


def setup(r: redis.Redis, n_profiles: int, rooms: int) -> None:
    r.flushall()
    rt = redis.Redis(connection_pool=r.connection_pool)
    for rec in generate(n_profiles, rooms=rooms, seed=3):
        rs.put_profile(rt, rec["id"], rec["expr"])
    rs.put_profile(rt, "probe", 'kind = "probe"')


def preload(r: redis.Redis, n: int, rooms: int, base: float = T0, k: int = 0) -> float:
    """Append n events (100 per entry) and a flush event; returns the wall time it took.
    `k`: the how-many-th interval (`--intervals`): new event ids, times after interval k-1's."""
    rnd = random.Random(1)
    t = time.perf_counter()
    base += k * (n * 0.01 + 200)
    with r.pipeline(transaction=False) as p:
        for lo in range(0, n, 100):
            evs = [
                event(rnd, k * n + i, base + i * 0.01, rooms) for i in range(lo, min(n, lo + 100))
            ]
            p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(evs), rs.INGEST_GATEWAY: "bench"})
            if len(p) >= 200:
                p.execute()
        flush = {"id": f"flush{k or ''}", "ts": base + n * 0.01 + 100, "kind": "none"}
        p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps([flush]), rs.INGEST_GATEWAY: "bench"})
        p.incrby(rs.INGEST_IN, n + 1)
        p.execute()
    return time.perf_counter() - t


class CpuMeter:
    """CPU seconds (user + system) by process kind over an interval: this process (the driver's
    Python), the JVM(s), Spark's Python workers, redis-server and the rest of the machine, from
    sampling this process's tree (a process gone between samples keeps its last reading)."""

    KINDS = ("driver", "jvm", "python workers", "redis", "other procs")

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.sys0 = psutil.cpu_times()
        self.threads0: dict[tuple[int, int], tuple[str, float]] = {}
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}
        self.sample(initial=True)

    def kind(self, p: Any) -> str:
        if p.pid == self.me.pid:
            return "driver"
        try:
            cmd = " ".join(p.cmdline())
        except Exception:  # noqa: BLE001 - gone
            return "other procs"
        if "redis-server" in cmd:
            return "redis"
        if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
            return "python workers"
        if "java" in cmd.split(" ")[0]:
            return "jvm"
        return "other procs"

    def sample(self, initial: bool = False) -> None:
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
            if p.pid not in self.last:
                self.first[p.pid] = cpu if initial else 0.0
            self.last[p.pid] = (self.last.get(p.pid, (self.kind(p), 0.0))[0], cpu)
            if self.last[p.pid][0] == "jvm":
                for tid, name, tcpu in jvm_threads(p.pid):
                    if (p.pid, tid) not in self.threads:
                        self.threads0[(p.pid, tid)] = (name, tcpu if initial else 0.0)
                    self.threads[(p.pid, tid)] = (name, tcpu)

    def totals(self) -> dict[str, Any]:
        import psutil

        self.sample()
        out = dict.fromkeys(self.KINDS, 0.0)
        for pid, (kind, cpu) in self.last.items():
            out[kind] += cpu - self.first[pid]
        now = psutil.cpu_times()
        busy = sum(
            getattr(now, f) - getattr(self.sys0, f)
            for f in ("user", "system", "nice", "irq", "softirq")
        )
        out["machine"] = busy  # every process of the machine (the other engineer's jobs too)
        got = {k: round(v, 2) for k, v in out.items()}
        by: dict[str, float] = {}
        for key, (name, tcpu) in self.threads.items():
            by[name] = by.get(name, 0.0) + tcpu - self.threads0[key][1]
        top = sorted(by.items(), key=lambda kv: -kv[1])
        return {**got, "jvm_threads": {k: round(v, 2) for k, v in top if v >= 0.05}}


def jvm_threads(pid: int) -> list[tuple[int, str, float]]:
    """A JVM's threads (Linux /proc): id, name without its number (JIT compiler, GC, task
    threads, the stream's thread...) and CPU seconds."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for d in Path(f"/proc/{pid}/task").glob("*"):
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        f = raw[raw.rindex(")") + 2 :].split()
        out.append(
            (int(d.name), re.sub(r"[#-]?\d+$", "", name).strip(), (int(f[11]) + int(f[12])) / tick)
        )
    return out


def status(r: redis.Redis) -> dict[str, Any]:
    st = rs.worker_status(r)
    return st["stats"] if st else {}


def run_worker(r: redis.Redis, n: int, rooms: int, intervals: int = 1) -> dict[str, Any]:
    from adapters.service.worker import EngineWorker, WorkerConfig

    w = EngineWorker(
        r,
        WorkerConfig(
            reorder_seconds=2.0,
            clock="event",
            name="bench",
            batch=20,
            snapshot_interval=1e9,
            snapshot_inputs=10**9,
            status_interval=1e9,
            lock_ttl=600,
        ),
    )
    t = time.perf_counter()
    w.start()
    ready = time.perf_counter() - t
    ivs = []
    for k in range(intervals):
        meter = CpuMeter()
        t0, before = time.perf_counter(), r.xlen(store.OUTBOX)
        preload(r, n, rooms, k=k)
        while w.totals["read"] < (k + 1) * (n + 1) or len(w.buffer) > 1:
            w.step(block=0.01)
        w.commit()
        secs = time.perf_counter() - t0
        cpu = meter.totals()
        ivs.append(
            {
                "seconds": round(secs, 2),
                "events_per_s": round(n / secs),
                "notifications": r.xlen(store.OUTBOX) - before,
                "cpu_s": cpu,
                "cores_busy": round(cpu["machine"] / secs, 2),
            }
        )
    return {
        "engine": "worker",
        "events": n,
        **ivs[0],
        "start_s": round(ready, 1),
        **({"intervals": ivs} if intervals > 1 else {}),
    }


def run_spark(
    r: redis.Redis, url: str, master: str, n: int, rooms: int, args: Any, work: Path
) -> dict[str, Any]:
    from adapters.spark import keyed
    from adapters.spark.session import get_spark, local_cores
    from adapters.spark.stream import StreamConfig, start_query

    master, _, api = master.partition("@")  # local[2]@rows: the Row API (`--state-api`)
    api = api or args.state_api
    floor = api.startswith("floor")  # Spark's own cost: the query, a processor doing nothing
    t = time.perf_counter()
    spark = get_spark(master, app=f"ens-bench-{master}", jit=args.jit)
    cp = work / f"cp-{master}-{api}"
    real, group_by = keyed.processor, None
    if floor:
        keyed.processor = floor_processor  # (start_query builds the operator through it)
    if api == "floor-shard":  # fewer groups: 2 x cores keys, many routes each
        group_by = shard_groups(2 * local_cores(master))
    try:
        q = start_query(
            spark,
            StreamConfig(
                url,
                key="room",
                checkpoint=str(cp),
                trigger=args.trigger,
                lateness=2.0,
                clock="event",
                state_api="rows" if floor else api,
            ),
        )
    finally:
        keyed.processor = real
        if group_by is not None:
            group_by()
    try:
        # warm: one event through every Python worker (profiles parsed, engines built)
        r.xadd(
            rs.INGEST,
            {
                rs.INGEST_BATCH: json.dumps(
                    [{"id": "warm", "ts": T0 - 100, "kind": "probe", "room": "r0"}]
                ),
                rs.INGEST_GATEWAY: "bench",
            },
        )
        r.incrby(rs.INGEST_IN, 1)
        deadline = time.monotonic() + 600
        while status(r).get("total_read") != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        ready = time.perf_counter() - t
        ivs = [timed(r, q, n, rooms, k, deadline) for k in range(args.intervals)]
        row = {
            "engine": f"spark {master} {api}",
            "state_api": api,
            "events": n,
            **ivs[0],
            "start_s": round(ready, 1),
            **({"intervals": ivs} if args.intervals > 1 else {}),
        }
        if args.paced:
            row.update(paced(r, args.rate, args.paced, rooms))
        return row
    finally:
        q.stop()
        spark.stop()
        shutil.rmtree(cp, ignore_errors=True)


def timed(r: redis.Redis, q: Any, n: int, rooms: int, k: int, deadline: float) -> dict[str, Any]:
    """The k-th timed interval of a Spark engine: n events preloaded (`preload`), until the
    query has read them all (and the warm-up's and earlier intervals') and holds none."""
    before = r.xlen(store.OUTBOX)
    first_batch = (q.lastProgress or {}).get("batchId", -1) + 1
    meter = CpuMeter()
    t0, since = time.perf_counter(), time.time()
    preload(r, n, rooms, k=k)
    polls = 0
    while time.monotonic() < deadline:
        st = status(r)
        if st.get("total_read") == 1 + (k + 1) * (n + 1) and st.get("buffered") == 0:
            break
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        time.sleep(0.1)
        polls += 1
        if polls % 10 == 0:
            meter.sample()
    secs = time.perf_counter() - t0
    cpu = meter.totals()
    last = status(r).get("batch", -1)
    while (q.lastProgress or {}).get("batchId", -1) < last and time.monotonic() < deadline:
        time.sleep(0.1)  # (the progress of the last batch comes after its sink's commit)
    return {
        "seconds": round(secs, 2),
        "events_per_s": round(n / secs),
        "notifications": r.xlen(store.OUTBOX) - before,
        "cpu_s": cpu,
        "worker_cpu_ms_per_event": round(1000 * cpu["python workers"] / n, 3),
        "cores_busy": round(cpu["machine"] / secs, 2),
        **batches(q, first_batch, since),
        **state_work(r, first_batch),
    }


def run_source(r: redis.Redis, url: str, n: int, rooms: int, parts: int = 4) -> dict[str, Any]:
    """Engine ``source``: the query's source code alone (`stream.read_range`: XRANGE, parse,
    bare filters, routing, the Arrow batch), in this process on the same events split into
    `parts` ranges as a micro-batch's partitions are (local[2]: 4): our part of the Python
    workers' CPU that is not the operator."""
    from adapters.spark import profile_log
    from adapters.spark.stream import initial_offset, ranges, read_range

    plog = profile_log.ProfileLog(r).sync()
    off = {**initial_offset(), "plog": plog, "n": n + 1}
    list(read_range(url, "room", "UTC", "0-0", "0-0", off, True))  # profiles compiled
    preload(r, n, rooms)
    top = rs.text(r.xrevrange(rs.INGEST, count=1)[0][0])
    c0, t0 = time.process_time(), time.perf_counter()
    rows = 0
    for lo, hi, o, first in ranges({**off, "ingest": "0-0"}, {**off, "ingest": top}, parts):
        rows += sum(b.num_rows for b in read_range(url, "room", "UTC", lo, hi, o, first))
    cpu = time.process_time() - c0
    return {
        "engine": "source",
        "events": n,
        "seconds": round(time.perf_counter() - t0, 2),
        "rows": rows,
        "cpu_s": {"driver": round(cpu, 2)},
    }


def shard_groups(shards: int) -> Any:
    """Engine ``<master>@floor-shard``: `start_query`'s ``groupBy("route")`` becomes a group
    per shard of the route space (``hash(route) % shards``) while the
    query starts; returns what undoes it."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    real = DataFrame.groupBy

    def by_shard(self: Any, *cols: Any) -> Any:
        if cols == ("route",):
            shard = F.concat(F.lit("shard"), F.pmod(F.hash("route"), F.lit(shards)).cast("string"))
            return real(self, shard.alias("shard"))
        return real(self, *cols)

    DataFrame.groupBy = by_shard  # type: ignore[method-assign]

    def undo() -> None:
        DataFrame.groupBy = real  # type: ignore[method-assign]

    return undo


def floor_processor(cfg: Any) -> Any:
    """The floor (engine ``<master>@floor``): a Row-API `StatefulProcessor` in the query's
    place (`start_query`: same source, groupBy(route), transformWithState in event time, same
    status sink) that does no engine work and keeps no state: it reads its rows and writes the
    status row the bench waits for (events counted, nothing held). What Spark costs whatever
    the operator does. (Defined in the bench: cloudpickle ships it to the workers by value.)"""
    from pyspark.sql import Row as SparkRow
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from adapters.spark.keyed import COUNTERS, STATS_COLS

    class FloorProcessor(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            t0 = time.process_time()
            timerValues.getCurrentWatermarkInMs()
            routes: dict[str, int] = {}  # (a shard's rows by route, as a real one would)
            for x in rows:
                n = routes.get(x["route"], 0)
                routes[x["route"]] = n + (x["key"] is not None and x["counted"])
            n = sum(routes.values())
            stats: dict[str, Any] = dict.fromkeys(STATS_COLS)
            stats.update(route=key[0], events=n, late=0, notes=0, held=0, nin=0, late_keys="")
            stats.update(
                dict.fromkeys(COUNTERS, 0), routes=len(routes), cpu=time.process_time() - t0
            )
            yield SparkRow(**stats)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            return iter(())

        def close(self) -> None:
            pass

    return FloorProcessor()


def batches(q: Any, first: int, since: float = 0.0) -> dict[str, Any]:
    """The micro-batches of the timed interval (from the query's progress: from batch `first`
    and started at `since` (epoch s) or later, so not the warm-up's): how many, and the wall
    seconds of their phases (Spark's ``durationMs``) summed."""
    from datetime import datetime

    def start(p: dict[str, Any]) -> float:
        return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()

    prog = [p for p in q.recentProgress if p["batchId"] >= first and start(p) >= since]
    dur: dict[str, float] = {}
    for p in prog:
        for k, v in p["durationMs"].items():
            dur[k] = dur.get(k, 0) + v / 1000
    keep = (
        "triggerExecution",
        "addBatch",
        "latestOffset",
        "queryPlanning",
        "walCommit",
        "commitOffsets",
    )
    out: dict[str, Any] = {
        "batches": len(prog),
        "batch_s": {k: round(dur[k], 2) for k in keep if k in dur},
    }
    if prog and "triggerExecution" in dur and "addBatch" in dur:
        # the driver's serial part: every phase but addBatch (offsets, planning, the WAL, the
        # commit), which holds the tasks (and the sink's commit on the driver: an upper bound
        # on the speedup); Amdahl: T(N) = serial + addBatch / N
        serial = dur["triggerExecution"] - dur["addBatch"]
        out["driver_serial_s_per_batch"] = round(serial / len(prog), 3)
        out["batch_s_mean"] = round(dur["triggerExecution"] / len(prog), 3)
        out["amdahl_speedup"] = {
            str(n): round(dur["triggerExecution"] / (serial + dur["addBatch"] / n), 2)
            for n in (4, 16, 64)
        }
    return out


def state_work(r: redis.Redis, first: int) -> dict[str, Any]:
    """The operator's state counters (``ens:spark:batches``): restores before and from batch
    `first`, and per-batch means over the batches from `first` that invoked any route."""
    from adapters.spark.keyed import COUNTERS
    from adapters.spark.stream import BATCHES_KEY

    recs = [json.loads(x) for x in r.lrange(BATCHES_KEY, 0, -1)]
    timed = [x for x in recs if x["batch"] >= first]
    busy = [x for x in timed if x.get("routes")]
    per = (
        {
            k: round(sum(x.get(k, 0) for x in busy) / len(busy), 3 if k == "cpu" else 1)
            for k in (*COUNTERS, "cpu")
        }
        if busy
        else {}
    )
    return {
        "restores": sum(x.get("restores", 0) for x in timed),
        "restores_warmup": sum(x.get("restores", 0) for x in recs if x["batch"] < first),
        "state_batches": len(busy),
        "state_per_batch": per,
    }


def idle_keys(
    r: redis.Redis, url: str, master: str, keys: int, args: Any, work: Path
) -> dict[str, Any]:
    """`keys` rooms get a route each (one `ack` event: nothing due after), then paced load on
    50 of them: the state work per micro-batch of that load."""
    from adapters.spark.session import get_spark
    from adapters.spark.stream import StreamConfig, start_query

    setup(r, args.profiles, 50)
    spark = get_spark(master, app=f"ens-bench-idle-{keys}", jit=args.jit)
    cp = work / f"cp-idle-{keys}"
    q = start_query(
        spark,
        StreamConfig(url, key="room", checkpoint=str(cp), trigger=args.trigger, clock="event"),
    )
    try:
        evs = [
            {"id": f"i{i}", "ts": T0 + i * 0.001, "kind": "ack", "room": f"r{i}"}
            for i in range(keys)
        ]
        with r.pipeline(transaction=False) as p:
            for lo in range(0, keys, 100):
                p.xadd(
                    rs.INGEST,
                    {rs.INGEST_BATCH: json.dumps(evs[lo : lo + 100]), rs.INGEST_GATEWAY: "bench"},
                )
            p.incrby(rs.INGEST_IN, keys)
            p.execute()
        deadline = time.monotonic() + 900
        t = time.perf_counter()
        while time.monotonic() < deadline:
            st = status(r)
            if st.get("total_read") == keys and st.get("buffered") == 0:
                break
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            time.sleep(0.2)
        populate = time.perf_counter() - t
        routes = r.scard("ens:spark:routes")
        time.sleep(3)  # the idle rule's batches settle
        first = (q.lastProgress or {}).get("batchId", -1) + 1
        lat = paced(r, args.rate, args.idle_seconds, 50)
        time.sleep(2)
        return {
            "engine": f"spark {master}",
            "idle_keys": keys,
            "routes": routes,
            "populate_s": round(populate, 1),
            **lat,
            **state_work(r, first),
        }
    finally:
        q.stop()
        spark.stop()
        shutil.rmtree(cp, ignore_errors=True)


def paced(r: redis.Redis, rate: float, seconds: float, rooms: int) -> dict[str, Any]:
    """Entries of 10 events at `rate` events/s, one probe each; XADD -> outbox latency."""
    rnd = random.Random(2)
    sent: dict[str, float] = {}
    top = r.xrevrange(store.OUTBOX, count=1)
    since = rs.text(top[0][0]) if top else "0-0"
    base = T0 + 10**6
    start = time.time()
    i = 0
    while time.time() - start < seconds:
        due = start + i / rate
        time.sleep(max(0.0, due - time.time()))
        now = time.time()
        evs = [event(rnd, i + k, base + (now - start), rooms) for k in range(9)]
        evs.append({"id": f"probe-{i}", "ts": base + (now - start), "kind": "probe"})
        eid = r.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(evs), rs.INGEST_GATEWAY: "bench"})
        sent[f"probe-{i}"] = rs.stream_ms(rs.text(eid))
        i += 10
    got: dict[str, float] = {}
    deadline = time.time() + 120
    while len(got) < len(sent) and time.time() < deadline:
        for eid, f in r.xrange(store.OUTBOX, min=f"({since}"):
            since = rs.text(eid)
            nrec = json.loads(f[store.OUTBOX_FIELD.encode()])
            if nrec["profile"] == "probe":
                got[nrec["events"]["e"]["id"]] = rs.stream_ms(since)
        time.sleep(0.2)
    lat = sorted(got[k] - t for k, t in sent.items() if k in got)
    return {
        "paced_rate": rate,
        "probes": len(sent),
        "lost": len(sent) - len(lat),
        "p50_ms": round(1000 * statistics.median(lat)),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * (len(lat) - 1)))]),
    }


def cpu_x(cpu: dict[str, float], n: int, wcpu: float) -> dict[str, float]:
    """CPU per event (`n` events) against the worker's (`wcpu` s per event): the Python
    workers', the JVM's and the whole job's (driver + JVM + Python workers)."""
    job = cpu["driver"] + cpu["jvm"] + cpu["python workers"]
    return {
        "python_workers_cpu_x": round(cpu["python workers"] / n / wcpu, 2),
        "jvm_cpu_x": round(cpu["jvm"] / n / wcpu, 2),
        "job_cpu_x": round(job / n / wcpu, 2),
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--profiles", type=int, default=10_000)
    ap.add_argument("--rooms", type=int, default=50)
    ap.add_argument("--trigger", default="500 milliseconds")
    ap.add_argument("--paced", type=float, default=20.0, help="seconds of paced load (0: none)")
    ap.add_argument("--rate", type=float, default=300.0, help="paced events/s")
    ap.add_argument(
        "--engines",
        default="worker,local[1],local[2],local-cluster[2,1,2048]",
        help="worker and Spark masters, comma-separated",
    )
    ap.add_argument(
        "--state-api",
        default="rows",
        choices=("pandas", "rows"),
        help="the operator's API (a master may name its own: local[2]@rows)",
    )
    ap.add_argument("--out", default="docs/results/spark_stream.jsonl")
    ap.add_argument(
        "--idle-keys", default="", help="e.g. 50,5000: the idle-keys runs (see the docstring)"
    )
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument(
        "--jit",
        default="c1",
        choices=("c1", "full"),
        help="the JVM's JIT compilers (`session.JIT_MODES`; c1: what `ens spark stream` "
        "runs; fixed by the first Spark engine of the run: one JVM per process)",
    )
    ap.add_argument(
        "--intervals",
        type=int,
        default=1,
        help="timed intervals of --events each, one after the other on the same engine: "
        "the first holds the fixed costs (first real batch: JIT, codegen), the others the "
        "steady state (`intervals` and `steady_*_cpu_x` in the row)",
    )
    return ap


def _against_worker(rows: list[dict[str, Any]], w: dict[str, Any]) -> None:
    """Each row's CPU per event against the in-process worker's of the same run (in place)."""
    for x in rows:
        if x is not w and x.get("events") and "cpu_s" in x:
            wcpu = w["cpu_s"]["driver"] / w["events"]
            if x["engine"] == "source":
                x["source_cpu_x"] = round(x["cpu_s"]["driver"] / x["events"] / wcpu, 2)
                continue
            x.update(cpu_x(x["cpu_s"], x["events"], wcpu))
            if "intervals" in x and "intervals" in w:  # after the first: per event at steady
                wst = sum(i["cpu_s"]["driver"] for i in w["intervals"][1:])
                mine = {
                    k: sum(i["cpu_s"][k] for i in x["intervals"][1:])
                    for k in ("driver", "jvm", "python workers")
                }
                st = cpu_x(mine, 1, wst)
                x.update({f"steady_{k}": v for k, v in st.items()})


def main() -> None:
    args = _parser().parse_args()
    work = Path(tempfile.mkdtemp(prefix="ens-bench-stream-"))
    rows = []
    try:
        with redis_server(work) as url:
            r = redis.Redis.from_url(url)
            engines = re.split(r",(?![^\[]*\])", args.engines)  # not the commas in [...]
            for eng in engines if args.events else []:
                setup(r, args.profiles, args.rooms)
                print(f"-- {eng}", file=sys.stderr, flush=True)
                if eng == "worker":
                    row = run_worker(r, args.events, args.rooms, args.intervals)
                elif eng == "source":
                    row = run_source(r, url, args.events, args.rooms)
                else:
                    row = run_spark(r, url, eng, args.events, args.rooms, args, work)
                row.update(profiles=args.profiles, rooms=args.rooms)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
            sparks = [e.partition("@")[0] for e in engines if e != "worker"]
            for n in [int(x) for x in args.idle_keys.split(",") if x] if sparks else []:
                print(f"-- idle keys {n} on {sparks[0]}", file=sys.stderr, flush=True)
                row = idle_keys(r, url, sparks[0], n, args, work)
                row.update(profiles=args.profiles)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
            r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {x["engine"]: x for x in rows if "idle_keys" not in x}
    w = by.get("worker")
    if w is not None:
        _against_worker(rows, w)
    one, two = (f"spark local[{c}] {args.state_api}" for c in (1, 2))
    if one in by and two in by:
        ratio = by[two]["events_per_s"] / by[one]["events_per_s"]
        print(f"scaling local[2]/local[1]: {ratio:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        for x in rows:
            fh.write(json.dumps(x) + "\n")
    for x in rows:
        print(x)


if __name__ == "__main__":
    main()
