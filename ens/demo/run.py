"""The run: start everything, load profiles and subscribers over the admin API, post the feed
like a gateway, wait for the deliveries, compare, summarize, stop."""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ens.demo.comparison import compare_with_replay, count_incidents
from ens.demo.config import (
    FACILITY_PROFILES,
    GATEWAY,
    HOST,
    DemoConfig,
    DemoResult,
    Feed,
    load_feed,
    load_profiles,
)
from ens.demo.display import Display, OutboxWatcher, print_summary
from ens.demo.processes import Service, running
from ens.demo.sinks import MailSink, WebhookSink, check_port, free_port
from ens.errors import DemoError, DemoFailure
from ens.summary import summary_rows

# ----------------------------------------------------------------------------- the run


def _api(client: httpx.Client, method: str, path: str, token: str, body: Any = None) -> Any:
    resp = client.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
    if resp.status_code >= 400:
        try:
            msg = resp.json().get("error", resp.text)
        except ValueError:
            msg = resp.text
        raise DemoError(f"{method} {path}: HTTP {resp.status_code}: {msg}")
    return resp.json() if resp.content else None


def _subscribers(pset: Any, sink: WebhookSink) -> tuple[list[dict[str, Any]], bool]:
    """The file's subscribers with webhooks pointing at the sink, a fresh secret each, no digest.

    Digest windows are wall-clock time, which does not fit days replayed in seconds.
    """
    out, dropped_digest = [], False
    for sub in pset.subscribers:
        chans = []
        for i, ch in enumerate(sub.get("channels", [])):
            dropped_digest |= "digest" in ch
            if "webhook" in ch:
                chans.append({"webhook": sink.url(sub["id"], i)})
            else:
                chans.append({"email": ch["email"]})
        dropped_digest |= "digest" in sub
        rec = {k: v for k, v in sub.items() if k not in ("channels", "digest", "secret")}
        secret = secrets.token_urlsafe(32)
        sink.secrets[sub["id"]] = secret
        out.append({**rec, "channels": chans, "secret": secret})
    return out, dropped_digest


def _delivery_done(r: Any) -> bool:
    """True once every outbox entry was read and acknowledged, with nothing scheduled."""
    import redis

    from notifiers import store

    last = r.xrevrange(store.OUTBOX, count=1)
    if not last:
        return True
    try:
        groups = {g["name"]: g for g in r.xinfo_groups(store.OUTBOX)}
    except redis.ResponseError:
        return False
    g = groups.get(store.GROUP)
    return bool(
        g
        and g["pending"] == 0
        and g["last-delivered-id"] == last[0][0]
        and r.zcard(store.RETRY) == 0
        and r.zcard(store.DIGESTS) == 0
    )


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (in the main thread), so the clean-up runs for it too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> DemoResult:
    """Run the demo; raises DemoError (user error) or DemoFailure. Stops everything it started.

    With ``keep_running`` the summary is printed before the wait, and the result is returned
    after Ctrl-C / SIGTERM.
    """
    with _sigterm_interrupts():
        return _run(cfg, console)


def _run(cfg: DemoConfig, console: Console | None) -> DemoResult:
    console = console or Console()
    t_start = time.perf_counter()
    feed = load_feed(cfg)
    pset = load_profiles(cfg.profiles or feed.profiles)
    if cfg.port:
        check_port(cfg.port)
    port = cfg.port or free_port()
    console.print(
        f"[bold]ENS demo[/]: {len(feed.events)} events ({feed.name}), "
        f"{len(pset.profiles)} profiles from {cfg.profiles or feed.profiles}"
    )

    display = Display(console, cfg.show)
    mail_sink = MailSink(display.mail)
    hook_sink = WebhookSink(display.webhook)
    data_dir = Path(tempfile.mkdtemp(prefix="ens-demo-"))
    service = Service(
        data_dir,
        port,
        cfg.reorder_seconds,
        {
            "ENS_SMTP_HOST": HOST,
            "ENS_SMTP_PORT": str(mail_sink.port),
            "ENS_SMTP_SECURITY": "none",
            "ENS_SMTP_FROM": "ENS demo <ens-demo@localhost>",
            "ENS_WORKER_POLL": "0.2",
            "ENS_WORKER_NAME": "ens-demo",
            "ENS_ENGINE_NAME": "ens-demo",
            "ENS_RETRY_BASE": "0.2",
        },
    )
    watcher: OutboxWatcher | None = None
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, data_dir, True)
        mail_sink.start()
        stack.callback(mail_sink.stop)
        hook_sink.start()
        stack.callback(hook_sink.stop)
        try:
            console.print(f"starting the service on {service.url} (embedded Redis in {data_dir})")
            service.start()
            console.print(
                f"  mail sink on {HOST}:{mail_sink.port}, webhook sink on "
                f"http://{HOST}:{hook_sink.port}/hook/<subscriber>/<channel>"
            )
            r = service.redis()
            subs, key = _load(console, service, pset, hook_sink, r)
            watcher = OutboxWatcher(service.redis(), display.notification)
            watcher.start()
            post_seconds = _post_and_wait(cfg, feed, key, r, service, display, watcher)
            outbox = list(watcher.records)
            result = _result(cfg, feed, pset.profiles, subs, outbox, mail_sink, hook_sink, r)
            result.post_seconds = post_seconds
            result.total_seconds = time.perf_counter() - t_start
            if cfg.keep_running:
                print_summary(console, result)
                _keep_running(console, service, key, hook_sink, mail_sink, display)
        except KeyboardInterrupt:
            console.print("interrupted; stopping")
            raise
        finally:
            if watcher is not None:
                watcher.stop()
            status = service.stop()
    result.service_status = status
    result.data_dir = str(data_dir)
    result.pids = service.pids()
    result.leftovers = [p for p in result.pids if running(p)]
    if not cfg.keep_running:
        result.total_seconds = time.perf_counter() - t_start
    return result


def _load(
    console: Console, service: Service, pset: Any, sink: WebhookSink, r: Any
) -> tuple[list[dict[str, Any]], str]:
    """Subscribers, then profiles, over the admin API (as an operator would); a gateway key."""
    from adapters.service import redis_store as rs

    subs, dropped = _subscribers(pset, sink)
    with httpx.Client(base_url=service.url, timeout=30, trust_env=False) as client:
        for sub in subs:
            _api(client, "POST", "/v1/subscribers", service.admin_token, sub)
        for p in pset.profiles:
            _api(
                client,
                "POST",
                "/v1/profiles",
                service.admin_token,
                {"id": p.id, "expr": p.source, "subscriber": p.subscriber},
            )
    if dropped:
        console.print(
            "[yellow]note:[/] e-mail digests are off in the demo (their windows are "
            "wall-clock time)"
        )
    key = rs.add_gateway(r, GATEWAY)  # no HTTP endpoint for gateways: `ens gateway add` does this
    console.print(
        f"  {len(subs)} subscribers and {len(pset.profiles)} profiles loaded over the "
        f"admin API; gateway {GATEWAY!r} created"
    )
    return subs, key


def _result(
    cfg: DemoConfig,
    feed: Feed,
    profiles: list[Any],
    subs: list[dict[str, Any]],
    outbox: list[dict[str, Any]],
    mails: MailSink,
    hooks: WebhookSink,
    r: Any,
) -> DemoResult:
    from notifiers import store

    replay_count, match = compare_with_replay(profiles, feed.parsed, outbox)
    truth = feed.truth if (cfg.profiles or feed.profiles) == FACILITY_PROFILES else None
    by_sub = {s["id"]: s for s in subs}
    mails_expected = webhooks_expected = 0
    for n in outbox:
        chans = by_sub.get(n.get("subscriber") or "", {}).get("channels", [])
        mails_expected += sum("email" in c for c in chans)
        webhooks_expected += sum("webhook" in c for c in chans)
    return DemoResult(
        feed=feed.name,
        events=len(feed.events),
        rows=summary_rows(profiles, outbox),
        notifications=len(outbox),
        replay_notifications=replay_count,
        replay_match=match,
        mails=len(mails.received),
        mails_expected=mails_expected,
        webhooks_valid=len(hooks.keys),
        webhooks_invalid=hooks.invalid,
        webhooks_expected=webhooks_expected,
        dead_letters=int(r.xlen(store.DEADLETTER)),
        incidents=None if truth is None else len(truth),
        incidents_found=0 if truth is None else count_incidents(truth, outbox),
    )


def _post_and_wait(
    cfg: DemoConfig,
    feed: Feed,
    key: str,
    r: Any,
    service: Service,
    display: Display,
    watcher: OutboxWatcher,
) -> float:
    """Post the feed in batches (progress bar), then wait for the engine and the deliveries."""
    from adapters.service import redis_store as rs

    total = len(feed.events)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-ndjson"}

    def processed() -> int:
        st = rs.worker_status(r)
        return int(st["stats"].get("total_events", 0)) if st else 0

    def check_alive() -> None:
        if service.proc is not None and service.proc.poll() is not None:
            raise DemoFailure(
                f"the service exited with status {service.proc.returncode}:\n" + service.log_tail()
            )
        if watcher.error is not None:
            raise DemoFailure(f"reading the outbox failed: {watcher.error}")

    client = httpx.Client(base_url=service.url, timeout=30, trust_env=False)
    with display.progress as progress, client:
        post = progress.add_task("posting events", total=total, n=0, m=0, w=0)
        engine = progress.add_task("engine (event clock)", total=total, n=0, m=0, w=0)
        display.tasks = {"post": post, "engine": engine}
        t0 = time.perf_counter()
        for i in range(0, total, cfg.batch):
            chunk = feed.events[i : i + cfg.batch]
            body = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in chunk)
            try:
                resp = client.post("/v1/events", content=body.encode(), headers=headers)
            except httpx.HTTPError as exc:
                check_alive()
                raise DemoFailure(f"posting events failed: {exc}") from None
            if resp.status_code != 202:
                raise DemoFailure(f"POST /v1/events: HTTP {resp.status_code}: {resp.text[:300]}")
            progress.update(post, advance=len(chunk))
            progress.update(engine, completed=processed())
        post_seconds = time.perf_counter() - t0
        progress.update(post, description="posted")
        last, moved = None, time.monotonic()
        while True:
            check_alive()
            done_events = processed()
            st = rs.worker_status(r) or {"stats": {}}
            engine_done = (
                done_events >= total
                and not st["stats"].get("buffered")
                and not st["stats"].get("pending_notifications")
            )
            progress.update(engine, completed=done_events)
            if engine_done and _delivery_done(r):
                break
            state = (done_events, len(watcher.records), sum(display.counts.values()))
            if state != last:
                last, moved = state, time.monotonic()
            elif time.monotonic() - moved > cfg.stall_timeout:
                what = "deliveries" if done_events >= total else "the engine"
                raise DemoFailure(
                    f"no progress for {cfg.stall_timeout:g} s, waiting for {what} "
                    f"({done_events}/{total} events processed, "
                    f"{len(watcher.records)} notifications)"
                )
            time.sleep(0.2)
        progress.update(engine, description="engine done")
        time.sleep(0.1)  # let the outbox watcher print the last records
        display.refresh()
    return post_seconds


def _keep_running(
    console: Console,
    service: Service,
    key: str,
    hooks: WebhookSink,
    mails: MailSink,
    display: Display,
) -> None:
    """Print how to reach everything, then wait for Ctrl-C or SIGTERM."""
    display.show = 10**9
    console.print()
    console.print(f"[bold]ENS keeps running[/] at {service.url}  (API docs: {service.url}/docs)")
    console.print(f"  admin token:  {service.admin_token}")
    console.print(f"  gateway key:  {key}")
    console.print(
        f"  data dir:     {service.data_dir}  (e.g. ens profile list --data-dir {service.data_dir})"
    )
    console.print(f"  service log:  {service.log_path}")
    console.print(
        f"  mail sink:    {HOST}:{mails.port};  webhook sink: "
        f"http://{HOST}:{hooks.port}/hook/<subscriber>/<channel>"
    )
    console.print(
        f"  try: curl -H 'Authorization: Bearer {key}' -d "
        f'\'{{"ts": {int(time.time())}, "kind": "temperature", "value": 35}}\' '
        f"{service.url}/v1/events"
    )
    console.print("Ctrl-C stops everything.")
    try:
        while service.proc is not None and service.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:  # also SIGTERM, see `_sigterm_interrupts`
        return
    raise DemoFailure(f"the service exited:\n{service.log_tail()}")
