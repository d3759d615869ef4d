"""`ens bench …`: benchmarks (figures, not tests)."""

from __future__ import annotations

from pathlib import Path

import typer

# The checkout `ens` is installed from (make installs it editable): the defaults below are its
# example files and its bench/results, whatever the current directory.
REPO = Path(__file__).resolve().parents[2]


def _default(rel: str) -> str:
    return str(REPO / rel)


def _need(path: str, what: str, flag: str, is_dir: bool = False) -> None:
    """A missing input is a usage error before any work (not after a minute of measuring)."""
    p = Path(path)
    if not (p.is_dir() if is_dir else p.is_file()):
        raise typer.BadParameter(f"{what} {path} not found", param_hint=flag)


def _counts(text: str, flag: str = "--sizes") -> list[int]:
    """--sizes (or ``flag``): positive integers, comma-separated."""
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give profile counts as integers, e.g. 1000,10000", param_hint=flag
        ) from None
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter(f"{text!r}: every count must be at least 1", param_hint=flag)
    return sizes


app = typer.Typer(
    help="Benchmarks: print figures and compare against a baseline measured in the same run.",
    no_args_is_help=True,
)


@app.command("archive")
def archive_cmd(
    events: int = typer.Option(100_000, help="Events posted per round."),
    batch: int = typer.Option(500, help="Events per POST."),
    clients: int = typer.Option(4, help="Concurrent gateways."),
    rounds: int = typer.Option(3, help="Rounds per mode (off and on alternate)."),
    apart: bool = typer.Option(
        False, "--apart", help="Run the archiver as its own process (`ens serve --role archive`)."
    ),
    flush: str = typer.Option("10s", "--flush", help="The service's --archive-flush."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """The service end to end with the event archive on vs off (same run): events/s, their
    ratio, and the archive's bytes per event."""
    from bench.archive import report, run

    if min(events, batch, clients, rounds) < 1:
        raise typer.BadParameter("--events, --batch, --clients and --rounds must be at least 1")
    report(run(events, batch, clients, rounds, apart, flush), as_json)


@app.command("pool")
def pool_cmd(
    sizes: str = typer.Option("1000,10000,100000,1000000", help="Profile counts, comma-separated."),
    events: int = typer.Option(20000, help="Events per measurement."),
    naive_max: int = typer.Option(
        100000, help="Skip naive evaluation above this many profiles (it is linear)."
    ),
    out: str = typer.Option(_default("bench/results"), help="Directory for CSV and PNG output."),
    seed: int = typer.Option(
        7, help="Random seed for profiles and events (same seed, same workload)."
    ),
    repeat: int = typer.Option(
        5, help="Timed passes over the events (CPU time); the median is reported."
    ),
) -> None:
    """Primitive pool: events/s and µs/event at growing profile counts vs naive evaluation.

    Also insert, delete and re-insert cost and memory per profile; writes pool.csv and pool.png to OUT. Recorded results: docs/benchmarks.md.
    """
    from bench.pool import run

    counts = _counts(sizes)
    if events < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--events")
    if repeat < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--repeat")
    run(counts, events, naive_max, out, seed, repeat)


@app.command("composite")
def composite_cmd(
    composites: int = typer.Option(10000, help="Composite seq profiles."),
    primitives: int = typer.Option(10000, help="Primitive profiles."),
    rounds: int = typer.Option(
        15,
        help="Measurement rounds, at least 2: even ones time whole events, odd ones the pool "
        "match alone (medians are reported).",
    ),
    batch: int = typer.Option(2000, help="Events per round and kind."),
    seed: int = typer.Option(
        7, help="Random seed for profiles and events (same seed, same workload)."
    ),
    variants: str = typer.Option(
        "references,dynamic,marking",
        help="Single-step variants to measure (references is the default engine).",
    ),
) -> None:
    """Single-step claim: the last event of a composite costs about a primitive event."""
    from bench.composite import run
    from filters.engine import Engine

    if rounds < 2:
        raise typer.BadParameter("must be at least 2", param_hint="--rounds")
    names = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in Engine.VARIANTS]
    if unknown or not names:
        given = ", ".join(repr(v) for v in unknown) if unknown else repr(variants)
        raise typer.BadParameter(
            f"unknown variant {given} (one of {', '.join(Engine.VARIANTS)})",
            param_hint="--variants",
        )
    run(composites, primitives, rounds, batch, seed, names)


@app.command("paper")
def paper_cmd(
    out: str = typer.Option(
        _default("bench/results/paper"), help="Directory for CSV and PNG output."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="Reduced sizes: 1,000 profiles, fewer points (about a minute)."
    ),
    seed: int = typer.Option(
        7, help="Random seed for profiles and events (same seed, same workload)."
    ),
    docs_img: str = typer.Option("", help="Also copy the PNG plots here (e.g. docs/img)."),
    replot: bool = typer.Option(
        False, "--replot", help="Only redraw plots and table from OUT/paper.csv."
    ),
) -> None:
    """The CompAS experiments, single-step (every variant) vs two-step (docs/paper.md).

    Composition order, number of profiles and profile cardinality, each with unique pairs and all pairs; writes paper.csv, paper_ratios.csv and three PNG plots to OUT. The full run takes 20-30 minutes; --quick about one.
    """
    from bench import paper

    if replot:
        from pathlib import Path

        if not (Path(out) / "paper.csv").is_file():
            raise typer.BadParameter(
                f"no {Path(out) / 'paper.csv'} to replot (run without --replot first)",
                param_hint="--out",
            )
        paper.replot(out, docs_img or None)
    else:
        paper.run(out, quick, seed, docs_img or None)


@app.command("lazy")
def lazy_cmd(
    ratios: str = typer.Option("1,10,100,1000", help="Rate ratios frequent:rare, comma-separated."),
    events: int = typer.Option(60000, help="Events per configuration (about)."),
    rooms: int = typer.Option(20, help="Rooms (partitions)."),
    repeat: int = typer.Option(3, help="Timed passes per plan (CPU time); the median is reported."),
    seed: int = typer.Option(7, help="Random seed (same seed, same events)."),
    periods: str = typer.Option(
        "60,300", help="Seconds between a room's frequent readings, comma-separated."
    ),
    out: str = typer.Option(
        _default("bench/results/lazy"), help="Directory for CSV and PNG output."
    ),
    docs_img: str = typer.Option("", help="Also copy the PNG plot here (e.g. docs/img)."),
    keti: str = typer.Option(
        _default("examples/data/keti"),
        help="KETI folder for the facility-profile run ('' skips it).",
    ),
    keti_rooms: str = typer.Option("", help="KETI rooms, comma-separated (default: all)."),
    keti_limit: int = typer.Option(0, help="At most this many KETI events (0: all)."),
    profiles: str = typer.Option(
        _default("examples/facility/profiles.yaml"), help="Profiles for the KETI run."
    ),
) -> None:
    """Rare-first vs eager plans: events/s and peak state at growing rate skew, then the KETI
    feed through the facility profiles (auto and rare-first vs eager, equal output). Results:
    docs/benchmarks.md."""
    from bench.lazy import run, run_keti

    rs = _counts(ratios, "--ratios") if ratios.strip() else []
    pds = tuple(float(p) for p in _counts(periods, "--periods"))
    if events < 100:
        raise typer.BadParameter("must be at least 100", param_hint="--events")
    if rooms < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--rooms")
    if repeat < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--repeat")
    if keti:
        _need(keti, "KETI folder", "--keti", is_dir=True)
        _need(profiles, "profile file", "--profiles")
    if ratios.strip():
        run(rs, events, rooms, repeat, seed, out, docs_img or None, pds)
    if keti:
        run_keti(
            keti,
            profiles,
            [r for r in keti_rooms.split(",") if r] or None,
            keti_limit or None,
            repeat,
        )


@app.command("engines")
def engines_cmd(
    repeat: int = typer.Option(
        5, help="Runs per engine and workload, interleaved (CPU time); the median is reported."
    ),
    quick: bool = typer.Option(False, "--quick", help="Fewer events and profiles (a few minutes)."),
    seed: int = typer.Option(7, help="Random seed (same seed, same workloads)."),
    only: str = typer.Option("", help="Only the workloads whose name contains this text."),
    against: str = typer.Option(
        "",
        help="Another source tree (e.g. a git worktree of main): measure it too, as 'before', "
        "in a second worker process interleaved with this tree ('after').",
    ),
    md: str = typer.Option(
        "", help="Write the table into this Markdown file (e.g. docs/benchmarks.md)."
    ),
    png: str = typer.Option("", help="Write the ratio plot here (e.g. docs/img/engines.png)."),
    hash_seeds: int = typer.Option(
        1,
        help="Worker processes per tree, string-hash seeds 0..K-1; repeat k runs in worker "
        "k mod K (hash order moves the two-step baseline's cost).",
    ),
) -> None:
    """Single-step vs two-step on keyed, growing and paper workloads, and plain filters vs a plain loop.

    Keyed composites, growth in N keyed profiles (hot and spread keys, select first and each),
    the paper's order experiment and plain threshold filters; ratios per workload. Results:
    docs/benchmarks.md.
    """
    from pathlib import Path

    from bench.engines import run

    if repeat < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--repeat")
    if not 1 <= hash_seeds <= repeat:
        raise typer.BadParameter(
            f"must be between 1 and --repeat ({repeat})", param_hint="--hash-seeds"
        )
    if against and not (Path(against) / "filters" / "engine.py").is_file():
        raise typer.BadParameter(
            f"{against!r} is not an ENS source tree (no filters/engine.py)", param_hint="--against"
        )
    try:
        run(repeat, quick, seed, only, against, md, png, hash_seeds)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--only") from None


@app.command("alarms")
def alarms_cmd(
    matches: int = typer.Option(10_000, help="Storm: matches."),
    rooms: int = typer.Option(200, help="Storm: rooms (alarm keys)."),
    buildings: int = typer.Option(10, help="Storm: buildings (the group_by label)."),
    span: float = typer.Option(600.0, help="Storm: seconds of event time."),
    open_alarms: int = typer.Option(100_000, "--open", help="List: open alarms in ens:alarms."),
    events: int = typer.Option(
        20_000, help="Throughput: events through the engine worker, alarms off and on."
    ),
    e2e_events: int = typer.Option(
        30_000,
        help="End to end: events POSTed to `ens serve` (a subprocess) over HTTP, alarms off "
        "and on, in the same run; then the same events through the engine worker alone "
        "(CPU time) (0: skip both).",
    ),
    e2e_rounds: int = typer.Option(
        2,
        min=1,
        help="End to end: rounds, each alarms off then on; the median of the rounds' on/off "
        "ratios is reported beside the best of each mode (single rounds vary much with other "
        "jobs on the machine).",
    ),
    assets: int = typer.Option(
        10_000,
        help="Assets: registered sensors with intervals; enrichment (µs per event) and "
        "sensor-silent fault detection against ingest without a registry (0: skip).",
    ),
) -> None:
    """Alarms: a storm grouped by building (messages vs one per transition, every transition
    in history), the engine worker and `ens serve` end to end (HTTP) with alarms off and on in
    the same run (the on/off ratio), `ens alarms list --match` on many open alarms, and the
    asset registry: enrichment and sensor-silent faults of 10,000 sensors against ingest
    without a registry (docs/benchmarks.md)."""
    import json

    from bench.alarms import e2e, list_bench, storm, throughput, worker_mix

    typer.echo(json.dumps({"storm": storm(matches, rooms, buildings, span)}))
    typer.echo(json.dumps({"throughput": throughput(events)}))
    if e2e_events:
        typer.echo(json.dumps({"e2e": e2e(e2e_events, repeat=e2e_rounds)}))
        typer.echo(json.dumps({"worker_mix": worker_mix(e2e_events, repeat=3)}))
    typer.echo(json.dumps({"list": list_bench(open_alarms)}))
    if assets:
        from bench.assets import run as assets_run

        typer.echo(json.dumps({"assets": assets_run(assets)}))
