"""Single-step vs two-step on every workload of docs/benchmarks.md (`ens bench engines`).

Each *cell* is one workload: profiles plus an event stream, built from a seed. Every cell is
run by the single-step `Engine` and by the two-step `TwoStepEngine` (plain filter cells: by
`Engine` and by a plain CPython loop, a bisect per kind, building the same notifications),
interleaved, `repeat` times; the CPU time (`time.process_time`) of each run is kept and the
median reported. The figure per cell is a speed ratio: baseline time / single-step time
(> 1: single-step faster), the median of each repeat's own ratio (its two runs come back to
back in one worker, so the ratio cancels the machine's drift between repeats, 3-5 % on these
machines). Plain filter cells report ENS time / loop time (a cost, target <= 2).

With `--against TREE` every run happens in one of two long-lived worker processes, one
importing `filters/` from TREE (before) and one from this tree (after), interleaved too, so
before and after are measured in the same run on the same machine load.

This file is also the worker (`python bench/engines.py --worker`): it only imports what both
trees have (`filters`, `profiles`, `bench.paper`), so it can measure an older tree.
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SS, TS, LOOP = "single-step", "two-step", "loop"


@dataclass(frozen=True)
class Cell:
    """One workload of the table: `group` orders and labels the table, `build` makes it."""

    name: str
    group: str
    baseline: str  # TS or LOOP
    build: Callable[[], tuple[list[Any], list[Any]]]  # -> (profiles, events)


# ------------------------------------------------------------------ workloads
def _keyed(shape: str, instances: int, n_events: int, seed: int) -> tuple[list[Any], list[Any]]:
    """`instances` copies of one composite, each keyed by `g = i` on every component."""
    from profiles.events import Event
    from profiles.parser import parse_profile

    def c(name: str, kind: str, i: int, neg: bool = False) -> str:
        return f'{"not " if neg else ""}{name}: kind = "{kind}" and g = {i}'

    shapes = {
        "seq2": lambda i: f"seq({c('a', 'A', i)}, {c('b', 'B', i)}) within 10m",
        "seq3": lambda i: f"seq({c('a', 'A', i)}, {c('b', 'B', i)}, {c('c', 'C', i)}) within 10m",
        "seq-not": lambda i: (
            f"seq({c('a', 'A', i)}, {c('x', 'X', i, True)}, {c('b', 'B', i)}) within 10m"
        ),
        "and2": lambda i: f"all({c('a', 'A', i)}, {c('b', 'B', i)}) within 10m",
    }
    profiles = [parse_profile(shapes[shape](i), f"{shape}-{i}") for i in range(instances)]
    rng = random.Random(seed)
    kinds = "ABCX"
    events = [
        Event(
            f"e{t}",
            float(t),
            {"kind": rng.choice(kinds), "g": rng.randrange(instances), "v": t % 7},
        )
        for t in range(n_events)
    ]
    return profiles, events


def _growth(
    n: int, hot: bool, select: str, n_events: int, seed: int
) -> tuple[list[Any], list[Any]]:
    """N keyed pairs `seq(a: A and x = i, b: B and x = i) within 1h`; x over 10 hot keys or all N."""
    from profiles.events import Event
    from profiles.parser import parse_profile

    tail = "" if select == "first" else " select each consume shared"
    tpl = parse_profile(
        f'seq(a: kind = "A" and x = 0, b: kind = "B" and x = 0) within 1h{tail}', "tpl"
    )
    profiles = [_with_x(tpl, i) for i in range(n)]
    rng = random.Random(seed)
    keys = rng.sample(range(n), min(10, n)) if hot else range(n)
    keys = list(keys)
    events = [
        Event(f"e{t}", float(t), {"kind": rng.choice("AB"), "x": rng.choice(keys)})
        for t in range(n_events)
    ]
    return profiles, events


def _with_x(tpl: Any, i: int) -> Any:
    """The template profile with `x = i` in both components (parsing 10,000 profiles would
    dominate the set-up; the ASTs are the same)."""
    from dataclasses import replace

    from profiles.ast import And, Cmp, Component

    comps = tuple(
        Component(c.name, And((c.expr.items[0], Cmp("x", "=", i))), c.negated)
        for c in tpl.expr.components
    )
    return replace(
        tpl,
        id=f"p{i}",
        expr=replace(tpl.expr, components=comps),
        source=tpl.source.replace("x = 0", f"x = {i}"),
    )


def _paper(n: int, groups: int, seed: int) -> tuple[list[Any], list[Any]]:
    """`ens bench paper`'s order experiment, unique pairs (`once`)."""
    from bench import paper

    rng = random.Random(seed)
    values = paper.sample_values(n, rng)
    profiles = paper.profiles_for(values, "unique pairs")
    starts = rng.sample(values, n)
    return profiles, paper.stream(starts, groups, rng)


def _plain(band: str, n_events: int, seed: int) -> tuple[list[Any], list[Any]]:
    """1,000 threshold filters `kind = "T" and v > t`; dense: ~25 matches per event, sparse: ~0.25."""
    from profiles.events import Event
    from profiles.parser import parse_profile

    rng = random.Random(seed)
    thresholds = list(range(1000))
    rng.shuffle(thresholds)
    profiles = [parse_profile(f'kind = "T" and v > {t}', f"f{i}") for i, t in enumerate(thresholds)]
    lo, hi = (0.0, 50.0) if band == "dense" else (-3.0, 1.0)
    kinds = ["T", "T", "T", "U"] if band == "dense" else ["T"]
    events = []
    for t in range(n_events):
        kind = kinds[t % len(kinds)]
        v = rng.uniform(lo, hi) * (4 / 3 if band == "dense" else 1)
        events.append(Event(f"e{t}", float(t), {"kind": kind, "v": v}))
    return profiles, events


def cells(quick: bool, seed: int) -> list[Cell]:
    ev_keyed = 5_000 if quick else 20_000
    ev_growth = 10_000 if quick else 50_000
    ev_plain = 5_000 if quick else 20_000
    n_paper = 2_000 if quick else 10_000
    out: list[Cell] = []
    for inst in (1, 100):
        for shape in ("seq2", "seq3", "seq-not", "and2"):
            out.append(
                Cell(
                    f"keyed {shape} x{inst}",
                    f"keyed composites, {inst} instance{'s' * (inst > 1)}",
                    TS,
                    lambda s=shape, i=inst: _keyed(s, i, ev_keyed, seed),  # type: ignore[misc]
                )
            )
    for select in ("first", "each"):
        for hot in (True, False):
            if select == "each" and hot:
                continue  # ~180 notifications per B event: it measures the output, not detection
            for n in (10, 1_000, 10_000):
                if select == "each" and n == 10:
                    continue  # the same: 10 keys are hot keys
                label = f"growth {select} {'hot' if hot else 'spread'} N={n:,}"
                group = f"growth, select {select}{' consume shared' * (select == 'each')}, {'10 hot keys' if hot else 'spread over N'}"
                out.append(
                    Cell(
                        label,
                        group,
                        TS,
                        lambda n=n, h=hot, s=select: _growth(n, h, s, ev_growth, seed),  # type: ignore[misc]
                    )
                )
    for g in (1, 10, 100, 1_000):
        out.append(
            Cell(
                f"paper order {g:,} groups",
                f"paper order experiment, unique pairs, {n_paper:,} profiles",
                TS,
                lambda g=g: _paper(n_paper, g, seed),  # type: ignore[misc]
            )
        )
    for band in ("dense", "sparse"):
        out.append(
            Cell(
                f"plain {band}",
                "plain filters, 1,000 thresholds (ENS cost / loop cost)",
                LOOP,
                lambda b=band: _plain(b, ev_plain, seed),  # type: ignore[misc]
            )
        )
    return out


# ------------------------------------------------------------------ measuring
def _run_engine(
    make: Callable[[list[Any]], Any], profiles: list[Any], events: list[Any]
) -> tuple[float, int]:
    """One pass; notifications are taken after every event (as `ens replay` and the service do),
    the loaded state is frozen out of the collector first (as they do too: `gc.freeze`)."""
    eng = make(profiles)
    notes = 0
    gc.collect()
    gc.freeze()
    try:
        t0 = time.process_time()
        process, take = eng.process, eng.take_notifications
        for ev in events:
            process(ev)
            notes += len(take())
        eng.finish()
        notes += len(take())
        return time.process_time() - t0, notes
    finally:
        gc.unfreeze()


def _run_loop(profiles: list[Any], events: list[Any]) -> tuple[float, int]:
    """The plain loop: per kind, thresholds sorted; `v > t` is a prefix; notifications in profile order."""
    from filters.notification import Notification

    by_kind: dict[Any, list[tuple[float, int]]] = {}
    pids = []
    for idx, p in enumerate(profiles):
        kind_cmp, v_cmp = p.expr.items
        by_kind.setdefault(kind_cmp.value, []).append((v_cmp.value, idx))
        pids.append(p.id)
    table = {}
    for kind, lst in by_kind.items():
        lst.sort()
        table[kind] = ([t for t, _ in lst], [i for _, i in lst])
    notes = 0
    gc.collect()
    gc.freeze()
    t0 = time.process_time()
    nseq = 0
    for ev in events:
        out: list[Any] = []  # handed on after every event, as the engine's are
        attrs = ev.attrs
        t = table.get(attrs.get("kind"))
        if t is None:
            continue
        v = attrs.get("v")
        if v.__class__ is not float and v.__class__ is not int:
            continue
        thr, idxs = t
        k = bisect_left(thr, v)
        if k:
            ts = ev.ts
            for idx in sorted(idxs[:k]):
                nseq += 1
                out.append(Notification(pids[idx], ts, {"e": ev}, None, nseq, None))
        notes += len(out)
    cpu = time.process_time() - t0
    gc.unfreeze()
    return cpu, notes


class Runner:
    """Measures (cell, engine) in this process; workloads are built once and kept."""

    def __init__(self, quick: bool, seed: int) -> None:
        self.cells = {c.name: c for c in cells(quick, seed)}
        self._built: dict[str, tuple[list[Any], list[Any]]] = {}

    def measure(self, cell: str, engine: str) -> tuple[float, int]:
        from filters.engine import Engine

        try:
            from filters.twostep.engine import TwoStepEngine
        except ModuleNotFoundError:  # a tree from before filters/ became subpackages
            from filters.twostep import TwoStepEngine  # type: ignore[attr-defined,no-redef]

        c = self.cells[cell]
        if cell not in self._built:
            self._built = {cell: c.build()}  # one workload at a time: 10,000 profiles are big
        profiles, events = self._built[cell]
        if engine == LOOP:
            cpu, notes = _run_loop(profiles, events)
        else:
            cpu, notes = _run_engine(Engine if engine == SS else TwoStepEngine, profiles, events)
        return cpu / len(events) * 1e6, notes


def worker() -> None:
    """Line protocol on stdin/stdout: {"quick", "seed"} once, then {"cell", "engine"} per run."""
    cfg = json.loads(sys.stdin.readline())
    runner = Runner(cfg["quick"], cfg["seed"])
    print(json.dumps({"ok": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        us, notes = runner.measure(req["cell"], req["engine"])
        print(json.dumps({"us": us, "notes": notes}), flush=True)


class _Worker:
    """A measuring process for one tree, with a fixed string-hash seed: set and dict orders of
    profile ids change with it, and so does the two-step baseline's cost (paper order at 1,000
    groups: 175-350 µs/event over four seeds), so before and after must share it."""

    def __init__(self, tree: Path, quick: bool, seed: int, hash_seed: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED=str(hash_seed))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send({"quick": quick, "seed": seed})

    def _send(self, msg: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker exited ({self.proc.wait()})")
        return json.loads(line)

    def measure(self, cell: str, engine: str) -> tuple[float, int]:
        r = self._send({"cell": cell, "engine": engine})
        return r["us"], r["notes"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


# --------------------------------------------------------------------- driver
def run(
    repeat: int,
    quick: bool,
    seed: int,
    only: str,
    against: str,
    out_md: str,
    out_png: str,
    hash_seeds: int = 1,
) -> list[dict]:
    from rich.console import Console

    console = Console(stderr=True)
    all_cells = [c for c in cells(quick, seed) if not only or only in c.name]
    if not all_cells:
        raise ValueError(f"no cell matches {only!r}")
    here = Path(__file__).resolve().parents[1]
    trees = {"before": Path(against).resolve(), "after": here} if against else {"": here}
    # Repeat k runs in the tree's worker with hash seed k % hash_seeds (seeds 0, 1, ...).
    versions = {
        v: [_Worker(tree, quick, seed, h) for h in range(hash_seeds)] for v, tree in trees.items()
    }
    times: dict[tuple[str, str, str], list[float]] = {}
    notes: dict[tuple[str, str, str], int] = {}
    t_start = time.perf_counter()
    try:
        with console.status("…") as status:
            for c in all_cells:  # one cell at a time (workloads are big), repeats interleaved
                for rep in range(repeat):
                    runs = [(v, e) for v in versions for e in (SS, c.baseline)]
                    if rep % 2:
                        runs.reverse()
                    for v, e in runs:
                        status.update(
                            f"[{time.perf_counter() - t_start:,.0f} s] {c.name}: {v} {e} ({rep + 1}/{repeat})"
                        )
                        us, n = versions[v][rep % hash_seeds].measure(c.name, e)
                        times.setdefault((c.name, v, e), []).append(us)
                        notes[(c.name, v, e)] = n
    finally:
        for workers in versions.values():
            for w in workers:
                w.close()
    rows = []
    for c in all_cells:
        row: dict[str, Any] = {"cell": c.name, "group": c.group, "baseline": c.baseline}
        for v in versions:
            ss_runs, base_runs = times[(c.name, v, SS)], times[(c.name, v, c.baseline)]
            pre = f"{v} " if v else ""
            row[f"{pre}ss_us"] = statistics.median(ss_runs)
            row[f"{pre}base_us"] = statistics.median(base_runs)
            # (single-step, baseline) per repeat; paired: a repeat's two runs are back to back
            # in one worker, so its ratio cancels the machine's drift between repeats (the
            # medians of the times do not)
            pairs = list(zip(ss_runs, base_runs, strict=True))
            row[f"{pre}runs"] = pairs
            loop = c.baseline == LOOP
            row[f"{pre}ratio"] = statistics.median([s / b if loop else b / s for s, b in pairs])
            row[f"{pre}notes"] = notes[(c.name, v, SS)]
            if notes[(c.name, v, SS)] != notes[(c.name, v, c.baseline)]:
                row[f"{pre}mismatch"] = (notes[(c.name, v, SS)], notes[(c.name, v, c.baseline)])
        rows.append(row)
    elapsed = time.perf_counter() - t_start
    _print(rows, list(versions), elapsed)
    if out_md:
        cmd = (
            "ens bench engines " + " ".join(sys.argv[3:])
            if sys.argv[1:3] == ["bench", "engines"]
            else "ens bench engines"
        )
        _write_md(rows, list(versions), Path(out_md), cmd, repeat, elapsed)
    if out_png:
        _plot(rows, list(versions), Path(out_png))
    return rows


def _summary(rows: list[dict], v: str) -> str:
    pre = f"{v} " if v else ""
    ratios = [r[f"{pre}ratio"] for r in rows if r["baseline"] == TS]
    if not ratios:
        return ""
    return (
        f"{pre}single-step / two-step speed: median {statistics.median(ratios):.2f}x, "
        f"min {min(ratios):.2f}x over {len(ratios)} cells"
    )


def _print(rows: list[dict], versions: list[str], elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"single-step vs baseline, µs per event (CPU, median) — {elapsed:,.0f} s")
    table.add_column("cell", no_wrap=True)
    for v in versions:
        pre = f"{v} " if v else ""
        for col in ("single-step", "baseline", "ratio", "notes"):
            table.add_column(pre + col, justify="right")
    for r in rows:
        cells_ = [r["cell"]]
        for v in versions:
            pre = f"{v} " if v else ""
            mark = " !" if f"{pre}mismatch" in r else ""
            cells_ += [
                f"{r[pre + 'ss_us']:.2f}",
                f"{r[pre + 'base_us']:.2f}",
                _ratio(r, pre),
                f"{r[pre + 'notes']:,}{mark}",
            ]
        table.add_row(*cells_)
    console = Console(width=200)
    console.print(table)
    for v in versions:
        console.print(_summary(rows, v))
    console.print(
        "ratio: two-step time / single-step time (> 1: single-step faster), median of each "
        "repeat's ratio; plain rows: ENS time / loop time (a cost); ! = notification counts differ"
    )


def _ratio(r: dict, pre: str) -> str:
    x = r[pre + "ratio"]
    return f"{x:.2f}" + (" cost" if r["baseline"] == LOOP else "x")


_BEGIN, _END = "<!-- bench engines: begin -->", "<!-- bench engines: end -->"


def _write_md(
    rows: list[dict], versions: list[str], path: Path, cmd: str, repeat: int, elapsed: float
) -> None:
    lines = [
        _BEGIN,
        "",
        f"Command: `{cmd}` ({repeat} repeats, {elapsed:,.0f} s, CPU time, median).",
        "",
    ]
    head = ["workload"]
    for v in versions:
        pre = f"{v} " if v else ""
        head += [f"{pre}single-step µs/ev", f"{pre}baseline µs/ev", f"{pre}ratio"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cols = [r["cell"]]
        for v in versions:
            pre = f"{v} " if v else ""
            cols += [f"{r[pre + 'ss_us']:.2f}", f"{r[pre + 'base_us']:.2f}", _ratio(r, pre)]
        lines.append("| " + " | ".join(cols) + " |")
    lines.append("")
    for v in versions:
        lines.append(f"- {_summary(rows, v)}")
    lines += [
        "- ratio: two-step time / single-step time (> 1: single-step faster), the median of each "
        "repeat's own ratio (its two runs back to back in one worker); plain filter rows: "
        "ENS time / plain-loop time per event (a cost, lower is better).",
        "",
        _END,
    ]
    block = "\n".join(lines)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if _BEGIN in text and _END in text:
        a, b = text.index(_BEGIN), text.index(_END) + len(_END)
        text = text[:a] + block + text[b:]
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## Single-step vs two-step on every workload (`ens bench engines`)\n\n"
            + block
            + "\n"
        )
    path.write_text(text)


def _plot(rows: list[dict], versions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp = [r for r in rows if r["baseline"] == TS]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(comp) + 1.5))
    h = 0.8 / len(versions)
    for k, v in enumerate(versions):
        pre = f"{v} " if v else ""
        ax.barh(
            [i + k * h for i in range(len(comp))],
            [r[pre + "ratio"] for r in comp],
            height=h,
            label=v or "single-step / two-step",
        )
    ax.set_yticks(
        [i + h * (len(versions) - 1) / 2 for i in range(len(comp))],
        [r["cell"] for r in comp],
        fontsize=7,
    )
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed ratio, two-step CPU time / single-step CPU time (> 1: single-step faster)")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.path.insert(0, os.getcwd())  # the tree measured (cwd), not this file's folder
    worker()
