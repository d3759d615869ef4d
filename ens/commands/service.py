"""Mounts `ens serve | profile | subscriber | gateway | post` and `ens notifications tail`.

One module per command group (`serve`, `profile`, `subscriber`, `gateway`, `post`, `tail`);
this one only adds them to a CLI with ``register(app)``, for `ens` and ``python -m ens.service``.
The management commands talk to Redis directly (``--redis-url`` / ``ENS_REDIS_URL``, else the
embedded Redis of ``--data-dir``), so they work whether the service is running or not; a running
service picks profile changes up at once. Only ``post`` goes through HTTP, like a gateway.
"""

from __future__ import annotations

from typing import Any

import typer

from ens.commands.gateway import gateway_app
from ens.commands.post import post
from ens.commands.profile import profile_app
from ens.commands.serve import serve
from ens.commands.subscriber import subscriber_app
from ens.commands.tail import tail


def retry_delay(attempt: int, retry_after: float | None, rng: Any = None) -> float:
    """`ens post`'s wait before a retry (`adapters.service.client.retry_delay`)."""
    from adapters.service.client import retry_delay as delay

    return delay(attempt, retry_after, rng)


def restamp(lines: list[str], now: float) -> list[str]:
    """`adapters.service.client.restamp` (``--now``)."""
    from adapters.service.client import restamp as shifted

    return shifted(lines, now)


def register(app: typer.Typer) -> None:
    """Add `serve`, `post`, `profile`, `subscriber`, `gateway` and `notifications tail`.

    ``tail`` joins the notifier team's ``notifications`` app (mounted here if it is not yet),
    since one CLI cannot have two groups of that name.
    """
    from ens.commands import notifications as notifier_cli

    app.command("serve")(serve)
    app.command("post")(post)
    app.add_typer(profile_app, name="profile")
    app.add_typer(subscriber_app, name="subscriber")
    app.add_typer(gateway_app, name="gateway")
    napp = notifier_cli.app
    if not any(c.name == "tail" for c in napp.registered_commands):
        napp.command("tail")(tail)
    if not any(g.name == "notifications" for g in app.registered_groups):
        app.add_typer(napp, name="notifications")
