"""`ens serve | profile | subscriber | gateway | post` and `ens notifications tail`.

Mounted by the main CLI with ``register(app)``. The management commands talk to Redis directly
(``--redis-url`` / ``ENS_REDIS_URL``, else the embedded Redis of ``--data-dir``), so they work
whether the service is running or not; a running service picks profile changes up at once.
Only ``post`` goes through HTTP, like a gateway.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ens.commands.store import DataDir, RedisUrl, Store
from ens.options import PLAN_HELP, STATS_HELP, check_tz, lazy_module
from profiles.errors import ENSError, ProfileError

if TYPE_CHECKING:
    from rich.console import Console

# Loaded when a command uses them, not when `ens` starts (redis alone took ~0.2 s).
rs = lazy_module("adapters.service.redis_store")
store = lazy_module("notifiers.store")

profile_app = typer.Typer(help="Manage the service's profiles.", no_args_is_help=True)
subscriber_app = typer.Typer(help="Manage subscribers (e-mail, webhooks).", no_args_is_help=True)
gateway_app = typer.Typer(help="Manage gateway API keys.", no_args_is_help=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _console() -> Console:
    from rich.console import Console  # rich is loaded by the commands that print with it

    return Console(soft_wrap=False)


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


# ----------------------------------------------------------------------------- serve


def _duration_option(flag: str, value: str) -> float | None:
    """A duration flag (30s, 5m, 30d, or seconds) as seconds; 'off' is None (no limit)."""
    from profiles.parser import parse_duration

    text = value.strip().lower()
    if text in ("off", "none"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise _fail(f"{flag} {value!r}: expected a duration such as 30s, 5m, 30d, "
                        "or 'off'") from None
    if seconds <= 0:
        raise _fail(f"{flag} {value!r}: must be above 0 (or 'off')")
    return seconds


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 8080,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    reorder_seconds: Annotated[
        float,
        typer.Option(
            "--default-lateness", "--reorder-seconds",
            help="Lateness (s) of gateways without their own (`ens gateway set --lateness`): "
                 "how far out of ts order their events may arrive; also how far the wall clock "
                 "of timers trails.",
        ),
    ] = 2.0,
    idle_timeout: Annotated[
        float, typer.Option(help="A gateway silent this long (s) no longer holds events back.")
    ] = 0.5,
    reorder_max_events: Annotated[
        int, typer.Option(help="Release the oldest held events beyond this many.")
    ] = 10_000,
    clock: Annotated[
        str, typer.Option(help="wall: timers fire by wall clock; event: only by event time.")
    ] = "wall",
    tz: Annotated[str, typer.Option(help="Time zone of clock(...) events.")] = "UTC",
    max_body: Annotated[int, typer.Option(help="Largest POST body in bytes (413 above).")] = 1
    << 20,
    deliver: Annotated[
        bool, typer.Option(help="Also run the notifier delivery worker (webhooks, e-mail).")
    ] = True,
    role: Annotated[
        list[str] | None,
        typer.Option(help="Run only these parts here: api, engine, deliver (repeat or comma "
                          "list; default all three). Run the others as their own processes."),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(help="builtin: the engine worker runs in this service; spark: it does "
                          "not (`ens spark stream` owns detection; API and delivery as usual)."),
    ] = "builtin",
    no_engine: Annotated[
        bool, typer.Option("--no-engine", help="Same as --engine spark.")
    ] = False,
    api_workers: Annotated[
        int, typer.Option(help="API processes accepting on the one port (forked; the engine "
                               "worker stays single).")
    ] = 1,
    max_backlog: Annotated[
        int, typer.Option(help="POST /v1/events answers 429 (Retry-After) while more events than "
                               "this wait for the engine; 0: no bound.")
    ] = 200_000,
    worker_name: Annotated[
        str | None,
        typer.Option(envvar="ENS_ENGINE_NAME", help="Engine consumer name (keep it stable)."),
    ] = None,
    snapshot_interval: Annotated[
        float, typer.Option(help="Snapshot the engine state this often (s); bounds recovery.")
    ] = 30.0,
    status_interval: Annotated[float, typer.Option(help="Log a summary this often (s).")] = 10.0,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ...")] = "INFO",
    reset_admin_token: Annotated[
        bool,
        typer.Option("--reset-admin-token", help="Issue a new admin token (printed once) first."),
    ] = False,
    index: Annotated[
        Path | None,
        typer.Option(help="An `ens spark index` snapshot: its profiles are imported (ids not stored "
                          "yet) and activated without parsing."),
    ] = None,
    max_future: Annotated[
        str, typer.Option(help="Reject events whose ts is further ahead of the wall clock "
                               "(e.g. 30s, 5m; 'off': no bound).")
    ] = "5m",
    max_past: Annotated[
        str, typer.Option(help="Reject events whose ts is further behind the wall clock "
                               "(e.g. 30d; 'off' for backfills of old data).")
    ] = "30d",
    body_timeout: Annotated[
        str, typer.Option(help="Answer 408 to a request whose body is not received within "
                               "this time (e.g. 10s; 'off': wait for ever).")
    ] = "10s",
    plan: Annotated[
        str, typer.Option(help=PLAN_HELP + " A restored snapshot is converted to it.")
    ] = "eager",
    stats: Annotated[Path | None, typer.Option(help=STATS_HELP)] = None,
    replan_every: Annotated[
        int, typer.Option(help="--plan auto: count component rates online (1 event in 8) and re-plan "
                               "every N events (0: never; the plan of --stats stays).")
    ] = 0,
    drift: Annotated[
        float, typer.Option(help="--replan-every: re-plan a profile when a component's rate moved by "
                                 "this factor since its plan was chosen.")
    ] = 4.0,
) -> None:
    """Run the service: HTTP API, engine worker and delivery worker, until Ctrl-C / SIGTERM."""
    from adapters.service.api import IngestLimits
    from adapters.service.server import ROLES, ServeConfig, run
    from adapters.service.worker import WorkerConfig

    if reorder_seconds < 0:  # engine time would run ahead of the wall clock
        raise _fail(f"--default-lateness (--reorder-seconds) must be >= 0, not {reorder_seconds:g}")
    if idle_timeout < 0:
        raise _fail(f"--idle-timeout must be >= 0, not {idle_timeout:g}")
    if clock not in ("wall", "event"):
        raise _fail(f"--clock must be wall or event, not {clock!r}")
    roles = tuple(dict.fromkeys(x.strip() for r in (role or ROLES) for x in r.split(",") if x.strip()))
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise _fail(f"--role {', '.join(bad) or '(empty)'}: expected api, engine or deliver")
    if engine not in ("builtin", "spark"):
        raise _fail(f"--engine must be builtin or spark, not {engine!r}")
    if engine == "spark" or no_engine:  # detection runs elsewhere: keep the other parts only
        roles = tuple(r for r in roles if r != "engine")
        if not roles:
            raise _fail("--engine spark leaves nothing to run here (--role engine only)")
    if api_workers < 1:
        raise _fail(f"--api-workers must be at least 1, not {api_workers}")
    if max_backlog < 0:
        raise _fail(f"--max-backlog must be 0 (no bound) or more, not {max_backlog}")
    try:
        check_tz(tz)
        from ens.plans import check_plan, load_stats

        check_plan(plan)
        rates = load_stats(stats)
        if replan_every < 0 or drift < 1.0:
            raise ENSError(f"--replan-every must be >= 0 and --drift >= 1 (got {replan_every}, {drift:g})")
    except ENSError as e:
        raise _fail(str(e)) from None
    limits = IngestLimits(
        max_future=_duration_option("--max-future", max_future),
        max_past=_duration_option("--max-past", max_past),
        body_timeout=_duration_option("--body-timeout", body_timeout),
    )
    wcfg = WorkerConfig(
        reorder_seconds=reorder_seconds, reorder_max_events=reorder_max_events, clock=clock,
        idle_timeout=idle_timeout,
        tz=tz, snapshot_interval=snapshot_interval, status_interval=status_interval,
        plan=plan, rates=rates, replan_every=replan_every, drift=drift,
    )
    if worker_name:
        wcfg.name = worker_name
    if index is not None:
        if not (index / "manifest.json").is_file():
            raise _fail(f"--index {index}: not an `ens spark index` snapshot (no manifest.json)")
        wcfg.index = str(index)
    if reset_admin_token:
        st = Store(redis_url, data_dir)
        token = rs.reset_admin_token(st.r)
        typer.echo(f"new admin token (shown once, keep it): {token}", err=True)
    cfg = ServeConfig(
        host=host, port=port, redis_url=redis_url, data_dir=data_dir, max_body=max_body,
        deliver=deliver, log_level=log_level, worker=wcfg, limits=limits, roles=roles,
        api_workers=api_workers, max_backlog=max_backlog,
    )
    raise typer.Exit(run(cfg))


# ----------------------------------------------------------------------------- profiles


def _read_text(file: Path) -> str:
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text()
    except OSError as exc:
        raise _fail(f"cannot read {file}: {exc.strerror}") from None


@profile_app.command("add")
def profile_add(
    file: Annotated[
        Path | None, typer.Argument(help="Profile file (YAML/JSON, as for ens check); '-' = stdin.")
    ] = None,
    pid: Annotated[str | None, typer.Option("--id", help="Profile id (with --expr).")] = None,
    expr: Annotated[str | None, typer.Option("--expr", help="Profile expression.")] = None,
    subscriber: Annotated[str | None, typer.Option(help="Subscriber id (with --expr).")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Validate and store profiles (and the file's subscribers): all of them or none.

    Problems are reported like `ens check`: every one, with profile id, line and column.
    """
    if (file is None) == (pid is None and expr is None):
        raise _fail("give a profile FILE or --id ID --expr EXPR (not both)")
    if file is None and (pid is None or expr is None):
        raise _fail("--id and --expr go together")
    st = Store(redis_url, data_dir)
    errors: list[ENSError] = []
    subs: list[dict[str, Any]] = []
    if file is not None:
        pset, errors = parse_profile_document(_read_text(file), str(file))
        items = [(p.id, p.source, p.subscriber) for p in pset.profiles]
        subs = pset.subscribers
        name = str(file)
    else:
        assert pid is not None and expr is not None
        items = [(pid, expr, subscriber)]
        name = "--expr"
    known = {s["id"] for s in subs}
    valid = 0
    for p_id, p_expr, p_sub in items:
        try:
            rs.validate_profile(None, p_id, p_expr, p_sub)
            if p_sub is not None and p_sub not in known and not st.r.hexists(
                store.SUBSCRIBERS, p_sub
            ):
                raise ProfileError(f"unknown subscriber {p_sub!r} (add it first)", p_id)
            valid += 1
        except ProfileError as exc:
            errors.append(exc)
    for sub in subs:
        try:
            rs.check_id(sub["id"], "subscriber id")
            store.Subscriber.model_validate(sub)
        except store.ValidationError as exc:
            errors.append(ENSError(f"subscriber {sub.get('id')!r}: {store.subscriber_error(exc)}"))
        except (ProfileError, ValueError) as exc:
            errors.append(ENSError(f"subscriber {sub.get('id')!r}: {exc}"))
    if errors:
        for e in errors:
            typer.echo(f"error: {e}", err=True)
        typer.echo(f"{name}: {len(errors)} problem(s), {valid} valid profile(s); nothing stored",
                   err=True)
        raise typer.Exit(2)
    for sub in subs:
        saved = store.put_subscriber(st.r, sub)
        typer.echo(f"subscriber {saved.id} stored")
        if saved.secret and not sub.get("secret"):
            typer.echo(f"  webhook signing secret (shown once): {saved.secret}")
    for p_id, p_expr, p_sub in items:
        _, created = rs.put_profile(st.r, p_id, p_expr, p_sub)
        typer.echo(f"profile {p_id} {'added' if created else 'replaced'}")


def parse_profile_document(text: str, name: str) -> tuple[Any, list[ENSError]]:
    from profiles.profile_file import parse_profile_document as parse

    return parse(text, name)


@profile_app.command("list")
def profile_list(redis_url: RedisUrl = None, data_dir: DataDir = None) -> None:
    """Show the stored profiles."""
    st = Store(redis_url, data_dir)
    recs = rs.list_profiles(st.r)
    from rich.table import Table

    table = Table(title=f"Profiles ({len(recs)})")
    for col in ("id", "subscriber", "created", "expr"):
        table.add_column(col, overflow="fold")
    for p in recs:
        table.add_row(p["id"], p.get("subscriber") or "-", _when(p.get("created")),
                      " ".join(p["expr"].split()))
    _console().print(table)


@profile_app.command("show")
def profile_show(
    pid: Annotated[str, typer.Argument(help="Profile id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print one profile."""
    st = Store(redis_url, data_dir)
    rec = rs.get_profile(st.r, pid)
    if rec is None:
        raise _fail(f"no profile {pid!r}")
    typer.echo(f"id:         {rec['id']}")
    typer.echo(f"subscriber: {rec.get('subscriber') or '-'}")
    typer.echo(f"created:    {_when(rec.get('created'))}")
    typer.echo(f"updated:    {_when(rec.get('updated'))}")
    typer.echo("expr:")
    for line in rec["expr"].rstrip().splitlines():
        typer.echo(f"  {line}")


@profile_app.command("rm")
def profile_rm(
    pid: Annotated[str, typer.Argument(help="Profile id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a profile (a running engine drops it at once)."""
    st = Store(redis_url, data_dir)
    if not rs.delete_profile(st.r, pid):
        raise _fail(f"no profile {pid!r}")
    typer.echo(f"profile {pid} removed")


# ----------------------------------------------------------------------------- subscribers


@subscriber_app.command("add")
def subscriber_add(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    email: Annotated[list[str] | None, typer.Option(help="E-mail address (repeatable).")] = None,
    webhook: Annotated[list[str] | None, typer.Option(help="Webhook URL (repeatable).")] = None,
    secret: Annotated[
        str | None, typer.Option(help="Webhook signing secret [generated and shown once].")
    ] = None,
    digest: Annotated[float | None, typer.Option(help="E-mail digest window (s).")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Store a subscriber (replacing one with the same id)."""
    channels: list[dict[str, Any]] = [{"email": a} for a in email or []]
    channels += [{"webhook": u} for u in webhook or []]
    if not channels:
        raise _fail("give at least one --email or --webhook")
    rec: dict[str, Any] = {"id": sid, "channels": channels}
    if secret:
        rec["secret"] = secret
    if digest is not None:
        rec["digest"] = digest
    try:
        rs.check_id(sid, "subscriber id")
        model = store.Subscriber.model_validate(rec)
    except store.ValidationError as exc:
        raise _fail(f"subscriber {sid!r}: {store.subscriber_error(exc)}") from None
    except (ProfileError, ValueError) as exc:
        raise _fail(str(exc)) from None
    st = Store(redis_url, data_dir)
    saved = store.put_subscriber(st.r, model)
    typer.echo(f"subscriber {sid} stored")
    if saved.secret and not secret:
        typer.echo(f"webhook signing secret (shown once): {saved.secret}")


@subscriber_app.command("list")
def subscriber_list(redis_url: RedisUrl = None, data_dir: DataDir = None) -> None:
    """Show subscribers and their channels (secrets are never shown)."""
    st = Store(redis_url, data_dir)
    subs = sorted(
        (store.Subscriber.model_validate_json(v) for v in st.r.hgetall(store.SUBSCRIBERS).values()),
        key=lambda s: s.id,
    )
    from rich.table import Table

    table = Table(title=f"Subscribers ({len(subs)})")
    for col in ("id", "channels", "digest", "profiles"):
        table.add_column(col, overflow="fold")
    for s in subs:
        chans = "\n".join(store.describe_channel(c.model_dump()) for c in s.channels) or "-"
        users = ", ".join(rs.profiles_of_subscriber(st.r, s.id)) or "-"
        table.add_row(s.id, chans, f"{s.digest:g} s" if s.digest else "-", users)
    _console().print(table)


@subscriber_app.command("rm")
def subscriber_rm(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a subscriber that no profile uses."""
    st = Store(redis_url, data_dir)
    users = rs.profiles_of_subscriber(st.r, sid)
    if users:
        raise _fail(f"subscriber {sid!r} is used by profiles {', '.join(users)}")
    if not st.r.hdel(store.SUBSCRIBERS, sid):
        raise _fail(f"no subscriber {sid!r}")
    typer.echo(f"subscriber {sid} removed")


# ----------------------------------------------------------------------------- gateways


Lateness = Annotated[
    str | None,
    typer.Option(help="How far out of ts order its events may arrive: 0 (in order: no wait), "
                      "500ms, 2s, ... or `default` (the service's --default-lateness)."),
]


def _lateness(text: str | None) -> float | None:
    try:
        return None if text is None else rs.parse_lateness(text)
    except ValueError as exc:
        raise _fail(f"--lateness: {exc}") from None


@gateway_app.command("add")
def gateway_add(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    lateness: Lateness = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Create a gateway and print its API key (once: only a hash is stored)."""
    late = _lateness(lateness)
    st = Store(redis_url, data_dir)
    try:
        key = rs.add_gateway(st.r, name, late)
    except ValueError as exc:
        raise _fail(str(exc)) from None
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
    if lateness is None:
        raise _fail("nothing to set (give --lateness)")
    late = _lateness(lateness)
    st = Store(redis_url, data_dir)
    if not rs.set_gateway_lateness(st.r, name, late):
        raise _fail(f"no gateway {name!r}")
    typer.echo(f"gateway {name}: lateness {'default' if late is None else f'{late:g} s'}")


@gateway_app.command("list")
def gateway_list(redis_url: RedisUrl = None, data_dir: DataDir = None) -> None:
    """Show gateways (names, creation, revocation)."""
    st = Store(redis_url, data_dir)
    gws = rs.list_gateways(st.r)
    from rich.table import Table

    table = Table(title=f"Gateways ({len(gws)})")
    for col in ("name", "created", "status", "lateness"):
        table.add_column(col)
    for g in gws:
        status = f"revoked {_when(g['revoked'])}" if g["revoked"] else "active"
        late = "default" if g["lateness"] is None else f"{g['lateness']:g} s"
        table.add_row(g["name"], _when(g["created"]), status, late)
    _console().print(table)


@gateway_app.command("revoke")
def gateway_revoke(
    name: Annotated[str, typer.Argument(help="Gateway name.")],
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a gateway's API key (its requests get 403 from now on)."""
    st = Store(redis_url, data_dir)
    if not rs.revoke_gateway(st.r, name):
        raise _fail(f"no gateway {name!r}")
    typer.echo(f"gateway {name} revoked")


# ----------------------------------------------------------------------------- post


def _batches(lines: Iterator[str], size: int) -> Iterator[list[tuple[int, str]]]:
    """(file line number, line) batches of non-blank lines."""
    batch: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            batch.append((lineno, line.rstrip("\r\n")))
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch


def post(
    file: Annotated[str, typer.Argument(help="JSON-lines event file, '-' for stdin.")],
    url: Annotated[
        str, typer.Option(envvar="ENS_URL", help="Service base URL.")
    ] = "http://127.0.0.1:8080",
    api_key: Annotated[
        str | None, typer.Option(envvar="ENS_API_KEY", help="Gateway API key (ens gateway add).")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Events per request.")] = 500,
    timeout: Annotated[float, typer.Option(help="HTTP timeout (s).")] = 30.0,
    retries: Annotated[
        int, typer.Option(min=0, help="Retries of a request that nothing accepted (service down or "
                                      "restarting: connection refused, 503, 429), with backoff.")
    ] = 5,
) -> None:
    """Send events to the service like a gateway; report rejected events by line number.

    A request is retried only when the service surely accepted none of it (the connection
    was refused, or it answered 503/429), so a retry never posts an event twice.
    """
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from notifiers.config import RetryPolicy
    from notifiers.webhook import parse_retry_after

    if not api_key:
        raise _fail("give --api-key or set ENS_API_KEY")
    if file == "-":
        fh: Any = sys.stdin
        total = None
    else:
        path = Path(file)
        if not path.exists():
            raise _fail(f"no such file: {file}")
        total = sum(1 for line in path.open(encoding="utf-8") if line.strip())
        fh = path.open(encoding="utf-8")
    accepted = rejected = 0
    problems: list[tuple[int, str]] = []
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/x-ndjson"}
    endpoint = url.rstrip("/") + "/v1/events"

    policy = RetryPolicy(base=0.5, cap=10.0, max_attempts=retries + 1, max_retry_after=60.0)

    def attempt(client: httpx.Client, body: bytes) -> httpx.Response:
        k = 0
        while True:  # returns the answer, or raises once the attempts are used up
            k += 1
            last = k == policy.max_attempts
            try:
                resp = client.post(endpoint, content=body, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
                if last:
                    raise _fail(f"cannot reach {endpoint}: {exc}", 1) from None
                why, after = f"cannot connect ({exc})", None
            except httpx.HTTPError as exc:  # sent: the service may have taken it, do not resend
                raise _fail(f"no answer from {endpoint}: {exc}", 1) from None
            else:
                if resp.status_code not in (429, 503) or last:
                    return resp
                why = f"HTTP {resp.status_code}"
                after = parse_retry_after(resp.headers.get("Retry-After"))
            wait = policy.delay(k, after)
            progress.console.print(f"{why}; retry {k} of {retries} in {wait:.1f} s")
            time.sleep(wait)

    def send(client: httpx.Client, chunk: list[tuple[int, str]]) -> tuple[int, int]:
        body = "".join(line + "\n" for _, line in chunk).encode()
        resp = attempt(client, body)
        if resp.status_code == 413 and len(chunk) > 1:  # split until it fits
            half = len(chunk) // 2
            a = send(client, chunk[:half])
            b = send(client, chunk[half:])
            return a[0] + b[0], a[1] + b[1]
        data = resp.json() if resp.headers.get("content-type") == "application/json" else {}
        if resp.status_code in (202, 422) and "accepted" in data:
            for err in data.get("errors", []):
                problems.append((chunk[err["index"]][0], err["error"]))
            return data["accepted"], data["rejected"]
        msg = data.get("error") or resp.text
        raise _fail(f"HTTP {resp.status_code} from {endpoint}: {msg}",
                    2 if resp.status_code in (400, 401, 403, 413) else 1)

    progress = Progress(
        TextColumn("posting"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rejected]} rejected"), console=Console(stderr=True),
        transient=False,
    )
    t0 = time.perf_counter()
    with fh, httpx.Client(timeout=timeout) as client, progress:
        task = progress.add_task("post", total=total, rejected=0)
        for chunk in _batches(fh, batch):
            a, rj = send(client, chunk)
            accepted += a
            rejected += rj
            progress.update(task, advance=len(chunk), rejected=rejected)
    for lineno, msg in sorted(problems):
        typer.echo(f"error: line {lineno}: {msg}", err=True)
    dt = time.perf_counter() - t0
    typer.echo(f"{accepted} accepted, {rejected} rejected in {dt:.2f} s")
    if rejected:
        raise typer.Exit(2)


# ----------------------------------------------------------------------------- notifications


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


# ----------------------------------------------------------------------------- mounting


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
