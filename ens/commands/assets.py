"""`ens assets import|check|list|show|rm`: the asset registry (docs/assets.md).

Like `ens gateway`, the commands talk to the service's Redis directly; a running service
picks a change up at once (the API processes within a second, the engine worker with the
next control entry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ens.commands import output
from ens.commands.output import Json
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module
from profiles.errors import ENSError

ast = lazy_module("adapters.service.asset_store")  # redis: only when a command runs

app = typer.Typer(
    help="The asset registry: sensors and gateways -> point type, room, floor, building, time "
    "zone, expected reporting interval (enrichment and sensor-silent faults).",
    no_args_is_help=True,
)

KindOpt = Annotated[str | None, typer.Option("--kind", help="sensor or gateway (default: either).")]
NOTHING_STORED = "problems; nothing stored"  # the count line after several errors


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A registry file: .csv (header row) or .yaml.")],
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="The registry becomes the file: assets not in it are removed."
        ),
    ] = False,
    fault_severity: Annotated[
        str | None,
        typer.Option(
            help="Severity of the sensor-silent alarms (comm-fault) of these assets; default: "
            "the file's fault.severity, else major. A `severity` column wins."
        ),
    ] = None,
    fault_subscriber: Annotated[
        str | None,
        typer.Option(help="Subscriber of those alarms; default: the file's fault.subscriber."),
    ] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Check a registry file whole and store it (all or nothing).

    Every asset with an interval gets a sensor-silent fault profile (docs/assets.md)."""
    from adapters.service.assets import read_registry
    from profiles.alarm import SEVERITIES

    if fault_severity is not None and fault_severity not in SEVERITIES:
        raise output.fail(f"--fault-severity {fault_severity!r}: one of {', '.join(SEVERITIES)}")
    try:
        reg = read_registry(file)
    except ENSError as exc:
        raise output.fail_all(exc, NOTHING_STORED) from None
    st = Store(redis_url, data_dir, create=True)
    try:
        res = ast.import_registry(
            st.r, reg, replace=replace, severity=fault_severity, subscriber=fault_subscriber
        )
    except ENSError as exc:
        raise output.fail_all(exc, NOTHING_STORED) from None
    typer.echo(
        f"{file}: {len(reg.assets)} assets: {res.added} added, {res.changed} changed, "
        f"{res.unchanged} unchanged, {res.removed} removed; {res.faults} with a sensor-silent "
        f"fault ({res.profiles_written} fault profiles written, {res.profiles_deleted} deleted)"
    )


@app.command("check")
def check_cmd(
    file: Annotated[Path, typer.Argument(help="A registry file: .csv (header row) or .yaml.")],
) -> None:
    """Check a registry file as `import` does, without a service: every problem with its line."""
    from adapters.service.assets import read_registry

    try:
        reg = read_registry(file)
    except ENSError as exc:
        raise output.fail_all(exc, NOTHING_STORED) from None
    faults = sum(1 for a in reg.assets if a.interval is not None)
    typer.echo(f"{file}: {len(reg.assets)} assets, {faults} with an expected interval")


@app.command("list")
def list_cmd(
    kind: KindOpt = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Every registered asset."""
    st = Store(redis_url, data_dir)
    rows = [a for a in ast.list_assets(st.r) if kind is None or a.get("kind") == kind]
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"Assets ({len(rows)})")
    cols = ("id", "kind", "point", "room", "floor", "building", "tz", "interval", "fault")
    for col in cols:
        table.add_column(col)
    for a in rows:
        fault = a.get("fault") or {}
        sev = a.get("severity") or fault.get("severity", "")
        table.add_row(
            *(str(a.get(c) or "") for c in cols[:7]),
            f"{a['interval']:g} s" if a.get("interval") is not None else "",
            sev if a.get("interval") is not None else "",
        )
    output.console().print(table)


@app.command("show")
def show_cmd(
    asset_id: Annotated[str, typer.Argument(metavar="ID", help="A sensor's or gateway's id.")],
    kind: KindOpt = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """One asset (JSON), with the id of its fault profile."""
    st = Store(redis_url, data_dir)
    found = ast.get_asset(st.r, asset_id, kind)
    if not found:
        raise output.fail(f"no asset {asset_id!r}")
    output.print_json(found)


@app.command("rm")
def rm_cmd(
    asset_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Asset ids.")],
    kind: Annotated[str, typer.Option("--kind", help="sensor or gateway.")] = "sensor",
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove assets and their fault profiles (their open alarms stay until cleared)."""
    st = Store(redis_url, data_dir)
    missing = [a for a in asset_ids if not ast.get_asset(st.r, a, kind)]
    if missing:
        raise output.fail(f"no {kind} {', '.join(map(repr, missing))} (nothing removed)")
    res = ast.remove_assets(st.r, [ast.key(kind, a) for a in asset_ids])
    typer.echo(f"{res.removed} removed ({res.profiles_deleted} fault profiles deleted)")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="assets")
