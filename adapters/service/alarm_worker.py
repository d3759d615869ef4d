"""The alarm part of the engine worker: notifications of alarm profiles -> `AlarmRules`, with
the same exactly-once discipline as the outbox (module docstring of `adapters.service.worker`).

The rules are deterministic: given the same notifications, commands and times, they give the
same transitions with the same ids. Each commit (and snapshot) runs one **alarm step** — the
alarm notifications it commits, in detection order, then the operator commands read since the
last commit (`adapters.service.alarm_store`), then ``advance(t)`` to the engine time ``t`` —
and writes its effects (history, the ``ens:alarms`` index, silences, outbox messages, command
replies) in the same MULTI/EXEC as its journal entry. The entry records the step's commands
and ``t`` (the notifications are reproduced by the engine), so a journal replay after a crash
rebuilds the same rules state and drops the effects, which were written already. The rules'
``snapshot()`` is stored with the engine checkpoint (field ``alarms`` of ``ens:checkpoint``).

A commit Redis refuses over ``maxmemory`` did not happen, and the worker keeps its state and
commits again (`adapters.service.pressure`). Its alarm step has changed the rules already and
consumed its commands, so the step is **held** (`AlarmPart.alarm_held`) until a commit writes
it: the retry feeds only the alarm notifications no held step fed, runs a step of its own for
them and for the commands read meanwhile, and writes every held step's effects; its journal
entry lists the steps in order (``{"steps": [...]}``, each with how many notifications it
fed), which the replay runs one by one.

A profile's `alarm:` comes with its stored definition; a `clear: {on: F}` (or a `clear: after`
the temporal pool can detect) registers the companion profile ``<id>#clear`` in the engine.
Notifications of alarm profiles and companions do not go to the outbox themselves: their
messages do.

With ``--routing FILE`` the rules get a `notifiers.routing.router.Router`: the subscribers of
each delivered transition come from the route tree, and escalation steps are timers of the same
step (so a journal replay fires them again without writing them twice). The pending steps are
part of the rules' snapshot, and each commit that changes one also writes it to
``ens:escalation:due`` (sorted set: occurrence -> due time) and ``ens:escalations`` (hash:
occurrence -> the next step), which `ens alarms show` reads.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from adapters.service import alarm_store as als
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.engine_state import LiveEngine, WorkerConfig
from filters.engine import Engine
from filters.notification import Notification
from notifiers import store
from notifiers.alarms import (
    AlarmNotFound,
    AlarmRules,
    AlarmStateConflict,
    Effects,
    GroupPolicy,
    Message,
    SilenceError,
)
from notifiers.records import owned
from notifiers.routing.router import Router
from profiles.alarm import CLEAR_SUFFIX, AlarmSpec, clear_companion
from profiles.ast import Profile
from profiles.errors import ProfileError

log = logging.getLogger("ens.service.worker")

CHECKPOINT_FIELD = "alarms"  # of ens:checkpoint: {"specs", "rules", "ctl"}
PRUNE_PER_STEP = 500  # closed alarms forgotten per commit at most (bounded work per commit)


@dataclass
class AlarmBatch:
    """One alarm step: what it journals (``entry``) and what it writes."""

    entry: dict[str, Any]
    effects: Effects
    replies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    silences: list[dict[str, Any]] = field(default_factory=list)
    # occurrence -> its next escalation step (None: none any more), as of the step
    escalations: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    pruned: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (id, labels)


class AlarmPart:
    """The alarm part of `EngineWorker`: `set_alarm` (with the profile's definition),
    `read_commands`, the step of each commit (`split`, `step`, `entry`, `write`,
    `published`) and its `replay`, the rules' checkpoint (`state`, `load`), `gauges`."""

    def __init__(self, r: redis.Redis, cfg: WorkerConfig, live: LiveEngine) -> None:
        self.r = r
        self.cfg = cfg
        self.live = live  # companion profiles go into its engine and definitions
        self.reset()

    @property
    def engine(self) -> Engine:
        return self.live.engine

    @property
    def defs(self) -> dict[str, Profile]:
        return self.live.defs

    @property
    def dirty(self) -> set[str]:
        return self.live.dirty

    @property
    def epoch(self) -> str:
        return self.live.epoch

    def _alarm_router(self) -> tuple[dict[str, GroupPolicy], GroupPolicy, Router | None]:
        """Grouping per subscriber, the default, and the router (``--routing``)."""
        routing = self.cfg.routing
        if routing is None:
            return {}, self.cfg.alarm_policy, None
        policies = dict(routing.grouping)
        default = policies.pop("*", self.cfg.alarm_policy)
        return policies, default, Router(routing)

    def reset(self) -> None:
        policies, default, router = self._alarm_router()
        self.router = router
        self.rules = AlarmRules({}, policies, default, router)
        self.alarm_specs: dict[str, dict[str, Any]] = {}  # profile id -> its `alarm:` (JSON)
        self.alarm_cmds: list[tuple[str, dict[str, Any]]] = []  # read, not applied yet
        self.alarm_control_id = "0-0"
        self.alarm_counted = 0.0  # monotonic time the counts were last made
        self.alarm_counts: dict[str, int] = {}  # "severity|state" -> alarms (heartbeat stats)
        self.alarm_dirty = False  # transitions since the last count
        self.escalations_gone: list[str] = []  # pending steps of a run with --routing, dropped
        self.alarm_held: list[AlarmBatch] = []  # steps applied to the rules, not committed yet
        self.alarm_fed = 0  # alarm notifications of the pending ones that held steps fed

    # ------------------------------------------------------------------ definitions
    def _is_alarm(self, pid: str) -> bool:
        return pid in self.alarm_specs or pid.endswith(CLEAR_SUFFIX)

    def set_alarm(self, pid: str, profile: Profile | None, alarm: dict[str, Any] | None) -> None:
        """Make ``alarm`` the `alarm:` of profile ``pid`` (None: not an alarm, or removed),
        with its companion profile in the engine."""
        comp_id = pid + CLEAR_SUFFIX
        if self.defs.pop(comp_id, None) is not None:
            try:
                self.engine.remove_profile(comp_id)
            except KeyError:
                pass
            self.dirty.add(comp_id)
        self.alarm_specs.pop(pid, None)
        self.rules.specs.pop(pid, None)
        if profile is None or alarm is None:
            return
        try:
            spec: AlarmSpec = rs.validate_alarm(profile, alarm)
        except ProfileError as exc:  # the API validates; this is a hand-edited hash
            log.error("ignoring the invalid alarm of profile %s: %s", pid, exc)
            return
        self.alarm_specs[pid] = alarm
        self.rules.specs[pid] = spec
        comp = clear_companion(profile, spec)
        if comp is not None:
            self.engine.add_profile(comp)
            self.defs[comp_id] = comp
            self.dirty.add(comp_id)

    # ------------------------------------------------------------------ state
    def load(self) -> None:
        """The rules as of the checkpoint (none: a new state)."""
        raw: Any = self.r.hget(rs.CHECKPOINT, CHECKPOINT_FIELD)
        if raw is None:
            return
        data = json.loads(raw)
        specs: dict[str, AlarmSpec] = {}
        for pid, alarm in data["specs"].items():
            prof = self.defs.get(pid)
            if prof is not None:
                specs[pid] = rs.validate_alarm(prof, alarm)
                self.alarm_specs[pid] = alarm
        policies, default, router = self._alarm_router()
        self.router = router
        self.rules = AlarmRules.restore(data["rules"], specs, policies, default, router)
        gone = [p["key"] for p in (data["rules"].get("router") or {}).get("pending", [])]
        if router is None and gone:  # started without --routing: nothing escalates any more
            self.escalations_gone = gone
            log.warning(
                "started without --routing: %d pending escalation(s) of the last run dropped",
                len(gone),
            )
        if router is not None and router.escalator.dropped:
            log.warning(
                "dropped %d pending escalation(s) whose policy is no longer in the routing "
                "file: %s",
                len(router.escalator.dropped),
                ", ".join(router.escalator.dropped[:10]),
            )
        self.alarm_control_id = data["ctl"]
        self.gauges(force=True)
        log.info(
            "restored alarm state: %d alarms, %d silences, command stream at %s",
            len(self.rules.book.alarms),
            len(self.rules.silences),
            self.alarm_control_id,
        )

    def state(self) -> str:
        return json.dumps(
            {
                "specs": self.alarm_specs,
                "rules": self.rules.snapshot(),
                "ctl": self.alarm_control_id,
            }
        )

    # ------------------------------------------------------------------ commands
    def read_commands(self) -> None:
        """Read operator commands (applied by the next commit, in order)."""
        for eid, cmd in als.read_commands(self.r, self.alarm_control_id):
            self.alarm_control_id = eid
            if time.time() - float(cmd.get("at", 0)) > als.COMMAND_MAX_AGE:
                log.warning("alarm command %s is too old and was not applied: %s", eid, cmd)
                continue
            self.alarm_cmds.append((eid, cmd))

    def wants_commit(self) -> bool:
        if self.alarm_cmds or self.escalations_gone or self.alarm_held:
            return True
        due = self.rules.due()
        now = self.engine.now
        if now is None:
            return False
        keep = self.cfg.alarm_closed_retention
        return (due is not None and due <= now) or (
            keep is not None and self.rules.book.prune_due(now - keep)
        )

    def _alarm_apply(self, cmd: dict[str, Any], t: float) -> tuple[Effects, dict[str, Any]]:
        """Apply one command at ``t``; its effects and its reply."""
        op = cmd.get("op")
        actor = str(cmd.get("actor") or "operator")
        try:
            if op == "ack":
                eff = self.rules.acknowledge(str(cmd["id"]), t, actor, str(cmd.get("note") or ""))
            elif op == "clear":
                eff = self.rules.clear(str(cmd["id"]), t, actor, str(cmd.get("reason") or ""))
            elif op == "silence":
                data = dict(cmd.get("silence") or {})
                data.setdefault("creator", actor)
                eff = self.rules.add_silence(data, t)
            elif op == "expire":
                eff = self.rules.expire_silence(str(cmd["id"]), t)
            else:
                return Effects(), {"status": 400, "error": f"unknown command {op!r}"}
        except AlarmNotFound as exc:
            return Effects(), {"status": 404, "error": str(exc)}
        except AlarmStateConflict as exc:
            return Effects(), {"status": 409, "error": str(exc), "state": exc.state}
        except SilenceError as exc:  # SilenceNotFound too
            status = 404 if exc.field == "id" and "no silence" in str(exc) else 422
            return Effects(), {"status": status, "error": str(exc), "field": exc.field}
        reply: dict[str, Any] = {"status": 200, "warnings": list(eff.warnings)}
        if eff.silence is not None:
            reply["silence"] = eff.silence.to_json()
        if op in ("ack", "clear"):
            a = self.rules.book.get(str(cmd["id"]).partition(".")[0])
            reply["alarm"] = als.index_record(a)
            reply["transition"] = eff.transitions[-1].to_json() if eff.transitions else None
        return eff, reply

    # ------------------------------------------------------------------ the step
    def split(self, notes: list[Notification]) -> tuple[list[Notification], list[Any]]:
        """(notifications for the outbox, those of alarm profiles)."""
        if not self.alarm_specs and not self.rules.book.alarms:
            return notes, []
        plain: list[Notification] = []
        alarm: list[Notification] = []
        for n in notes:
            (alarm if self._is_alarm(n.profile) else plain).append(n)
        return plain, alarm

    def _alarm_now(self) -> float:
        now = self.engine.now
        return time.time() if now is None else now

    def step(self, notes: list[Notification]) -> list[AlarmBatch]:
        """The steps a commit writes: those held from refused commits, then (if there is
        anything to do) a new one for the alarm notifications ``notes`` none of them fed."""
        new = notes[self.alarm_fed :]
        if new or self.alarm_cmds or self.escalations_gone or not self.alarm_held:
            batch = self._alarm_new_step(new)
            if batch is not None:
                batch.entry["n"] = len(new)
                self.alarm_held.append(batch)
        self.alarm_fed = len(notes)
        return self.alarm_held

    @staticmethod
    def entry(batches: list[AlarmBatch]) -> dict[str, Any] | None:
        """The journal entry's ``al``: one step as it was (version 3), several in a list."""
        if not batches:
            return None
        if len(batches) == 1:
            return {k: v for k, v in batches[0].entry.items() if k != "n"}
        return {"steps": [b.entry for b in batches]}

    def _alarm_new_step(self, notes: list[Notification]) -> AlarmBatch | None:
        """Feed the batch's alarm notifications, then the commands, then advance."""
        if not notes and not self.wants_commit():
            return None
        t = self._alarm_now()
        eff = self._alarm_feed(notes)
        batch = AlarmBatch({"ops": [], "t": t, "ctl": self.alarm_control_id}, eff)
        for eid, cmd in self.alarm_cmds:
            got, reply = self._alarm_apply(cmd, t)
            eff.extend(got)
            batch.entry["ops"].append(cmd)
            batch.replies.append((eid, reply))
            if got.silence is not None:
                batch.silences.append(got.silence.to_json())
        self.alarm_cmds = []
        eff.extend(self.rules.advance(t))
        keep = self.cfg.alarm_closed_retention
        if keep is not None:  # journalled: a replay forgets the same, whatever its setting
            gone = self.rules.prune(t, keep, PRUNE_PER_STEP)
            if gone:
                batch.pruned = [(a.id, a.labels()) for a in gone]
                batch.entry["pruned"] = [a.id for a in gone]
        if self.router is not None:
            batch.escalations = {k: self.router.next_step(k) for k in self.router.take_changed()}
        batch.escalations.update(dict.fromkeys(self.escalations_gone))
        self.escalations_gone = []
        return batch

    def _alarm_feed(self, notes: list[Notification]) -> Effects:
        defs = self.defs
        subs: dict[str, str | None] = {}  # profile -> its subscriber (once per profile)

        def sub_of(n: Notification) -> str | None:
            sub = subs.get(n.profile, "")
            if sub == "":
                prof = defs.get(n.profile.split("#", 1)[0])
                sub = subs[n.profile] = prof.subscriber if prof is not None else n.subscriber
            return sub

        return self.rules.on_matches(
            (n.profile, n.ts, n.partition, {k: ev.id for k, ev in n.events.items()}, sub_of(n))
            for n in notes
        )

    def replay(self, entry: dict[str, Any] | None, redone: list[Notification]) -> None:
        """Re-run a journalled step onto the restored rules (its effects were written)."""
        _, notes = self.split(redone)
        if entry is None:
            if notes:  # a journal written before alarms: the same notifications, no time
                self._alarm_feed(notes)
            return
        steps = entry.get("steps", [{**entry, "n": len(notes)}])
        at = 0
        for step in steps:
            t = float(step["t"])
            self._alarm_feed(notes[at : at + int(step["n"])])
            at += int(step["n"])
            for cmd in step["ops"]:
                self._alarm_apply(cmd, t)
            self.rules.advance(t)
            self.rules.book.forget(step.get("pruned", []))
            self.alarm_control_id = step["ctl"]

    # ------------------------------------------------------------------ writing
    def write(self, p: Any, batches: list[AlarmBatch], retention: float) -> None:
        """Everything the steps produced, in the caller's transaction."""
        for batch in batches:
            self._alarm_write_step(p, batch, retention)

    def _alarm_write_step(self, p: Any, batch: AlarmBatch, retention: float) -> None:
        eff = batch.effects
        minid = f"{max(int((time.time() - retention) * 1000), 0)}-0"
        trs = eff.transitions
        als.add_history(p, als.history_entries(trs), minid)
        # labels are the key's: indexed once per occurrence
        als.index_many(p, ((tr.alarm, tr.labels) for tr in trs if tr.kind == "raise"))
        book = self.rules.book
        alarms = book.alarms
        touched = {tr.alarm for tr in eff.transitions if tr.alarm in alarms}  # else: pruned since
        if touched:
            p.hset(
                als.ALARMS,
                mapping={
                    a.id: owned(orjson.dumps(als.index_record(a, book.labels(a))))
                    for a in map(alarms.__getitem__, touched)
                },
            )
        for aid, labels in batch.pruned:
            als.unindex(p, aid, labels)
        for s in batch.silences:
            p.hset(als.SILENCES, s["id"], json.dumps(s))
        store.enqueue_many(p, [self._alarm_message(msg) for msg in eff.messages])
        for eid, reply in batch.replies:
            p.rpush(als.REPLY + eid, json.dumps(reply))
            p.expire(als.REPLY + eid, als.REPLY_TTL)
        for key, step in sorted(batch.escalations.items()):
            if step is None:
                p.zrem(als.ESCALATION_DUE, key)
                p.hdel(als.ESCALATIONS, key)
            else:
                p.zadd(als.ESCALATION_DUE, {key: step["due_at"]})
                p.hset(als.ESCALATIONS, key, orjson.dumps(step))

    def published(self, batches: list[AlarmBatch]) -> None:
        """The steps are committed: count what they wrote (Prometheus), hold them no more."""
        for batch in batches:
            self._alarm_count(batch)
        self.alarm_held = []
        self.alarm_fed = 0

    def _alarm_count(self, batch: AlarmBatch) -> None:
        trs = batch.effects.transitions
        for kind, k in Counter(tr.kind for tr in trs).items():  # a labels() lookup per kind
            m.ALARM_TRANSITIONS.labels(kind=kind).inc(k)
        silenced = sum(tr.delivery == "silenced" for tr in trs)
        if silenced:
            m.ALARM_SILENCED.inc(silenced)
        if self.router is not None:
            if self.router.steps:
                m.ESCALATION_STEPS.inc(self.router.steps)
            if self.router.held:
                m.ROUTING_HELD.inc(self.router.held)
            self.router.steps = self.router.held = 0
        msgs = batch.effects.messages
        for mkind, k in Counter(msg.kind for msg in msgs).items():
            m.ALARM_MESSAGES.labels(kind=mkind).inc(k)
        overflow = sum(msg.overflow for msg in msgs)
        if overflow:
            m.ALARM_OVERFLOW.inc(overflow)
        if batch.effects.transitions or batch.pruned:
            self.alarm_dirty = True
        if batch.pruned:
            m.ALARMS_PRUNED.inc(len(batch.pruned))
            log.debug("pruned %d closed alarms from ens:alarms", len(batch.pruned))

    def gauges(self, force: bool = False) -> dict[str, int]:
        """Alarms by severity and state, for the heartbeat's stats (`/metrics` reads them:
        `ens_alarms`): counted over the book after a change, at most once a second."""
        mono = time.monotonic()
        if not force and (not self.alarm_dirty or mono - self.alarm_counted < 1.0):
            return self.alarm_counts
        self.alarm_counted, self.alarm_dirty = mono, False
        counts = Counter(f"{a.severity}|{a.state}" for a in self.rules.book.alarms.values())
        self.alarm_counts = dict(counts)
        return self.alarm_counts

    def _alarm_record(self, msg: Message) -> dict[str, Any]:
        """The outbox record of a message: alarm fields and how to acknowledge each alarm.
        Its id (the webhook Idempotency-Key) is the transition's id for a message of one
        transition, else the message's."""
        notices = [als.notice_json(n) for n in msg.notices]
        alarm: dict[str, Any] = dict(notices[0]) if notices else {}
        alarm.update(message=msg.id, message_kind=msg.kind, group=msg.group, overflow=msg.overflow)
        alarm["notices"] = notices
        return _envelope(msg, alarm, self.epoch)

    def _alarm_message(self, msg: Message) -> dict[str, Any]:
        """`_alarm_record` with its ``alarm`` as the bytes orjson would write for it
        (`orjson.Fragment`): each notice written once (it is at the top and in ``notices``),
        no dict copied. The outbox entry is the same, byte for byte."""
        try:
            blobs = [als.notice_bytes(n) for n in msg.notices]
            tail = orjson.dumps(
                {"message": msg.id, "message_kind": msg.kind, "group": msg.group,
                 "overflow": msg.overflow}
            )  # fmt: skip
        except TypeError:  # beyond orjson: the record as a dict (`OutboxRecord.blob`)
            return self._alarm_record(msg)
        head = blobs[0][:-1] + b"," if blobs else b"{"
        body = head + tail[1:-1] + b',"notices":[' + b",".join(blobs) + b"]}"
        return _envelope(msg, orjson.Fragment(body), self.epoch)


def _envelope(msg: Message, alarm: Any, epoch: str) -> dict[str, Any]:
    """The outbox record of a message around its ``alarm``: its id (the webhook
    Idempotency-Key) is the transition's id for a message of one transition, else the
    message's."""
    first = msg.notices[0] if msg.notices else None
    if msg.kind == "single" and first is not None and first.transition:
        nid = first.transition  # routed to another subscriber too: a key of its own
        if msg.subscriber != first.labels.get("subscriber", ""):
            nid += f"@{msg.subscriber}"
    else:
        nid = f"msg:{epoch}:{msg.id}"
    return {
        "id": nid,
        "profile": first.labels.get("profile", "") if first is not None else "",
        "subscriber": msg.subscriber or None,
        "ts": msg.ts,
        "events": {},
        "alarm": alarm,
    }
