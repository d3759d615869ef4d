"""The asset registry in Redis and the sensor-silent fault profiles generated from it
(docs/assets.md).

Keys
----
``ens:assets``          hash; ``KIND/ID`` (``sensor/t-101``, ``gateway/lobby``) -> JSON: the
                        asset (`assets.Asset.to_json`) with ``fault`` (the severity and
                        subscriber of its sensor-silent alarm, fixed at its import) and
                        ``updated``
``ens:assets:version``  integer; incremented by every change: the API processes reload the
                        registry when it moves (`enrich.AssetCache`)

Every registered asset with an expected interval has a generated profile in ``ens:profiles``
(``"generated": "assets"``): ``comm-fault:ID`` = ``absent(sensor = "ID") within T`` (a gateway:
``comm-fault-gw:ID``, ``absent(gateway = "ID")``) with an ``alarm:`` block — severity, ``clear:
{on: 'sensor = "ID"'}`` and fixed labels (``class=comm-fault``, the sensor, its place). Without
``per``, `absent`'s timer starts when the profile is activated (LANGUAGE.md §4), so a sensor
never heard since the profile came in raises its alarm T later; its next event clears it. An
import writes the registry, the generated profiles that changed (and deletes those no longer
wanted) and one ``op=assets`` entry on ``ens:control`` in one MULTI/EXEC: all or nothing. The
engine worker then reconciles its profiles with ``ens:profiles`` (one entry, not one per
profile: the control stream is trimmed to 10,000 entries).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from adapters.service import redis_store as rs
from adapters.service.assets import Asset, AssetError, Registry
from notifiers import store
from profiles.alarm import AlarmSpec

ASSETS = "ens:assets"
VERSION = "ens:assets:version"
GENERATED = "assets"  # the `generated` field of the profiles made here
FAULT_CLASS = "comm-fault"
SENSOR_PREFIX = "comm-fault:"
GATEWAY_PREFIX = "comm-fault-gw:"
DEFAULT_SEVERITY = "major"
SENSOR_ATTR = "sensor"  # the event attribute a sensor's id is in


def key(kind: str, aid: str) -> str:
    return f"{kind}/{aid}"


@dataclass(frozen=True, slots=True)
class ImportResult:
    added: int
    changed: int
    unchanged: int
    removed: int
    faults: int  # assets with a sensor-silent fault profile after the change
    profiles_written: int
    profiles_deleted: int

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


def fault_profile(rec: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The generated profile (id, stored record without times) of an asset record, or None
    (no expected interval)."""
    interval = rec.get("interval")
    if interval is None:
        return None
    aid, kind = rec["id"], rec.get("kind", "sensor")
    attr, pid = (SENSOR_ATTR, SENSOR_PREFIX) if kind == "sensor" else ("gateway", GATEWAY_PREFIX)
    cond = f"{attr} = {json.dumps(aid)}"
    if _integer(aid):  # a gateway may send the id as a JSON number: both forms are the sensor
        cond = f"({cond} or {attr} = {aid})"
    fault = rec.get("fault") or {}
    labels = {"class": FAULT_CLASS, kind: aid}
    labels.update({k: rec[k] for k in ("point", "room", "floor", "building") if rec.get(k)})
    spec = AlarmSpec(
        severity=rec.get("severity") or fault.get("severity") or DEFAULT_SEVERITY,
        clear="on",
        clear_on=cond,
        labels=tuple(sorted(labels.items())),
    )
    return pid + aid, {
        "id": pid + aid,
        "expr": f"absent({cond}) within {_seconds(float(interval))}s",
        "subscriber": fault.get("subscriber"),
        "alarm": spec.to_json(),
        "generated": GENERATED,
    }


def _integer(aid: str) -> bool:
    """An id that a JSON number can spell (``101``; not ``0101``, not longer than an int64)."""
    return aid.isascii() and aid.isdigit() and len(aid) <= 18 and (aid == "0" or aid[0] != "0")


def _seconds(x: float) -> str:
    """A duration as the parser reads it (``1e+06`` is not a duration; ``1000000`` is)."""
    return str(int(x)) if x.is_integer() else repr(x)


def list_assets(r: redis.Redis) -> list[dict[str, Any]]:
    """Every asset record, by kind then id."""
    recs = [json.loads(rs.text(v)) for v in r.hgetall(ASSETS).values()]
    return sorted(recs, key=lambda a: (a.get("kind", "sensor"), a["id"]))


def get_asset(r: redis.Redis, aid: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The assets named ``aid`` (a sensor and a gateway may share a name), with their fault
    profile's id when they have one."""
    out = []
    for k in (kind,) if kind else ("sensor", "gateway"):
        raw = r.hget(ASSETS, key(k, aid))
        if raw is not None:
            rec = json.loads(rs.text(raw))
            gen = fault_profile(rec)
            rec["fault_profile"] = gen[0] if gen else None
            out.append(rec)
    return out


def version(r: redis.Redis) -> int:
    return int(r.get(VERSION) or 0)


def import_registry(
    r: redis.Redis,
    reg: Registry,
    *,
    replace: bool = False,
    severity: str | None = None,
    subscriber: str | None = None,
) -> ImportResult:
    """Store the registry's assets (``replace``: and remove every other) with their fault
    profiles, in one transaction. The fault severity: the asset's own, else ``severity``, else
    the file's ``fault.severity``, else major; the subscriber: ``subscriber``, else the
    file's. AssetError (nothing stored) for an unknown subscriber."""
    sub = subscriber or reg.fault_subscriber
    if sub is not None and not r.hexists(store.SUBSCRIBERS, sub):
        raise AssetError(f"fault subscriber {sub!r}: no such subscriber (add it first)")
    fault = {"severity": severity or reg.fault_severity or DEFAULT_SEVERITY, "subscriber": sub}
    new = {key(a.kind, a.id): _record(a, fault) for a in reg.assets}
    return _commit(r, new, replace=replace, drop=())


def remove_assets(r: redis.Redis, keys: list[str]) -> ImportResult:
    """Remove assets (``KIND/ID`` keys) and their fault profiles, in one transaction."""
    return _commit(r, {}, replace=False, drop=tuple(keys))


def _record(a: Asset, fault: dict[str, Any]) -> dict[str, Any]:
    rec = a.to_json()
    rec["fault"] = {k: v for k, v in fault.items() if v is not None}
    return rec


def _same(old: dict[str, Any] | None, rec: dict[str, Any]) -> bool:
    return old is not None and {k: v for k, v in old.items() if k != "updated"} == rec


def _profile_changes(
    final: dict[str, dict[str, Any]], have: dict[str, dict[str, Any]], now: float
) -> tuple[dict[str, dict[str, Any]], dict[str, str], list[str]]:
    """The generated fault profiles the registry ``final`` wants, those of them to write (new
    or changed, keeping their creation time) and the stored ones (``have``) to delete."""
    want = {}
    for rec in final.values():
        gen = fault_profile(rec)
        if gen is not None:
            want[gen[0]] = gen[1]
    write: dict[str, str] = {}
    for pid, prof in want.items():
        cur = have.get(pid)
        if cur is not None and all(cur.get(k) == v for k, v in prof.items()):
            continue
        created = cur["created"] if cur is not None else now
        write[pid] = rs.dumps({**prof, "created": created, "updated": now})
    delete = [pid for pid in have if pid not in want]
    return want, write, delete


def _commit(
    r: redis.Redis, new: dict[str, dict[str, Any]], *, replace: bool, drop: tuple[str, ...]
) -> ImportResult:
    """Write the registry ``old (+ new | new only) - drop`` and make the generated profiles
    follow; retried if another change came in between (WATCH on the version)."""
    while True:
        with r.pipeline(transaction=True) as p:
            try:
                p.watch(VERSION)
                old = {rs.text(k): json.loads(rs.text(v)) for k, v in p.hgetall(ASSETS).items()}
                gone = (
                    [k for k in old if k not in new] if replace else [k for k in drop if k in old]
                )
                final = {k: v for k, v in old.items() if k not in gone}
                final.update(new)
                now = time.time()
                want, write, delete = _profile_changes(final, _generated(p), now)
                changed = {k: v for k, v in new.items() if not _same(old.get(k), v)}
                p.multi()
                if changed:
                    p.hset(
                        ASSETS,
                        mapping={k: rs.dumps({**v, "updated": now}) for k, v in changed.items()},
                    )
                if gone:
                    p.hdel(ASSETS, *gone)
                if write:
                    p.hset(rs.PROFILES, mapping=write)  # type: ignore[arg-type]
                if delete:
                    p.hdel(rs.PROFILES, *delete)
                if changed or gone or write or delete:
                    p.incr(VERSION)
                    p.xadd(
                        rs.CONTROL,
                        {"op": "assets"},
                        maxlen=rs.CONTROL_MAXLEN,
                        approximate=True,
                    )
                p.execute()
            except redis.WatchError:
                continue
        added = sum(1 for k in changed if k not in old)
        return ImportResult(
            added=added,
            changed=len(changed) - added,
            unchanged=len(new) - len(changed),
            removed=len(gone),
            faults=len(want),
            profiles_written=len(write),
            profiles_deleted=len(delete),
        )


def _generated(r: Any) -> dict[str, dict[str, Any]]:
    """The stored profiles this module generated, by id."""
    ids = [
        pid
        for pid in map(rs.text, r.hkeys(rs.PROFILES))
        if pid.startswith((SENSOR_PREFIX, GATEWAY_PREFIX))
    ]
    out: dict[str, dict[str, Any]] = {}
    for pid, raw in zip(ids, r.hmget(rs.PROFILES, ids) if ids else [], strict=True):
        if raw is None:
            continue
        rec = json.loads(rs.text(raw))
        if rec.get("generated") == GENERATED:
            out[pid] = rec
    return out
