"""`ens bench archive`: the service end to end with the event archive on and off, same run.

Each round starts a redis-server and `ens serve` (archive off, or `--archive DIR`), posts
``--events`` events in batches from ``--clients`` gateways and times from the first POST
until the engine has processed every event (and, archive on, until the archive holds them
all); rounds alternate off/on so that a busy machine weighs on both alike. Reported: events/s
end to end (first POST to every event processed) per mode (median of the rounds), their
ratio, the archive's bytes per event, and how long after the engine the archive held them
all (its lag: about the flush interval plus the engine's archive commit, 1 s).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from adapters.archive.layout import list_files, open_archive
from adapters.service import redis_store as rs
from bench.service_load import Gen, probe_times, profiles, redis_server, run_phase, service


def one_round(
    archive: bool,
    events: int,
    batch: int,
    clients: int,
    work: Path,
    seed: int,
    apart: bool = False,
    flush: str = "10s",
) -> dict[str, Any]:
    """One service, one load; the end-to-end time and the archive's size."""
    d = Path(tempfile.mkdtemp(prefix="round-", dir=work))
    uri = str(d / "archive")
    with redis_server(d) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        for pid, expr in profiles(200, 200):
            rs.put_profile(r, pid, expr)
        keys = [rs.add_gateway(r, f"bench-{i}", 0.05) for i in range(clients)]
        extra: tuple[str, ...] = ("--archive", uri, "--archive-flush", flush) if archive else ()
        port = 18000 + random.randrange(2000)
        roles = ("--role", "api,engine") if archive and apart else ()
        with contextlib.ExitStack() as stack:
            if archive and apart:  # the archiver in a process of its own
                stack.enter_context(archiver_process(url, d / "archiver.log", extra))
            base = stack.enter_context(service(url, port, 0.1, d / "serve.log", *extra, *roles))
            time.sleep(0.5)
            gen = Gen(seed)
            cpu0 = _cpu()
            t0 = time.perf_counter()
            posted = run_phase(base, keys, gen, events, batch, clients, batch, {})
            # last, one probe per gateway: the engine feeds them after every other event (ts
            # order), and its probe profile's notifications say when
            last: dict[str, float] = {}
            run_phase(base, keys, gen, clients, 1, clients, 1, last)
            deadline = time.monotonic() + 300
            while not set(last) <= set(probe_times(r, 4 * clients)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the engine did not process every event; see {d}")
                time.sleep(0.005)
            processed_s = time.perf_counter() - t0
            arc_events = 0
            if archive:
                arc = open_archive(uri)
                while time.monotonic() < deadline:
                    files = list_files(arc)
                    arc_events = sum(_rows(f.path) for f in files)
                    if arc_events >= events:
                        break
                    time.sleep(0.05)
            elapsed = time.perf_counter() - t0
            cpu = {k: v - cpu0.get(k, 0.0) for k, v in _cpu().items()}
        size = sum(f.size for f in list_files(open_archive(uri))) if archive else 0
        r.close()
    shutil.rmtree(d, ignore_errors=True)
    return {
        "archive": archive,
        "events": events,
        "post_s": posted,
        "ingest_eps": events / posted,
        "e2e_s": processed_s,
        "e2e_eps": events / processed_s,
        "archived_s": elapsed if archive else None,  # until the archive held every event
        "archived": arc_events,
        "archive_bytes": size,
        # CPU seconds of the load (first POST to archived) per process kind
        "cpu": cpu,
    }


@contextlib.contextmanager
def archiver_process(url: str, log: Path, extra: tuple[str, ...]) -> Iterator[None]:
    """`ens serve --role archive` on the same Redis."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ens.service",
                "serve",
                "--redis-url",
                url,
                "--role",
                "archive",
                "--log-level",
                "WARNING",
                *extra,
            ],
            stdout=fh,
            stderr=fh,
        )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def _cpu() -> dict[str, float]:
    """User + system CPU seconds of this run's child processes: the service, redis-server."""
    import psutil

    out: dict[str, float] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
            kind = "redis" if "redis" in p.name() else "service"
            if "--role archive" in cmd:
                kind = "archiver"
            out[kind] = out.get(kind, 0.0) + t.user + t.system
        except psutil.Error:
            continue
    return out


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def run(
    events: int, batch: int, clients: int, rounds: int, apart: bool = False, flush: str = "10s"
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ens-bench-archive-"))
    out: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        for i in range(rounds):
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                out[mode].append(
                    one_round(mode == "on", events, batch, clients, work, 7 + i, apart, flush)
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    off = statistics.median(x["e2e_eps"] for x in out["off"])
    on = statistics.median(x["e2e_eps"] for x in out["on"])
    ingest_off = statistics.median(x["ingest_eps"] for x in out["off"])
    ingest_on = statistics.median(x["ingest_eps"] for x in out["on"])
    lag = statistics.median(x["archived_s"] - x["e2e_s"] for x in out["on"])
    cpu = {
        mode: {
            kind: statistics.median(x["cpu"].get(kind, 0.0) / x["events"] * 1e6 for x in out[mode])
            for kind in ("service", "archiver", "redis")
        }
        for mode in ("off", "on")
    }
    per_event = statistics.median(x["archive_bytes"] / max(x["archived"], 1) for x in out["on"])
    return {
        "events": events,
        "batch": batch,
        "clients": clients,
        "rounds": rounds,
        "archiver": "own process" if apart else "thread of the service",
        "flush": flush,
        "off_eps": off,
        "on_eps": on,
        "ratio": on / off,
        "ingest_off_eps": ingest_off,
        "ingest_on_eps": ingest_on,
        "bytes_per_event": per_event,
        "archive_after_s": lag,
        "cpu_us_per_event": cpu,
        "runs": out,
    }


def report(res: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(res, indent=2))
        return
    print(
        f"{res['events']} events per round in batches of {res['batch']} from "
        f"{res['clients']} gateways, {res['rounds']} rounds each (medians)"
    )
    print(f"archive off: {res['off_eps']:10.0f} events/s end to end")
    print(f"archive on:  {res['on_eps']:10.0f} events/s end to end")
    print(f"ratio on/off: {res['ratio']:.3f}")
    print(
        f"ingest (POSTs answered): off {res['ingest_off_eps']:.0f}, on {res['ingest_on_eps']:.0f} "
        f"events/s ({res['ingest_on_eps'] / res['ingest_off_eps']:.3f})"
    )
    c = res["cpu_us_per_event"]
    print(
        f"CPU µs per event (service, archiver process, redis-server; archiver: {res['archiver']}): "
        f"off {c['off']['service']:.1f}, -, {c['off']['redis']:.1f}; "
        f"on {c['on']['service']:.1f}, {c['on']['archiver']:.1f}, {c['on']['redis']:.1f}"
    )
    print(f"archive: {res['bytes_per_event']:.1f} bytes per event (Parquet, zstd)")
    print(
        f"archive complete {res['archive_after_s']:.2f} s after the engine "
        f"(--archive-flush {res['flush']}, or 100,000 events)"
    )
