"""The CompAS experiments (Hinze, "Efficient Filtering of Composite Events"), single-step vs two-step.

Set-up, as we read the paper (docs/paper.md explains the choices):

- Profiles are sequences (A; Z) over one integer attribute x in [-100000, 100000]:
  profile i is ``seq(a: k = "A" and x = v_i, z: k = "Z")`` with distinct v_i, so every
  profile is distinct (its starting component) while the closing component is common to
  all of them, as in the paper where one closing event terminates a whole group of
  composite events. First-instance selection (the default ``select first``).
- Two runs of every experiment: *unique pairs* (``once``: the profile is removed after its
  first match) and *all pairs* (``consume shared``: the partial match stays and pairs its
  starting event with every later Z).
- The stream: starting events (one A per profile, x = v_i, random order) split into g
  groups, each group closed by one Z event. One event per second of stream time.

Measured per event, in one process, for every engine: the response time of
``process`` (wall clock around the call), the part spent in the primitive pool's
``match`` (the filter step) and the rest (composition: everything the engine does
with the matches, including the single-step engine's auxiliary profile inserts and
deletes), and the composite response time: from the arrival of the event that
completes a match (the call of ``process``) to the moment its notification is
appended to the engine's output.
"""

from __future__ import annotations

import csv
import gc
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from filters.engine import Engine
from filters.twostep.engine import TwoStepEngine
from profiles.ast import And, Cmp, Component, Profile, Seq
from profiles.events import Event
from profiles.parser import parse_profile

MODES = {"unique pairs": "once", "all pairs": "consume shared"}
X_RANGE = (-100_000, 100_000)


# --------------------------------------------------------------------------- engines
def engines() -> dict[str, Callable[[list[Profile]], Any]]:
    """Every single-step variant `Engine` accepts (asked at run time), and the two-step engine."""
    out: dict[str, Callable[[list[Profile]], Any]] = {}
    for variant in getattr(Engine, "VARIANTS", ("dynamic",)):
        try:
            Engine([], variant=variant)  # type: ignore[call-arg]
        except (TypeError, ValueError):
            continue
        out[f"single-step:{variant}"] = lambda ps, v=variant: Engine(ps, variant=v)  # type: ignore[misc]
    if not out:
        out["single-step"] = lambda ps: Engine(ps)
    out["two-step"] = lambda ps: TwoStepEngine(ps)
    return out


# -------------------------------------------------------------------------- workload
def profiles_for(values: list[int], mode: str, cardinality: int = 2) -> list[Profile]:
    """Distinct (A; M2; ...; Z) profiles, one per value. Built from one parsed template:
    parsing 20,000 profiles would dominate the set-up, and the ASTs are the same."""
    mids = "".join(f', c{j}: k = "M{j}"' for j in range(2, cardinality))
    text = f'seq(a: k = "A" and x = 0{mids}, z: k = "Z") {MODES[mode]}'
    tpl = parse_profile(text, "tpl")
    assert isinstance(tpl.expr, Seq)
    first, *rest = tpl.expr.components
    out = []
    for i, v in enumerate(values):
        comp = Component(first.name, And((Cmp("k", "=", "A"), Cmp("x", "=", v))))
        expr = replace(tpl.expr, components=(comp, *rest))
        out.append(replace(tpl, id=f"p{i}", expr=expr, source=text.replace("x = 0", f"x = {v}")))
    return out


def stream(starts: list[int], groups: int, rng: random.Random, cardinality: int = 2) -> list[Event]:
    """The starting events (x values in arrival order) in `groups` groups, each closed by the
    intermediate events M2.. (for longer sequences) and one Z."""
    events: list[Event] = []
    n = len(starts)
    bounds = [round(n * j / groups) for j in range(groups + 1)]
    t = 0.0
    for j in range(groups):
        for x in starts[bounds[j] : bounds[j + 1]]:
            t += 1
            events.append(Event(f"a{int(t)}", t, {"k": "A", "x": x}))
        for m in range(2, cardinality):
            t += 1
            events.append(Event(f"m{int(t)}", t, {"k": f"M{m}", "x": rng.randint(*X_RANGE)}))
        t += 1
        events.append(Event(f"z{int(t)}", t, {"k": "Z", "x": rng.randint(*X_RANGE)}))
    return events


class _Stamped(list):
    """The engine's output list, time-stamping every notification as it is appended."""

    __slots__ = ("stamps",)

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[int] = []

    def append(self, item: Any) -> None:  # noqa: D102 - list API
        self.stamps.append(time.perf_counter_ns())
        super().append(item)


def measure_best(
    eng: dict,
    profiles: list[Profile],
    events: list[Event],
    repeats: int,
    progress: Callable[[str], None],
    label: str,
) -> dict[str, dict]:
    """Every engine `repeats` times, interleaved (the machine is shared and noisy); per engine
    the run with the lowest CPU time is kept."""
    best: dict[str, dict] = {}
    rep = 0
    while rep < repeats:
        rep += 1
        for name, make in eng.items():
            progress(f"{label}, {name} ({rep}/{repeats})")
            r = measure(make, profiles, events)
            if name not in best or r["cpu_us"] < best[name]["cpu_us"]:
                best[name] = r
            if r["notifications"] > 1_000_000:
                repeats = 1  # output-bound runs are long and their noise is small
    return best


def measure(
    make: Callable[[list[Profile]], Any], profiles: list[Profile], events: list[Event]
) -> dict:
    """Run the stream once; per-event response, filter and composition times, composite response."""
    eng = make(profiles)
    out = _Stamped()
    eng.collect_into(out)  # never taken: every notification is stamped as it is appended
    pool = eng.pool
    inner = pool.match
    spent = [0]
    clock = time.perf_counter_ns

    def timed_match(attrs: dict) -> list:
        t0 = clock()
        r = inner(attrs)
        spent[0] += clock() - t0
        return r

    pool.match = timed_match  # instance attribute shadows the method
    resp: list[int] = []
    filt: list[int] = []
    z_resp: list[int] = []
    comp_resp: list[int] = []
    notes = 0
    gc.collect()
    gc.disable()
    cpu0 = time.process_time_ns()
    try:
        for ev in events:
            spent[0] = 0
            t0 = clock()
            eng.process(ev)
            dt = clock() - t0
            resp.append(dt)
            filt.append(spent[0])
            if ev.attrs["k"] == "Z":
                z_resp.append(dt)
            if out:
                notes += len(out)
                comp_resp.extend(s - t0 for s in out.stamps)
                out.clear()
                out.stamps.clear()
    finally:
        cpu = time.process_time_ns() - cpu0
        gc.enable()
    n = len(resp)
    return {
        "events": n,
        "notifications": notes,
        "cpu_us": cpu / n / 1000,
        "response_us": sum(resp) / n / 1000,
        "filter_us": sum(filt) / n / 1000,
        "composition_us": (sum(resp) - sum(filt)) / n / 1000,
        "z_response_us": statistics.fmean(z_resp) / 1000 if z_resp else 0.0,
        "composite_response_us": statistics.fmean(comp_resp) / 1000 if comp_resp else 0.0,
        "partial_matches_end": eng.stats()["partial_matches"],
    }


# ------------------------------------------------------------------------ experiments
def sample_values(n: int, rng: random.Random) -> list[int]:
    return rng.sample(range(X_RANGE[0], X_RANGE[1] + 1), n)


def exp_order(
    n: int,
    groups: list[int],
    seed: int,
    eng: dict,
    progress: Callable[[str], None],
    repeats: int,
    all_pairs_max_groups: int,
) -> list[dict]:
    """(a) Composition order: n profiles, n starting events in g groups."""
    rows = []
    for mode in MODES:
        for g in groups:
            if mode == "all pairs" and g > all_pairs_max_groups:
                continue  # n (g + 1) / 2 notifications: the output, not the filter, is measured
            rng = random.Random(seed)
            values = sample_values(n, rng)
            profiles = profiles_for(values, mode)
            starts = rng.sample(values, n)
            events = stream(starts, g, rng)
            res = measure_best(
                eng, profiles, events, repeats, progress, f"(a) {mode}, {g:,} groups"
            )
            for name, r in res.items():
                rows.append(
                    {
                        "experiment": "order",
                        "mode": mode,
                        "groups": g,
                        "profiles": n,
                        "cardinality": 2,
                        "engine": name,
                        **r,
                    }
                )
    return rows


def exp_profiles(
    counts: list[int],
    n_start: int,
    groups: list[int],
    seed: int,
    eng: dict,
    progress: Callable[[str], None],
    repeats: int,
) -> list[dict]:
    """(b) Number of profiles: n_start starting events; the first n_start profiles can start."""
    rows = []
    for mode in MODES:
        for g in groups:
            for n in counts:
                rng = random.Random(seed)
                values = sample_values(max(counts + [n_start]), rng)
                profiles = profiles_for(values[:n], mode)
                starts = rng.sample(values[:n_start], n_start)
                events = stream(starts, g, rng)
                res = measure_best(
                    eng,
                    profiles,
                    events,
                    repeats,
                    progress,
                    f"(b) {mode}, {g:,} groups, {n:,} profiles",
                )
                for name, r in res.items():
                    rows.append(
                        {
                            "experiment": "profiles",
                            "mode": mode,
                            "groups": g,
                            "profiles": n,
                            "cardinality": 2,
                            "engine": name,
                            **r,
                        }
                    )
    return rows


def exp_cardinality(
    n: int,
    cards: list[int],
    groups: int,
    seed: int,
    eng: dict,
    progress: Callable[[str], None],
    repeats: int,
) -> list[dict]:
    """(c) Profile cardinality: sequences of c components (A; M2; ...; Z)."""
    rows = []
    for mode in MODES:
        for c in cards:
            rng = random.Random(seed)
            values = sample_values(n, rng)
            profiles = profiles_for(values, mode, c)
            events = stream(rng.sample(values, n), groups, rng, c)
            res = measure_best(
                eng, profiles, events, repeats, progress, f"(c) {mode}, cardinality {c}"
            )
            for name, r in res.items():
                rows.append(
                    {
                        "experiment": "cardinality",
                        "mode": mode,
                        "groups": groups,
                        "profiles": n,
                        "cardinality": c,
                        "engine": name,
                        **r,
                    }
                )
    return rows


# ---------------------------------------------------------------------------- output
def _plot(
    rows: list[dict],
    exp: str,
    x: str,
    ys: list[str],
    title: str,
    path: Path,
    split: str | None = None,
    logx: bool = False,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = [r for r in rows if r["experiment"] == exp]
    panels = (
        [(m, s) for m in MODES for s in sorted({r[split] for r in sel})]
        if split
        else [(m, None) for m in MODES]
    )
    fig, axes = plt.subplots(
        len(ys), len(panels), figsize=(4.2 * len(panels), 3.4 * len(ys)), squeeze=False
    )
    for col, (mode, sv) in enumerate(panels):
        for row, y in enumerate(ys):
            ax = axes[row][col]
            for name in dict.fromkeys(r["engine"] for r in sel):
                pts = sorted(
                    (r[x], r[y])
                    for r in sel
                    if r["engine"] == name
                    and r["mode"] == mode
                    and (sv is None or r[split] == sv)
                    and r[y] > 0
                )  # log scale: no matches, no composite response
                style = "--" if name == "two-step" else "-"
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=name
                )
            if logx:
                ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(x)
            label = {
                "cpu_us": "response, CPU (µs/event)",
                "composition_us": "composition, wall (µs/event)",
            }
            ax.set_ylabel(label.get(y, y.replace("_us", " (µs, wall)").replace("_", " ")))
            ax.set_title(f"{mode}" + (f", {sv:,} {split}" if sv is not None else ""), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratios(rows: list[dict]) -> list[dict]:
    """two-step / single-step for every measurement point and single-step variant (> 1: single-step faster)."""
    key = ("experiment", "mode", "groups", "profiles", "cardinality")
    base = {tuple(r[k] for k in key): r for r in rows if r["engine"] == "two-step"}
    out = []
    for r in rows:
        if r["engine"] == "two-step":
            continue
        b = base.get(tuple(r[k] for k in key))
        if b is None:
            continue
        out.append(
            {
                **{k: r[k] for k in key},
                "engine": r["engine"],
                "cpu_ratio": b["cpu_us"] / r["cpu_us"],
                "response_ratio": b["response_us"] / r["response_us"],
                "composition_ratio": b["composition_us"] / max(r["composition_us"], 1e-9),
                "z_ratio": b["z_response_us"] / max(r["z_response_us"], 1e-9),
                "composite_ratio": b["composite_response_us"]
                / max(r["composite_response_us"], 1e-9),
            }
        )
    return out


def plot_all(rows: list[dict], dest: Path, docs_img: str | None) -> None:
    plots = {
        "paper_order.png": (
            "order",
            "groups",
            ["cpu_us", "z_response_us", "composite_response_us"],
            "(a) composition order: response time per event vs number of groups",
            None,
            True,
        ),
        "paper_profiles.png": (
            "profiles",
            "profiles",
            ["cpu_us", "composite_response_us"],
            "(b) response time vs number of profiles",
            "groups",
            False,
        ),
        "paper_cardinality.png": (
            "cardinality",
            "cardinality",
            ["cpu_us", "composition_us"],
            "(c) response and composition time vs profile cardinality",
            None,
            False,
        ),
    }
    for fname, (exp, x, ys, title, split, logx) in plots.items():
        _plot(rows, exp, x, ys, title, dest / fname, split, logx)
        if docs_img:
            Path(docs_img).mkdir(parents=True, exist_ok=True)
            shutil.copy(dest / fname, Path(docs_img) / fname)


def replot(out: str, docs_img: str | None) -> None:
    """Plots and the summary table again from `paper.csv` (no measuring)."""
    from rich.console import Console

    rows: list[dict] = []
    with (Path(out) / "paper.csv").open() as fh:
        for r in csv.DictReader(fh):
            rows.append(
                {
                    k: (
                        v
                        if k in ("experiment", "mode", "engine")
                        else float(v)
                        if "." in v
                        else int(v)
                    )
                    for k, v in r.items()
                }
            )
    plot_all(rows, Path(out), docs_img)
    Console(width=200).print(summary_table(rows, 0))


def summary_table(rows: list[dict], seconds: float) -> Any:
    """One row per measurement point: CPU µs per event for every engine, and the ratios
    two-step / single-step (best variant) for CPU time per event, for the events that close
    the groups (Z), and for the composite response time (> 1: single-step faster)."""
    from rich.table import Table

    names = list(dict.fromkeys(r["engine"] for r in rows))
    singles = [n for n in names if n != "two-step"]
    title = "µs per event (CPU) and two-step / best single-step" + (
        f" — {seconds:,.0f} s" if seconds else ""
    )
    table = Table(title=title)
    for col in ["exp.", "mode", "groups", "profiles", "card.", "notes"]:
        table.add_column(col, justify="right")
    for n in names:
        table.add_column(n.replace("single-step:", "ss:"), justify="right")
    for col in ["cpu ×", "Z event ×", "composite resp. ×"]:
        table.add_column(col, justify="right")
    key = ("experiment", "mode", "groups", "profiles", "cardinality")
    points: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        points.setdefault(tuple(r[k] for k in key), {})[r["engine"]] = r
    for k, by in points.items():
        two = by["two-step"]
        best = min((by[n] for n in singles), key=lambda r: r["cpu_us"])
        zbest = min(by[n]["z_response_us"] for n in singles)
        cbest = min(by[n]["composite_response_us"] for n in singles)
        table.add_row(
            k[0],
            k[1],
            f"{k[2]:,}",
            f"{k[3]:,}",
            str(k[4]),
            f"{two['notifications']:,}",
            *[f"{by[n]['cpu_us']:.1f}" for n in names],
            f"{two['cpu_us'] / best['cpu_us']:.2f}",
            f"{two['z_response_us'] / zbest:.2f}" if zbest else "–",
            f"{two['composite_response_us'] / cbest:.2f}" if cbest else "–",
        )
    return table


def run(out: str, quick: bool, seed: int, docs_img: str | None = None) -> list[dict]:
    """All three experiments for every engine; CSV, PNG plots and a summary table."""
    from rich.console import Console

    console = Console(stderr=True)
    eng = engines()
    if quick:
        n, groups, all_max, repeats = 1000, [1, 10, 100, 1000], 1000, 1
        counts, n_start, g_b, cards, cgroups = [0, 500, 1000, 2000], 1000, [1, 100], [2, 3, 5], 100
    else:
        n, groups, all_max, repeats = 10_000, [1, 10, 100, 1000, 10_000], 1000, 3
        counts, n_start, g_b = [0, 2500, 5000, 10_000, 15_000, 20_000], 10_000, [1, 1000]
        cards, cgroups = [2, 3, 4, 6, 8], 100
    rows: list[dict] = []
    t0 = time.perf_counter()
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    log = (dest / "progress.log").open("w")
    with console.status("…") as status:

        def progress(msg: str) -> None:
            line = f"[{time.perf_counter() - t0:,.0f} s] {msg}"
            status.update(line)
            print(line, file=log, flush=True)  # the full run is long; follow it with tail -f

        rows += exp_order(n, groups, seed, eng, progress, repeats, all_max)
        rows += exp_profiles(counts, n_start, g_b, seed, eng, progress, repeats)
        rows += exp_cardinality(n, cards, cgroups, seed, eng, progress, repeats)
    log.close()
    with (dest / "paper.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    ratios = _ratios(rows)
    with (dest / "paper_ratios.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(ratios[0]))
        w.writeheader()
        w.writerows(ratios)
    plot_all(rows, dest, docs_img)
    Console(width=200).print(summary_table(rows, time.perf_counter() - t0))
    return rows
