"""Engine state as versioned data: what a checkpoint or a Spark state store holds.

A snapshot used to be a pickle of the whole `Engine`: Python's class paths were the format, so
renaming a private class could strand a running site's partial matches at an upgrade, and
nothing said which release wrote it. Now a snapshot is

    b"ENS-STATE " + JSON header + b"\\n" + body

The header names the format and its version (``{"format": "ens.engine-state", "version": 2,
"profiles": "apart" | "inline"}``). The body holds plain data (None, bool, int, float, str,
bytes, tuple, list, dict, set) and engine objects as (stable name, state): the stable names are
declared next to the classes (`register`), not taken from Python, and `SCHEMA` lists the state
fields of each name in this version, so a changed class shows up in the tests as a format change
that needs a new version and a migration (`MIGRATIONS`). The body is encoded with pickle's C
codec (restore speed is what a Spark key pays per batch) but read by an unpickler that resolves
only stable names and refuses every class path; `plain` shows it without building anything.

Version 1 is the old pickle: it is read through the classes of this release and written back as
version 2; when that is no longer possible, `load` says so and what to do instead of dropping
the state.

A profile an `apart` snapshot refers to may be gone by the time it is restored (removed since):
with `missing`, `load` resolves it to an `Unresolved` placeholder instead of refusing the whole
snapshot, and the engine leaves out what holds one (`filters.restore`).
"""

from __future__ import annotations

import copyreg
import gc
import io
import itertools
import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sortedcontainers import SortedList

from filters.errors import StateError as StateError  # its old import path
from profiles.ast import Profile

MAGIC = b"ENS-STATE "
FORMAT = "ens.engine-state"
VERSION = 2

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


# ------------------------------------------------------------------ registry

_BY_NAME: dict[str, type] = {}
_BY_TYPE: dict[type, str] = {}


def register(name: str, cls: type) -> type:
    """Give `cls` a stable name in snapshots (declared next to the class: renaming the class
    then changes nothing; changing its state fields changes `SCHEMA`, hence the version)."""
    if _BY_NAME.get(name, cls) is not cls:
        raise ValueError(f"state name {name!r} is taken by {_BY_NAME[name].__qualname__}")
    _BY_NAME[name] = cls
    _BY_TYPE[cls] = name
    return cls


def _register_ast() -> None:
    import dataclasses

    import profiles.ast as ast

    for attr in dir(ast):
        cls = getattr(ast, attr)
        if (
            isinstance(cls, type)
            and dataclasses.is_dataclass(cls)
            and cls.__module__ == ast.__name__
        ):
            register(f"ast.{cls.__name__}", cls)


def _register_base() -> None:
    from filters.notification import Notification
    from filters.temporal import TemporalPool
    from profiles.events import Event

    register("event", Event)
    register("notification", Notification)
    register("temporal-pool", TemporalPool)
    _register_ast()


_register_base()

# Library types stored by their content: (name, to_args(obj)); rebuilt as cls(*args).
_SPECIAL: dict[type, tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    SortedList: ("sorted-list", lambda sl: (list(sl),)),
    itertools.count: ("count", lambda c: (int(repr(c)[6:-1]),)),
}
for _cls, (_name, _args) in _SPECIAL.items():
    register(_name, _cls)

# State fields of each stable name in this version (dict states: keys; slotted classes with
# their own __getstate__: the kind of state). Checked by tests/test_state.py on engines that
# ran every conformance case under every variant and plan.
SCHEMA: dict[str, tuple[str, ...]] = {
    "absent-runtime": (
        "active",
        "engine",
        "idx",
        "once",
        "parts",
        "per",
        "pid",
        "profile",
        "subscriber",
        "window",
    ),
    "binding": ("ev", "seq"),
    "composite-runtime": (
        "active",
        "engine",
        "idx",
        "kind",
        "nth",
        "once",
        "parts",
        "per",
        "pid",
        "pm_count",
        "profile",
        "subscriber",
        "unique",
        "window",
    ),
    "engine": (
        "_clock_users",
        "_clocks",
        "_count_since",
        "_counted",
        "_counts",
        "_fresh",
        "_next_idx",
        "_nseq",
        "_online",
        "_out",
        "_rts",
        "_seq",
        "drift",
        "now",
        "plan",
        "rates",
        "replan_every",
        "sample",
        "timers",
        "trace_only",
        "tracer",
        "tz",
        "variant",
    ),
    "event": ("attrs", "id", "ts"),
    "filter-runtime": ("active", "engine", "idx", "once", "per", "pid", "profile", "subscriber"),
    "lazy-partition": ("tuple[4]",),
    "lazy-seq-runtime": (
        "_sweep_at",
        "active",
        "each",
        "engine",
        "idx",
        "k",
        "once",
        "parts",
        "per",
        "pid",
        "profile",
        "subscriber",
        "unique",
        "window",
    ),
    "notification": ("events", "partition", "profile", "seq", "subscriber", "ts"),
    "partial-match": (
        "alive",
        "binds",
        "counts",
        "deadline",
        "handle",
        "mask",
        "negc",
        "nlog",
        "part",
        "regs",
    ),
    "partition": (
        "dormant",
        "handle",
        "held",
        "history",
        "key",
        "pms",
        "regs",
        "starts",
        "starts_ts",
        "until",
        "values",
    ),
    "rates": ("by_filter", "by_profile"),
    "temporal-pool": ("_items", "_tie"),
}

# version v -> {stable name of version v: what builds it in version v + 1} (a class whose
# __setstate__ converts the old state), for every name whose state changed. Version 1 (the
# pickle) is read by the engine's old reader instead (`load`'s `legacy`).
MIGRATIONS: dict[int, dict[str, Any]] = {}


# ------------------------------------------------------------------ writing
#
# The body is written by pickle's C encoder, but no class travels by its Python path: an
# object of a registered class is reduced to (copyreg.__newobj__ or its class, args, state)
# and the class itself is written as a persistent id "class:<stable name>" (a profile of an
# `apart` snapshot as "profile:<id>"). The reader resolves exactly those ids and the one
# global copyreg.__newobj__; anything else is refused.

_CLASS = "class:"
_PROFILE = "profile:"


class _Writer(pickle.Pickler):
    def __init__(self, f: io.BytesIO, apart: bool) -> None:
        super().__init__(f, protocol=5)
        self.apart = apart
        self.pids = {cls: _CLASS + name for cls, name in _BY_TYPE.items()}  # one str each: memoized

    def persistent_id(self, obj: Any) -> str | None:
        if isinstance(obj, type):
            pid = self.pids.get(obj)
            if pid is None and obj.__module__.split(".")[0] in (
                "filters",
                "profiles",
                "adapters",
                "ens",
            ):
                raise StateError(
                    f"cannot store a {obj.__module__}.{obj.__qualname__} in an engine "
                    "snapshot: the class has no stable name (filters.state.register)"
                )
            return pid
        if self.apart and obj.__class__ is Profile:
            return _PROFILE + obj.id
        return None

    def reducer_override(self, obj: Any) -> Any:
        special = _SPECIAL.get(type(obj))
        if special is not None:
            return (type(obj), special[1](obj))
        return NotImplemented


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while a snapshot is written or read.

    Reading builds ~10^5 objects that all stay alive (writing, their state dicts): the
    collections their allocations trigger walk the whole young heap and free nothing, and were
    ~75 % of a restore's time (docs/state.md). Nested use keeps an outer pause.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def dump(root: Any, *, profiles_apart: bool = False) -> bytes:
    """`root` (an engine) as a version-`VERSION` snapshot; with `profiles_apart`, profiles are
    stored as their ids (`load` then needs them)."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "profiles": "apart" if profiles_apart else "inline",
    }
    buf = io.BytesIO()
    buf.write(MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n")
    with collector_paused():
        _Writer(buf, profiles_apart).dump(root)
    return buf.getvalue()


# ------------------------------------------------------------------ records
#
# A partitioned engine (`filters.partstate`) stores its state as records instead of one
# snapshot: one per profile partition and a header (engine-level counters). A record is a
# snapshot of this version whose header names its kind (``"record": "partition"``) and whose
# body is a dict with the fields `RECORDS` lists; the objects inside are the stable names of
# `SCHEMA`. The runtime a partition belongs to is not stored: it is a reference ("ref:<name>")
# resolved to the runtime of the engine the record is loaded into.

# Records have their own version (the snapshot's `VERSION` names the object states inside):
# version 2 wrote the body as a dict of `RECORDS`' fields; version 3 writes it as a tuple in
# that order (no field names per record; a Spark route writes ~10 records per step) and its
# header's profile order may be a digest of the compiled engine's (`filters.partstate`).
# A version-2 record is still read (`load_record` gives every version's body as the dict).
RECORD_VERSION = 3

RECORDS: dict[str, tuple[str, ...]] = {
    "partition": ("due", "key", "kind", "profile", "state", "timers"),
    "header": (
        "clocks",
        "inactive",
        "lazy",
        "now",
        "nseq",
        "order",
        "out",
        "pm_counts",
        "seq",
        "sweeps",
        "tie",
    ),
}

_REF = "ref:"


class _RecordWriter(_Writer):
    def __init__(self, f: io.BytesIO, refs: Mapping[int, str]) -> None:
        super().__init__(f, True)
        self.refs = refs

    def persistent_id(self, obj: Any) -> str | None:  # every object: `_Writer`'s, inline
        ref = self.refs.get(id(obj))
        if ref is not None:
            return _REF + ref
        if obj.__class__ is Profile:
            pid: str = obj.id
            return _PROFILE + pid
        if isinstance(obj, type):
            return super().persistent_id(obj)
        return None


def dump_record(kind: str, body: dict[str, Any], refs: Mapping[int, str] | None = None) -> bytes:
    """A record of `kind` (`RECORDS`); `refs` (id(object) -> name) stores those objects as
    references (`load_record` resolves them to objects of the loading engine)."""
    fields = RECORDS[kind]
    if tuple(sorted(body)) != fields:
        raise ValueError(f"a {kind} record has the fields {fields}, not {sorted(body)}")
    buf = io.BytesIO()
    buf.write(_record_head(kind))
    with collector_paused():
        _RecordWriter(buf, refs or {}).dump(tuple([body[f] for f in fields]))
    return buf.getvalue()


def load_record(
    data: bytes,
    kind: str,
    profiles: Mapping[str, Profile] | None = None,
    refs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of a `kind` record (`dump_record`); "ref:<name>" resolves through `refs`.
    Anything else, a record of another kind or a damaged one, raises `StateError`."""
    lead = _RECORD_HEADS.get(kind)
    if lead is None:
        lead = _RECORD_HEADS[kind] = _record_head(kind)
    if data.startswith(lead):  # this version's own: no header to parse (10^5 at a recovery)
        return _record_body(data, len(lead), kind, profiles, refs)
    head = header(data)
    if head.get("record") != kind:
        what = f"a {head['record']} record" if head.get("record") else "a whole-engine snapshot"
        raise StateError(f"expected an engine {kind} record, got {what}")
    if head["version"] > RECORD_VERSION:
        raise StateError(
            f"this {kind} record was written by a newer ENS (record format version "
            f"{head['version']}; this release reads up to {RECORD_VERSION}): upgrade ENS to "
            "read it"
        )
    return _record_body(data, data.index(b"\n") + 1, kind, profiles, refs)


def _record_head(kind: str, version: int = RECORD_VERSION) -> bytes:
    head = {"format": FORMAT, "version": version, "profiles": "apart", "record": kind}
    return MAGIC + json.dumps(head, separators=(",", ":")).encode() + b"\n"


_RECORD_HEADS: dict[str, bytes] = {}
_CLASSES: dict[Any, Any] = {}  # "class:<name>" -> class, shared by every record's reader


def _record_body(
    data: bytes,
    start: int,
    kind: str,
    profiles: Mapping[str, Profile] | None,
    refs: Mapping[str, Any] | None,
) -> dict[str, Any]:
    reader = _RecordReader(io.BytesIO(data[start:]), profiles or {}, refs or {})
    with collector_paused():
        try:
            body = reader.load()
        except StateError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise StateError(
                f"the {kind} record's body is damaged ({exc}); nothing was loaded"
            ) from None
    return _record_fields(body, kind)


def _record_fields(body: Any, kind: str) -> dict[str, Any]:
    """A record's body as the dict of its fields (version 3 stores a tuple in field order)."""
    fields = RECORDS[kind]
    if body.__class__ is tuple and len(body) == len(fields):
        return dict(zip(fields, body, strict=True))
    if not isinstance(body, dict) or tuple(sorted(body)) != fields:
        raise StateError(f"not an engine {kind} record: its body has other fields")
    return body


# ------------------------------------------------------------------ reading


class Unresolved:
    """A profile a snapshot refers to that the restore was not given (removed since the
    snapshot): what holds it is left out of the restored engine (`filters.restore`). Never
    stored: a snapshot of an engine still holding one would fail (no stable name)."""

    __slots__ = ("id",)

    def __init__(self, profile_id: str) -> None:
        self.id = profile_id

    def __repr__(self) -> str:
        return f"Unresolved({self.id!r})"


class _Supplying(Mapping[str, "Profile | Unresolved"]):
    """The supplied profiles, and one `Unresolved` (recorded in `missing`) for any other id."""

    def __init__(self, profiles: Mapping[str, Profile], missing: dict[str, Unresolved]) -> None:
        self.profiles = profiles
        self.missing = missing

    def __getitem__(self, profile_id: str) -> Profile | Unresolved:
        got = self.profiles.get(profile_id)
        if got is not None:
            return got
        gone = self.missing.get(profile_id)
        if gone is None:
            gone = self.missing[profile_id] = Unresolved(profile_id)
        return gone

    def __iter__(self) -> Iterator[str]:
        return iter(self.profiles)

    def __len__(self) -> int:
        return len(self.profiles)


class _Reader(pickle.Unpickler):
    """Resolves stable names through the registry; refuses every class path."""

    def __init__(
        self,
        f: io.BytesIO,
        profiles: Mapping[str, Profile | Unresolved],
        classes: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f)
        self.profiles = profiles
        self.classes = classes if classes is not None else _BY_NAME
        self.resolved: dict[Any, Any] = {}  # one class per reference: a snapshot names few

    def persistent_load(self, pid: Any) -> Any:
        if pid.__class__ is not str:
            return self._resolve(pid)
        got = self.resolved.get(pid)
        if got is None:
            got = self.resolved[pid] = self._resolve(pid)
        return got

    def _resolve(self, pid: Any) -> Any:
        if isinstance(pid, str):
            if pid.startswith(_CLASS):
                cls = self.classes.get(pid[len(_CLASS) :])
                if cls is None:
                    raise StateError(
                        f"this snapshot holds a {pid[len(_CLASS) :]!r}, which this release "
                        "does not know"
                    )
                return cls
            if pid.startswith(_PROFILE):
                try:
                    return self.profiles[pid[len(_PROFILE) :]]
                except KeyError:
                    raise StateError(
                        f"the snapshot refers to profile {pid[len(_PROFILE) :]!r}, "
                        "which was not supplied"
                    ) from None
        raise StateError(f"not an ENS engine snapshot: unknown reference {pid!r}")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("copyreg", "__newobj__"):
            return copyreg.__newobj__  # type: ignore[attr-defined]  # (not in typeshed)
        raise StateError(f"not an ENS engine snapshot: its body names the class {module}.{name}")


class _RecordReader(_Reader):
    def __init__(
        self, f: io.BytesIO, profiles: Mapping[str, Profile], refs: Mapping[str, Any]
    ) -> None:
        super().__init__(f, profiles)
        self.refs = refs
        self.resolved = _CLASSES  # class names only: a reference is resolved each time

    def persistent_load(self, pid: Any) -> Any:
        if pid.__class__ is str and pid.startswith(_CLASS):
            got = _CLASSES.get(pid)
            if got is None:
                got = _CLASSES[pid] = self._resolve(pid)
            return got
        return self._resolve(pid)

    def _resolve(self, pid: Any) -> Any:
        if isinstance(pid, str) and pid.startswith(_REF):
            try:
                return self.refs[pid[len(_REF) :]]
            except KeyError:
                raise StateError(f"the record refers to {pid[len(_REF) :]!r}, not given") from None
        return super()._resolve(pid)


def header(data: bytes) -> dict[str, Any]:
    """The header of a snapshot (version 1, the old pickle, has none: ``{"version": 1}``)."""
    if data[:1] == b"\x80":
        return {"format": FORMAT, "version": 1}
    if not data.startswith(MAGIC):
        raise StateError("not an ENS engine snapshot (no ENS-STATE header)")
    end = data.find(b"\n", len(MAGIC))
    try:
        head = json.loads(data[len(MAGIC) : end])
    except ValueError:
        raise StateError("not an ENS engine snapshot: its header is not JSON") from None
    if (
        not isinstance(head, dict)
        or head.get("format") != FORMAT
        or not isinstance(head.get("version"), int)
    ):
        raise StateError(f"not an ENS engine snapshot: header {head!r}")
    return head


def load(
    data: bytes,
    profiles: Mapping[str, Profile] | None = None,
    legacy: Callable[[bytes, Mapping[str, Any]], Any] | None = None,
    missing: dict[str, Unresolved] | None = None,
) -> Any:
    """The engine of a snapshot. `profiles` (id -> profile) resolves a `profiles_apart`
    snapshot; `legacy` reads a version-1 snapshot (the engine's old unpickler). A reference to
    a profile not in `profiles` is refused (`StateError`), or, given a `missing` dict, resolved
    to an `Unresolved` recorded there (the engine then leaves out what holds it)."""
    supplied: Mapping[str, Any] = profiles or {}
    if missing is not None:
        supplied = _Supplying(supplied, missing)
    head = header(data)
    version = head["version"]
    if version == 1:
        if legacy is None:
            raise StateError("a version 1 snapshot (the old pickle) needs the engine's reader")
        with collector_paused():
            return _load_v1(data, supplied, legacy)
    if version > VERSION:
        raise StateError(
            f"this snapshot was written by a newer ENS (state format version {version}; "
            f"this release reads up to {VERSION}): upgrade ENS to restore it"
        )
    classes: Mapping[str, Any] = _BY_NAME
    for v in range(version, VERSION):  # an older version: its names resolve to migrating shims
        classes = {**classes, **MIGRATIONS[v]}
    reader = _Reader(io.BytesIO(data[data.index(b"\n") + 1 :]), supplied, classes)
    with collector_paused():
        try:
            return reader.load()
        except StateError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise StateError(
                f"the snapshot's body is damaged ({exc}); nothing was restored"
            ) from None


def _load_v1(
    data: bytes,
    profiles: Mapping[str, Any],
    legacy: Callable[[bytes, Mapping[str, Any]], Any],
) -> Any:
    try:
        return legacy(data, profiles)
    except KeyError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the old format is reported the same way
        raise StateError(
            "this snapshot is in the state format of ENS 0.1 (version 1, a pickle of the engine's "
            f"classes), which this release can no longer read ({type(exc).__name__}: {exc}). Nothing "
            "was restored or deleted: run the release that wrote it until its next snapshot, or "
            "upgrade through a release that reads both formats (each release reads the previous one)"
        ) from None


class Stored:
    """An object of a snapshot seen as plain data (`plain`): its stable name, arguments, state."""

    __slots__ = ("args", "state")
    name = ""
    args: tuple[Any, ...]
    state: Any

    def __new__(cls, *args: Any) -> Stored:
        obj = object.__new__(cls)
        obj.args, obj.state = args, None
        return obj

    def __init__(self, *args: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _PlainReader(_Reader):
    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f, {})
        self.types: dict[str, type[Stored]] = {}

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, str) and pid.startswith(_CLASS):
            name = pid[len(_CLASS) :]
            t = self.types.get(name)
            if t is None:
                t = self.types[name] = type("Stored", (Stored,), {"__slots__": (), "name": name})
            return t
        if isinstance(pid, str) and pid.startswith((_PROFILE, _REF)):
            return pid
        return super().persistent_load(pid)


def plain(data: bytes) -> Stored:
    """The snapshot's object graph with every engine object as a `Stored` (for migrations, the
    schema test and looking inside a checkpoint); never builds an engine class."""
    head = header(data)
    if head["version"] < 2:
        raise StateError("a version 1 snapshot (the old pickle) has no plain view")
    stored: Stored = _PlainReader(io.BytesIO(data[data.index(b"\n") + 1 :])).load()
    if head.get("record") in RECORDS:  # a record's body: the dict of its fields
        return _record_fields(stored, head["record"])  # type: ignore[return-value]
    return stored


def fields_of(content: Any) -> tuple[str, ...]:
    """The field names of one stored state (what `SCHEMA` records)."""
    if (
        isinstance(content, tuple)
        and len(content) == 2
        and (content[0] is None or isinstance(content[0], dict))
        and isinstance(content[1], dict)
    ):
        return tuple(sorted({*(content[0] or {}), *content[1]}))
    if isinstance(content, dict):
        return tuple(sorted(k for k in content if isinstance(k, str)))
    if isinstance(content, tuple):
        return (f"tuple[{len(content)}]",)
    return (type(content).__name__,)
