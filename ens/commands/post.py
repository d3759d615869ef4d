"""`ens post`: send an event file to the service like a gateway; the retrying client is
`adapters.service.client`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ens.commands.output import fail
from ens.options import parse_duration
from profiles.errors import ENSError

_Url = Annotated[str, typer.Option(envvar="ENS_URL", help="Service base URL.")]
_ApiKey = Annotated[
    str | None, typer.Option(envvar="ENS_API_KEY", help="Gateway API key (ens gateway add).")
]
_Retries = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Most retries of a request that nothing accepted "
        "(service down or restarting: connection refused, "
        "503, 429) [default: as many as --retry-for allows].",
    ),
]
_RetryFor = Annotated[
    str,
    typer.Option(
        help="Keep retrying such a request for up to this long (backoff with "
        "jitter, at least the service's Retry-After), e.g. 30s, 5m, 1h."
    ),
]
_Now = Annotated[
    bool,
    typer.Option(
        "--now",
        help="Re-stamp the events so that the last one is now, "
        "keeping their spacing (for example files from the past, "
        "which the service's --max-past refuses).",
    ),
]


def post(
    file: Annotated[str, typer.Argument(help="JSON-lines event file, '-' for stdin.")],
    url: _Url = "http://127.0.0.1:8080",
    api_key: _ApiKey = None,
    batch: Annotated[int, typer.Option(min=1, help="Events per request.")] = 500,
    timeout: Annotated[str, typer.Option(help="HTTP timeout (e.g. 30s).")] = "30s",
    retries: _Retries = None,
    retry_for: _RetryFor = "5m",
    now: _Now = False,
) -> None:
    """Send events to the service like a gateway; report rejected events by line number.

    A request is retried only when the service surely accepted none of it (the connection
    was refused, or it answered 503/429), so a retry never posts an event twice.
    """
    try:
        http_timeout = parse_duration("--timeout", timeout, above=True, maximum=86400.0)
        patience = parse_duration("--retry-for", retry_for, maximum=7 * 86400.0)
    except ENSError as e:
        raise fail(str(e)) from None
    assert http_timeout is not None and patience is not None
    import httpx

    from adapters.errors import PostFailed
    from adapters.service import client as cl

    if not api_key:
        raise fail("give --api-key or set ENS_API_KEY")
    try:
        url = cl.service_url(url)
    except ValueError as exc:
        raise fail(f"--url {url!r}: {exc}") from None
    fh, total = _open_events(file, now)
    accepted = rejected = 0
    progress = _progress()

    def say(line: str) -> None:  # one line per retry, whatever the reason's length; the
        # service's reason is text, not rich markup
        progress.console.print(line, soft_wrap=True, markup=False, highlight=False)

    t0 = time.perf_counter()
    with fh, httpx.Client(timeout=http_timeout) as client, progress:
        poster = cl.EventPoster(client, url, api_key, patience, retries, say, retry_for)
        task = progress.add_task("post", total=total, rejected=0)
        try:
            for chunk in cl.batches(fh, batch):
                a, rj = poster.send(chunk)
                accepted += a
                rejected += rj
                progress.update(task, advance=len(chunk), rejected=rejected)
        except PostFailed as exc:
            raise fail(str(exc), exc.exit_status) from None
    for lineno, msg in sorted(poster.problems):
        typer.echo(f"error: line {lineno}: {msg}", err=True)
    dt = time.perf_counter() - t0
    waited = poster.waited
    wait_note = f" ({waited:.1f} s of it waiting for the service)" if waited else ""
    typer.echo(f"{accepted} accepted, {rejected} rejected in {dt:.2f} s{wait_note}")
    if rejected:
        raise typer.Exit(2)


def _open_events(file: str, now: bool) -> tuple[Any, int | None]:
    """The event lines to send (re-stamped with ``--now``) and how many, when known."""
    from adapters.service import client as cl

    if file == "-":
        fh: Any = sys.stdin
        total = None
    else:
        path = Path(file)
        if not path.exists():
            raise fail(f"no such file: {file}")
        total = sum(1 for line in path.open(encoding="utf-8") if line.strip())
        fh = path.open(encoding="utf-8")
    if now:
        import io

        with fh:
            fh = io.StringIO("".join(cl.restamp(list(fh), time.time())))
    return fh, total


def _progress() -> Any:
    """The progress bar on stderr; a pipe or a log file gets none."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("posting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rejected]} rejected"),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )
