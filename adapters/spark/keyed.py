"""The per-route operator of `ens spark stream` on Spark's per-key state API.

A `StatefulProcessor` (``transformWithState``, the Row API, or ``transformWithStateInPandas``:
`processor`; time mode EventTime, RocksDB state store with changelog checkpointing) keeps,
per route (a value of ``--key``, a value of another `per` attribute, or a shard of the
profiles without a partition):

- ``hdr`` (ValueState): a small header: profile version applied, engine time, next due
  time, held-event count and earliest ts, the Spark timer registered (`KeyEngine.run`);
- ``held`` (ListState): the events held back by the watermark, appended to without reading
  while nothing is due;
- ``eng`` (ValueState): the engine header (`PartitionedEngine.end`: time, counters, clocks),
  the due time of every partition that has a timer, which partitions exist, and the small
  partition records themselves (`live.Known`: up to 32 kB a route, 4 kB a record), read only
  when the engine runs;
- ``parts`` (MapState (profile, partition id) -> record): the larger partition records
  (`filters.partitions`); a step reads those its events reach and those due by the
  watermark, and writes those it changed;
- one event-time timer at the route's next due time, so a route with nothing due is never
  invoked.

The compiled profiles are the Python worker's (`live.compiled`, per profile version and
route class): no whole-engine restore, only partition records. Each call is a round trip to the JVM's state server (~50-100 µs), so a call reads each piece
at most once and writes only what changed. Counters (whole-engine restores, records and
bytes read and written, state calls, timers fired, task CPU) go out with each route's status
row; the sink sums them per micro-batch (`adapters.spark.stream.write_status`).
"""

from __future__ import annotations

import json
import pickle
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

STATS_DDL = (
    "route string, events long, late long, notes long, held long, nin long, "
    "late_keys string, gw string, ts double, wall double"
)  # + the counters of `keyed.COUNTERS_DDL`; gw/ts/wall: a source partition's gateway progress
STATS_COLS = [c.split()[0] for c in STATS_DDL.split(", ")] + ["cpu"]
HDR_DDL = "h binary"
ENG_DDL = "h binary, dues binary"
HELD_DDL = "ts double, key string, gw string, ev binary"
PART_KEY_DDL = "profile string, part string"
PART_DDL = "rec binary"
COUNTERS = (
    "restores",  # whole-route loads (every record: a profile change of the route's class)
    "parts_read",  # partition records read
    "parts_written",
    "bytes_read",
    "bytes_written",
    "calls",  # state calls (each a round trip to the JVM)
    "timers",  # Spark timers fired (Spark's own timer metrics stay 0 for Python processors)
    "routes",  # route invocations
    "cached",  # state reads the Python worker's cache answered (`RouteCache`): no call
)
COUNTERS_DDL = ", ".join(f"{c} long" for c in COUNTERS) + ", cpu double"
MARKER = "ens-operator.json"  # in the checkpoint: which operator wrote its state
OPERATORS = {  # the marker of each API's operator (same state layout; Spark refuses to resume
    # a checkpoint under the other: STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA)
    "pandas": {"operator": "transformWithStateInPandas", "layout": 2},
    "rows": {"operator": "transformWithState", "layout": 2},
}
OPERATOR = OPERATORS["pandas"]  # (what a checkpoint of the pandas operator already holds)


@dataclass
class RouteCache:
    """What this Python worker last read or wrote of a route's state, valid while the route
    header's random token (`tok`, new with every write of the route's state) is the one it
    was written with: a re-executed micro-batch (its writes rolled back) or another worker's
    step finds another token and reads the state store again. None: not known here."""

    tok: str
    eng: tuple[bytes | None, dict[str, Any]] | None  # engine header and meta (`live.Known`)
    held: list[tuple[float, str, str, bytes]] | None  # the held list's rows
    parts: dict[str, bytes | None]  # map records read or written (None: not in the map)


_cache: dict[str, RouteCache] = {}  # route -> its state as this worker last saw it
CACHE_ROUTES = 1024  # (each up to ~40 kB: the inline records, the held list, map records seen)


def cache_take(route: str, tok: str | None) -> RouteCache | None:
    """The route's cached state if it was cached under `tok` (the route header's); the entry
    leaves the cache either way (`cache_put` once the step has written)."""
    hit = _cache.pop(route, None)
    return hit if hit is not None and tok is not None and hit.tok == tok else None


def cache_put(route: str, entry: RouteCache) -> None:
    """Remember `entry` (the latest first out when full)."""
    _cache.pop(route, None)
    if len(_cache) >= CACHE_ROUTES:
        _cache.pop(next(iter(_cache)))
    _cache[route] = entry


class MapRecords:
    """`live.Records` over the route's MapState (profile, partition id) -> record, counted;
    `known`: the records this worker's cache knows (`RouteCache.parts`), kept up to date."""

    def __init__(
        self, parts: Any, count: dict[str, float], known: dict[str, bytes | None] | None = None
    ) -> None:
        self.parts = parts
        self.count = count
        self.known: dict[str, bytes | None] = known if known is not None else {}
        self.writes = 0

    @staticmethod
    def _key(k: str) -> tuple[str, str]:
        return (json.loads(k)[0], k)

    def get(self, key: str) -> bytes | None:
        if key in self.known:
            self.count["cached"] += 1
            return self.known[key]
        v = self.parts.getValue(self._key(key))
        self.count["calls"] += 1
        got = None if v is None else bytes(v[0])
        if got is not None:
            self.count["bytes_read"] += len(got)
        self.known[key] = got
        return got

    def put(self, key: str, data: bytes) -> None:
        self.parts.updateValue(self._key(key), (data,))
        self.writes += 1
        self.count["calls"] += 1
        self.count["bytes_written"] += len(data)
        self.known[key] = data

    def delete(self, key: str) -> None:
        self.parts.removeKey(self._key(key))
        self.writes += 1
        self.count["calls"] += 1
        self.known[key] = None

    def keys(self) -> list[str]:
        self.count["calls"] += 1
        return [k[1] for k in self.parts.keys()]


def _held_row(h: Any) -> tuple[float, str, str, bytes]:
    ev = h[4]
    return (h[0], h[2], h[3], pickle.dumps((ev.id, ev.ts, ev.attrs), pickle.HIGHEST_PROTOCOL))


@dataclass(frozen=True)
class StepSettings:
    """What a route's step takes from the query's `stream.StreamConfig`: only these travel
    with the processor Spark ships to each task."""

    url: str
    key: str
    tz: str
    ttl: int
    plan: tuple[str, Any]  # (plan, rates): the engines' evaluation plan
    late_events: str
    late_max: int

    @classmethod
    def of(cls, cfg: Any) -> StepSettings:
        return cls(
            cfg.redis_url,
            cfg.key,
            cfg.tz,
            cfg.dedup_ttl,
            (cfg.plan, cfg.rates),
            cfg.late_events,
            cfg.late_max,
        )


@dataclass
class RouteState:
    """A route's pieces of Spark's per-key state (`StatefulProcessor.init`'s handles)."""

    handle: Any  # the StatefulProcessorHandle: timers
    hdr: Any  # ValueState: the route header
    held: Any  # ListState: the held events
    eng: Any  # ValueState: the engine header and its meta
    parts: Any  # MapState: the larger partition records

    @classmethod
    def of(cls, handle: Any) -> RouteState:
        return cls(
            handle,
            handle.getValueState("hdr", HDR_DDL),
            handle.getListState("held", HELD_DDL),
            handle.getValueState("eng", ENG_DDL),
            handle.getMapState("parts", PART_KEY_DDL, PART_DDL),
        )


def batch_rows(frames: list[pd.DataFrame], wm: float | None) -> tuple[list[Any], float | None]:
    """The `live.Row`s of a key's input frames, and the watermark: Spark's, or the batch's
    (the offset's, on every row) if later."""
    from adapters.spark.live import Row

    batch: list[Any] = []
    for pdf in frames:
        rw = pdf["wm"].max()
        if rw == rw:  # (not NaN)
            wm = float(rw) if wm is None else max(wm, float(rw))
        batch += [
            Row(
                k if isinstance(k, str) else None,
                gw,
                None if ts != ts else ts,
                ev,
                plog,
                ep,
                bool(c),
            )
            for k, gw, ts, ev, plog, ep, c in zip(
                pdf["key"],
                pdf["gw"],
                pdf["ts"],
                pdf["ev"],
                pdf["plog"],
                pdf["epoch"],
                pdf["counted"],
                strict=True,
            )
        ]
    return batch, wm


def batch_of_rows(rows: Iterator[Any], wm: float | None) -> tuple[list[Any], float | None]:
    """`batch_rows` for the Row API (``transformWithState``): the key's input `Row`s (the
    columns of `stream.ROW_DDL`, nulls as None) as `live.Row`s, and the watermark."""
    from adapters.spark.live import Row

    batch: list[Any] = []
    at: tuple[int, ...] | None = None
    for x in rows:
        if at is None:
            f = x.__fields__
            at = tuple(f.index(c) for c in ("key", "gw", "ts", "ev", "plog", "epoch", "counted"))
            iw = f.index("wm")
        rw = x[iw]
        if rw is not None and rw == rw:
            wm = float(rw) if wm is None else max(wm, float(rw))
        k, gw, ts, ev, plog, ep, c = (x[i] for i in at)
        batch.append(Row(k, gw, None if ts != ts else ts, ev, plog, ep, bool(c)))
    return batch, wm


class RouteStep:
    """One invocation of a route on its state (`step_route`): each piece read at most once
    and only if the engine needs it, answered by this worker's cache (`RouteCache`) when it
    can; each piece written only if it changed. Every state call is counted (`count`)."""

    def __init__(self, st: RouteState, count: dict[str, float], hit: RouteCache | None) -> None:
        self.st = st
        self.count = count
        self.eng: tuple[bytes | None, dict[str, Any]] | None = hit.eng if hit else None
        self.rows: list[tuple[float, str, str, bytes]] | None = hit.held if hit else None
        self.recs = MapRecords(st.parts, count, hit.parts if hit else None)

    def held(self) -> list[Any]:
        """The held events (`KeyEngine.run`'s `load_held`)."""
        from adapters.spark.live import Event, arrival

        count = self.count
        rows = self.rows
        if rows is None:
            rows = self.rows = [tuple(x) for x in self.st.held.get()]
            count["calls"] += 1
            count["bytes_read"] += sum(len(x[3]) + 32 for x in rows)
        else:
            count["cached"] += 1
        return [
            (ts, arrival(k), k, gw, Event(*pickle.loads(ev)))  # noqa: S301 - our own state
            for ts, k, gw, ev in rows
        ]

    def eng_state(self) -> tuple[bytes | None, dict[str, Any]]:
        """The engine header and its meta (`KeyEngine.run`'s `load_eng`)."""
        if self.eng is not None:
            self.count["cached"] += 1
            return self.eng
        v = self.st.eng.get()
        self.count["calls"] += 1
        if v is None:
            return None, {}
        self.count["bytes_read"] += len(v[0]) + len(v[1])
        self.eng = (bytes(v[0]), pickle.loads(v[1]))  # noqa: S301 - our own state
        return self.eng

    def write_eng(self, got: tuple[bytes, dict[str, Any]]) -> None:
        eh, dues = got
        d = pickle.dumps(dues, pickle.HIGHEST_PROTOCOL)
        self.st.eng.update((eh, d))
        self.count["calls"] += 1
        self.count["bytes_written"] += len(eh) + len(d)
        self.eng = (eh, pickle.loads(d))  # noqa: S301 - (a copy: `run` keeps none)

    def write_held(self, out: Any, hdr: dict[str, Any] | None) -> None:
        """The held list as `run` left it: stored whole (it was read), appended to, or
        (a new route) known empty."""
        count = self.count
        if out.held_list is not None:
            rows = [_held_row(h) for h in out.held_list]
            if rows:
                self.st.held.put(rows)
                count["calls"] += 1
                count["bytes_written"] += sum(len(x[3]) for x in rows)
            elif hdr is not None and hdr["nheld"]:
                self.st.held.clear()
                count["calls"] += 1
            self.rows = rows
        elif out.append:
            rows = [_held_row(h) for h in out.append]
            self.st.held.appendList(rows)
            count["calls"] += 1
            count["bytes_written"] += sum(len(x[3]) for x in rows)
            if self.rows is not None:
                self.rows = self.rows + rows
        elif hdr is None:
            self.rows = []

    def set_timer(
        self, old: int | None, want: int | None, wm_ms: int, fired: int | None
    ) -> int | None:
        """The route's one Spark timer moved from `old` to `want` (never in the past: it would
        fire again at once); the timer it has now."""
        if want is not None and want <= wm_ms:
            want = wm_ms + 1
        if want != old:
            if old is not None and old != fired:
                self.st.handle.deleteTimer(old)
                self.count["calls"] += 1
            if want is not None:
                self.st.handle.registerTimer(want)
                self.count["calls"] += 1
        return want

    def write_hdr(self, raw: Any, new: dict[str, Any]) -> None:
        blob = pickle.dumps(new, pickle.HIGHEST_PROTOCOL)
        if raw is None or blob != raw[0]:
            self.st.hdr.update((blob,))
            self.count["calls"] += 1
            self.count["bytes_written"] += len(blob)


def step_route(
    st: RouteState,
    cfg: StepSettings,
    route: str,
    rows: list[Any],
    wm: float | None,
    wm_ms: int,
    fired: int | None,
) -> dict[str, Any] | None:
    """One invocation of a route (its input rows, or its timer `fired`): `KeyEngine.run` on
    the route's state, the notifications and late events out to Redis, the state written
    back. The route's status row (None: a profile change for a route without an engine)."""
    from adapters.spark import live

    t0 = time.process_time()
    count: dict[str, float] = dict.fromkeys(COUNTERS, 0)
    count["routes"] = 1
    count["timers"] = fired is not None
    raw = st.hdr.get()
    count["calls"] += 1
    hdr = None
    if raw is not None:
        count["bytes_read"] += len(raw[0])
        hdr = pickle.loads(raw[0])  # noqa: S301 - our own state store
    if hdr is None and all(r.key is None and r.ts is None for r in rows):
        return None  # a profile change for a route without an engine: nothing to apply
    eng = live.KeyEngine(route, live.versions(cfg.url, cfg.key), cfg.tz, cfg.plan, cfg.late_events)
    # (this module's cache: Spark ships the processor, a class defined in `processor`, to each
    # task by cloudpickle, which copies module-level objects such a class names; this
    # module-level function is shipped by reference)
    step = RouteStep(st, count, cache_take(route, hdr.get("tok") if hdr is not None else None))
    out = eng.run(hdr, rows, wm, step.held, step.eng_state, step.recs)
    count["restores"] += out.restores
    count["parts_read"] += out.parts_read
    count["parts_written"] += out.parts_written
    r = live.client(cfg.url)
    if hdr is None:
        r.sadd(live.ROUTES, route)
    if out.records:
        live.Outbox(r, cfg.ttl).write(out.records)
    if out.late_records:  # before the state: a re-execution writes them again, skipped
        live.LateOutput(r, cfg.ttl, cfg.late_max).write(out.late_records)
    wrote = count["calls"]
    if out.eng is not None:
        step.write_eng(out.eng)
    step.write_held(out, hdr)
    if hdr is None:
        step.eng = step.eng or (None, {})
    assert out.hdr is not None
    new = out.hdr
    new["tms"] = step.set_timer(
        hdr.get("tms") if hdr is not None else None, out.timer_ms, wm_ms, fired
    )
    changed = count["calls"] != wrote or step.recs.writes
    # a new token whenever the route's state is written: caches of it elsewhere lapse
    new["tok"] = secrets.token_hex(8) if changed or hdr is None else hdr.get("tok")
    step.write_hdr(raw, new)
    if new["tok"] is not None:
        cache_put(route, RouteCache(new["tok"], step.eng, step.rows, step.recs.known))
    live.settle_garbage(eng.dropped)
    stats: dict[str, Any] = dict.fromkeys(STATS_COLS)
    stats.update(
        route=route,
        events=out.events,
        late=out.late,
        notes=len(out.records),
        held=out.held,
        nin=0,
        late_keys=json.dumps(out.late_keys) if out.late_keys else "",
        **{c: int(count[c]) for c in COUNTERS},
        cpu=time.process_time() - t0,
    )
    return stats


def processor(cfg: Any) -> Any:
    """The StatefulProcessor instance of a query, for `cfg` (a `stream.StreamConfig`; pyspark
    is imported only here): for ``transformWithStateInPandas`` (`cfg.state_api` "pandas":
    input and output as pandas frames) or ``transformWithState`` ("rows": `Row`s; no pandas
    frame per route group or status row). Its methods hand the route's rows to `step_route`."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    settings = StepSettings.of(cfg)
    rows_api = getattr(cfg, "state_api", "rows") == "rows"
    if rows_api:
        from pyspark.sql import Row as SparkRow

        def batch_of(rows: Iterator[Any], wm: float | None) -> tuple[list[Any], float | None]:
            return batch_of_rows(rows, wm)

        def emit(stats: dict[str, Any]) -> Any:
            return SparkRow(**stats)

    else:
        import pandas as pd

        def batch_of(rows: Iterator[Any], wm: float | None) -> tuple[list[Any], float | None]:
            return batch_rows([p for p in rows if len(p)], wm)

        def emit(stats: dict[str, Any]) -> Any:
            return pd.DataFrame([stats])

    class RouteProcessor(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = RouteState.of(handle)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            wm_ms = timerValues.getCurrentWatermarkInMs()
            batch, wm = batch_of(rows, wm_ms / 1000.0 if wm_ms > 0 else None)
            yield from self._step(key[0], batch, wm, wm_ms, None)

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            wm_ms = timerValues.getCurrentWatermarkInMs()
            yield from self._step(
                key[0], [], wm_ms / 1000.0, wm_ms, expiredTimerInfo.getExpiryTimeInMs()
            )

        def _step(
            self, route: str, rows: list[Any], wm: float | None, wm_ms: int, fired: int | None
        ) -> Iterator[Any]:
            stats = step_route(self.state, settings, route, rows, wm, wm_ms, fired)
            if stats is not None:
                yield emit(stats)

        def close(self) -> None:
            pass

    return RouteProcessor()


def local_dir(checkpoint: str) -> Path | None:
    """The checkpoint's directory on this machine (None: on another file system)."""
    if checkpoint.startswith("file:"):
        return Path(checkpoint[5:])
    if "://" in checkpoint:
        return None
    return Path(checkpoint)


def checkpoint_api(checkpoint: str) -> str | None:
    """The state API (`OPERATORS`) whose operator wrote `checkpoint` (None: unknown or new)."""
    d = local_dir(checkpoint)
    mark = None if d is None else d / MARKER
    if mark is None or not mark.exists():
        return None
    try:
        got = json.loads(mark.read_text())
    except ValueError:
        return None
    return next((api for api, op in OPERATORS.items() if op == got), None)


def check_checkpoint(checkpoint: str) -> str | None:
    """Why this release cannot run on `checkpoint` (None: it can): a checkpoint of the
    earlier operator (applyInPandasWithState, one pickled engine per route) has no state this
    operator can read, and Spark would fail on it with a schema error."""
    d = local_dir(checkpoint)
    if d is None or not (d / "offsets").is_dir() or not any((d / "offsets").iterdir()):
        return None
    mark = d / MARKER
    if mark.exists():
        try:
            got = json.loads(mark.read_text())
        except ValueError:
            got = None
        if got in OPERATORS.values():
            return None
    return (
        f"checkpoint {checkpoint} holds the state of an earlier `ens spark stream` "
        "(applyInPandasWithState, one pickled engine per route), which this release cannot "
        "read (it keeps per-key state: transformWithStateInPandas, docs/spark.md). Let the "
        "old query finish what it holds (stop the API's intake, wait for `ens status` to show "
        "nothing buffered), then start this one with a new --checkpoint directory (or delete "
        "this one); a new checkpoint reads ens:ingest from its start under a new epoch, so trim "
        "ens:ingest (XTRIM) first if its events were already processed"
    )


def mark_checkpoint(checkpoint: str, api: str = "pandas") -> None:
    """Record in the checkpoint which operator writes its state (`check_checkpoint`,
    `checkpoint_api`)."""
    d = local_dir(checkpoint)
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
        (d / MARKER).write_text(json.dumps(OPERATORS[api]))
