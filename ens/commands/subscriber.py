"""`ens subscriber add | preview | templates | list | status | test | rm`.

Replacing and the signing secret follow `notifiers.subscriber_change`, as the HTTP route does.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ens.commands import output
from ens.commands.output import Json, fail
from ens.commands.store import DataDir, NotifierConfig, RedisUrl, Store
from ens.options import lazy_module, parse_duration
from profiles.errors import ENSError, ProfileError

rs = lazy_module("adapters.service.redis_store")
store = lazy_module("notifiers.store")


subscriber_app = typer.Typer(help="Manage subscribers (e-mail, webhooks).", no_args_is_help=True)


_AddSlack = Annotated[
    list[str] | None,
    typer.Option(help="Slack (or compatible) incoming-webhook URL (repeatable)."),
]
_AddTeams = Annotated[
    list[str] | None,
    typer.Option(help="Microsoft Teams incoming-webhook URL: an Adaptive Card (repeatable)."),
]
_AddTemplate = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME=FILE: a Jinja2 template for email_subject, email_text, email_html, "
        "webhook, slack or teams (repeatable; docs/notifiers.md#templates)."
    ),
]
_AddSecret = Annotated[
    str | None, typer.Option(help="Webhook signing secret [generated and shown once].")
]
_AddDigest = Annotated[
    str | None,
    typer.Option(
        help="E-mail digest window: notifications within it go out as one mail (e.g. 10m)."
    ),
]
_AddReplace = Annotated[
    bool,
    typer.Option(
        "--replace", help="Replace a stored subscriber of the same id whose definition differs."
    ),
]
_AddRotateSecret = Annotated[
    bool,
    typer.Option(
        "--rotate-secret",
        help="Give the subscriber a new webhook signing secret (shown once) instead of "
        "keeping the stored one.",
    ),
]


@subscriber_app.command("add")
def subscriber_add(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    email: Annotated[list[str] | None, typer.Option(help="E-mail address (repeatable).")] = None,
    webhook: Annotated[list[str] | None, typer.Option(help="Webhook URL (repeatable).")] = None,
    slack: _AddSlack = None,
    teams: _AddTeams = None,
    template: _AddTemplate = None,
    secret: _AddSecret = None,
    digest: _AddDigest = None,
    replace: _AddReplace = False,
    rotate_secret: _AddRotateSecret = False,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Store a subscriber.

    An id stored with another definition is replaced only with --replace (the change is
    shown either way); the same definition again changes nothing. A replaced subscriber keeps
    its webhook signing secret, so its receivers go on verifying, unless --rotate-secret or
    --secret is given.
    """
    from notifiers import subscriber_change as sc

    channels: list[dict[str, Any]] = [{"email": a} for a in email or []]
    channels += [{"webhook": u} for u in webhook or []]
    channels += [{"webhook": u, "format": "slack"} for u in slack or []]
    channels += [{"webhook": u, "format": "teams"} for u in teams or []]
    if not channels:
        raise fail("give at least one --email, --webhook, --slack or --teams")
    if secret and rotate_secret:
        raise fail("--secret and --rotate-secret both set the secret: give one")
    rec: dict[str, Any] = {"id": sid, "channels": channels}
    if secret:
        rec["secret"] = secret
    if template:
        rec["templates"] = _template_files(template)
    try:
        if digest is not None:
            rec["digest"] = parse_duration("--digest", digest)
    except ENSError as exc:
        raise fail(str(exc)) from None
    try:
        rs.check_id(sid, "subscriber id")
        model = store.Subscriber.model_validate(rec)
    except store.ValidationError as exc:
        raise fail(f"subscriber {sid!r}: {store.subscriber_error(exc)}") from None
    except (ProfileError, ValueError) as exc:
        raise fail(str(exc)) from None
    st = Store(redis_url, data_dir, create=True)
    change = sc.plan(st.r, model, rotate=rotate_secret)
    if change.needs_replace and not replace:
        typer.echo(f"error: {change.refusal()}:", err=True)
        for line in change.lines:
            typer.echo(f"  {line}", err=True)
        typer.echo("nothing stored", err=True)
        raise typer.Exit(2)
    _, shown_secret = sc.apply(st.r, change)
    word = {"new": "stored", "changed": "replaced", "rotated": "secret rotated"}
    typer.echo(f"subscriber {sid} {word.get(change.status, change.status)}")
    for line in change.lines:
        typer.echo(f"  {line}")
    if shown_secret:
        typer.echo(f"webhook signing secret (shown once): {shown_secret}")


def _template_files(specs: list[str]) -> dict[str, str]:
    """``NAME=FILE`` options as name -> template text (checked with the record)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq or not name or not path:
            raise fail(f"--template {spec!r}: give NAME=FILE, e.g. slack=alarm.slack.j2")
        try:
            out[name.strip()] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"--template {name}: cannot read {path}: {exc}") from None
    return out


@subscriber_app.command("preview")
def subscriber_preview(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    transition: Annotated[
        str,
        typer.Option(
            help="The sample message: notification (a profile match), raise, repeat, ack, "
            "clear (an alarm transition), group or digest (several alarms)."
        ),
    ] = "raise",
    channel: Annotated[
        int | None, typer.Option(help="Only this channel (its index, from 0).")
    ] = None,
    template: Annotated[
        list[str] | None,
        typer.Option(help="NAME=FILE: try a template instead of the stored one (not stored)."),
    ] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print what each channel of a subscriber would receive for a sample message, rendered
    with its templates (a template that fails on the sample is reported and the default shown,
    as delivery would send it)."""
    import logging

    from notifiers import template_samples, templates

    st = Store(redis_url, data_dir)
    sub = store.get_subscriber(st.r, sid)
    if sub is None:
        raise fail(f"no subscriber {sid!r} (see ens subscriber list)")
    if template:
        merged = {**(sub.templates or {}), **_template_files(template)}
        try:
            sub = store.Subscriber.model_validate({**sub.model_dump(), "templates": merged})
        except store.ValidationError as exc:
            raise fail(f"subscriber {sid!r}: {store.subscriber_error(exc)}") from None
    try:
        n = template_samples.sample(transition, sub.id)
    except ValueError as exc:
        raise fail(f"--transition: {exc}") from None
    picked = list(enumerate(sub.channels))
    if channel is not None:
        if not 0 <= channel < len(picked):
            raise fail(f"subscriber {sid!r} has channels 0..{len(picked) - 1}, not {channel}")
        picked = [picked[channel]]
    for name, source in sorted((sub.templates or {}).items()):
        try:
            templates.render(name, source, n)
        except Exception as exc:  # what delivery would meet: it sends the default instead
            typer.echo(
                f"warning: template {name} fails on the {transition} sample "
                f"({type(exc).__name__}: {exc}); the default is shown, as delivery sends it",
                err=True,
            )
    logging.getLogger("ens.notifiers").setLevel(logging.ERROR)  # reported just above
    for k, ch in picked:
        typer.echo(f"=== channel {k}: {store.describe_channel(ch.model_dump())}")
        if isinstance(ch, store.WebhookChannel):
            body = templates.webhook_body(sub.id, ch, sub.templates, n)
            typer.echo("Content-Type: application/json\n")
            typer.echo(body.decode())
        else:
            sender = os.environ.get("ENS_SMTP_FROM", "ens@localhost")
            msg = templates.email_message(sub.id, sub.templates, n, sender, ch.email)
            for header in ("Subject", "From", "To", "Content-Type"):
                typer.echo(f"{header}: {msg[header]}")
            for part in msg.walk():
                if not part.is_multipart():
                    typer.echo(f"\n--- {part.get_content_type()}")
                    typer.echo(part.get_content().rstrip("\n"))


@subscriber_app.command("templates")
def subscriber_templates(
    name: Annotated[
        str | None,
        typer.Argument(help="email_subject, email_text, email_html, webhook, slack or teams."),
    ] = None,
) -> None:
    """Print the default templates (all, or one by name): a starting point for --template."""
    from notifiers.templates import DEFAULT_TEMPLATES

    if name is not None and name not in DEFAULT_TEMPLATES:
        raise fail(f"no template {name!r} (known: {', '.join(DEFAULT_TEMPLATES)})")
    for key, text in DEFAULT_TEMPLATES.items():
        if name is None:
            typer.echo(f"=== {key}")
        if name in (None, key):
            typer.echo(text.rstrip("\n"))


@subscriber_app.command("list")
def subscriber_list(
    redis_url: RedisUrl = None, data_dir: DataDir = None, as_json: Json = False
) -> None:
    """Show subscribers and their channels (secrets are never shown; a webhook URL is shown
    with its password and query values masked)."""
    st = Store(redis_url, data_dir)
    subs = sorted(
        (store.Subscriber.model_validate_json(v) for v in st.r.hgetall(store.SUBSCRIBERS).values()),
        key=lambda s: s.id,
    )
    if as_json:
        output.print_json(
            [
                {
                    "id": s.id,
                    "channels": [store.redact(c.model_dump(exclude_none=True)) for c in s.channels],
                    "digest": s.digest,
                    "templates": sorted(s.templates or {}),
                    "has_secret": bool(s.secret)
                    or any(getattr(c, "secret", None) for c in s.channels),
                    "profiles": rs.profiles_of_subscriber(st.r, s.id),
                }
                for s in subs
            ]
        )
        return
    from rich.table import Table

    table = Table(title=f"Subscribers ({len(subs)})")
    for col in ("id", "channels", "digest", "profiles"):
        table.add_column(col, overflow="fold")
    for s in subs:
        chans = "\n".join(store.describe_channel(c.model_dump()) for c in s.channels) or "-"
        users = ", ".join(rs.profiles_of_subscriber(st.r, s.id)) or "-"
        table.add_row(s.id, chans, f"{s.digest:g} s" if s.digest else "-", users)
    output.console().print(table)


@subscriber_app.command("status")
def subscriber_status(
    sid: Annotated[str | None, typer.Argument(help="Subscriber id [all of them].")] = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Show delivery status per subscriber: delivered, retries, dead letters, what is
    pending or retrying now, circuit breakers of its destinations, last success and error.

    Counts are of outcomes since the store was created (a retried attempt counts once each);
    "now" columns are what the delivery schedule holds at this moment.
    """
    from notifiers.status import subscriber_status as status_of

    st = Store(redis_url, data_dir)
    if sid is not None:
        sub = store.get_subscriber(st.r, sid)
        if sub is None:
            raise fail(f"no subscriber {sid!r} (see ens subscriber list)")
        subs = [sub]
    else:
        subs = sorted(
            (
                store.Subscriber.model_validate_json(v)
                for v in st.r.hgetall(store.SUBSCRIBERS).values()
            ),
            key=lambda s: s.id,
        )
    rows = status_of(st.r, subs)
    if as_json:
        output.print_json(rows)
        return
    from rich.table import Table

    def when(ts: float | None) -> str:
        return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")

    table = Table(title=f"Delivery status ({len(rows)} subscriber{'s' if len(rows) != 1 else ''})")
    for col in (
        "id",
        "delivered",
        "retried",
        "dead",
        "pending now",
        "retrying now",
        "dead letters now",
        "breakers",
        "last success",
        "last error",
    ):
        table.add_column(col, overflow="fold")
    for row in rows:
        breakers = "\n".join(
            f"{d} {b['state']}" + (f" until {when(b['until'])}" if b["state"] == "open" else "")
            for d, b in row["breakers"].items()
        )
        error = f"{when(row['last_error_at'])} {row['last_error']}" if row["last_error"] else "-"
        table.add_row(
            row["id"],
            str(row["delivered"]),
            str(row["retried"]),
            str(row["dead"]),
            str(row["pending"]),
            str(row["retrying"]),
            str(row["dead_letters"]),
            breakers or "-",
            when(row["last_success"]),
            error,
        )
    output.console().print(table)


@subscriber_app.command("test")
def subscriber_test(
    sid: Annotated[str, typer.Argument(help="Subscriber id.")],
    channel: Annotated[
        int | None,
        typer.Option("--channel", min=0, help="Only this channel (0-based, as listed) [each]."),
    ] = None,
    deadline: Annotated[
        float, typer.Option("--deadline", min=0.1, max=60, help="Seconds each send may take.")
    ] = 10.0,
    config: NotifierConfig = None,
    redis_url: RedisUrl = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Send a real signed test message to the subscriber's channels (or one) through the
    delivery senders, and show what each receiver answered (HTTP status, SMTP reply).
    Exit status 1 when a channel did not take it."""
    from notifiers.config import ConfigError, NotifierConfig
    from notifiers.probe import send_test

    st = Store(redis_url, data_dir)
    sub = store.get_subscriber(st.r, sid)
    if sub is None:
        raise fail(f"no subscriber {sid!r} (see ens subscriber list)", 3)
    try:
        cfg = NotifierConfig.load(config)
        probes = send_test(sub, cfg, channel, deadline)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except IndexError as exc:
        raise fail(f"--channel: {exc.args[0]}") from None
    if as_json:
        output.print_json([p.to_json() for p in probes])
    else:
        for p in probes:
            verdict = "delivered" if p.delivered else "FAILED"
            typer.echo(f"#{p.channel} {p.to}: {verdict} ({p.answer}, {p.seconds:.2f} s)")
    if not all(p.delivered for p in probes):
        raise typer.Exit(1)


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
        raise fail(f"subscriber {sid!r} is used by profiles {', '.join(users)}")
    if not st.r.hdel(store.SUBSCRIBERS, sid):
        raise fail(f"no subscriber {sid!r}")
    typer.echo(f"subscriber {sid} removed")
