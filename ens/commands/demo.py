"""`ens demo`: run the main job on embedded defaults (mounted with ``app.command("demo")``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def demo(
    profiles: Annotated[
        Path | None,
        typer.Option(
            help="Profile file with subscribers (default: the example for the feed: "
            "facility, quickstart with --events, facility-spark with --dataset)."
        ),
    ] = None,
    events: Annotated[
        Path | None, typer.Option(help="JSON-lines event file to post (not the synthetic feed).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="Post a real data set instead (e.g. keti; see ens data).")
    ] = None,
    dataset_path: Annotated[
        Path | None, typer.Option(help="Where the data set lives (default: examples/data/NAME).")
    ] = None,
    days: Annotated[float, typer.Option(help="Days of the synthetic feed or data set.")] = 2.0,
    buildings: Annotated[int, typer.Option(help="Buildings of the synthetic feed.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic feed.")] = 1,
    port: Annotated[int, typer.Option(help="HTTP port of the service (0: a free one).")] = 0,
    batch: Annotated[int, typer.Option(min=1, help="Events per POST.")] = 500,
    reorder_seconds: Annotated[
        float, typer.Option(help="The service's reorder window (event time and wall time).")
    ] = 0.5,
    show: Annotated[
        int, typer.Option(min=0, help="Print the first N notifications and deliveries.")
    ] = 15,
    keep_running: Annotated[
        bool,
        typer.Option("--keep-running", help="Keep the service up afterwards (Ctrl-C stops it)."),
    ] = False,
) -> None:
    """Start ENS on embedded defaults with a mail and a webhook sink, stream a feed, summarise.

    Everything runs on loopback in a temporary directory and is stopped at the end.
    """
    from rich.console import Console

    from ens.demo import DemoConfig, DemoError, DemoFailure, print_summary, run_demo

    cfg = DemoConfig(
        profiles=profiles,
        events=events,
        dataset=dataset,
        dataset_path=dataset_path,
        days=days,
        buildings=buildings,
        seed=seed,
        port=port,
        batch=batch,
        reorder_seconds=reorder_seconds,
        show=show,
        keep_running=keep_running,
    )
    console = Console()
    if not console.is_terminal:  # logs and CI: do not wrap at 80 columns
        console = Console(width=max(console.width, 110))
    try:
        result = run_demo(cfg, console)
    except DemoError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except DemoFailure as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if keep_running:
        console.print(
            f"stopped: service exit status {result.service_status}, "
            f"{len(result.leftovers)} of {len(result.pids)} processes left running"
        )
    else:
        print_summary(console, result)
    if not result.ok:
        typer.echo("error: the demo's checks failed (see the table above)", err=True)
        raise typer.Exit(1)
