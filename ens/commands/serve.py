"""`ens serve`: its options are the fields of `ServiceSettings`, one flag each."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from adapters.service.settings import DEFAULTS, Option, ServiceSettings
from ens.commands.output import fail
from ens.commands.store import Store
from ens.options import lazy_module
from profiles.errors import ENSError

rs = lazy_module("adapters.service.redis_store")


def _serve_parameter(name: str, opt: Option) -> inspect.Parameter:
    """`ens serve`'s parameter for one setting: flags, variable, help and default from its
    declaration in `ServiceSettings`. Numbers and durations arrive as text and are checked by
    `ServiceSettings.load`, so every one fails the same way."""
    kind = opt.kind
    default: Any = opt.shown
    annotation: Any = str | None if default is None else str
    decls: tuple[str, ...] = opt.flags
    if kind == "switch":
        default = bool(getattr(DEFAULTS, name))
        annotation = bool
        if opt.switch_off:
            decls = (f"{opt.flags[0]}/{opt.switch_off}",)
    elif kind == "path":
        annotation, default = Path | None, None
    elif kind == "roles":
        annotation, default = list[str] | None, None
    info = typer.Option(*decls, envvar=opt.env, help=opt.help)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[annotation, info],
        default=default,
    )


def serve(**values: Any) -> None:
    """Run the service: HTTP API, engine worker and delivery worker, until Ctrl-C / SIGTERM."""
    from adapters.service.console import backtests, evidence
    from adapters.service.server import ServeConfig, run
    from ens.commands.backtest import console_backtest
    from ens.explain import explain

    # what the console (a layer below) runs from this one: backtests, an alarm's explain
    backtests.RUNNER = console_backtest
    evidence.EXPLAIN = explain
    from adapters.service.worker import WorkerConfig
    from ens.plans import check_plan, load_stats

    try:  # every value checked by the one settings object, naming its option
        settings = ServiceSettings.load(values, os.environ)
        check_plan(settings.plan)
        rates = load_stats(settings.stats)
        routing = None
        if settings.routing is not None:  # checked whole before anything starts
            from notifiers.routing import load_routing

            routing = load_routing(
                settings.routing, need_route=False, stored=lambda: _stored_schedules(settings)
            )
    except ENSError as e:
        raise fail(str(e)) from None
    load_index: Callable[[str], list[Any]] | None = None
    if settings.index is not None:  # the Spark adapter only with --index
        from adapters.spark import index

        load_index = index.load_index
    if settings.reset_admin_token:
        st = Store(settings.redis_url, settings.data_dir, create=True)
        token = rs.reset_admin_token(st.r)
        typer.echo(f"new admin token (shown once, keep it): {token}", err=True)
    worker = WorkerConfig.from_settings(settings, rates, load_index, routing)
    raise typer.Exit(run(ServeConfig.from_settings(settings, worker)))


def _stored_schedules(settings: ServiceSettings) -> list[str]:
    """The stored schedules' ids: receivers a routing file that lists its `subscribers` may
    name (asked only when it names one it does not define)."""
    from notifiers.schedule_store import schedule_ids

    return schedule_ids(Store(settings.redis_url, settings.data_dir, create=True).r)


_SERVE_PARAMETERS = [
    _serve_parameter(name, opt) for name, opt in ServiceSettings.options() if opt.flags
]
serve.__signature__ = inspect.Signature(_SERVE_PARAMETERS)  # type: ignore[attr-defined]
serve.__annotations__ = {p.name: p.annotation for p in _SERVE_PARAMETERS}
