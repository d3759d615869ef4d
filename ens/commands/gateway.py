"""`ens gateway add | set | list | revoke`: API keys and lateness (rules in
`adapters.service.admin`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ens.commands import output
from ens.commands.output import Json, fail, when
from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module

rs = lazy_module("adapters.service.redis_store")


gateway_app = typer.Typer(help="Manage gateway API keys.", no_args_is_help=True)


Lateness = Annotated[
    str | None,
    typer.Option(
        help="How far out of ts order its events may arrive: 0 (in order: no wait), "
        "500ms, 2s, ... or `default` (the service's --default-lateness)."
    ),
]


def _lateness(text: str | None) -> float | None:
    from adapters.errors import Refused
    from adapters.service import admin

    try:
        return admin.parse_lateness(text)
    except Refused as exc:
        raise fail(str(exc)) from None


@gateway_app.command("add")
def gateway_add(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    lateness: Lateness = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Create a gateway and print its API key (once: only a hash is stored)."""
    from adapters.errors import Refused
    from adapters.service import admin

    late = _lateness(lateness)
    try:
        rs.check_gateway_name(name)  # before a store is created for it
        key = admin.add_gateway(Store(redis_url, data_dir, create=True).r, name, late)
    except (Refused, ValueError) as exc:
        raise fail(str(exc)) from None
    typer.echo(f"gateway {name} created; its API key (shown once):", err=True)
    typer.echo(key)


@gateway_app.command("set")
def gateway_set(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    lateness: Lateness = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Change a gateway's settings; a running service applies them at once."""
    from adapters.errors import Refused
    from adapters.service import admin

    if lateness is None:
        raise fail("nothing to set (give --lateness)")
    late = _lateness(lateness)
    try:
        admin.set_gateway(Store(redis_url, data_dir).r, name, late)
    except Refused as exc:
        raise fail(str(exc)) from None
    typer.echo(f"gateway {name}: lateness {'default' if late is None else f'{late:g} s'}")


@gateway_app.command("list")
def gateway_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Show gateways (names, creation, revocation)."""
    st = Store(redis_url, data_dir)
    gws = rs.list_gateways(st.r)
    if as_json:
        output.print_json(gws)
        return
    from rich.table import Table

    table = Table(title=f"Gateways ({len(gws)})")
    for col in ("name", "created", "status", "lateness"):
        table.add_column(col)
    for g in gws:
        status = f"revoked {when(g['revoked'])}" if g["revoked"] else "active"
        late = "default" if g["lateness"] is None else f"{g['lateness']:g} s"
        table.add_row(g["name"], when(g["created"]), status, late)
    output.console().print(table)


@gateway_app.command("revoke")
def gateway_revoke(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a gateway's API key (its requests get 403 from now on)."""
    from adapters.errors import Refused
    from adapters.service import admin

    try:
        admin.revoke_gateway(Store(redis_url, data_dir).r, name)
    except Refused as exc:
        raise fail(str(exc)) from None
    typer.echo(f"gateway {name} revoked")
