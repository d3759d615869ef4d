"""`ens bench lazy`: rare-first vs eager evaluation on skewed streams (issue 16).

Workload: ROOMS rooms; every room reports a temperature reading (component `a`) every
PERIOD seconds (60, and 300 as the facility feed polls), with the 3-component shape also a
humidity reading (`m`); a broken window (`b`, the rare component) comes once per RATIO
readings per room. Profiles:

- two:   seq(a, b) within 30m per room
- three: seq(a, m, b) within 30m per room where m.value > a.value + 35
- mid:   seq(a, b, m) within 30m per room where m.value > a.value + 35 (the rare one in the middle)

each under `select first` / `consume unique` and `select each` / `consume shared`. Every
configuration runs the same events through the eager plan, `--plan auto` (rates counted
from the events, as `ens spark stats` would) and `--plan rare-first`; the outputs are checked
equal in the run. Figures: events/s (median of REPEAT passes, CPU time), and peak state
(partial matches of the eager engine; buffered events + partial matches of rare-first).
"""

from __future__ import annotations

import csv
import random
import statistics
import time
from pathlib import Path
from typing import Any

from ens.plans import count_stats
from filters.engine import Engine
from filters.plans.choose import Rates
from profiles.ast import Profile
from profiles.events import Event
from profiles.parser import parse_profile

SHAPES = {
    "two": 'seq(a: kind = "temperature", b: kind = "window" and state = "broken") within 30m per room',
    "three": (
        'seq(a: kind = "temperature", m: kind = "humidity", b: kind = "window" and state = "broken") '
        "within 30m per room where m.value > a.value + 35"
    ),
    # the rare component in the middle: `auto` lets it drive (select each), `rare-first` the last
    "mid": (
        'seq(a: kind = "temperature", b: kind = "window" and state = "broken", m: kind = "humidity") '
        "within 30m per room where m.value > a.value + 35"
    ),
}
SELECTIONS = {
    "first/unique": "select first consume unique",
    "each/shared": "select each consume shared",
}
PLANS = ("eager", "auto", "rare-first")


def events_for(
    shape: str, ratio: int, n_events: int, rooms: int, seed: int, period: float = 60.0
) -> list[Event]:
    """About n_events events in time order: readings every `period` s, a window per `ratio` readings."""
    rnd = random.Random(seed)
    per_step = (1 if shape == "two" else 2) + 1.0 / ratio  # events per room and reading period
    steps = max(1, int(n_events / (rooms * per_step)))
    evs: list[tuple[float, int, dict[str, Any]]] = []
    k = 0
    for r in range(rooms):
        room = f"r{r}"
        off = rnd.uniform(0, period)
        woff = rnd.randrange(ratio)
        for t in range(steps):
            ts = t * period + off
            evs.append(
                (
                    ts,
                    k,
                    {"room": room, "kind": "temperature", "value": round(rnd.uniform(18, 30), 1)},
                )
            )
            k += 1
            if shape != "two":
                evs.append(
                    (
                        ts + period / 2,
                        k,
                        {"room": room, "kind": "humidity", "value": round(rnd.uniform(30, 70), 1)},
                    )
                )
                k += 1
            if t % ratio == woff:
                evs.append(
                    (ts + period / 4, k, {"room": room, "kind": "window", "state": "broken"})
                )
                k += 1
    evs.sort(key=lambda x: (x[0], x[1]))
    return [Event(f"e{i}", ts, attrs) for i, (ts, _k, attrs) in enumerate(evs)]


def _run(eng: Engine, evs: list[Event], out: list) -> None:
    """Feed every event and finish, collecting the notifications into `out` (the timed loop)."""
    process, pending, take = eng.process, eng.pending, eng.take_notifications
    for ev in evs:
        process(ev)
        if pending():
            out.extend(take())
    eng.finish(None)
    out.extend(eng.take_notifications())


def _pass(
    profile: Profile, plan: str, rates: Rates, evs: list[Event], watch: bool
) -> tuple[float, int, list]:
    """One replay: (CPU seconds, peak state, notifications as JSON when `watch`)."""
    eng = Engine([profile], plan=plan, rates=rates)
    out: list = []
    peak = 0
    t0 = time.process_time()
    if watch:
        for i, ev in enumerate(evs):
            eng.process(ev)
            if eng.pending():
                out.extend(eng.take_notifications())
            if not i & 63:
                peak = max(peak, eng.stats()["partial_matches"])
        eng.finish(None)
        out.extend(eng.take_notifications())
    else:
        _run(eng, evs, out)
    dt = time.process_time() - t0
    return dt, peak, [n.to_json() for n in out] if watch else []


def run(
    ratios: list[int],
    n_events: int,
    rooms: int,
    repeat: int,
    seed: int,
    out: str,
    docs_img: str | None,
    periods: tuple[float, ...] = (60.0, 300.0),
) -> list[dict]:
    from rich.console import Console

    console = Console()
    rows: list[dict] = []
    for shape, base in SHAPES.items():
        for sel_name, sel in SELECTIONS.items():
            profile = parse_profile(f"{base} {sel}", f"{shape}-{sel_name.replace('/', '-')}")
            for period, ratio in [(pd, r) for pd in periods for r in ratios]:
                evs = events_for(shape, ratio, n_events, rooms, seed, period)
                rates = Rates(count_stats([profile], evs))
                res: dict[str, Any] = {}
                outs = {}
                peaks = {}
                for plan in PLANS:
                    _dt, peaks[plan], outs[plan] = _pass(profile, plan, rates, evs, watch=True)
                times: dict[str, list[float]] = {plan: [] for plan in PLANS}
                for _ in range(repeat):  # interleaved: a load change hits every plan alike
                    for plan in PLANS:
                        times[plan].append(_pass(profile, plan, rates, evs, watch=False)[0])
                for plan in PLANS:
                    res[plan] = (len(evs) / statistics.median(times[plan]), peaks[plan])
                equal = all(o == outs["eager"] for o in outs.values())
                if not equal:
                    raise SystemExit(f"DIFFERENT OUTPUT: {shape} {sel_name} {ratio}:1")
                chosen = Engine([], plan="auto", rates=rates).plan_of(profile)
                row = {
                    "shape": shape,
                    "select": sel_name,
                    "period": period,
                    "ratio": ratio,
                    "events": len(evs),
                    "notifications": len(outs["eager"]),
                    "eager_eps": round(res["eager"][0]),
                    "rare_first_eps": round(res["rare-first"][0]),
                    "auto_eps": round(res["auto"][0]),
                    "speedup_rare_first": round(res["rare-first"][0] / res["eager"][0], 2),
                    "speedup_auto": round(res["auto"][0] / res["eager"][0], 2),
                    "auto_plan": "rare-first" if chosen.lazy else "eager",
                    "eager_peak": res["eager"][1],
                    "rare_first_peak": res["rare-first"][1],
                    "equal_output": equal,
                }
                rows.append(row)
                console.print(
                    f"{shape:5} {sel_name:12} {period:>4g}s {ratio:>5}:1  eager {row['eager_eps']:>9,}/s  "
                    f"rare-first {row['rare_first_eps']:>9,}/s ({row['speedup_rare_first']}x)  "
                    f"auto[{row['auto_plan']}] {row['speedup_auto']}x  peak {row['eager_peak']:,} -> "
                    f"{row['rare_first_peak']:,}  ({row['notifications']:,} notifications, equal)"
                )
    console.print(_table(rows, rooms, n_events, repeat))
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    with open(outdir / "lazy.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    png = outdir / "lazy.png"
    plot(rows, png)
    if docs_img:
        import shutil

        Path(docs_img).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(docs_img) / "lazy.png")
    console.print(f"wrote {outdir / 'lazy.csv'} and {png}")
    return rows


def _table(rows: list[dict], rooms: int, n_events: int, repeat: int) -> Any:
    """The rows as a rich table, one line per shape, selection, period and ratio."""
    from rich.table import Table

    table = Table(
        title=f"rare-first vs eager ({rooms} rooms, ~{n_events:,} events, median of {repeat})"
    )
    for col in (
        "shape",
        "select",
        "period",
        "ratio",
        "eager ev/s",
        "rare-first ev/s",
        "x",
        "auto",
        "auto x",
        "peak eager",
        "peak rare-first",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["shape"],
            r["select"],
            f"{r['period']:g}s",
            f"{r['ratio']}:1",
            f"{r['eager_eps']:,}",
            f"{r['rare_first_eps']:,}",
            f"{r['speedup_rare_first']}",
            r["auto_plan"],
            f"{r['speedup_auto']}",
            f"{r['eager_peak']:,}",
            f"{r['rare_first_peak']:,}",
        )
    return table


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for shape, sel, period in sorted({(r["shape"], r["select"], r["period"]) for r in rows}):
        rs = [r for r in rows if (r["shape"], r["select"], r["period"]) == (shape, sel, period)]
        xs = [r["ratio"] for r in rs]
        style = "-" if sel == "each/shared" else ":"
        marker = "o" if shape == "two" else "s"
        label = f"{shape}, {sel}, {period:g}s"
        axes[0].plot(xs, [r["speedup_rare_first"] for r in rs], style, marker=marker, label=label)
        axes[1].plot(xs, [r["speedup_auto"] for r in rs], style, marker=marker, label=label)
        axes[2].plot(
            xs,
            [max(r["eager_peak"], 1) / max(r["rare_first_peak"], 1) for r in rs],
            style,
            marker=marker,
            label=label,
        )
    titles = (
        "--plan rare-first vs eager: events/s",
        "--plan auto vs eager: events/s",
        "peak state: eager / rare-first",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rate ratio frequent : rare")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ratio (same run)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_keti(
    path: str, profiles_path: str, rooms: list[str] | None, limit: int | None, repeat: int
) -> dict:
    """The KETI feed through the facility profiles: auto and rare-first vs eager, equal output."""
    from adapters.datasets import iter_dataset
    from profiles.profile_file import load_profile_file

    profiles = load_profile_file(Path(profiles_path)).profiles
    from profiles.events import event_from_obj

    evs = [
        event_from_obj(d, f"#{i}")
        for i, d in enumerate(iter_dataset("keti", path, rooms=rooms, limit=limit))
    ]
    rates = Rates(count_stats(profiles, evs, source=path))
    outs: dict[str, list] = {}
    eps: dict[str, float] = {}
    times: dict[str, list[float]] = {plan: [] for plan in PLANS}
    for _ in range(repeat):  # interleaved: a load change hits every plan alike
        for plan in PLANS:
            eng = Engine(profiles, plan=plan, rates=rates)
            out: list = []
            t0 = time.process_time()
            _run(eng, evs, out)
            times[plan].append(time.process_time() - t0)
            out.sort(key=lambda n: (n.ts, n.seq))
            outs[plan] = [n.to_json() for n in out]
    for plan in PLANS:
        eps[plan] = len(evs) / statistics.median(times[plan])
    equal = all(o == outs["eager"] for o in outs.values())
    print(
        f"KETI {path} ({len(evs):,} events, {len(profiles)} facility profiles, median of {repeat}):"
    )
    for plan in PLANS:
        print(
            f"  {plan:10} {eps[plan]:>10,.0f} events/s  ({eps[plan] / eps['eager']:.2f}x eager), "
            f"{len(outs[plan]):,} notifications"
        )
    print(f"  equal output: {'yes' if equal else 'NO'}")
    for mode in ("auto", "rare-first"):
        eng = Engine([], plan=mode, rates=rates)
        for p in profiles:
            pl = eng.plan_of(p)
            print(f"  {mode:10} {p.id:18} {'rare-first' if pl.lazy else 'eager':10} {pl.reason}")
    if not equal:
        raise SystemExit("DIFFERENT OUTPUT on KETI")
    return {"events": len(evs), "eps": eps, "equal": equal, "notifications": len(outs["eager"])}
