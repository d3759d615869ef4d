"""`ens bench alarms`: the alarm rules and the service's alarm index, measured.

1. **Storm** (the pure rules, event time): N matches over R rooms in B buildings within a
   span of event time, one alarm profile with `clear: after`; the messages delivered with
   grouping by building (``group_wait``/``group_interval``) beside the count without grouping
   (one message per delivered transition), and every transition in history.
2. **List** (a real redis-server): ``ens:alarms`` filled with A open alarms as the engine
   worker writes them, then `alarm_store.list_alarms` with ``--match room=...`` — the function
   `ens alarms list` and `GET /v1/alarms` call — timed, and the CLI itself as a subprocess.
3. **Throughput**: the engine worker in-process, one profile plain vs as an alarm.
4. **End to end** (`e2e`): `ens serve` driven over HTTP as `bench/service_load.py` does, a
   facility's profile set without and with `alarm:` blocks, in the same run; the on/off ratio.
   `worker_mix`: the same profile set and events through the engine worker alone (CPU time),
   also once the subscriber has had an hour of messages (the steady state).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from notifiers.alarms import AlarmRules, GroupPolicy, History
from notifiers.alarms.grouping import Outlet
from profiles.alarm import AlarmSpec


def storm(
    matches: int = 10_000,
    rooms: int = 200,
    buildings: int = 10,
    span: float = 600.0,
    group_wait: float = 30.0,
    group_interval: float = 300.0,
    seed: int = 1,
) -> dict[str, Any]:
    rnd = random.Random(seed)
    spec = AlarmSpec("major", "after", 120.0, None, ("raise", "clear"))
    pol = GroupPolicy(("building",), group_wait, group_interval)
    rules = AlarmRules({"storm": spec}, default=pol)
    hist = History()
    times = sorted(rnd.uniform(0, span) for _ in range(matches))
    messages = 0
    t0 = time.perf_counter()
    for i, t in enumerate(times):
        room = rnd.randrange(rooms)
        part = {"building": f"b{room % buildings}", "room": f"r{room}"}
        eff = rules.on_match("storm", t, part, {"e": f"e{i}"}, "night")
        hist.extend(eff.transitions)
        messages += len(eff.messages)
    eff = rules.advance(span + 3600)
    hist.extend(eff.transitions)
    messages += len(eff.messages)
    elapsed = time.perf_counter() - t0
    st = rules.stats["night"]
    return {
        "matches": matches,
        "rooms": rooms,
        "buildings": buildings,
        "transitions": len(hist.records),
        "history_complete": st["transitions"] == len(hist.records),
        "raises": st["raise"],
        "clears": st["clear"],
        "repeats": st["repeat"],
        "messages_without_grouping": st["to_notify"],
        "messages_grouped": messages,
        "seconds": round(elapsed, 3),
    }


def fill_index(r: Any, n: int, batch: int = 10_000) -> None:
    """``ens:alarms`` with ``n`` open alarms, each written as the worker writes it."""
    from adapters.service import alarm_store as als

    spec = AlarmSpec("major", "manual", None, None, ("raise", "clear"))
    rules = AlarmRules({"p": spec})
    for lo in range(0, n, batch):
        mapping = {}
        for i in range(lo, min(lo + batch, n)):
            part = {"building": f"b{i % 50}", "floor": str(i % 7), "room": f"r{i}"}
            rules.on_match("p", 1_000.0 + i * 1e-3, part, {"e": f"e{i}"}, "night")
        with r.pipeline(transaction=False) as p:
            for aid, a in list(rules.book.alarms.items())[lo:]:
                mapping[aid] = json.dumps(als.index_record(a))
                als.index_labels(p, aid, a.labels())
            p.hset(als.ALARMS, mapping=mapping)
            p.execute()


@contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away redis-server without persistence (`service_load.redis_server`)."""
    from bench import service_load as sl

    d = Path(tempfile.mkdtemp(prefix="ens-bench-alarms-"))
    try:
        with sl.redis_server(d, aof=False) as url:
            yield url
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def bench_worker(
    url: str,
    profiles: list[tuple[str, str, dict[str, Any] | None]],
    events: list[dict[str, Any]],
    per_entry: int = 100,
    gateway: str = "g",
) -> Iterator[tuple[Any, Any]]:
    """An emptied database of the server at ``url`` with ``profiles`` (id, expression, alarm
    block) stored and ``events`` waiting in the ingest stream (``per_entry`` a batch), and an
    engine worker on it in event time with no reorder delay and no periodic snapshot; yields
    (client, worker) with the worker not started yet (some benches time its start)."""
    import redis

    from adapters.service import redis_store as rs
    from adapters.service.worker import EngineWorker, WorkerConfig

    rb = redis.Redis.from_url(url)
    try:
        rb.flushdb()
        for pid, expr, alarm in profiles:
            rs.put_profile(rb, pid, expr, alarm=alarm)
        with rb.pipeline(transaction=False) as p:
            for i in range(0, len(events), per_entry):
                p.xadd(rs.INGEST, {rs.INGEST_BATCH: json.dumps(events[i : i + per_entry]),
                                   rs.INGEST_GATEWAY: gateway})  # fmt: skip
            p.execute()
        cfg = WorkerConfig(name="bench", clock="event", block=0, reorder_seconds=0.0,
                           snapshot_interval=1e9, max_skew=float("inf"))  # fmt: skip
        yield rb, EngineWorker(rb, cfg)
    finally:
        rb.close()


def list_bench(n: int = 100_000, repeat: int = 3) -> dict[str, Any]:
    import redis

    from adapters.service import alarm_store as als

    with redis_server() as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        t0 = time.perf_counter()
        fill_index(r, n)
        fill = time.perf_counter() - t0
        room = f"r{n // 2}"

        def timed(*matchers: str) -> tuple[float, int]:
            best, found = float("inf"), 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                found = len(als.list_alarms(r, matchers=als.parse_matchers(matchers)))
                best = min(best, time.perf_counter() - t0)
            return best, found

        best, found = timed(f"room={room}")
        building, in_building = timed("building=b7")
        scan, scanned = timed(f"room=~{room}")
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "ens", "alarms", "list", "--match", f"room={room}", "--json",
             "--redis-url", url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        cli = time.perf_counter() - t0
        assert len(json.loads(out.stdout)) == 1
        r.close()
    return {
        "alarms": n,
        "fill_seconds": round(fill, 2),
        "list_match_seconds": round(best, 4),
        "found": found,
        "list_building_seconds": round(building, 4),
        "building_found": in_building,
        "list_regex_scan_seconds": round(scan, 3),
        "regex_found": scanned,
        "cli_seconds": round(cli, 3),
    }


def throughput(events: int = 20_000, rooms: int = 200, repeat: int = 2) -> dict[str, Any]:
    """The engine worker (in-process, real redis-server) on the same events with one profile
    as a plain profile and as an alarm profile (clear on an event): events per second each.
    Every match of the plain profile is an outbox record; as an alarm, every match is a
    history entry and the raises and clears are messages."""
    rnd = random.Random(3)
    evs = [
        {"id": f"e{i}", "ts": 1_700_000_000.0 + i * 0.01, "kind": "window",
         "state": "closed" if rnd.random() < 0.1 else "open", "room": f"r{rnd.randrange(rooms)}"}
        for i in range(events)
    ]  # fmt: skip
    expr = 'seq(w: kind = "window" and state = "open") per room'
    alarm = {"severity": "major", "clear": {"on": 'kind = "window" and state = "closed"'}}
    out: dict[str, Any] = {"events": events}
    with redis_server() as url:
        for _ in range(repeat):
            for name, spec in (("off", None), ("on", alarm)):
                with bench_worker(url, [("win", expr, spec)], evs) as (rb, w):
                    w.start()
                    t0 = time.perf_counter()
                    while w.step(block=0):
                        pass
                    w.snapshot()
                    rate = events / (time.perf_counter() - t0)
                    out[f"alarms_{name}_events_per_s"] = max(
                        out.get(f"alarms_{name}_events_per_s", 0), round(rate)
                    )
                    if spec is not None:
                        out["transitions"], out["history_entries"] = history_size(rb)
    out["on_vs_off"] = round(out["alarms_on_events_per_s"] / out["alarms_off_events_per_s"], 3)
    return out


def worker_mix(events: int = 30_000, repeat: int = 5, hour_rate: int = 1000) -> dict[str, Any]:
    """The engine worker alone (in-process, real redis-server) on `e2e`'s profile set and
    event mix, every profile plain ("off") and with its `alarm:` ("on"), alternating
    ``repeat`` times: CPU seconds (`time.process_time`, which other jobs on the machine
    disturb less than the wall clock) of working off ``events`` events posted as `e2e` posts
    them (entries of 500), in commits as large as the worker makes them. Events per CPU
    second per run, the best of each mode, their ratio and the median of the runs' ratios.
    "hour": "on" once the subscriber has had an hour of ``hour_rate`` messages/s under a cap
    it never reaches (its outlet holds their times, as a service that has run that long has
    it): the steady state, which a run of seconds never reaches."""
    from bench import service_load as sl

    gen = sl.Gen(7)
    evs = [gen.event() for _ in range(events)]
    for i, e in enumerate(evs):
        e["ts"] = 1_700_000_000.0 + i * 5e-5
    pairs = [*sl.profiles(200, 200), ("window-open", WINDOW_EXPR)]
    runs: dict[str, list[float]] = {"off": [], "on": [], "hour": []}
    for _ in range(repeat):
        for mode in runs:
            profiles = [(pid, x, _alarm_of(pid) if mode != "off" else None) for pid, x in pairs]
            with redis_server() as url, bench_worker(url, profiles, evs, per_entry=500) as (_, w):
                w.start()
                if mode == "hour":  # the profiles' subscriber ("": none) sent for an hour
                    # under a cap it never reaches (message times are kept only under a cap)
                    w.alarms.rules.dispatch.default = GroupPolicy(cap_per_hour=10**9)
                    out = w.alarms.rules.dispatch.outlets[""] = Outlet()
                    start = evs[0]["ts"] - 3600.0
                    out.sent.extend(start + i / hour_rate for i in range(hour_rate * 3600))
                t0 = time.process_time()
                while w.step(block=0):
                    pass
                if w.pending:
                    w.commit()
                runs[mode].append(events / (time.process_time() - t0))
    ratios = [on / off for off, on in zip(runs["off"], runs["on"], strict=True)]
    hour = [h / off for off, h in zip(runs["off"], runs["hour"], strict=True)]
    return {
        "events": events,
        "off_events_per_cpu_s": [round(x) for x in runs["off"]],
        "on_events_per_cpu_s": [round(x) for x in runs["on"]],
        "best_on_vs_off": round(max(runs["on"]) / max(runs["off"]), 3),
        "median_on_vs_off": round(statistics.median(ratios), 3),
        "hour_rate": hour_rate,
        "after_an_hour_on_events_per_cpu_s": [round(x) for x in runs["hour"]],
        "median_after_an_hour_on_vs_off": round(statistics.median(hour), 3),
    }


WINDOW_EXPR = 'seq(w: kind = "window" and state = "open") per room'
WINDOW_ALARM = {"severity": "major", "clear": {"on": 'kind = "window" and state = "closed"'}}


def e2e(
    events: int = 30_000,
    batch: int = 500,
    clients: int = 2,
    composites: int = 200,
    filters: int = 200,
    repeat: int = 2,
    root: Path | None = None,
    window_only: bool = False,
) -> dict[str, Any]:
    """`ens serve` end to end, alarms off and on, in one run (issue 35: within 10 %).

    The profile set of `bench/service_load.py` (a probe filter, per-room composites and
    filters) plus ``window-open`` (`seq(...) per room`, a match for about one event in
    twelve). "off": every profile plain; "on": the same profiles with `alarm:` blocks —
    ``window-open`` clears on a closed window, the composites `clear: after 30m`, the filters
    `clear: manual`. Each run: a fresh redis-server database, the service as a subprocess,
    ``events`` events POSTed in batches of ``batch`` by ``clients`` gateways over HTTP, then a
    final probe; events/s is ``events`` over the time from the first POST to the probe's
    notification in the outbox. The modes alternate ``repeat`` times (rounds: off, then on);
    the best of each counts (``on_vs_off``), and the median of the rounds' own ratios
    (``median_on_vs_off``, with ``rounds_on_vs_off``): a single round varies much with other
    jobs on the machine. Beside it, the service process's CPU per event in each run
    (``..._serve_cpu_us_per_event``) and ``cpu_off_vs_on`` (best off over best on; per round:
    ``median_cpu_off_vs_on``): the ratio the rate would have where the service alone bounds
    it, which other jobs on the machine disturb much less. ``load``: the machine's load
    average (1 min) at the start and the end.
    ``root``: the source tree the service runs from (another checkout: a before/after);
    ``window_only``: "on" gives only ``window-open`` an `alarm:` (the others stay plain).
    """
    import redis

    from adapters.service import alarm_store as als
    from adapters.service import redis_store as rs
    from bench import service_load as sl

    def alarm_of(pid: str) -> dict[str, Any] | None:
        return None if window_only and pid != "window-open" else _alarm_of(pid)

    profs = [*sl.profiles(composites, filters), ("window-open", WINDOW_EXPR)]
    out: dict[str, Any] = {"events": events, "batch": batch, "clients": clients,
                           "profiles": len(profs)}  # fmt: skip
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ens-bench-alarms-e2e-"))
    # a redis-server per run: the service of a run never sees the keys of another
    try:
        for i in range(repeat):
            for mode in ("off", "on"):
                (work / f"{mode}-{i}").mkdir()
                with sl.redis_server(work / f"{mode}-{i}") as url:
                    r = redis.Redis.from_url(url, decode_responses=True)
                    for pid, expr in profs:
                        rs.put_profile(r, pid, expr, alarm=alarm_of(pid) if mode == "on" else None)
                    keys = [rs.add_gateway(r, f"bench-{k}") for k in range(clients)]
                    port = 18000 + random.randrange(2000)
                    log = work / f"serve-{mode}-{i}.log"
                    with sl.service(url, port, 2.0, log, root=root or sl.ROOT) as base:
                        gen = sl.Gen(7)
                        sent: dict[str, float] = {}
                        cpu0 = _serve_cpu(str(port))
                        t0 = time.perf_counter()
                        sl.run_phase(base, keys, gen, events, batch, clients, batch, sent)
                        _final_probe(r, base, keys[0], gen)
                        rate = events / (time.perf_counter() - t0)
                        cpu = _serve_cpu(str(port)) - cpu0
                    k = f"alarms_{mode}_events_per_s"
                    out.setdefault(f"alarms_{mode}_runs", []).append(round(rate))
                    out.setdefault(f"alarms_{mode}_serve_cpu_us_per_event", []).append(
                        round(cpu * 1e6 / events, 1)
                    )
                    out[k] = max(out.get(k, 0), round(rate))
                    if mode == "on":
                        out["transitions"], out["history_entries"] = history_size(r)
                        out["alarms"] = r.hlen(als.ALARMS)
                    r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _e2e_summary(out, load0)


def _e2e_summary(out: dict[str, Any], load0: float) -> dict[str, Any]:
    """`e2e`'s ratios: of the best runs, and the medians of the rounds' own."""
    out["on_vs_off"] = round(out["alarms_on_events_per_s"] / out["alarms_off_events_per_s"], 3)
    cpu_off = min(out["alarms_off_serve_cpu_us_per_event"])
    out["cpu_off_vs_on"] = round(cpu_off / min(out["alarms_on_serve_cpu_us_per_event"]), 3)
    pairs = list(zip(out["alarms_off_runs"], out["alarms_on_runs"], strict=True))
    out["rounds_on_vs_off"] = [round(on / off, 3) for off, on in pairs]
    out["median_on_vs_off"] = round(statistics.median(on / off for off, on in pairs), 3)
    cpus = zip(
        out["alarms_off_serve_cpu_us_per_event"],
        out["alarms_on_serve_cpu_us_per_event"],
        strict=True,
    )
    out["median_cpu_off_vs_on"] = round(statistics.median(off / on for off, on in cpus), 3)
    out["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return out


def _serve_cpu(port: str) -> float:
    """CPU seconds (user + system) so far of the `ens serve` child listening on ``port`` and
    its children: the API and the engine worker share its GIL, so its CPU per event is what
    bounds the events/s of a busy machine, where the wall-clock rate varies with other jobs."""
    import psutil

    total = 0.0
    for p in psutil.Process().children():
        try:
            if "serve" in p.cmdline() and port in p.cmdline():
                for q in [p, *p.children(recursive=True)]:
                    t = q.cpu_times()
                    total += t.user + t.system
        except psutil.Error:
            pass
    return total


def history_size(r: Any) -> tuple[int, int]:
    """(transitions, entries) of ``ens:alarm:history``: an entry of coalesced repeats stands
    for several transitions (docs/alarms.md, "History")."""
    from adapters.service import alarm_store as als

    recs = als.history(r, limit=10**8)
    return sum(len(als.transition_ids(t)) for t in recs), len(recs)


def _final_probe(r: Any, base: str, key: str, gen: Any, timeout: float = 300.0) -> None:
    """Post a final probe and wait until its notification is in the outbox. Each poll reads
    only the entries written since the last one (the whole outbox each 50 ms cost the run
    itself CPU, in this process and in Redis, and more with alarms on: an alarm message is
    about four times the size of a plain notification)."""
    from bench import service_load as sl
    from notifiers import store

    last: Any = r.xrevrange(store.OUTBOX, count=1)
    start = "(" + last[0][0] if last else "-"
    ev = gen.event(probe=True)
    with sl.warm_client(base, key) as c:
        c.post("/v1/events", json=ev).raise_for_status()
    deadline = time.monotonic() + timeout
    while True:
        entries: Any = r.xrange(store.OUTBOX, min=start)
        for _eid, f in entries:
            n = json.loads(f[store.OUTBOX_FIELD])
            if n["profile"] == "probe" and n["events"]["e"]["id"] == ev["id"]:
                return
        if entries:
            start = "(" + entries[-1][0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the final probe was not notified within {timeout:g} s")
        time.sleep(0.05)


class _Recorder:
    """A pipeline that only counts the commands given to it."""

    def __init__(self) -> None:
        self.n = 0

    def __getattr__(self, name: str) -> Any:
        def command(*a: Any, **k: Any) -> None:
            self.n += 1

        return command


def _alarm_of(pid: str) -> dict[str, Any] | None:
    """The alarm block of `alarm_step`'s profiles: composites minor, filters warning."""
    if pid == "window-open":
        return WINDOW_ALARM
    if pid.startswith("c"):
        return {"severity": "minor", "clear": "after 30m"}
    return {"severity": "warning", "clear": "manual"} if pid.startswith("f") else None


def alarm_step(events: int = 20_000, repeat: int = 5) -> dict[str, Any]:
    """The engine worker's alarm step alone, per match (µs), best of ``repeat``: the alarm
    notifications of `e2e`'s profile set (every profile an alarm) over ``events`` events,
    captured once from an in-process worker on a real redis-server, then fed to fresh rules
    (``rules``: `AlarmPart._alarm_feed` + ``advance``), written into a recording pipeline
    (``writer``: the commands built) and into a real MULTI/EXEC (``redis``, which builds them
    again). ``rules`` and ``writer`` are CPU time (`time.process_time`: other jobs on the
    machine disturb it less), ``redis`` the wall clock (it includes the server's work)."""
    import inspect

    from adapters.service.alarm_worker import AlarmBatch, AlarmPart
    from bench import service_load as sl
    from notifiers.alarms import AlarmRules

    gen = sl.Gen(7)
    evs = [gen.event() for _ in range(events)]
    for i, e in enumerate(evs):
        e["ts"] = 1_700_000_000.0 + i * 0.002
    listed = "batches" in inspect.signature(AlarmPart.write).parameters
    best = {"rules": 1e9, "writer": 1e9, "redis": 1e9}
    profiles = [(pid, expr, _alarm_of(pid))
                for pid, expr in [*sl.profiles(200, 200), ("window-open", WINDOW_EXPR)]]  # fmt: skip
    with redis_server() as url, bench_worker(url, profiles, evs, per_entry=500) as (rb, w):
        w.start()
        notes: list[Any] = []
        feed = w.alarms._alarm_feed

        def capture(ns: list[Any]) -> Any:
            notes.extend(ns)
            return feed(ns)

        w.alarms._alarm_feed = capture  # type: ignore[method-assign,assignment]
        while w.step(block=0):
            pass
        if w.pending:
            w.commit()
        end = w.alarms._alarm_now()
        for _ in range(repeat):
            w.alarms.rules = AlarmRules(dict(w.alarms.rules.specs), {}, w.cfg.alarm_policy, None)
            t0 = time.process_time()
            eff = feed(notes)
            eff.extend(w.alarms.rules.advance(end))
            t1 = time.process_time()
            batch = AlarmBatch({"ops": [], "t": end, "ctl": "0-0"}, eff)
            arg: Any = [batch] if listed else batch
            rec = _Recorder()
            w.alarms.write(rec, arg, 86400 * 30)
            t2 = time.process_time()
            rb.delete("ens:alarm:history", "ens:alarms", "ens:outbox")
            t2w = time.perf_counter()
            with rb.pipeline(transaction=True) as p:
                w.alarms.write(p, arg, 86400 * 30)
                p.execute()
            t3 = time.perf_counter()
            for k, v in (("rules", t1 - t0), ("writer", t2 - t1), ("redis", t3 - t2w)):
                best[k] = min(best[k], v)
        out = {f"{k}_us_per_match": round(v * 1e6 / len(notes), 1) for k, v in best.items()}
        out["total_us_per_match"] = round(sum(best.values()) * 1e6 / len(notes), 1)
        out.update(matches=len(notes), transitions=len(eff.transitions),
                   messages=len(eff.messages), commands=rec.n)  # fmt: skip
        out["transitions"], out["history_entries"] = len(eff.transitions), history_size(rb)[1]
    return out
