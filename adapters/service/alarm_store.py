"""Alarms in Redis (docs/alarms.md, "The service"): the keys, the records, and the operator's
side of the command stream.

The engine worker owns the alarm rules (`notifiers.alarms.AlarmRules`): it is the only writer
of alarm state. What it writes, each in the MULTI/EXEC of the journal commit (or snapshot)
whose inputs produced it:

- ``ens:alarms`` (hash): alarm id -> its current record (the current occurrence; for listing),
- ``ens:alarm:history`` (stream): one entry per transition, trimmed to the retention,
- ``ens:silences`` (hash): silence id -> silence (expired ones stay),
- ``ens:outbox``: the messages (the delivery worker sends them as any notification),
- ``ens:alarm:reply:<command id>`` (list, expires): the answer to an operator command.

People's actions (acknowledge, clear, add or expire a silence) are **commands**: the API and
the CLI XADD them to ``ens:alarm:control`` and wait for the reply. The worker applies each
command once, in order, and journals it with the commit that writes its effects and its reply;
the position in the command stream is part of the journal and the checkpoint. A crash before
that commit re-reads the command after the restart; after it, the journal replay re-applies
it to the restored state without writing anything again. So each command is applied exactly
once, and its 404/409 comes from the state that owns the answer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import redis

from adapters.errors import WorkerUnavailable as WorkerUnavailable  # its old import path
from notifiers.alarms import Alarm, Matcher, Notice, SilenceError, Transition
from notifiers.alarms.silences import parse_time
from notifiers.records import owned, text
from profiles.errors import ENSError

ALARMS = "ens:alarms"
BY_LABEL = "ens:alarms:by:"  # + "label=value": set of the alarm ids with that label value
HISTORY = "ens:alarm:history"
SILENCES = "ens:silences"
CONTROL = "ens:alarm:control"
REPLY = "ens:alarm:reply:"  # + command entry id
ESCALATION_DUE = "ens:escalation:due"  # sorted set: occurrence ID.N -> due time of its next step
ESCALATIONS = "ens:escalations"  # hash: occurrence ID.N -> its next step (JSON)
CONTROL_MAXLEN = 10_000
REPLY_TTL = 300  # s: a reply nobody waited for goes away
REPLY_SLICE = 2.0  # s: one BLPOP of `wait_reply`, well within a client's socket timeout
COMMAND_MAX_AGE = 300.0  # s: an older command is not applied (whoever sent it gave up)
OPS = ("ack", "clear", "silence", "expire")


_ALARM_FIELDS = tuple(
    f.name for f in dataclasses.fields(Alarm) if f.name not in ("events", "transitions")
)
_TRANSITION_FIELDS = tuple(f.name for f in dataclasses.fields(Transition))
_alarm_values = operator.attrgetter(*_ALARM_FIELDS)  # the values in one C call


def index_record(a: Alarm, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``ens:alarms`` keeps of an alarm: its record without the last match's events.
    (A shallow copy: `dataclasses.asdict` deep-copies, and this runs per transition.)
    ``labels``: ``a.labels()`` if the caller has them made already."""
    rec = dict(zip(_ALARM_FIELDS, _alarm_values(a), strict=True))
    rec["labels"] = a.labels() if labels is None else labels
    return rec


def ack_hint(aid: str) -> dict[str, str]:
    """How to acknowledge an alarm: the command and the HTTP call (in every message)."""
    return {
        "command": f"ens alarms ack {aid}",
        "http": f"POST /v1/alarms/{aid}/ack",
    }


# ----------------------------------------------------------------------------- commands


def send_command(
    r: redis.Redis, op: str, args: Mapping[str, Any], timeout: float = 10.0
) -> dict[str, Any]:
    """Append a command for the engine worker and wait for its reply (`WorkerUnavailable`
    after ``timeout``). The reply is ``{"status": 200|404|409|422, ...}``."""
    return wait_reply(r, post_command(r, op, args), timeout)


def post_command(r: redis.Redis, op: str, args: Mapping[str, Any]) -> str:
    """Append a command to ``ens:alarm:control``; its entry id (the reply's key)."""
    if op not in OPS:
        raise ValueError(f"unknown alarm command {op!r}")
    cmd = {"op": op, "at": time.time(), **args}
    return text(r.xadd(CONTROL, {"c": json.dumps(cmd)}, maxlen=CONTROL_MAXLEN, approximate=True))


def wait_reply(r: redis.Redis, eid: str, timeout: float = 10.0) -> dict[str, Any]:
    """The reply to command ``eid``. BLPOP in slices shorter than the client's socket timeout
    (redis-py's default is 5 s): a longer ``--wait`` is not a "Timeout reading from socket"."""
    deadline = time.monotonic() + max(timeout, 1.0)
    got: Any = None
    while got is None and (left := deadline - time.monotonic()) > 0:
        got = r.blpop([REPLY + eid], timeout=max(min(left, REPLY_SLICE), 0.01))
    if got is None:
        raise WorkerUnavailable(
            f"the engine worker did not answer within {timeout:g} s (is `ens serve` running?); "
            f"command {eid} is applied when it reads it, within {COMMAND_MAX_AGE:g} s"
        )
    out: dict[str, Any] = json.loads(text(got[1]))
    return out


def read_commands(r: redis.Redis, after: str, count: int = 100) -> list[tuple[str, dict[str, Any]]]:
    resp: Any = r.xread({CONTROL: after}, count=count)
    out = []
    for eid, fields in resp[0][1] if resp else []:
        raw = fields.get(b"c") if b"c" in fields else fields.get("c")
        try:
            cmd = json.loads(text(raw))
        except (TypeError, ValueError):
            cmd = {"op": "?"}
        out.append((text(eid), cmd if isinstance(cmd, dict) else {"op": "?"}))
    return out


# ----------------------------------------------------------------------------- reading


def parse_matchers(items: Iterable[str]) -> list[Matcher]:
    """``--match room=101`` / ``?match=room=101``: Alertmanager matchers (SilenceError names
    the field ``matchers``)."""
    return [Matcher.parse(m) for m in items]


def label_key(label: str, value: str) -> str:
    return f"{BY_LABEL}{label}={value}"


def index_labels(p: Any, aid: str, labels: Mapping[str, str]) -> None:
    """Add an alarm to the sets of its label values (in the caller's transaction). A label of
    an alarm key never changes but its severity may (a new definition): a stale member only
    widens the candidates, which the matchers then filter."""
    for k, v in labels.items():
        p.sadd(label_key(k, v), aid)


# SADD to each of KEYS its members: ARGV holds, per key in order, how many, then them. One
# command for a step's label sets instead of one SADD per set (a queued command of a MULTI
# costs a round of packing and reply parsing; a step's raises fill a set per room).
SETS_SCRIPT = """
local i = 1
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  redis.call('SADD', KEYS[k], unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return #KEYS
"""
SETS_CHUNK = 2000  # members per script call (Lua's unpack takes a few thousand at most)


def index_many(p: Any, raised: Iterable[tuple[str, Mapping[str, str]]]) -> None:
    """`index_labels` for many alarms: the same sets, in one script call per 2,000 members
    (`SETS_SCRIPT`)."""
    sets: dict[tuple[str, str], list[str]] = {}
    for aid, labels in raised:
        for kv in labels.items():
            ids = sets.get(kv)
            if ids is None:
                sets[kv] = [aid]
            else:
                ids.append(aid)
    keys: list[str] = []
    argv: list[Any] = []
    for (k, v), ids in sets.items():
        for lo in range(0, len(ids), SETS_CHUNK):
            part = ids[lo : lo + SETS_CHUNK]
            if len(argv) + len(part) > SETS_CHUNK and keys:
                p.eval(SETS_SCRIPT, len(keys), *keys, *argv)
                keys, argv = [], []
            keys.append(label_key(k, v))
            argv.append(len(part))
            argv.extend(part)
    if keys:
        p.eval(SETS_SCRIPT, len(keys), *keys, *argv)


# XADD each ARGV[2..] (a transition's JSON) as field "t", trimming to MINID ARGV[1]: one
# command for a step's history instead of one per transition (each queued command of a
# MULTI costs a round of parsing on both sides). Sent whole (EVAL, which Redis caches by its
# SHA1): a registered script in a pipeline costs a SCRIPT EXISTS round trip per commit, and
# an EVALSHA of a script Redis has forgotten (a restart) would fail inside the transaction.
HISTORY_SCRIPT = """
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', 't', ARGV[i])
end
return #ARGV - 1
"""
HISTORY_CHUNK = 1000  # transitions per script call


def add_history(p: Any, entries: Sequence[bytes], minid: str) -> None:
    """Append transitions (`history_json`) to ``ens:alarm:history`` in the caller's
    transaction, in order (`HISTORY_SCRIPT`)."""
    for lo in range(0, len(entries), HISTORY_CHUNK):
        p.eval(HISTORY_SCRIPT, 1, HISTORY, minid, *entries[lo : lo + HISTORY_CHUNK])


def unindex(p: Any, aid: str, labels: Mapping[str, str]) -> None:
    """Remove a pruned alarm from ``ens:alarms`` and its label sets (in the caller's
    transaction); an emptied set goes away."""
    p.hdel(ALARMS, aid)
    for k, v in labels.items():
        p.srem(label_key(k, v), aid)


def _candidates(r: redis.Redis, matchers: Sequence[Matcher], severity: str | None) -> Any:
    """The raw records to filter: those in every equality matcher's label set (fast with
    100,000 alarms), else the whole hash."""
    keys = [label_key(m.label, m.value) for m in matchers if m.op == "="]
    if severity is not None:
        keys.append(label_key("severity", severity))
    if not keys:
        cursor = 0
        while True:
            cursor, chunk = r.hscan(ALARMS, cursor, count=10_000)
            yield from chunk.values()  # type: ignore[union-attr]  # a dict here
            if cursor == 0:
                return
    ids = sorted(r.sinter(keys))  # type: ignore[arg-type]
    for lo in range(0, len(ids), 10_000):
        yield from (v for v in r.hmget(ALARMS, ids[lo : lo + 10_000]) if v is not None)


def list_alarms(
    r: redis.Redis,
    state: str | None = None,
    severity: str | None = None,
    matchers: Sequence[Matcher] = (),
) -> list[dict[str, Any]]:
    """Alarms of ``ens:alarms`` that pass the filters, newest last seen first."""
    out = []
    for raw in _candidates(r, matchers, severity):
        rec = orjson.loads(raw)
        if state is not None and rec["state"] != state:
            continue
        if severity is not None and rec["severity"] != severity:
            continue
        labels = rec["labels"]
        if all(m.matches(labels) for m in matchers):
            out.append(rec)
    out.sort(key=lambda a: (-a["last_seen"], a["id"]))
    return out


def get_alarm(r: redis.Redis, aid: str) -> dict[str, Any] | None:
    raw = r.hget(ALARMS, aid.partition(".")[0])
    return None if raw is None else json.loads(text(raw))


def next_escalation(r: redis.Redis, rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pending escalation step of an alarm's current occurrence (None: none pending):
    policy, level, when it is due and its receivers."""
    raw = r.hget(ESCALATIONS, f"{rec['id']}.{rec['occurrence']}")
    return None if raw is None else json.loads(text(raw))


def escalations_pending(r: redis.Redis) -> int:
    return int(r.zcard(ESCALATION_DUE))  # type: ignore[arg-type]


def history(
    r: redis.Redis,
    matchers: Sequence[Matcher] = (),
    since: float | None = None,
    alarm: str | None = None,
    limit: int = 10_000,
) -> list[dict[str, Any]]:
    """Transitions (oldest first) of ``ens:alarm:history`` since ``since`` (transition time)."""
    out: list[dict[str, Any]] = []
    start = "-"
    while len(out) < limit:
        entries: Any = r.xrange(HISTORY, min=start, count=1000)
        if not entries:
            break
        for _eid, fields in entries:
            raw = fields.get(b"t") if b"t" in fields else fields.get("t")
            t = json.loads(text(raw))
            if since is not None and t["ts"] < since:
                continue
            if alarm is not None and alarm not in (t["alarm"], f"{t['alarm']}.{t['occurrence']}"):
                continue
            if all(m.matches(t["labels"]) for m in matchers):
                out.append(t)
        if len(entries) < 1000:
            break
        start = "(" + text(entries[-1][0])
    return out[:limit]


def parse_since(since: str | None, now: float | None = None) -> float | None:
    """``--since 7d`` / ``?since=``: a duration back from now, or an RFC 3339 time
    (ValueError saying what is expected)."""
    from profiles.options import OptionError, parse_duration

    if since is None:
        return None
    if "T" in since or since.count("-") >= 2:
        try:
            return parse_time(since, "since")
        except SilenceError:
            raise ValueError(
                f"{since!r}: expected a duration (7d, 12h) or an RFC 3339 time"
            ) from None
    try:
        back = parse_duration("since", since)
    except OptionError:
        raise ValueError(f"{since!r}: expected a duration (7d, 12h) or an RFC 3339 time") from None
    return (time.time() if now is None else now) - back


def history_fields(tr: Transition) -> dict[str, bytes]:
    """A history entry: the transition as JSON (`Transition.to_json`'s keys)."""
    return {"t": history_json(tr)}


def history_json(tr: Transition, **extra: Any) -> bytes:
    """The transition's fields in order (orjson writes the dataclass itself: no dict), then
    ``extra``."""
    if not extra:
        return owned(orjson.dumps(tr))  # kept until the commit: `owned`
    return owned(
        orjson.dumps({**{name: getattr(tr, name) for name in _TRANSITION_FIELDS}, **extra})
    )


@functools.lru_cache(maxsize=1 << 16)
def _ack_fragment(aid: str) -> orjson.Fragment:
    """`ack_hint` as orjson writes it, made once per alarm (it is in every message)."""
    return orjson.Fragment(orjson.dumps(ack_hint(aid)))


def notice_bytes(n: Notice) -> bytes:
    """`notice_json` as orjson writes it (TypeError beyond orjson, as `orjson.dumps`)."""
    return orjson.dumps(_notice_fields(n, _ack_fragment(n.alarm)))


def notice_json(n: Notice) -> dict[str, Any]:
    """A notice as an alarm message lists it: `Notice.to_json` with ``kind`` as
    ``transition_kind`` (last) and how to acknowledge the alarm."""
    return _notice_fields(n, ack_hint(n.alarm))


def _notice_fields(n: Notice, acknowledge: Any) -> dict[str, Any]:
    """`notice_json`'s dict with ``acknowledge`` as given (`notice_bytes` gives it as bytes
    made once per alarm). Built in one literal, in that key order (it runs per message); the
    labels are shared, to be serialised at once."""
    return {
        "alarm": n.alarm, "occurrence": n.occurrence, "transition": n.transition, "ts": n.ts,
        "state": n.state, "severity": n.severity, "count": n.count, "first_seen": n.first_seen,
        "last_seen": n.last_seen, "labels": n.labels, "transition_kind": n.kind,
        "acknowledge": acknowledge,
    }  # fmt: skip


def history_entries(trs: Sequence[Transition]) -> list[bytes]:
    """The history entries of one step's transitions, in order: one per transition, except
    that consecutive repeats of one alarm occurrence that deliver nothing (a further match:
    a count and a time) are one entry — the last repeat, with ``repeats`` (how many it
    stands for) and ``since`` (the first one's time). Its ``count``/``first_seen``/
    ``last_seen`` are the alarm's after them; the repeats' ids are the ``repeats`` ids up to
    its own (`transition_ids`)."""
    keep: list[Transition | None] = []
    runs: dict[str, int] = {}  # alarm -> index in keep of its open run's last repeat
    merged: dict[int, tuple[int, float]] = {}  # index -> (repeats, since)
    for tr in trs:
        if tr.kind == "repeat" and tr.delivery == "none":
            i = runs.get(tr.alarm)
            if i is not None:
                k, since = merged.pop(i, (1, keep[i].ts))  # type: ignore[union-attr]
                keep[i] = None
                merged[len(keep)] = (k + 1, since)
            runs[tr.alarm] = len(keep)
        else:
            runs.pop(tr.alarm, None)
        keep.append(tr)
    out = []
    for i, kept in enumerate(keep):
        if kept is None:
            continue
        if i in merged:
            k, since = merged[i]
            out.append(history_json(kept, repeats=k, since=since))
        else:
            out.append(history_json(kept))
    return out


def transition_ids(rec: Mapping[str, Any]) -> list[str]:
    """The ids of the transitions a history entry stands for (several: coalesced repeats)."""
    k = int(rec.get("repeats", 1))
    if k == 1:
        return [rec["id"]]
    head, _, n = str(rec["id"]).rpartition(".")
    return [f"{head}.{j}" for j in range(int(n) - k + 1, int(n) + 1)]


def list_silences(r: redis.Redis) -> list[dict[str, Any]]:
    recs = [json.loads(text(v)) for v in r.hvals(SILENCES)]
    return sorted(recs, key=lambda s: (s.get("created_at", 0), s["id"]))


# ----------------------------------------------------------------------------- ack tokens

TOKENS = "ens:tokens"  # hash: sha256 of a token -> {"name", "scope", "created"}
SCOPES = ("ack",)  # "ack": list alarms (and their history) and acknowledge them, nothing else


def add_token(r: redis.Redis, name: str, scope: str = "ack") -> str:
    """Create a scoped token (shown once; only its hash is kept); replaces one of that name."""
    import hashlib
    import secrets

    if scope not in SCOPES:
        raise ENSError(f"unknown token scope {scope!r} (one of {', '.join(SCOPES)})")
    revoke_token(r, name)
    token = f"ack_{secrets.token_urlsafe(24)}"
    rec = {"name": name, "scope": scope, "created": time.time()}
    r.hset(TOKENS, hashlib.sha256(token.encode()).hexdigest(), json.dumps(rec))
    return token


def token_of(r: redis.Redis, sha: str) -> dict[str, Any] | None:
    raw = r.hget(TOKENS, sha)
    return None if raw is None else json.loads(text(raw))


def list_tokens(r: redis.Redis) -> list[dict[str, Any]]:
    return sorted((json.loads(text(v)) for v in r.hvals(TOKENS)), key=lambda t: t["name"])


def revoke_token(r: redis.Redis, name: str) -> bool:
    gone = False
    for sha, raw in r.hgetall(TOKENS).items():
        if json.loads(text(raw))["name"] == name:
            gone = bool(r.hdel(TOKENS, sha)) or gone
    return gone
