"""The per-route operator of `ens spark stream` on Spark's per-key state API.

A `StatefulProcessor` (``transformWithStateInPandas``, time mode EventTime, RocksDB state
store with changelog checkpointing) keeps, per route (a value of ``--key``, a value of
another `per` attribute, or a shard of the profiles without a partition):

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
OPERATOR = {"operator": "transformWithStateInPandas", "layout": 2}


@dataclass
class RouteCache:
    """What this Python worker last read or wrote of a route's state, valid while the route
    header's random token (`tok`, new with every write of the route's state) is the one it
    was written with: a re-executed micro-batch (its writes rolled back) or another worker's
    step finds another token and reads the state store again. None: not known here."""

    tok: str
    eng: tuple[bytes, dict[str, Any]] | None  # the engine header and its meta (`live.Known`)
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


def processor(cfg: Any) -> Any:
    """The StatefulProcessor instance of a query, for `cfg` (a `stream.StreamConfig`; pyspark
    is imported only here)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from adapters.spark import keyed, live
    from adapters.spark.live import client, versions

    url, key, tz, ttl = cfg.redis_url, cfg.key, cfg.tz, cfg.dedup_ttl
    plan = (cfg.plan, cfg.rates)
    late_events, late_max = cfg.late_events, cfg.late_max

    class RouteProcessor(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.hdr = handle.getValueState("hdr", HDR_DDL)
            self.held = handle.getListState("held", HELD_DDL)
            self.eng = handle.getValueState("eng", ENG_DDL)
            self.parts = handle.getMapState("parts", PART_KEY_DDL, PART_DDL)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            frames = [p for p in rows if len(p)]
            wm_ms = timerValues.getCurrentWatermarkInMs()
            wm = wm_ms / 1000.0 if wm_ms > 0 else None
            batch: list[Any] = []
            for pdf in frames:
                rw = pdf["wm"].max()
                if rw == rw:  # this batch's watermark (the offset's, on every row)
                    wm = float(rw) if wm is None else max(wm, float(rw))
                batch += [
                    live.Row(
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
            yield from self._step(key[0], batch, wm, wm_ms, None)

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[pd.DataFrame]:
            wm_ms = timerValues.getCurrentWatermarkInMs()
            yield from self._step(
                key[0], [], wm_ms / 1000.0, wm_ms, expiredTimerInfo.getExpiryTimeInMs()
            )

        def _step(
            self, route: str, rows: list[Any], wm: float | None, wm_ms: int, fired: int | None
        ) -> Iterator[pd.DataFrame]:
            t0 = time.process_time()
            count: dict[str, float] = dict.fromkeys(COUNTERS, 0)
            count["routes"] = 1
            count["timers"] = fired is not None
            raw = self.hdr.get()
            count["calls"] += 1
            hdr = None
            if raw is not None:
                count["bytes_read"] += len(raw[0])
                hdr = pickle.loads(raw[0])  # noqa: S301 - our own state store
            stats: dict[str, Any] = dict.fromkeys(STATS_COLS)
            stats.update(route=route, events=0, late=0, notes=0, held=0, nin=0, late_keys="")
            if hdr is None and all(r.key is None and r.ts is None for r in rows):
                return  # a profile change for a route without an engine: nothing to apply
            eng = live.KeyEngine(route, versions(url, key), tz, plan, late_events)
            # (the module's cache, reached through the module: Spark ships this class to each
            # task by cloudpickle, which would copy a module-level dict named here)
            hit = keyed.cache_take(route, hdr.get("tok") if hdr is not None else None)
            seen: dict[str, Any] = {
                "eng": hit.eng if hit else None,
                "held": hit.held if hit else None,
            }

            def held() -> list[Any]:
                rows_ = seen["held"]
                if rows_ is None:
                    rows_ = seen["held"] = [tuple(x) for x in self.held.get()]
                    count["calls"] += 1
                    count["bytes_read"] += sum(len(x[3]) + 32 for x in rows_)
                else:
                    count["cached"] += 1
                return [
                    (ts, live.arrival(k), k, gw, live.Event(*pickle.loads(ev)))  # noqa: S301
                    for ts, k, gw, ev in rows_
                ]

            def eng_state() -> tuple[bytes | None, dict[str, float]]:
                if seen["eng"] is not None:
                    count["cached"] += 1
                    return seen["eng"]  # type: ignore[no-any-return]
                v = self.eng.get()
                count["calls"] += 1
                if v is None:
                    return None, {}
                count["bytes_read"] += len(v[0]) + len(v[1])
                got = seen["eng"] = (bytes(v[0]), pickle.loads(v[1]))  # noqa: S301 - ours
                return got  # type: ignore[no-any-return]

            recs = MapRecords(self.parts, count, hit.parts if hit else None)
            out = eng.run(hdr, rows, wm, held, eng_state, recs)
            count["restores"] += out.restores
            count["parts_read"] += out.parts_read
            count["parts_written"] += out.parts_written
            r = client(url)
            if hdr is None:
                r.sadd(live.ROUTES, route)
            if out.records:
                live.Outbox(r, ttl).write(out.records)
            if out.late_records:  # before the state: a re-execution writes them again, skipped
                live.LateOutput(r, ttl, late_max).write(out.late_records)
            wrote = count["calls"]
            if out.eng is not None:
                eh, dues = out.eng
                d = pickle.dumps(dues, pickle.HIGHEST_PROTOCOL)
                self.eng.update((eh, d))
                count["calls"] += 1
                count["bytes_written"] += len(eh) + len(d)
                seen["eng"] = (eh, pickle.loads(d))  # noqa: S301 - (a copy: `run` keeps none)
            if out.held_list is not None:
                rows_ = [_held_row(h) for h in out.held_list]
                if rows_:
                    self.held.put(rows_)
                    count["bytes_written"] += sum(len(x[3]) for x in rows_)
                elif hdr is not None and hdr["nheld"]:
                    self.held.clear()
                else:
                    count["calls"] -= 1
                count["calls"] += 1
                seen["held"] = rows_
            elif out.append:
                rows_ = [_held_row(h) for h in out.append]
                self.held.appendList(rows_)
                count["calls"] += 1
                count["bytes_written"] += sum(len(x[3]) for x in rows_)
                if seen["held"] is not None:
                    seen["held"] = seen["held"] + rows_
            elif hdr is None:
                seen["held"] = []
            if hdr is None:
                seen["eng"] = seen["eng"] or (None, {})
            assert out.hdr is not None
            new = out.hdr
            old_t = hdr.get("tms") if hdr is not None else None
            want = out.timer_ms
            if want is not None and want <= wm_ms:
                want = wm_ms + 1  # never in the past: it would fire again at once
            if want != old_t:
                if old_t is not None and old_t != fired:
                    self.handle.deleteTimer(old_t)
                    count["calls"] += 1
                if want is not None:
                    self.handle.registerTimer(want)
                    count["calls"] += 1
            new["tms"] = want
            changed = count["calls"] != wrote or recs.writes
            # a new token whenever the route's state is written: caches of it elsewhere lapse
            new["tok"] = secrets.token_hex(8) if changed or hdr is None else hdr.get("tok")
            blob = pickle.dumps(new, pickle.HIGHEST_PROTOCOL)
            if raw is None or blob != raw[0]:
                self.hdr.update((blob,))
                count["calls"] += 1
                count["bytes_written"] += len(blob)
            if new["tok"] is not None:
                keyed.cache_put(
                    route, RouteCache(new["tok"], seen["eng"], seen["held"], recs.known)
                )
            live.settle_garbage(eng.dropped)
            stats.update(
                events=out.events,
                late=out.late,
                notes=len(out.records),
                held=out.held,
                late_keys=json.dumps(out.late_keys) if out.late_keys else "",
                **{c: int(count[c]) for c in COUNTERS},
                cpu=time.process_time() - t0,
            )
            yield pd.DataFrame([stats])

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
        if got == OPERATOR:
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


def mark_checkpoint(checkpoint: str) -> None:
    """Record in the checkpoint which operator writes its state (`check_checkpoint`)."""
    d = local_dir(checkpoint)
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
        (d / MARKER).write_text(json.dumps(OPERATOR))
