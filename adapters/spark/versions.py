"""The executors' profile sets: the profile log read at a log id, parsed once per process.

A micro-batch names a profile-log entry (`adapters.spark.profile_log`); every task of it builds
the same `Version` from it. Parsing is the slow part (10^4 profiles: 2 s per Python worker), so
parsed profiles are pickled in Redis (``ens:spark:ast:*``) for the other workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapters.spark.clients as clients
import adapters.spark.routes as routes
from adapters.service import redis_store as rs
from adapters.spark.profile_log import PLOG
from profiles.ast import Profile
from profiles.errors import ProfileError

log = logging.getLogger("ens.spark.stream")

PARSED = "ens:spark:ast:"  # + sha1 of (code, id, expr, subscriber): the parsed profile (TTL)


@dataclass
class Version:
    """The profiles of one log entry, parsed, by class."""

    log_id: str
    profiles: dict[str, Profile]  # all of them (restore resolves snapshot references here)
    by_class: dict[str, dict[str, Profile]]  # 's', 'k', GLOBAL (all others) and route classes
    sigs: dict[str, tuple[str, str | None]]  # pid -> (expr, subscriber)

    def of(self, cls: str) -> dict[str, Profile]:
        return self.by_class.get(cls, {})


_ast_tag: list[str] = []


def _ast_version() -> str:
    """A digest of the code that defines parsed profiles: pickles of another version of it
    (a rolling upgrade, a checkout with other AST classes) are never read."""
    if not _ast_tag:
        import profiles

        root = Path(profiles.__file__).parent
        h = hashlib.sha1()
        for f in sorted(p for p in root.iterdir() if p.suffix in (".py", ".lark")):
            h.update(f.read_bytes())
        _ast_tag.append(h.hexdigest()[:12])
    return _ast_tag[0]


class Versions:
    """The executors' side: profile sets by log id, parsed once per process (a small cache)."""

    def __init__(self, r: Any, key: str) -> None:
        self.r = r
        self.key = key
        self.parsed: dict[tuple[str, str, str | None], Profile | None] = {}
        self.cache: dict[str, Version] = {}

    def _parse(self, pid: str, expr: str, sub: str | None) -> Profile | None:
        k = (pid, expr, sub)
        if k not in self.parsed:
            try:  # the API validated it; a hand-edited hash is logged and left out
                self.parsed[k] = rs.validate_profile(None, pid, expr, sub)
            except ProfileError as exc:
                log.error("ignoring invalid stored profile %s: %s", pid, exc)
                self.parsed[k] = None
        return self.parsed[k]

    def _load(self, sigs: dict[str, tuple[str, str | None]], ttl: int = 7 * 86400) -> None:
        """Fill `parsed` for `sigs` from ``ens:spark:ast:*`` and store what had to be parsed.

        Every Python worker needs the parsed profiles, and Spark starts workers as tasks need
        them (and stops them after a minute idle): parsing 10^4 profiles is 2 s per worker,
        loading their pickles 0.3 s. A definition's AST is a pure function of it, so a stale or
        concurrent write stores the same thing.
        """
        todo = [
            k for k in ((pid, e, sub) for pid, (e, sub) in sigs.items()) if k not in self.parsed
        ]
        if not todo:
            return
        names = [
            PARSED + hashlib.sha1(json.dumps([_ast_version(), *k]).encode()).hexdigest()
            for k in todo
        ]
        fresh = {}
        for i in range(0, len(todo), 5000):
            for k, name, raw in zip(
                todo[i : i + 5000],
                names[i : i + 5000],
                self.r.mget(names[i : i + 5000]),
                strict=True,
            ):
                try:
                    p = pickle.loads(raw) if raw is not None else None  # noqa: S301 - ours
                except Exception:  # noqa: BLE001 - written by another version: parse again
                    p = None
                if isinstance(p, Profile) and p.id == k[0]:
                    self.parsed[k] = p
                elif self._parse(*k) is not None:
                    fresh[name] = pickle.dumps(self.parsed[k], pickle.HIGHEST_PROTOCOL)
        if fresh:
            with self.r.pipeline(transaction=False) as p:
                for name, blob in fresh.items():
                    p.set(name, blob, ex=ttl)
                p.execute()

    def at(self, log_id: str) -> Version:
        v = self.cache.get(log_id)
        if v is not None:
            return v
        base = max(
            (c for c in self.cache.values() if rs.parse_id(c.log_id) < rs.parse_id(log_id)),
            key=lambda c: rs.parse_id(c.log_id),
            default=None,
        )
        sigs = dict(base.sigs) if base else {}
        lo = f"({base.log_id}" if base else "-"
        for _eid, f in self.r.xrange(PLOG, min=lo, max=log_id):
            for pid, d in json.loads(f[b"d"]).items():
                if d is None:
                    sigs.pop(pid, None)
                else:
                    sigs[pid] = (d[0], d[1])
        profiles: dict[str, Profile] = {}
        by_class: dict[str, dict[str, Profile]] = {"s": {}, "k": {}, routes.GLOBAL: {}}
        self._load(sigs)
        for pid, (expr, sub) in sigs.items():
            p = self._parse(pid, expr, sub)
            if p is not None:
                profiles[pid] = p
                by_class[routes.profile_class(p, self.key)][pid] = p
                rc = routes.route_class(p, self.key)
                if rc not in by_class:
                    by_class[rc] = {}
                if rc not in ("s", "k"):
                    by_class[rc][pid] = p
        v = Version(log_id, profiles, by_class, sigs)
        if len(self.cache) >= 4:
            self.cache.pop(min(self.cache, key=rs.parse_id))
        self.cache[log_id] = v
        return v


_versions: dict[tuple[str, str], Versions] = {}


def versions(url: str, key: str) -> Versions:
    """The process's `Versions` of a Redis and `--key`."""
    v = _versions.get((url, key))
    if v is None:
        v = _versions[(url, key)] = Versions(clients.client(url), key)
    return v
