"""What one `ens spark stream` task does with a route's events, on plain Python values (tests
need no Spark).

`KeyEngine` is one ENS engine per route (a key value, a value of another `per` attribute, a
shard of the unpartitioned profiles; `adapters.spark.routes`) whose state is kept in pieces in
Spark's per-key state (`adapters.spark.keyed`): a header, the reorder buffer, the engine header
and one record per profile partition; the compiled profiles are the Python worker's
(`compiled`). It is deterministic given its inputs, because Spark re-executes a micro-batch
after a crash from the offsets and state it checkpointed, and the re-execution must decide
exactly what the first one did. `stateless` runs the bare filters for the source.

The other parts of a task are modules of their own: the profile log and the profile versions
(`adapters.spark.profile_log`, `adapters.spark.versions`), the idempotent writes to the
outbox and ``ens:late`` (`adapters.spark.sinks`), reading ingest entries
(`adapters.spark.ingest`) and the gateways' watermark (`adapters.spark.watermark`).

Notification ids keep the worker's form ``f"{profile}:{epoch}:{seq}"``: ``seq`` is the
detection counter of the engine that found it (part of its state), ``epoch`` is the
query's epoch (drawn when a query starts without a checkpoint, carried in its offsets) and a
hash of the key value, so two keys' engines never give the same id. Bare filters
(stateless) use the event key (``entry-id.i``) for ``seq``.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapters.service import redis_store as rs
from adapters.service.feeding import feed, is_late, log_late
from adapters.service.late import LateRecord

# the names keyed.py, bench/spark_tasks.py and the tests take from here
from adapters.spark.clients import client as client
from adapters.spark.profile_log import ProfileLog as ProfileLog
from adapters.spark.routes import ROUTES as ROUTES
from adapters.spark.routes import TICK as TICK
from adapters.spark.routes import class_of_route
from adapters.spark.sinks import LateOutput as LateOutput
from adapters.spark.sinks import Outbox as Outbox
from adapters.spark.versions import Version, Versions
from adapters.spark.versions import versions as versions
from adapters.spark.watermark import gateway_watermark as gateway_watermark
from adapters.spark.watermark import merge_progress as merge_progress
from adapters.spark.watermark import whole_ms as whole_ms
from filters.engine import Engine
from filters.notification import Notification
from filters.partitions import PartId, PartitionedEngine, encode_id
from filters.restore import Skipped
from notifiers.records import outbox_notification
from profiles.events import Event

log = logging.getLogger("ens.spark.stream")

# ------------------------------------------------------------------ engines


def arrival(event_key: str) -> tuple[int, int, int]:
    """The ingest order of an event key (``ms-seq`` or ``ms-seq.i``): the tie-break of ts."""
    eid, _, i = event_key.partition(".")
    ms, seq = rs.parse_id(eid)
    return ms, seq, int(i or 0)


def record(n: Notification, epoch: str, seq: Any = None) -> dict[str, Any]:
    """The outbox record, as the service's worker writes it (`outbox_notification`)."""
    return outbox_notification(n, epoch, seq)


def route_epoch(epoch: str, route: str) -> str:
    return epoch + hashlib.sha1(route.encode()).hexdigest()[:8]


@dataclass
class Row:
    """One input row of a key's engine: an event (``key`` set) or a tick (only ``ts``)."""

    key: str | None
    gw: str
    ts: float | None
    ev: bytes | None  # the pickled Event
    plog: str
    epoch: str
    counted: bool = True  # False: the global engine's copy of an event a keyed engine counts


Held = tuple[float, tuple[int, int, int], str, str, Event]  # ts, arrival, event key, gw, event


@dataclass
class Stepped:
    """What one call of `KeyEngine.step` / `KeyEngine.run` gives back."""

    blob: bytes | None  # `step`: the new state as one blob (None: nothing changed)
    due: float  # the earliest ts it waits for (a held event or a timer); inf if none
    records: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0  # events fed (not counting the global engine's copies of keyed events)
    late: int = 0
    held: int = 0
    late_keys: dict[str, str] = field(default_factory=dict)  # late event key -> gateway
    late_records: list[LateRecord] = field(default_factory=list)  # for ens:late (output)
    # `run`: the state in pieces, each None when unchanged
    hdr: dict[str, Any] | None = None  # the header (small: read on every call)
    append: list[Held] = field(default_factory=list)  # held events to append (list not read)
    held_list: list[Held] | None = None  # the whole held list to store (it was read)
    eng: tuple[bytes, dict[str, Any]] | None = None  # engine header, {"dues", "have"}
    parts_read: int = 0  # partition records read
    parts_written: int = 0
    restores: int = 0  # whole-route loads (every record: a profile change)
    timer_ms: int | None = None  # the Spark event-time timer to have (ms), None: none


_live: dict[str, tuple[str, int, Engine]] = {}  # route -> (epoch, gen, engine): no restore
_skip_warned: set[str] = set()  # profiles whose state a restore left out, logged (per process)
_dropped = 0  # engines this process let go of since its last full collection
_calls = 0  # calls since then


def settle_garbage(dropped: int = 0) -> None:
    """In a Spark Python worker: freeze what is alive, collect in full only now and then.

    PySpark's daemon calls ``gc.collect()`` after every task of a reused worker: a full
    collection walks every engine the worker keeps (`_live`: up to one per route, ~15k objects
    each with 3,000 profiles) and the parsed profiles, 0.1-0.5 s per task, and automatic
    generation-2 collections did the same during restores (2-5x the restore itself). Objects
    alive after a step are moved to the permanent generation (`gc.freeze`, O(1)), which
    collections skip; the cyclic garbage frozen with them (engines dropped for a newer state)
    is collected in full once as many engines were dropped as are alive (amortized: a full
    collection per engine dropped walks about one engine), or every 200 calls.
    """
    global _dropped, _calls
    try:
        from pyspark import TaskContext
    except ImportError:
        return
    if TaskContext.get() is None:  # not in a Spark task (tests, the driver): leave gc alone
        return
    _dropped += dropped
    _calls += 1
    if _dropped >= max(8, len(_live)) or _calls >= 200:
        gc.unfreeze()
        gc.collect()
        _dropped = _calls = 0
    gc.freeze()


def timer_ms(due: float, held_min: float) -> int | None:
    """The Spark event-time timer (whole ms) that wakes a route when something is due: a held
    event is released at a watermark >= its ts, an engine timer fires at one > its time."""
    t = min(
        math.ceil(round(held_min * 1000, 3)) if held_min < math.inf else math.inf,
        math.floor(round(due * 1000, 3)) + 1 if due < math.inf else math.inf,
    )
    return None if t == math.inf else int(t)


class Records(Protocol):
    """A route's partition records by `encode_id` (Spark: a MapState; `KeyEngine.step`: a dict)."""

    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self) -> list[str]: ...


class Known:
    """A route's records by partition id, with the set of those that exist (kept in the
    route's state): a partition an event reaches but that holds nothing (most of them: a
    `per room` sequence's later component reaches every such profile) costs no state call
    to read or delete, and no `encode_id`.

    Small records are kept `inline`, in the value that holds the route's engine header (read
    whenever the engine runs, written whenever it ran): a route whose records are small
    costs no state call per record (each is a round trip to the JVM, ~100 µs, where copying a
    few kB more is a few µs; a record of a `per room` sequence is ~0.6 kB). A record over `INLINE_MAX` bytes, or past `INLINE_TOTAL` for
    the route, goes to `records` (Spark: the MapState)."""

    INLINE_MAX = 4096
    INLINE_TOTAL = 32768

    def __init__(
        self, records: Records, have: set[PartId], inline: dict[PartId, bytes] | None = None
    ) -> None:
        self.records = records
        self.have = have
        self.inline = inline if inline is not None else {}
        self.size = sum(len(d) for d in self.inline.values())

    def get(self, part: PartId) -> bytes | None:
        got = self.inline.get(part)
        if got is not None:
            return got
        return self.records.get(encode_id(part)) if part in self.have else None

    def put(self, part: PartId, data: bytes) -> None:
        old = self.inline.get(part)
        size = self.size - (len(old) if old is not None else 0)
        if len(data) <= self.INLINE_MAX and size + len(data) <= self.INLINE_TOTAL:
            if old is None and part in self.have:  # it was in the map
                self.records.delete(encode_id(part))
            self.inline[part] = data
            self.size = size + len(data)
        else:
            if old is not None:
                del self.inline[part]
                self.size = size
            self.records.put(encode_id(part), data)
        self.have.add(part)

    def delete(self, part: PartId) -> None:
        old = self.inline.pop(part, None)
        if old is not None:
            self.size -= len(old)
        elif part in self.have:
            self.records.delete(encode_id(part))
        self.have.discard(part)

    def keys(self) -> list[PartId]:
        return sorted(self.have, key=encode_id)


class DictRecords(dict[str, bytes]):
    """`Records` in a dict."""

    def put(self, key: str, data: bytes) -> None:
        self[key] = data

    def delete(self, key: str) -> None:
        self.pop(key, None)

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())


_compiled: dict[tuple[str, str, str, str, int], PartitionedEngine] = {}  # per Python worker


def compiled(versions: Versions, ver: str, cls: str, tz: str, plan: tuple[str, Any]) -> Any:
    """The compiled profiles of a route class at a profile version, as a `PartitionedEngine`
    holding no state: built once per Python worker and version, shared by its routes (each
    step `begin`s with a route's header and `end`s with none)."""
    k = (ver, cls, tz, plan[0], id(plan[1]))
    pe = _compiled.get(k)
    if pe is None:
        if len(_compiled) >= 8:
            _compiled.pop(next(iter(_compiled)))
        eng = Engine(list(versions.at(ver).of(cls).values()), tz=tz, plan=plan[0], rates=plan[1])
        pe = _compiled[k] = PartitionedEngine(eng, shared=True)
    return pe


class KeyEngine:
    """One route's engine, its reorder buffer and its applied profiles.

    The state is in pieces (`run`): a small header (versions, engine time, next due time,
    held count), the held events (a list, appended to without reading it while nothing is
    due), the engine header with the partitions' due times (read when the engine runs), and
    one record per profile partition (`filters.partitions`: only those the step's events
    reach or has due are read, only those it changed written). The compiled profiles are
    the Python worker's (`compiled`). `step` keeps all of it in one blob (tests).
    """

    def __init__(
        self,
        route: str,
        versions: Versions,
        tz: str = "UTC",
        plan: tuple[str, Any] = ("eager", None),
        late_events: str = "output",
    ) -> None:
        self.route = route
        self.late_events = late_events  # "output": late events go to ens:late; "feed": fed
        self.versions = versions
        self.tz = tz
        self.plan = plan  # --plan / --stats: the engines' evaluation plan
        self.cls = class_of_route(route)
        self.starts_at_first = self.cls[:1] == "g"  # no partition: starts with the stream
        self.engine: Engine | None = None  # the engine of the last step (tests)
        self.dropped = 0  # kept for `settle_garbage`: nothing is dropped per step any more

    def step(self, blob: bytes | None, rows: list[Row], wm: float | None) -> Stepped:
        """`run` with the state as one pickled blob (tests): {"hdr", "eng", "held", "parts"}."""
        st = pickle.loads(blob) if blob is not None else None  # noqa: S301 - our own state
        recs = DictRecords((st or {}).get("parts", {}))
        out = self.run(
            (st or {}).get("hdr"),
            rows,
            wm,
            lambda: [(*h[:4], Event(*h[4])) for h in st["held"]],  # type: ignore[index]
            lambda: st["eng"],  # type: ignore[index]
            recs,
        )
        held = out.held_list if out.held_list is not None else (st or {}).get("held", [])
        new = {
            "hdr": out.hdr,
            "eng": out.eng if out.eng is not None else (st or {}).get("eng"),
            "held": [
                h if not isinstance(h[4], Event) else (*h[:4], (h[4].id, h[4].ts, h[4].attrs))
                for h in [*held, *out.append]
            ],
            "parts": dict(recs),
        }
        out.blob = pickle.dumps(new, pickle.HIGHEST_PROTOCOL)
        return out

    def run(
        self,
        hdr: dict[str, Any] | None,
        rows: list[Row],
        wm: float | None,
        load_held: Callable[[], list[Held]],
        load_eng: Callable[[], tuple[bytes | None, dict[str, Any]]],
        records: Records,
    ) -> Stepped:
        """Take the rows, apply the batch's profile version, feed what the watermark `wm`
        releases (in ts, then ingest order), advance to `wm` if a timer falls due before it.

        The engine runs only when it must: a new profile version, a late event to feed, or
        something due by `wm` (a held event, a partition's timer, a clock); otherwise the new
        events are only appended to the held list and nothing else is read. When it runs, it
        reads the held events (`load_held`), the engine header and due times (`load_eng`) and
        the records of the partitions the released events reach or has due; it writes the
        records it changed to `records` (`Stepped.eng`: the new engine header and due times).

        An event older than the engine's time is late (the worker's rule,
        `adapters.service.intake`): kept out of the engine, in `Stepped.late_records`, or fed
        at once with ``late_events="feed"``. Engine time moves to `wm` only when a timer falls
        due before it, so an engine with nothing due keeps the time of its last event and does
        not make events late that nothing has been decided past (the wall clock's watermark,
        ``--clock wall``, moves on every batch)."""
        out = Stepped(None, float("inf"))
        new_route = hdr is None
        if hdr is None:
            hdr = self._new_header(rows)
        else:
            hdr = dict(hdr)
            hdr["copies"] = set(hdr.get("copies", ()))
        ver = max((r.plog for r in rows), key=rs.parse_id, default=None)
        starts = [r.ts for r in rows if r.ts is not None]
        first = self.starts_at_first and hdr["now"] is None and bool(starts)
        must = new_route or first or (ver is not None and ver != hdr["ver"])
        copies = {r.key for r in rows if not r.counted}
        new, fed_late = self._arrived(rows, hdr["now"], copies, out)
        held_min = min(hdr["held_min"], min((h[0] for h in new), default=math.inf))
        copies = copies & {h[2] for h in new} | hdr["copies"]
        due = wm is not None and (held_min <= wm or hdr["timer"] < wm)
        if not (must or fed_late or due):  # nothing to run: the new events wait in the list
            out.append = new
            hdr.update(nheld=hdr["nheld"] + len(new), held_min=held_min, copies=copies)
        else:
            held = (load_held() if hdr["nheld"] else []) + new
            held.sort(key=lambda h: (h[0], h[1]))
            n = 0
            if wm is not None:
                while n < len(held) and held[n][0] <= wm:
                    n += 1
            self._run(hdr, ver, starts, fed_late, held[:n], wm, load_eng, records, out)
            out.events += sum(held[i][2] not in copies for i in range(n))
            out.held_list = held[n:]
            hdr.update(
                nheld=len(out.held_list),
                held_min=out.held_list[0][0] if out.held_list else math.inf,
                copies={h[2] for h in out.held_list} & copies,
            )
        hdr["late"] = hdr.get("late", 0) + out.late
        out.hdr = hdr
        out.held = hdr["nheld"]
        out.due = min(hdr["held_min"], hdr["timer"])
        out.timer_ms = timer_ms(hdr["timer"], hdr["held_min"])
        return out

    def _new_header(self, rows: list[Row]) -> dict[str, Any]:
        """The header of a route's first step (its epoch: the query's, from its rows)."""
        epoch = next((r.epoch for r in rows), "")
        return {
            "ver": None,
            "epoch": route_epoch(epoch, self.route),
            "now": None,
            "timer": math.inf,
            "nheld": 0,
            "held_min": math.inf,
            "copies": set(),
            "late": 0,
        }

    def _arrived(
        self, rows: list[Row], now: float | None, copies: set[str | None], out: Stepped
    ) -> tuple[list[Held], list[tuple[Event, str, str]]]:
        """The rows' events in ingest order, split at the engine's time `now`: those to hold
        (not late), and the late ones to feed at once (``late_events="feed"``; otherwise
        they go to `out.late_records`). Late events are counted in `out`."""
        new: list[Held] = []
        fed_late: list[tuple[Event, str, str]] = []
        for r in sorted((r for r in rows if r.key is not None), key=lambda r: arrival(r.key)):  # type: ignore[arg-type]
            ev = pickle.loads(r.ev)  # type: ignore[arg-type]  # noqa: S301 - the reader's
            if is_late(now, ev.ts):
                out.late += 1
                out.late_keys[r.key] = r.gw  # type: ignore[index]
                if self.late_events == "feed":
                    fed_late.append((ev, r.key, r.gw))  # type: ignore[arg-type]
                    out.events += r.key not in copies
                else:
                    out.late_records.append(LateRecord.of(ev, r.key, r.gw, now))  # type: ignore[arg-type]
                    if out.late <= 10:
                        assert now is not None  # (late: behind the engine's time)
                        _log_late(now, ev, r.gw, "sent to the late output (not matched)")
            else:
                new.append((ev.ts, arrival(r.key), r.key, r.gw, ev))  # type: ignore[arg-type]
        return new, fed_late

    def _run(
        self,
        hdr: dict[str, Any],
        ver: str | None,
        starts: list[float],
        fed_late: list[tuple[Event, str, str]],
        released: list[Held],
        wm: float | None,
        load_eng: Callable[[], tuple[bytes | None, dict[str, Any]]],
        records: Records,
        out: Stepped,
    ) -> None:
        """The engine's part of `run`: load what the step needs, step, store what changed."""
        eh, meta = load_eng() if hdr["ver"] is not None else (None, {})
        dues: dict[PartId, float] = dict(meta.get("dues", {}))
        known = Known(records, set(meta.get("have", ())), dict(meta.get("inline", {})))
        upgrade = ver is not None and ver != hdr["ver"] and hdr["ver"] is not None
        if upgrade:  # a profile change: every record of the route, in an engine of its own
            pe = self._upgrade(eh, hdr["ver"], ver, known, dues, out)  # type: ignore[arg-type]
            loaded = set(pe.loaded())
        else:
            pe = compiled(self.versions, ver or hdr["ver"], self.cls, self.tz, self.plan)
            pe.begin(eh)
            loaded = set()
        hdr["ver"] = ver or hdr["ver"]
        engine = pe.engine
        self.engine = engine
        if self.starts_at_first and engine.now is None and starts:
            pe.advance(min(starts))  # starts at the stream's first event (replay's rule)
        events = [e for e, _k, _g in fed_late] + [h[4] for h in released]
        until = wm if wm is not None else (engine.now if engine.now is not None else -math.inf)
        gone: dict[str, int] = {}
        for part in pe.wanted(events, dues, until, known.have):
            if part in loaded or part not in known.have:
                continue
            data = known.get(part)
            if data is None:
                continue
            out.parts_read += 1
            if not pe.load(part, data):  # its profile is gone (removed, `once` reported)
                known.delete(part)
                dues.pop(part, None)
                gone[part[0]] = gone.get(part[0], 0) + 1
        if gone:
            self._report(Skipped({p: {"partitions": n} for p, n in gone.items()}))
        for i, (ev, key, gw) in enumerate(fed_late):
            self._feed(pe, ev, key, gw, late=i < 10)
        for h in released:
            self._feed(pe, h[4], h[2], h[3])
        nxt = min([engine.timers.head, *dues.values()])
        if wm is not None and engine.now is not None and wm > engine.now and nxt < wm:
            pe.advance(wm)
        for part, rec in pe.changed().items():
            if rec is None:
                known.delete(part)
                dues.pop(part, None)
            else:
                known.put(part, rec.data)
                out.parts_written += 1
                if rec.due is None:
                    dues.pop(part, None)
                else:
                    dues[part] = rec.due
        retired = pe.retired()
        if retired:  # a `once` profile reported: its records go
            for part in known.keys():
                if part[0] in retired:
                    known.delete(part)
                    dues.pop(part, None)
        out.records = [record(x, hdr["epoch"]) for x in pe.take_notifications()]
        hdr["now"] = engine.now
        hdr["timer"] = min([engine.timers.head, *dues.values()])
        meta = {"dues": dues, "have": known.have, "inline": known.inline}
        out.eng = (pe.end() if not upgrade else pe.header(), meta)

    def _upgrade(
        self,
        eh: bytes,
        old: str,
        ver: str,
        records: Known,
        dues: dict[PartId, float],
        out: Stepped,
    ) -> Any:
        """The route's whole state in an engine of its own, the profiles of version `ver`
        applied to it (removed and changed ones dropped, new ones activated at its time)."""
        v_old = self.versions.at(old)
        have = v_old.of(self.cls)
        order = [p for p in PartitionedEngine.profile_order(eh) if p in have]
        order += [p for p in have if p not in order]
        engine = Engine([have[p] for p in order], tz=self.tz, plan=self.plan[0], rates=self.plan[1])
        pe = PartitionedEngine(engine, shared=True)
        pe.begin(eh)
        out.restores += 1
        for part in records.keys():
            data = records.get(part)
            if data is None:
                continue
            out.parts_read += 1
            if not pe.load(part, data):
                records.delete(part)
                dues.pop(part, None)
        v = self.versions.at(ver)
        self._apply(engine, {"ver": old}, v)
        keep = v.of(self.cls)
        for part in records.keys():  # records of the profiles dropped or changed
            pid = part[0]
            if pid not in keep or v.sigs.get(pid) != v_old.sigs.get(pid):
                records.delete(part)
                dues.pop(part, None)
        pe._mark(pe.loaded())  # noqa: SLF001 - every partition kept is stored again
        return pe

    def _apply(self, engine: Engine, st: dict[str, Any], v: Version) -> None:
        """Make the engine's profiles those of this class in version `v` (what changed only)."""
        want = v.of(self.cls)
        old = self.versions.at(st["ver"])
        defs = {pid: old.sigs[pid] for pid in old.of(self.cls)}
        for pid in list(defs):
            if pid not in want or v.sigs.get(pid) != defs[pid]:
                try:
                    engine.remove_profile(pid)
                except KeyError:  # a `once` profile that fired has removed itself
                    pass
                del defs[pid]
        for pid, p in want.items():
            if pid not in defs:
                engine.add_profile(p)
                defs[pid] = v.sigs[pid]
        st["ver"] = v.log_id

    def _report(self, skipped: Skipped) -> None:
        """Log what a restore left out (state of removed profiles: it can produce nothing),
        once per profile and process, as the service's checkpointer does."""
        new = Skipped(
            {p: c for p, c in skipped.removed.items() if p not in _skip_warned},
            {p: n for p, n in skipped.inactive.items() if p not in _skip_warned},
        )
        if new:
            _skip_warned.update(new.removed, new.inactive)
            log.warning(
                "restore of route %s left out engine state of profiles that no longer exist: %s",
                self.route,
                new.describe(),
            )

    def _feed(self, pe: Any, ev: Event, key: str, gw: str, late: bool = False) -> None:
        if late:
            _log_late(pe.engine.now, ev, gw, "processed in arrival order")
        feed(pe.process, ev, gw, log)  # the service's rule: a poison event is logged, skipped


def _log_late(now: float, ev: Event, gw: str, what: str) -> None:
    log_late(log, now, ev, gw, what)  # the service's line


# `stateless`'s engines by (profile version, tz), with the `Versions` they were built from
_bare: dict[tuple[str, str], tuple[Versions, Engine | None]] = {}


def stateless(
    versions: Versions, log_id: str, epoch: str, events: list[tuple[str, Event]], tz: str = "UTC"
) -> list[dict[str, Any]]:
    """Bare filters over events in any order: each match on its own, id by event key. The
    engine is built once per Python worker and profile version (`_bare`): it holds no state
    a later call could see (bare filters keep none; notification ids are event keys)."""
    if not events:
        return []
    k = (log_id, tz)
    got = _bare.get(k)
    if got is None or got[0] is not versions:  # (another store's versions: built again)
        profiles = list(versions.at(log_id).by_class["s"].values())
        if len(_bare) >= 4:
            _bare.pop(next(iter(_bare)))
        got = _bare[k] = (versions, Engine(profiles, tz=tz) if profiles else None)
    engine = got[1]
    if engine is None:
        return []
    out = []
    for key, ev in events:
        engine.process(ev)
        for n in engine.take_notifications():
            out.append(record(n, epoch + "s", key))
    return out
