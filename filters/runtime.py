"""What every single-step runtime shares: the engine it reports to, the base class, bindings.

A *runtime* is one profile's state inside the engine (`filters.engine.Engine`): plain filter
profiles (`FilterRuntime`), `absent` (`AbsentRuntime`), composites evaluated eagerly
(`filters.eager.composite.CompositeRuntime`) or rare-first (`filters.rarefirst.lazy.LazySeqRuntime`). They
see the engine only through `EngineHost`, so none of their modules imports the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol

from filters.pool.primitive import Entry, Eqs, PrimitivePool
from filters.temporal import TIMER, TemporalPool
from profiles.ast import Absent, Filter, Profile
from profiles.events import Event

INF = float("inf")

PartKey = tuple[Any, ...]  # a partition's `per` values, normalised (`Runtime.partition_key`)
RegKey = tuple[int, Eqs]  # an auxiliary registration: (leaf, where-values bound so far)
Handle = tuple[Any, ...]  # an entry of the temporal pool (what `TemporalPool.discard` takes)


class EngineHost(Protocol):
    """What a runtime uses of its engine (`filters.engine.Engine` implements it)."""

    pool: PrimitivePool
    timers: TemporalPool
    tracer: Callable[[str, str, str], None] | None
    now: float | None
    cap_partition: int  # `filters.caps`: PMs per partition of a profile
    cap_profile: int  # PMs per profile
    cap_notifications: int  # notifications per profile and event

    def emit(
        self,
        profile: str,
        ts: float,
        events: dict[str, Event],
        partition: dict[str, Any] | None,
        subscriber: str | None,
    ) -> None: ...  # `filters.output.NotificationOutput.emit`

    def trace(self, profile_id: str, action: str, detail: str) -> None: ...

    def count_dropped_pm(self, pid: str, n: int = 1) -> None: ...

    def count_capped_notifications(self, pid: str, n: int) -> None: ...

    def deactivate(self, rt: Runtime) -> None: ...  # a `once` profile that reported


class Binding:
    """A bound event: its arrival number fixes the total order."""

    __slots__ = ("seq", "ev")

    def __init__(self, seq: int, ev: Event) -> None:
        self.seq = seq
        self.ev = ev


_SHARED: dict[Any, Any] = {}


def shared(t: Any) -> Any:
    """One object for equal small tuples (component names, registration keys) across profiles.

    Thousands of profiles of one shape then read the same few objects on every completion,
    which stay in the CPU cache, instead of one copy each (measured: bench composite).
    """
    return _SHARED.setdefault(t, t)


def fmt_ts(ts: float) -> str:
    return f"{ts:.3f}".rstrip("0").rstrip(".")


def fmt_events(events: Mapping[str, Event]) -> str:
    return "{" + ", ".join(f"{k}: {v.id}" for k, v in events.items()) + "}"


class Runtime:
    """One profile's state inside the engine.

    `on_event` gets the leaves the event matched as a list it must only read: the engine hands
    the same one-element list to every runtime that matched one leaf (`Engine._fan_out`).
    """

    has_sink: ClassVar[bool] = False  # `sink` may return a handler (the engine asks only then)
    # slotted: one engine runs 10^4 runtimes, each touched by few events (paper, spread keys),
    # and a slotted object is one block of memory with no dict (one A/B: a PM's opening
    # 8.1 -> 6.8 us; repeats within noise, docs/benchmarks.md). `__dict__` for the runtimes
    # that keep unslotted fields (rare-first, absent); a snapshot stores the same dict of
    # fields as before (`__getstate__`).
    __slots__ = (
        "engine",
        "profile",
        "idx",
        "active",
        "per",
        "pid",
        "subscriber",
        "once",
        "starts",
        "__dict__",
    )

    def __init__(self, engine: EngineHost, profile: Profile, idx: int) -> None:
        self.engine = engine
        self.profile = profile
        self.idx = idx
        self.active = True
        self.per = profile.per
        self.pid, self.subscriber, self.once = profile.id, profile.subscriber, profile.once
        # the pool entries of its starting components and their owners, set by the engine (what
        # leaves the pool with the profile, without looking the filters up again); on the
        # runtime, not in a dict of the engine: one look-up fewer when a profile goes
        self.starts: tuple[tuple[Entry, tuple[int, int]], ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        """The fields as one dict (slotted, then the rest), as when runtimes had no slots; not
        the pool's entries (`starts`: the pool is rebuilt on restore)."""
        state = {
            k: getattr(self, k)
            for k in slot_fields(type(self))
            if k != "starts" and hasattr(self, k)
        }
        state.update(self.__dict__)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def start_registrations(self) -> Iterable[tuple[Filter, int]]:
        return ()

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        """`ev` (arrival number `seq`) matched `leaves` of this profile (sorted; read-only)."""
        raise NotImplementedError

    def on_timer(self, when: float, payload: Any) -> None:
        pass

    def activate(self, now: float | None) -> None:
        pass

    def sink(self, leaf: int) -> Callable[[Event, int], bool] | None:
        """A fast handler for events matching only `leaf` (see `LazySeqRuntime.sink`); most
        runtimes have none (a class that may have one sets `has_sink`)."""
        return None

    def live(self) -> tuple[int, int]:
        """(partial matches, partitions) held; a rare-first runtime counts its buffered events."""
        return (0, 0)

    def clear(self) -> None:
        """Forget all state (the profile is being removed)."""

    def fresh(self) -> bool:
        """Holds nothing but its profile: a snapshot stores the profile only (see Engine)."""
        return False

    def report(self, ts: float, events: dict[str, Event], partition: dict[str, Any] | None) -> None:
        eng = self.engine
        eng.emit(self.pid, ts, events, partition, self.subscriber)
        if eng.tracer is not None:
            eng.trace(self.pid, "reported", fmt_events(events) + f" at {fmt_ts(ts)}")
        if self.once:
            eng.deactivate(self)

    def _trace(self, action: str, detail: str) -> None:
        self.engine.trace(self.profile.id, action, detail)

    def partition_key(self, attrs: dict[str, Any]) -> PartKey | None:
        """The event's partition (`per` values, normalised); None if it lacks a `per` attribute."""
        per = self.per
        if not per:
            return ()
        if len(per) == 1:  # the usual case
            v = attrs.get(per[0])
            if v is None:
                return None
            return ((bool, v),) if v.__class__ is bool else (v,)
        vals = []
        for a in per:
            v = attrs.get(a)
            if v is None:
                return None
            vals.append((bool, v) if v.__class__ is bool else v)  # `norm`, inline: every event
        return tuple(vals)

    def partition_values(self, attrs: dict[str, Any]) -> dict[str, Any] | None:
        """The `per` values as reported; built only when a partition is created (every event
        of a profile with `per` computes its key, few create a partition)."""
        return {a: attrs[a] for a in self.per} if self.per else None


class DerivedRuntime(Runtime):
    """A runtime with compiled tables (`_DERIVED`, set by `_derive` from the profile).

    Snapshots keep the state, not the tables: they are rebuilt on restore.
    """

    _DERIVED: ClassVar[tuple[str, ...]] = ()
    __slots__ = ()

    def _derive(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        derived = self._DERIVED
        return {k: v for k, v in super().__getstate__().items() if k not in derived}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # a runtime no longer active (found only by its no-op timers, in snapshots written
        # before those were left out) or whose profile was not supplied never runs again: the
        # engine leaves it out (`filters.restore`), and its profile may be another one now
        if self.active and isinstance(self.profile, Profile):
            self._derive()


_SLOT_FIELDS: dict[type, tuple[str, ...]] = {}


def slot_fields(cls: type) -> tuple[str, ...]:
    """The slotted fields of `cls` and its bases, bases first (the order they are set in)."""
    got = _SLOT_FIELDS.get(cls)
    if got is None:
        names: list[str] = []
        for c in reversed(cls.__mro__):
            slots = c.__dict__.get("__slots__", ())
            names += [s for s in ((slots,) if isinstance(slots, str) else slots) if s != "__dict__"]
        got = _SLOT_FIELDS[cls] = tuple(names)
    return got


class FilterRuntime(Runtime):
    def start_registrations(self) -> Iterable[tuple[Filter, int]]:
        return [(self.profile.expr, 0)]  # type: ignore[list-item]  # a filter profile's expr

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        self.report(ev.ts, {"e": ev}, None)

    def fresh(self) -> bool:
        return True


class AbsentRuntime(Runtime):
    """absent(F) within T: one notification per silence, re-armed by the next F event."""

    def __init__(self, engine: EngineHost, profile: Profile, idx: int) -> None:
        super().__init__(engine, profile, idx)
        assert isinstance(profile.expr, Absent)
        self.window = float(profile.within or 0.0)
        # key -> [last event | None, handle, values]
        self.parts: dict[PartKey, list[Any]] = {}

    def start_registrations(self) -> Iterable[tuple[Filter, int]]:
        expr = self.profile.expr
        assert isinstance(expr, Absent)
        return [(expr.filter, 0)]

    def activate(self, now: float | None) -> None:
        if not self.per and now is not None and () not in self.parts:
            self._arm((), None, None, now)

    def _arm(
        self, key: PartKey, values: dict[str, Any] | None, last: Event | None, at: float
    ) -> None:
        st = self.parts.get(key)
        if st is not None:
            self.engine.timers.discard(st[1])
        handle = self.engine.timers.add(at + self.window, TIMER, (self, key))
        self.parts[key] = [last, handle, values]

    def on_event(self, ev: Event, seq: int, leaves: list[int]) -> None:
        key = self.partition_key(ev.attrs)
        if key is None:
            return
        values = self.partition_values(ev.attrs)
        if self.engine.tracer is not None:
            self._trace(
                "restarted", f"silence timer by {ev.id} until ts={fmt_ts(ev.ts + self.window)}"
            )
        self._arm(key, values, ev, ev.ts)

    def on_timer(self, when: float, key: Any) -> None:
        st = self.parts.pop(key, None)
        if st is None:
            return
        last, _, values = st
        self.report(when, {"last": last} if last is not None else {}, values)

    def live(self) -> tuple[int, int]:
        return (len(self.parts), len(self.parts))

    def fresh(self) -> bool:
        return not self.parts  # quiet: no timer armed (activation is not replayed on restore)

    def load_partition(self, key: PartKey, st: list[Any]) -> None:
        """A stored partition back (`filters.partstate`; its timer: the engine)."""
        self.parts[key] = st

    def unload_partition(self, key: PartKey, timers: bool = True) -> None:
        st = self.parts.pop(key, None)
        if st is not None and timers:
            self.engine.timers.discard(st[1])

    def clear(self) -> None:
        for st in self.parts.values():
            self.engine.timers.discard(st[1])
        self.parts.clear()
