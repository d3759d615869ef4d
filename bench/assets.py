"""`ens bench alarms` (assets case): 10,000 registered sensors with intervals, against the same
ingest without a registry, in the same run (docs/benchmarks.md, docs/assets.md).

1. **Enrichment** (the API's per-event path, in-process): an event that carries only its
   sensor id parsed and normalized as `POST /v1/events` does (`event_from_obj`,
   `normalized_json`), without and with `AssetCache.enrich` over the 10,000-sensor registry:
   µs per event each, the difference and the ratio. Also the registry's import (one
   MULTI/EXEC with the fault profiles) and one API process's reload of it.
2. **Fault detection** (the engine worker in-process on a real redis-server, event time): the
   same readings through the worker with one plain profile — as sent (no registry), enriched
   (as the API stores them), and enriched with the registry's 10,000 `comm-fault` profiles
   (`absent(sensor = ID) within 60s` and their `#clear` companions); 1 % of the sensors never
   report and are raised. Events per second each, the ratios to no registry, µs per event of
   the fault profiles, and the worker's start with the 10,000 fault profiles to activate.
3. **HTTP** (`ens serve` as a subprocess, API and engine): the readings POSTed with no
   registry, with the registry without intervals (enrichment only) and with intervals
   (enrichment and fault detection): µs per event accepted, each on a fresh redis-server.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

T0 = 1_700_000_000.0
PLAIN = ("co2-high", 'kind = "co2" and value > 1500')


def _registry_csv(sensors: int, interval: str = "60s") -> str:
    rows = ["id,kind,point,room,floor,building,tz,interval"]
    for i in range(sensors):
        room = i // 5
        rows.append(
            f"s{i},sensor,co2,r{room},{room % 20},b{room % 10},Europe/Berlin,{interval}"
        )  # fmt: skip
    return "\n".join(rows) + "\n"


def _events(sensors: int, silent: float, seed: int = 5) -> list[dict[str, Any]]:
    """Two reports 45 s apart from each sensor but the silent share, in ts order (90 s)."""
    rnd = random.Random(seed)
    quiet = max(1, int(sensors * silent))
    evs: list[dict[str, Any]] = []
    for i in range(quiet, sensors):
        off = rnd.uniform(0, 45)
        for k in range(2):
            evs.append({"ts": T0 + off + 45 * k, "sensor": f"s{i}", "kind": "co2",
                        "value": round(rnd.uniform(350, 1600), 1)})  # fmt: skip
    evs.sort(key=lambda e: e["ts"])
    for n, e in enumerate(evs):
        e["id"] = f"e{n}"
    return evs


def enrichment(sensors: int = 10_000, events: int = 50_000, repeat: int = 5) -> dict[str, Any]:
    """The API's per-event parse + normalize, without and with enrichment (µs per event)."""
    from adapters.service.asset_store import ASSETS, key
    from adapters.service.assets import parse_registry
    from adapters.service.enrich import AssetCache
    from adapters.service.routes.bodies import normalized_json
    from profiles.events import event_from_obj

    reg = parse_registry(_registry_csv(sensors), "bench", csv_format=True)
    raw = {key(a.kind, a.id): json.dumps(a.to_json()) for a in reg.assets}
    cache = AssetCache()
    t0 = time.perf_counter()
    cache.load(1, raw)
    reload_ms = (time.perf_counter() - t0) * 1e3
    rnd = random.Random(1)
    objs = [
        {"id": f"e{i}", "ts": T0 + i * 0.01, "sensor": f"s{rnd.randrange(sensors)}",
         "value": 412.0}
        for i in range(events)
    ]  # fmt: skip

    def plain() -> None:
        for obj in objs:
            ev = event_from_obj(obj, "-")
            normalized_json(obj, ev)

    def enriched() -> None:
        for obj in objs:
            ev = event_from_obj(obj, "-")
            ev.attrs = cache.enrich(ev.attrs, "gw")
            normalized_json(obj, ev)

    best = {"off": float("inf"), "on": float("inf")}
    for _ in range(repeat):
        for name, fn in (("off", plain), ("on", enriched)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    off, on = (best[k] / events * 1e6 for k in ("off", "on"))
    return {
        "sensors": sensors,
        "events": events,
        "ingest_us_per_event_without_registry": round(off, 2),
        "ingest_us_per_event_with_enrichment": round(on, 2),
        "enrichment_us_per_event": round(on - off, 2),
        "with_vs_without": round(on / off, 3),
        "registry_reload_ms": round(reload_ms, 1),
        "_store": ASSETS,
    }


def detection(sensors: int = 10_000, silent: float = 0.01, repeat: int = 2) -> dict[str, Any]:
    """The engine worker on the same readings: ``plain`` (as the sensors send them, no
    registry), ``enriched`` (as the API stores them with a registry: five more attributes),
    ``faults`` (enriched, and the registry's fault profiles in the engine)."""

    from adapters.service import alarm_store as als
    from adapters.service import asset_store as ast
    from adapters.service.assets import parse_registry
    from adapters.service.enrich import AssetCache
    from bench.alarms import bench_worker, redis_server

    reg = parse_registry(_registry_csv(sensors), "bench", csv_format=True)
    cache = AssetCache()
    cache.load(1, {ast.key(a.kind, a.id): json.dumps(a.to_json()) for a in reg.assets})
    plain = _events(sensors, silent)
    enriched = [{**cache.enrich(e, "gw")} for e in plain]
    out: dict[str, Any] = {"sensors": sensors, "events": len(plain),
                           "silent_sensors": max(1, int(sensors * silent))}  # fmt: skip
    modes = ("plain", "enriched", "faults")
    with redis_server() as url:
        for _ in range(repeat):
            for mode in modes:
                evs = plain if mode == "plain" else enriched
                with bench_worker(url, [(*PLAIN, None)], evs, gateway="gw") as (rb, w):
                    if mode == "faults":
                        t0 = time.perf_counter()
                        ast.import_registry(rb, reg)
                        out["import_seconds"] = round(time.perf_counter() - t0, 2)
                    t0 = time.perf_counter()
                    w.start()
                    if mode == "faults":
                        out["worker_start_seconds_with_faults"] = round(time.perf_counter() - t0, 2)
                    t0 = time.perf_counter()
                    while w.step(block=0):
                        pass
                    rate = len(evs) / (time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    w.snapshot()  # a fixed cost (the engine's state), not one per event
                    out[f"{mode}_snapshot_seconds"] = round(time.perf_counter() - t0, 2)
                    k = f"{mode}_events_per_s"
                    out[k] = max(out.get(k, 0), round(rate))
                    if mode == "faults":
                        raised = [a for a in als.list_alarms(rb) if a["profile"].startswith("comm")]
                        out["comm_fault_alarms"] = len(raised)
    us = {m: 1e6 / out[f"{m}_events_per_s"] for m in modes}
    out["enriched_vs_plain"] = round(us["plain"] / us["enriched"], 3)
    out["faults_vs_plain"] = round(us["plain"] / us["faults"], 3)
    out["worker_us_per_event"] = {m: round(v, 1) for m, v in us.items()}
    out["detection_us_per_event"] = round(us["faults"] - us["enriched"], 1)
    return out


def http(
    sensors: int = 10_000, events: int = 20_000, batch: int = 500, repeat: int = 2
) -> dict[str, Any]:
    """`ens serve` (a subprocess: API and engine worker) taking ``events`` readings over HTTP
    (batches of ``batch``, one client) with no registry, with the registry without intervals
    (enrichment only) and with intervals (enrichment and the 10,000 fault profiles): µs per
    event from the first POST to the last answer, each mode on a fresh redis-server, the
    modes alternating ``repeat`` times (the best of each)."""
    import shutil
    import tempfile
    from pathlib import Path

    import httpx
    import redis

    from adapters.service import asset_store as ast
    from adapters.service import redis_store as rs
    from adapters.service.assets import parse_registry
    from bench import service_load as sl

    regs = {
        "enrichment": parse_registry(_registry_csv(sensors, ""), "bench", csv_format=True),
        "faults": parse_registry(_registry_csv(sensors), "bench", csv_format=True),
    }
    rnd = random.Random(2)
    out: dict[str, Any] = {"sensors": sensors, "events": events, "batch": batch}
    work = Path(tempfile.mkdtemp(prefix="ens-bench-assets-"))
    try:
        for i in range(repeat):
            for mode in ("none", "enrichment", "faults"):
                (work / f"{mode}-{i}").mkdir()
                with sl.redis_server(work / f"{mode}-{i}", aof=False) as url:
                    r = redis.Redis.from_url(url, decode_responses=True)
                    if mode in regs:
                        ast.import_registry(r, regs[mode])
                    key = rs.add_gateway(r, "bench")
                    port = 18000 + rnd.randrange(2000)
                    log = work / f"serve-{mode}-{i}.log"
                    with (
                        sl.service(url, port, 0.5, log) as base,
                        httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=60) as c,
                    ):
                        c.get("/healthz")
                        now = time.time()
                        bodies = [
                            [{"ts": now, "sensor": f"s{rnd.randrange(sensors)}", "value": 412.0}
                             for _ in range(batch)]
                            for _ in range(events // batch)
                        ]  # fmt: skip
                        t0 = time.perf_counter()
                        for b in bodies:
                            c.post("/v1/events", json=b).raise_for_status()
                        us = (time.perf_counter() - t0) / (len(bodies) * batch) * 1e6
                    k = f"{mode}_us_per_event"
                    out[k] = round(min(out.get(k, float("inf")), us), 1)
                    r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["enrichment_vs_none"] = round(out["none_us_per_event"] / out["enrichment_us_per_event"], 3)
    out["faults_vs_none"] = round(out["none_us_per_event"] / out["faults_us_per_event"], 3)
    return out


def run(sensors: int = 10_000) -> dict[str, Any]:
    enr = enrichment(sensors)
    enr.pop("_store", None)
    return {"enrichment": enr, "detection": detection(sensors), "http": http(sensors)}
