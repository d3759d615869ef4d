"""`ens bench …`: benchmarks (figures, not tests)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks: print figures and compare against a baseline measured in the same run.", no_args_is_help=True)


@app.command("pool")
def pool_cmd(
    sizes: str = typer.Option("1000,10000,100000,1000000", help="Profile counts, comma-separated."),
    events: int = typer.Option(20000, help="Events per measurement."),
    naive_max: int = typer.Option(100000, help="Skip naive evaluation above this many profiles (it is linear)."),
    out: str = typer.Option("bench/results", help="Directory for CSV and PNG output."),
    seed: int = typer.Option(7),
) -> None:
    """Primitive pool: events/s and µs/event at growing profile counts vs naive evaluation."""
    from bench.pool import run

    run([int(s) for s in sizes.split(",")], events, naive_max, out, seed)
