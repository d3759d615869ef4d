"""`ens spark stream`: live detection as a Spark Structured Streaming query.

    ens:ingest --(Python data source: stream-id ranges)--> rows routed by route
      --(transformWithState: one engine per route, per-key state)--> ens:outbox

Source. `IngestSource` is a PySpark Python streaming data source (no JVM connector): an
offset is ``{"ingest": last entry id, "plog": profile-log id, "epoch": ..., "n": events the
API accepted up to it}``; a micro-batch's id range is split by time into partitions, each
read with XRANGE. The reader parses each event (bad ones are logged, recorded in
``ens:spark:invalid`` and skipped), evaluates bare filters on the spot and routes the rest
by route class (`routes.route_class`): profiles `per --key` by its value, profiles `per`
other attributes by the first of theirs, the others to 8 shards by profile id.

Engines. `keyed.processor` runs `live.KeyEngine` per route with its state in Spark's per-key
state (RocksDB). Event time: the service's per-gateway watermark
(`watermark.offset_watermark`: own latenesses, the idle rule), computed by the driver in
`latestOffset` from the gateways' progress the status sink merged (``ens:spark:gateways``)
and carried in the offset (checkpointed, so re-executions agree), releases held events in
(ts, ingest) order and advances the engine, which fires trailing negations, ``absent`` and
``within`` expiries (engine time moves to the watermark only when a timer falls due before
it); an event older than its engine's time is late: written to the service's late output
``ens:late`` (`sinks.LateOutput`, idempotent like the outbox; ``--late-events feed``: fed at
once), logged, counted once per event (the sink unions the engines' late keys). ``--clock
wall`` also raises the offset's watermark to the wall clock minus the largest active
lateness. A route with something due has one Spark event-time timer at that time (Spark's
watermark is the offsets' watermark, one batch later); a route with nothing due is never
invoked.

Output. Notifications are written by the tasks themselves, idempotently (`sinks.Outbox`),
with deterministic ids: a micro-batch re-executed after a crash restores the same state,
reads the same range and profile version, and so gives the same ids, which are skipped.
Late records likewise (`sinks.LateOutput`, one per ingest event key).
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import adapters.spark.ingest as ingest
import adapters.spark.live as live
import adapters.spark.profile_log as profile_log
import adapters.spark.routes as routes
import adapters.spark.sinks as sinks
import adapters.spark.watermark as watermark
from adapters.service import redis_store as rs
from adapters.service.watermarks import Watermarks
from adapters.spark.clients import _clients, client  # noqa: F401 - tests
from adapters.spark.versions import _versions, versions  # noqa: F401 - tests

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("ens.spark.stream")

SOURCE = "ens_ingest"
ROW_DDL = (
    "route string, key string, gw string, ts double, evtime timestamp, ev binary, "
    "plog string, epoch string, nin long, wm double, wall double, counted boolean"
)
PAGE = 2000
STATUS_KEY = "ens:spark:status"
HELD_KEY = "ens:spark:held"  # route -> events its engine holds back
BATCHES_KEY = "ens:spark:batches"  # the last micro-batches' state counters (JSON, oldest first)
BATCHES_KEPT = 1000
SINK = "ens_status"
HOLDER = f"spark|{socket.gethostname()}"  # ens:engine:status's holder while a query runs

_relevance: dict[tuple[str, str], Any] = {}


def routers(url: str, key: str, log_id: str) -> list[tuple[str, str | None, Any]]:
    """The route classes of a profile version that have profiles, in routing order (the keyed
    class first: it counts the event), each with the attribute that routes it (None: a shard
    of the profiles without a partition, one route) and its `Relevance`."""
    from adapters.spark.plan import Relevance

    k = (url, log_id)
    if k not in _relevance:
        if len(_relevance) > 16:
            _relevance.clear()
        v = versions(url, key).at(log_id)
        out: list[tuple[str, str | None, Any]] = []
        for cls in sorted(v.by_class, key=lambda c: (c != "k", c[:1] == "g", c)):
            if cls in ("s", "g") or not v.by_class[cls]:
                continue
            attr = key if cls == "k" else cls[1:] if cls[:1] == "a" else None
            out.append((cls, attr, Relevance(v.by_class[cls].values())))
        _relevance[k] = out
    return _relevance[k]


# ------------------------------------------------------------------ source


def _source_classes() -> tuple[type, type]:
    """The DataSource / reader classes (built lazily: pyspark is imported only when used)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Range(InputPartition):
        def __init__(self, lo: str, hi: str, offset: dict[str, Any], first: bool) -> None:
            self.lo, self.hi, self.offset, self.first = lo, hi, offset, first

    class IngestReader(DataSourceStreamReader):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.url = options["url"]
            self.key = options.get("key", "building")
            self.parts = int(options.get("partitions", "2"))
            self.tz = options.get("tz", "UTC")
            self.ttl = int(options.get("dedup_ttl", str(7 * 86400)))
            self.lateness = float(options.get("lateness", "2.0"))
            self.idle = float(options.get("idle_timeout", "0.5"))
            self.clock = options.get("clock", "event")
            self._last: dict[str, Any]  # the latest offset (set by latestOffset)
            self._plog: Any = None

        def initialOffset(self) -> dict[str, Any]:
            return initial_offset()

        def latestOffset(
            self, start: dict[str, Any] | None = None, limit: Any = None
        ) -> dict[str, Any]:
            r = client(self.url)
            if self._plog is None:
                self._plog = profile_log.ProfileLog(r)
            if start is None:  # Spark < 4.2 calls latestOffset() without the start
                start = self._last if hasattr(self, "_last") else self.initialOffset()
            self._last = latest_offset(r, self._plog, start, self.lateness, self.idle, self.clock)
            return self._last

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
            return [Range(*x) for x in ranges(start, end, self.parts)]

        def read(self, partition: Any) -> Iterator[Any]:
            yield from read_range(
                self.url,
                self.key,
                self.tz,
                partition.lo,
                partition.hi,
                partition.offset,
                partition.first,
                self.ttl,
            )

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class IngestSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return SOURCE

        def schema(self) -> str:
            return ROW_DDL

        def streamReader(self, schema: Any) -> Any:
            return IngestReader(self.options)

    return IngestSource, IngestReader


def initial_offset() -> dict[str, Any]:
    """A new query's offset (no checkpoint): a new epoch, so its ids never meet an older
    query's."""
    return {
        "ingest": "0-0",
        "plog": "0-0",
        "epoch": secrets.token_hex(4),
        "n": 0,
        "t": None,
        "wm": None,
    }


def latest_offset(
    r: Any, plog_log: Any, start: dict[str, Any], lateness: float, idle: float, clock: str
) -> dict[str, Any]:
    """The driver's next offset after `start`: the newest ingest entry, the profile log's head
    (`plog_log.sync()`), the events the API accepted and the watermark; `start` itself when
    nothing changed (no micro-batch)."""
    plog = plog_log.sync()
    with r.pipeline(transaction=True) as p:
        p.xrevrange(rs.INGEST, count=1)
        p.get(rs.INGEST_IN)
        p.time()  # Redis's clock, as the entry ids: the idle rule compares the two
        p.hgetall(watermark.GATEWAYS)
        p.hgetall(rs.GATEWAYS)
        # the heartbeat `/healthz` checks: Spark asks for new offsets every trigger
        p.hset(rs.ENGINE_STATUS, mapping={"ts": repr(time.time()), "holder": HOLDER})
        last, n, (sec, usec), prog, gws, _ = p.execute()
    top = rs.text(last[0][0]) if last else "0-0"
    if rs.parse_id(top) < rs.parse_id(start["ingest"]):
        top = start["ingest"]  # trimmed or reset: never go back
    now = sec + usec / 1e6
    # ens:spark:gateways holds the progress of every entry up to start["ingest"]
    # (the previous batch committed): as of start["t"], or of now if none came since
    same = top == start["ingest"]
    wm = watermark.offset_watermark(
        {rs.text(g): json.loads(v) for g, v in prog.items()},
        {rs.text(g): json.loads(v).get("lateness") for g, v in gws.items()},
        lateness,
        idle,
        now if same else start.get("t"),
        now if clock == "wall" else None,
    )
    off = {
        "ingest": top,
        "plog": plog,
        "epoch": start["epoch"],
        "n": max(int(n or 0), int(start["n"])),
        "t": now,
        "wm": wm,
    }
    if same and all(off[k] == start.get(k) for k in ("plog", "n", "wm")):
        return start  # nothing new: no micro-batch
    return off


def ranges(
    start: dict[str, Any], end: dict[str, Any], parts: int
) -> list[tuple[str, str, dict[str, Any], bool]]:
    """A micro-batch's id range split by time into at most `parts` source partitions:
    (lo, hi, offset, first); the offset carries the profile version before this batch's
    (``ctl``) if it changed."""
    lo, hi = start["ingest"], end["ingest"]
    ctl = start.get("plog") if start.get("plog") != end.get("plog") else None
    end = {**end, "ctl": ctl}
    if lo == hi:
        return [(lo, hi, end, True)]
    lo_ms, hi_ms = rs.parse_id(lo)[0], rs.parse_id(hi)[0]
    k = max(1, min(parts, hi_ms - lo_ms + 1))
    cuts = [lo_ms + (hi_ms - lo_ms + 1) * i // k for i in range(1, k)]
    bounds = [lo] + [f"{c - 1}-18446744073709551615" for c in cuts] + [hi]
    bounds = [
        b for i, b in enumerate(bounds) if i == 0 or rs.parse_id(b) > rs.parse_id(bounds[i - 1])
    ]
    return [(a, b, end, i == 0) for i, (a, b) in enumerate(pairwise(bounds))]


class _Rows:
    """The columns of the source's rows (`ROW_DDL`), one Arrow batch per partition read."""

    TYPES = (
        "string string string float64 timestamp binary string string int64 float64 float64 bool_"
    )

    def __init__(self, plog: str, epoch: str, nin: int, wm: float | None) -> None:
        self.plog, self.epoch, self.nin, self.wm = plog, epoch, nin, wm
        self.cols: dict[str, list[Any]] = {c.split()[0]: [] for c in ROW_DDL.split(", ")}

    def add(
        self,
        route: str,
        k: str | None,
        gw: str,
        ts: float | None,
        ev: bytes | None,
        evtime: float | None = None,
        wall: float | None = None,
        counted: bool = True,
    ) -> None:
        cols = self.cols
        cols["route"].append(route)
        cols["key"].append(k)
        cols["gw"].append(gw)
        cols["ts"].append(ts)
        cols["evtime"].append(  # a whole ms (`watermark.PER_SECOND`): Spark's watermark keeps it
            round(evtime * 1e6) if evtime is not None and math.isfinite(evtime) else None
        )
        cols["ev"].append(ev)
        cols["plog"].append(self.plog)
        cols["epoch"].append(self.epoch)
        cols["nin"].append(self.nin)
        cols["wm"].append(self.wm)
        cols["wall"].append(wall)
        cols["counted"].append(counted)

    def batch(self) -> Any:
        import pyarrow as pa

        types = [
            pa.timestamp("us", tz="UTC") if t == "timestamp" else getattr(pa, t)()
            for t in self.TYPES.split()
        ]
        names = list(self.cols)
        return pa.RecordBatch.from_arrays(
            [pa.array(self.cols[n], t) for n, t in zip(names, types, strict=True)], names=names
        )


def read_range(
    url: str,
    key: str,
    tz: str,
    lo: str,
    hi: str,
    offset: dict[str, Any],
    first: bool,
    ttl: int = 7 * 86400,
) -> Iterator[Any]:
    """The rows of ingest entries in (lo, hi]: routed events, plus bookkeeping rows."""
    r = client(url)
    plog, epoch, wm = offset["plog"], offset["epoch"], offset.get("wm")
    route_of = routers(url, key, plog)
    rows = _Rows(plog, epoch, int(offset["n"]), wm)
    seen = Watermarks(0.0, 0.0, 0)  # the gateways' progress in this range (`observe`)
    first_ts = None
    cursor = f"({lo}"
    while lo != hi:
        page = r.xrange(rs.INGEST, min=cursor, max=hi, count=PAGE)
        if not page:
            break
        plain = _route_page(r, page, route_of, rows, seen)
        stamps = [ev.ts for _k, ev in plain] + ([] if first_ts is None else [first_ts])
        first_ts = min(stamps, default=None)
        notes = live.stateless(versions(url, key), plog, epoch, plain, tz)
        if notes:
            sinks.Outbox(r, ttl).write(notes)
        cursor = f"({rs.text(page[-1][0])}"
        if len(page) < PAGE:
            break
    if first and offset.get("ctl"):  # profiles changed: the engines they concern apply them
        for route in changed_routes(r, versions(url, key), offset["ctl"], plog):  # now
            rows.add(route, None, "", None, None)
    # the gateways' progress reaches the driver (the sink), which computes the next batches'
    # watermark from it (`watermark.offset_watermark`), also when no engine wanted the events;
    # the first partition's row carries `nin` to the status, and this batch's watermark into
    # Spark's (the next batch's `getCurrentWatermarkMs`: what a timer sees without rows)
    if first:
        rows.add(routes.TICK, None, "", None, None, evtime=wm)
    for gw, (ts, wall) in seen.progress().items():
        rows.add(routes.TICK, None, gw, ts, None, wall=wall)
    for cls, attr, _rel in route_of:  # the unpartitioned engines' start time and version
        if attr is None:
            rows.add(cls, None, "", first_ts, None)
    live.settle_garbage()
    yield rows.batch()


def _route_page(
    r: Any,
    page: list[Any],
    route_of: list[tuple[str, str | None, Any]],
    rows: _Rows,
    seen: Watermarks,
) -> list[tuple[str, Any]]:
    """Parse a page of ingest entries, note the gateways' progress and add each event's rows
    (one per route class that wants it; counted by the first); returns the events (for the
    bare filters)."""
    from adapters.spark.plan import route_key

    plain: list[tuple[str, Any]] = []
    for eid, fields in page:
        eid = rs.text(eid)
        wall = rs.stream_ms(eid)
        for k, gw, obj in ingest.decode(eid, fields, r):
            ev = ingest.parse(k, gw, obj, r)
            if ev is None:
                continue
            seen.observe(gw, ev.ts, wall)
            plain.append((k, ev))
            blob = None
            for cls, attr, relevant in route_of:  # counted in `events` by one engine only
                if attr is None:
                    route = cls
                else:
                    rk = route_key(ev.attrs.get(attr))
                    if rk is None:
                        continue
                    route = "k" + rk if cls == "k" else f"{cls}|{rk}"
                if relevant(ev.attrs):
                    if blob is None:
                        blob = pickle.dumps(ev, pickle.HIGHEST_PROTOCOL)
                        rows.add(route, k, gw, ev.ts, blob)
                    else:
                        rows.add(route, k, gw, ev.ts, blob, counted=False)
    return plain


def changed_routes(r: Any, versions: Any, before: Any, now: str) -> list[str]:
    """The routes whose engines a profile change concerns: those of the route classes of the
    profiles that changed between versions `before` and `now` (every route if `before` is
    not a version: a checkpoint's offset of an older release)."""
    names = sorted(rs.text(x) for x in r.smembers(routes.ROUTES))
    if not isinstance(before, str):
        return names
    old, new = versions.at(before), versions.at(now)
    pids = {p for p in old.sigs.keys() | new.sigs.keys() if old.sigs.get(p) != new.sigs.get(p)}
    classes = {
        routes.route_class(v.profiles[p], versions.key)
        for v in (old, new)
        for p in pids
        if p in v.profiles
    }
    return [x for x in names if routes.class_of_route(x) in classes]


def register(spark: SparkSession) -> None:
    source, _reader = _source_classes()
    spark.dataSource.register(source)


# ------------------------------------------------------------------ engines


STATE_APIS = ("pandas", "rows")  # transformWithStateInPandas, transformWithState (Row)
STATE_API_ENV = "ENS_SPARK_STATE_API"


def default_state_api() -> str:
    """The operator's API unless the query says (``ENS_SPARK_STATE_API``, else rows: the Row
    API costs the Python workers ~30 % less CPU than pandas frames per route, docs/spark.md)."""
    return os.environ.get(STATE_API_ENV) or "rows"


@dataclass
class StreamConfig:
    redis_url: str
    key: str = "building"
    checkpoint: str = ".ens-spark-stream"
    trigger: str = "1 second"
    lateness: float = 2.0  # of gateways without their own (`ens gateway set --lateness`)
    idle_timeout: float = 0.5  # a gateway silent this long (s) holds no event back
    clock: str = "event"
    tz: str = "UTC"
    partitions: int = 0  # source partitions per micro-batch (0: the shuffle partitions)
    dedup_ttl: int = 7 * 86400
    plan: str = "eager"  # evaluation plan of the engines (docs/plans.md); same output
    rates: Any = None  # `filters.plans.choose.Rates` from --stats, for plan auto
    late_events: str = "output"  # late events: "output" (ens:late) or "feed" (fed at once)
    late_max: int = 10_000  # about this many entries kept in ens:late
    state_api: str = field(default_factory=default_state_api)  # `STATE_APIS`


def out_ddl() -> str:
    from adapters.spark.keyed import COUNTERS_DDL, STATS_DDL

    return f"{STATS_DDL}, {COUNTERS_DDL}"


def _sink_classes() -> type:
    """The status sink: a Python streaming data sink (no py4j callback in the driver)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

    @dataclass
    class Totals(WriterCommitMessage):
        counts: dict[str, int]
        held: dict[str, int]
        nin: int | None
        late: dict[str, str]  # late event key -> gateway (an event late in two engines: once)
        gws: dict[str, list[float]]  # gateway progress
        work: dict[str, float]  # the state counters (`keyed.COUNTERS`) and task CPU, summed

    class StatusWriter(DataSourceStreamWriter):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.url = options["url"]

        def write(self, iterator: Iterator[Any]) -> Totals:
            from adapters.spark.keyed import COUNTERS

            counts = {"events": 0, "notes": 0}
            work: dict[str, float] = dict.fromkeys((*COUNTERS, "cpu"), 0)
            held: dict[str, int] = {}
            late: dict[str, str] = {}
            gws: dict[str, list[float]] = {}
            nin = None
            for x in iterator:
                if x["route"] == routes.TICK:  # a source partition's bookkeeping row
                    nin = max(nin or 0, int(x["nin"]))
                    if x["gw"] and x["ts"] is not None and x["wall"] is not None:
                        gws = watermark.merge_progress(gws, {x["gw"]: [x["ts"], x["wall"]]})
                    continue
                for f in counts:
                    counts[f] += int(x[f])
                for f in work:
                    work[f] += x[f] or 0
                if x["late_keys"]:
                    late.update(json.loads(x["late_keys"]))
                held[x["route"]] = int(x["held"])
            return Totals(counts, held, nin, late, gws, work)

        def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
            write_status(client(self.url), [m for m in messages if m is not None], batchId)

    class StatusSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return SINK

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return StatusWriter(self.options)

    return StatusSink


def write_status(r: Any, messages: list[Any], batch_id: int) -> None:
    """Totals into ``ens:spark:status`` and ``ens:engine:status`` (the API's back-pressure
    reads ``total_read`` there), counted once per batch id (a re-executed batch is not)."""
    done = int(rs.text(r.hget(STATUS_KEY, "batch") or b"-1"))
    tot = json.loads(r.hget(STATUS_KEY, "totals") or b"{}")
    held = {k: v for m in messages for k, v in m.held.items()}
    gws: dict[str, list[float]] = {}
    for m in messages:
        gws = watermark.merge_progress(gws, m.gws)
    if gws:  # a max per gateway: written again by a re-executed batch, it changes nothing
        old = {rs.text(g): json.loads(v) for g, v in r.hgetall(watermark.GATEWAYS).items()}
        merged = watermark.merge_progress(old, gws)
        r.hset(watermark.GATEWAYS, mapping={g: json.dumps(v) for g, v in merged.items()})
    if batch_id > done:
        work: dict[str, float] = {}
        for m in messages:
            for f, v in m.counts.items():
                tot[f] = tot.get(f, 0) + v
            for f, x in m.work.items():
                work[f] = work.get(f, 0) + x
        if work:  # this batch's state work (bench/spark_stream.py reads them)
            work["cpu"] = round(work["cpu"], 4)
            rec = json.dumps({"batch": batch_id, **work})
            with r.pipeline(transaction=False) as p:
                p.rpush(BATCHES_KEY, rec)
                p.ltrim(BATCHES_KEY, -BATCHES_KEPT, -1)
                p.execute()
            for f, x in work.items():
                tot.setdefault("work", {})[f] = round(tot.get("work", {}).get(f, 0) + x, 4)
        late = {k: g for m in messages for k, g in m.late.items()}
        tot["late"] = tot.get("late", 0) + len(late)
        by_gw = tot.setdefault("late_by_gateway", {})
        for g in late.values():
            by_gw[g] = by_gw.get(g, 0) + 1
        nin = max((m.nin for m in messages if m.nin is not None), default=None)
        if nin is not None:
            tot["read"] = nin
    with r.pipeline(transaction=True) as p:
        if held:
            p.hset(HELD_KEY, mapping=held)
        p.hvals(HELD_KEY)
        p.hlen(ingest.INVALID)
        res = p.execute()
    buffered, invalid = sum(int(v) for v in res[-2]), res[-1]
    stats = {
        "engine": "spark",
        "total_read": tot.get("read", 0),
        "total_events": tot.get("events", 0),
        "total_late": tot.get("late", 0),
        "total_notifications": tot.get("notes", 0),
        "total_invalid": invalid,
        "late_by_gateway": tot.get("late_by_gateway", {}),
        "buffered": buffered,
        "batch": batch_id,
        "state": tot.get("work", {}),
    }
    with r.pipeline(transaction=True) as p:
        p.hset(STATUS_KEY, mapping={"batch": max(batch_id, done), "totals": json.dumps(tot)})
        p.hset(
            rs.ENGINE_STATUS,
            mapping={
                "ts": repr(time.time()),
                "holder": HOLDER,
                "stats": rs.dumps(stats),
                "read": stats["total_read"],
                "buffered": buffered,
            },
        )  # read by rs.INGEST_SCRIPT
        p.execute()
    if batch_id % 20 == 0 or tot.get("late"):
        log.info("batch %d: %s", batch_id, stats)


def resume_api(cfg: StreamConfig) -> str:
    """The state API the query runs on: the checkpoint's, when it has one (Spark cannot resume
    a checkpoint under another stateful operator), else `cfg.state_api`."""
    from adapters.spark import keyed

    if cfg.state_api not in STATE_APIS:
        raise ValueError(f"state_api must be one of {', '.join(STATE_APIS)}, not {cfg.state_api!r}")
    had = keyed.checkpoint_api(cfg.checkpoint)
    if had is not None and had != cfg.state_api:
        log.warning(
            "checkpoint %s was written by the %s operator: the query continues on it "
            "(--state-api %s); Spark cannot move a query's state to another stateful operator, "
            "so a new --checkpoint is the way to switch",
            cfg.checkpoint,
            had,
            had,
        )
        return had
    return cfg.state_api


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def start_query(spark: SparkSession, cfg: StreamConfig) -> StreamingQuery:
    """Register the source and start the query (returns at once; the query runs in the JVM).

    Raises ValueError for a checkpoint of the earlier operator (`keyed.check_checkpoint`)."""
    from pyspark.sql import functions as F

    from adapters.spark import keyed

    why = keyed.check_checkpoint(cfg.checkpoint)
    if why:
        raise ValueError(why)
    api = resume_api(cfg)
    cfg = replace(cfg, state_api=api)
    register(spark)
    spark.dataSource.register(_sink_classes())
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    parts = cfg.partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
    src = (
        spark.readStream.format(SOURCE)
        .option("url", cfg.redis_url)
        .option("key", cfg.key)
        .option("tz", cfg.tz)
        .option("partitions", str(parts))
        .option("dedup_ttl", str(cfg.dedup_ttl))
        .option("lateness", repr(cfg.lateness))
        .option("idle_timeout", repr(cfg.idle_timeout))
        .option("clock", cfg.clock)
        .load()
        .withWatermark("evtime", "0 milliseconds")  # evtime: the offsets' watermark
    )
    grouped = src.filter(F.col("route") != routes.TICK).groupBy("route")
    routed = (  # the same processor and state schemas on either API (`keyed.processor`)
        grouped.transformWithState(keyed.processor(cfg), out_ddl(), "Append", "EventTime")
        if api == "rows"
        else grouped.transformWithStateInPandas(
            keyed.processor(cfg), out_ddl(), "Append", "EventTime"
        )
    )
    zero = F.lit(0).cast("long")
    ticks = src.filter(F.col("route") == routes.TICK).select(  # no group: merged in the sink
        "route",
        *(zero.alias(c) for c in ("events", "late", "notes", "held")),
        "nin",
        F.lit("").alias("late_keys"),
        "gw",
        "ts",
        "wall",
        *(zero.alias(c) for c in keyed.COUNTERS),
        F.lit(0.0).alias("cpu"),
    )
    out = routed.unionByName(ticks)
    keyed.mark_checkpoint(cfg.checkpoint, api)
    return (
        out.writeStream.outputMode("append")
        .format(SINK)
        .option("url", cfg.redis_url)
        .option("checkpointLocation", cfg.checkpoint)
        .trigger(processingTime=cfg.trigger)
        .queryName("ens-stream")
        .start()
    )
