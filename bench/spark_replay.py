"""Benchmark: `ens spark replay` vs a local replay over the KETI feed, by number of rooms.

    python bench/spark_replay.py --rooms 5,10,25 [--data ../shared/data/keti]
    python bench/spark_replay.py --rooms 51 --cold     # full feed, the CLI as a user runs it

Local: one engine over the adapter's time-ordered stream — what `ens replay`
computes (its sort is the identity on a sorted stream), streamed, because the
whole feed as a list of events does not fit a laptop's memory. Spark: the
replay job in-process on a warm session (per-stage seconds), or with `--cold`
the command line in a subprocess (JVM start included). Both outputs are
compared byte for byte. Results: bench/results/spark_replay.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROFILES = "examples/facility-spark/profiles.yaml"


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of this process and every live descendant (JVM, Python workers), Linux /proc.

    The machine these figures come from is shared, so wall time alone says
    little; CPU time does not depend on what else runs.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(f[1])
        cpu[int(d.name)] = sum(int(x) for x in f[11:15]) / tick  # utime stime cutime cstime
    me, total = root or os.getpid(), 0.0
    for pid in cpu:
        p = pid
        while p > 1 and p != me:
            p = parent.get(p, 0)
        if p == me:
            total += cpu[pid]
    return total


def local(data: str, rooms: list[str], out: Path) -> dict:
    from adapters.datasets import iter_dataset
    from filters.engine import Engine
    from profiles.events import event_from_obj
    from profiles.profile_file import load_profile_file

    ps = load_profile_file(PROFILES).profiles
    eng = Engine(ps)
    notes = []
    n = 0
    t, c = time.perf_counter(), time.process_time()
    for obj in iter_dataset("keti", data, rooms=rooms):
        eng.process(event_from_obj(obj, ""))
        n += 1
        if eng.pending():
            notes.extend(eng.take_notifications())
    eng.finish()
    notes.extend(eng.take_notifications())
    notes.sort(key=lambda x: (x.ts, x.seq))
    with out.open("w") as fh:
        for x in notes:
            fh.write(json.dumps(x.to_json(), separators=(", ", ": ")) + "\n")
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "cpu_s": round(time.process_time() - c, 2),
        "events": n,
        "notifications": len(notes),
    }


def spark_warm(spark, data: str, rooms: list[str], out: Path, fused: bool) -> dict:  # noqa: ANN001
    from adapters.spark.feed import read_dataset
    from adapters.spark.replay import replay_job
    from profiles.profile_file import load_profile_file

    ps = load_profile_file(PROFILES).profiles
    t, c = time.perf_counter(), tree_cpu()
    src = lambda plan: read_dataset(spark, "keti", data, "room", plan, rooms)  # noqa: E731
    st = replay_job(
        spark, ps, src, str(out), key="room", dataset=("keti", data, rooms) if fused else None
    )
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "cpu_s": round(tree_cpu() - c, 2),
        "events": st.events,
        "notifications": st.notifications,
        "stages": st.seconds,
    }


def spark_cold(data: str, rooms: list[str], out: Path, master: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "ens.commands.spark",
        "replay",
        "--dataset",
        "keti",
        data,
        "--rooms",
        ",".join(rooms),
        "--profiles",
        PROFILES,
        "--key",
        "room",
        "--out",
        str(out),
        "--master",
        master,
    ]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cpu = 0.0
    while p.poll() is None:  # the process tree's CPU, sampled: its JVM is not reaped by us
        cpu = max(cpu, tree_cpu(p.pid))
        time.sleep(1)
    err = p.stderr.read() if p.stderr else ""
    if p.returncode:
        raise RuntimeError(err)
    log = [ln for ln in err.splitlines() if ln.startswith("spark:")]
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "cpu_s": round(cpu, 2),
        "command": " ".join(cmd[1:]),
        "log": log,
    }


def plot(results: list[dict], png: Path) -> None:
    """Seconds vs rooms: local replay, Spark CLI (wall), Spark CPU; the latest figures per room count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loc = {r["rooms"]: r["local"] for r in results if "local" in r}
    cli = {r["rooms"]: r["spark_cli"] for r in results if "spark_cli" in r}
    last = {n: {"local": loc[n], "spark_cli": cli[n]} for n in loc if n in cli}
    rooms = sorted(last)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(
        rooms, [last[n]["local"]["seconds"] for n in rooms], "o-", label="local replay (1 core)"
    )
    ax.plot(
        rooms,
        [last[n]["spark_cli"]["seconds"] for n in rooms],
        "s-",
        label="ens spark replay, wall (local[2])",
    )
    ax.plot(
        rooms, [last[n]["spark_cli"]["cpu_s"] for n in rooms], "s:", label="ens spark replay, CPU s"
    )
    ax.set_xlabel("KETI rooms replayed")
    ax.set_ylabel("seconds")
    ax.set_title("KETI replay: Spark vs one local engine (identical output)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/keti")
    ap.add_argument("--rooms", default="5,10,25", help="room counts (first N rooms by name)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--cold", action="store_true", help="run the CLI in a subprocess (JVM start included)"
    )
    ap.add_argument("--no-local", action="store_true", help="reuse the last local output")
    ap.add_argument(
        "--generic", action="store_true", help="also time the generic path (parse table + shuffle)"
    )
    ap.add_argument("--out", default="bench/results/spark_replay.json")
    ap.add_argument("--plot", default=None, help="only draw this PNG from the results in --out")
    args = ap.parse_args()
    if args.plot:
        plot(json.loads(Path(args.out).read_text()), Path(args.plot))
        return

    from adapters.datasets.keti import list_rooms

    all_rooms = sorted(list_rooms(Path(args.data)))
    res_path = Path(args.out)
    results = json.loads(res_path.read_text()) if res_path.exists() else []
    spark = None
    for n in [int(x) for x in args.rooms.split(",")]:
        rooms = all_rooms[:n]
        d = Path("bench/results")
        lo, so = d / f"keti-{n}-local.jsonl", d / f"keti-{n}-spark.jsonl"
        rec: dict = {
            "rooms": n,
            "master": args.master,
            "cpus": os.cpu_count(),
            "load_before": os.getloadavg(),
        }
        if not args.no_local:
            rec["local"] = local(args.data, rooms, lo)
        if args.cold:
            rec["spark_cli"] = spark_cold(args.data, rooms, so, args.master)
        else:
            if spark is None:
                from adapters.spark.session import get_spark

                t = time.perf_counter()
                spark = get_spark(args.master)
                rec["spark_start_s"] = round(time.perf_counter() - t, 2)
            rec["spark"] = spark_warm(spark, args.data, rooms, so, fused=True)
            rec["identical_fused"] = sha(lo) == sha(so)
            if args.generic:
                rec["spark_generic"] = spark_warm(spark, args.data, rooms, so, fused=False)
        rec["identical"] = sha(lo) == sha(so)
        rec["load_after"] = os.getloadavg()
        results.append(rec)
        res_path.write_text(json.dumps(results, indent=1))
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
