"""`ens notifications tail`: the outbox as JSON lines (joins the notifier team's group)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import lazy_module

store = lazy_module("notifiers.store")


def tail(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new ones.")] = False,
    last: Annotated[int | None, typer.Option(help="Start with only the last N.")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print outbox notifications as JSON lines (oldest first)."""
    st = Store(redis_url, data_dir)
    r = st.r
    if last is not None:
        entries = list(reversed(r.xrevrange(store.OUTBOX, count=last))) if last > 0 else []
    else:
        entries = r.xrange(store.OUTBOX)
    cursor = "0-0"
    if not entries:
        top = r.xrevrange(store.OUTBOX, count=1)
        cursor = top[0][0] if top else "0-0"
    try:
        while True:
            for eid, fields in entries:
                typer.echo(fields.get(store.OUTBOX_FIELD, json.dumps(fields)))
                cursor = eid
            if not follow:
                break
            resp = r.xread({store.OUTBOX: cursor}, block=1000)
            entries = resp[0][1] if resp else []
    except KeyboardInterrupt:
        pass
