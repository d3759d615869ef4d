"""The profile file (docs/language.md §7): YAML or JSON with `profiles` and optional `subscribers`.

Every problem is collected (`ens check` prints them all); a file with any
problem is rejected as a whole by `load_profile_file`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from profiles.alarm import AlarmSpec, parse_alarm
from profiles.ast import Profile
from profiles.errors import ENSError, ManyErrors, ProfileError
from profiles.parser import parse_profile
from profiles.subscribers import UNKNOWN_KEY, Loc, describe, subscriber_problems


@dataclass
class ProfileSet:
    profiles: list[Profile] = field(default_factory=list)
    subscribers: list[dict[str, Any]] = field(default_factory=list)
    alarms: dict[str, AlarmSpec] = field(default_factory=dict)  # profile id -> its `alarm:`
    entries: int = 0  # profile entries in the file, valid or not
    invalid: int = 0  # of those, entries with at least one problem
    profile_problems: int = 0  # problems found in profile entries
    subscriber_problems: int = 0  # problems found in subscriber entries
    tz: str | None = None  # the file's `tz:`: the zone of its profiles' localtime/weekday

    def summary(self, name: str, errors: list[Any]) -> str:
        """``FILE: N problem(s) (P in K profile(s), S in subscribers, O elsewhere); V of T
        profile(s) valid``: the parts add up to N and to T."""
        other = len(errors) - self.profile_problems - self.subscriber_problems
        parts = []
        if self.profile_problems:
            parts.append(f"{self.profile_problems} in {self.invalid} profile(s)")
        if self.subscriber_problems:
            parts.append(f"{self.subscriber_problems} in subscribers")
        if other:
            parts.append(f"{other} elsewhere")
        return (
            f"{name}: {len(errors)} problem(s) ({', '.join(parts)}); "
            f"{len(self.profiles)} of {self.entries} profile(s) valid"
        )


def _node_get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                node_: yaml.Node = v
                return node_
    return None


def _key_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The key node (not the value) of ``key`` in a mapping node: where a bad key is written."""
    if isinstance(node, yaml.MappingNode):
        for k, _ in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return k
    return None


def _at(name: str, node: yaml.Node | None) -> str:
    """``FILE:LINE:COL`` of a node (1-based), or just the file when the node is unknown."""
    if node is None:
        return name
    return f"{name}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


PROFILE_KEYS: tuple[str, ...] = ("id", "expr", "subscriber", "description", "alarm")


def _expr_line(node: yaml.Node | None) -> int | None:
    if node is None:
        return None
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        line += 1
    return line


def _node_at(node: yaml.Node | None, loc: Loc) -> yaml.Node | None:
    """The deepest node along ``loc`` (mapping keys, sequence indexes) that the file has."""
    for step in loc:
        if isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
        elif isinstance(step, str) and (child := _node_get(node, step)) is not None:
            node = child
        else:
            break
    return node


def subscriber_messages(sub: Any, n: int) -> list[tuple[str, Loc, bool]]:
    """Every problem of subscriber #n (1-based), worded for `ens check`, with its location.

    The rules are profiles.subscribers, the ones a stored subscriber obeys too; only the
    subscriber's name is put in front (``subscriber 'ops': channels.0.email: ...``). The flag
    says the problem is a key that has no place there (located at the key, not its value).
    """
    sid = sub.get("id") if isinstance(sub, Mapping) else None
    who = f"subscriber {sid!r}" if isinstance(sid, str) and sid else f"subscriber #{n}"
    return [
        (f"{who}: {describe(loc, msg)}", loc, msg.startswith(UNKNOWN_KEY))
        for loc, msg in subscriber_problems(sub)
    ]


def validate_subscriber(sub: Any, where: str, n: int = 1) -> dict[str, Any]:
    """The subscriber entry (#n of its file), or its first problem raised."""
    problems = subscriber_messages(sub, n)
    if problems:
        raise ProfileError(problems[0][0])
    valid: dict[str, Any] = sub  # subscriber_messages found nothing wrong: it is a mapping
    return valid


# libyaml's loader when PyYAML was built with it (~10x faster); its nodes carry marks too
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (positions for FILE:LINE:COL) and the data built from it: one parse."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    finally:
        loader.dispose()


def parse_profile_document(
    text: str, name: str = "<profiles>"
) -> tuple[ProfileSet, list[ENSError]]:
    """Parse a whole file; return the valid profiles and every problem found."""
    errors: list[ENSError] = []
    out = ProfileSet()
    try:
        root, data = _load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(getattr(e, "problem", e))
        if "mapping values are not allowed" in problem:  # `expr: seq(a: ...)`: the ': ' is YAML's
            problem += (
                "; an expression with ': ' in it (seq(a: ...)) must be quoted "
                "(expr: 'seq(a: ...)') or written as a block (expr: |)"
            )
        return out, [ProfileError(f"{name}: not valid YAML/JSON{where}: {problem}")]
    if data is None:
        data = {}
    if isinstance(data, list):  # a bare list of profiles is accepted too
        data = {"profiles": data}
        root = yaml.MappingNode("tag:yaml.org,2002:map", [(yaml.ScalarNode("", "profiles"), root)])
    if not isinstance(data, dict):
        return out, [
            ProfileError(f"{name}: expected a mapping with 'profiles' (and optional 'subscribers')")
        ]
    for key in data:
        if key not in ("profiles", "subscribers", "tz"):
            errors.append(
                ProfileError(
                    f"{_at(name, _key_node(root, str(key)))}: unknown top-level key {str(key)!r} "
                    "(allowed: profiles, subscribers, tz)"
                )
            )
    if "tz" in data:
        out.tz = _file_tz(data["tz"], _at(name, _node_get(root, "tz")), errors)
    plist = data.get("profiles") or []
    pnodes = _node_get(root, "profiles")
    pnode_items = pnodes.value if isinstance(pnodes, yaml.SequenceNode) else []
    if not isinstance(plist, list):
        errors.append(ProfileError(f"{name}: 'profiles' must be a list"))
        plist = []
    seen: set[str] = set()
    out.entries = len(plist)
    for i, item in enumerate(plist):
        before = len(errors)
        _profile_entry(i, item, pnode_items, seen, name, out, errors, out.tz, text)
        if len(errors) > before:
            out.invalid += 1
            out.profile_problems += len(errors) - before
    _subscriber_entries(data, root, name, out, errors)
    return out, errors


def _profile_entry(
    i: int,
    item: Any,
    pnode_items: list[Any],
    seen: set[str],
    name: str,
    out: ProfileSet,
    errors: list[ENSError],
    tz: str | None = None,
    text: str = "",
) -> None:
    """One entry of ``profiles``: parsed into ``out.profiles``, or its problems into ``errors``."""
    node = pnode_items[i] if i < len(pnode_items) else None
    file_line = node.start_mark.line + 1 if node is not None else None
    if not isinstance(item, dict):
        errors.append(
            ProfileError(
                f"profile #{i + 1} must be a mapping with id and expr", file_line=file_line
            )
        )
        return
    pid = item.get("id")
    if not isinstance(pid, (str, int)) or pid == "":
        errors.append(ProfileError(f"profile #{i + 1} has no id", file_line=file_line))
        return
    pid = str(pid)
    if pid in seen:
        errors.append(ProfileError("duplicate profile id", pid, file_line=file_line))
        return
    seen.add(pid)
    extra = [k for k in item if k not in PROFILE_KEYS]
    for key in extra:  # each at its own place: `exp:` for `expr:` is a typo to point at
        errors.append(
            ProfileError(
                f"{_at(name, _key_node(node, str(key)))}: profile {pid!r}: unknown key {str(key)!r} "
                f"(allowed: {', '.join(PROFILE_KEYS)})"
            )
        )
    if extra:
        return
    expr = item.get("expr")
    if expr is not None and not isinstance(expr, str):
        errors.append(
            ProfileError(
                f"expr must be a string, got {type(expr).__name__} {expr!r}",
                pid,
                file_line=file_line,
            )
        )
        return
    if not isinstance(expr, str) or not expr.strip():
        errors.append(ProfileError("missing expr", pid, file_line=file_line))
        return
    sub = item.get("subscriber")
    try:
        profile = parse_profile(expr, pid, str(sub) if sub is not None else None, tz)
    except ProfileError as e:
        expr_node = _node_get(node, "expr") if node is not None else None
        errors.append(e.located(pid, _expr_line(expr_node) if expr_node is not None else None))
        profile = None
    if "alarm" in item:
        spec, problems = parse_alarm(
            item["alarm"], _node_get(node, "alarm"), profile, pid, name, text
        )
        errors.extend(problems)
        if spec is None:
            return
        if profile is not None:
            out.alarms[pid] = spec
    if profile is not None:
        out.profiles.append(profile)


def _file_tz(value: Any, where: str, errors: list[ENSError]) -> str | None:
    """The file's ``tz:`` (an IANA zone name), or None with the problem added to `errors`."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if isinstance(value, str) and value.strip():
        try:
            ZoneInfo(value.strip())
            return value.strip()
        except (ZoneInfoNotFoundError, ValueError):
            pass
    errors.append(
        ProfileError(
            f"{where}: tz: unknown time zone {value!r} (an IANA name such as UTC or "
            "Europe/Berlin: the zone of localtime and weekday in this file's profiles)"
        )
    )
    return None


_TEMPLATE_LINE = re.compile(r"^templates\.\w+: line (\d+):")


def _template_line(at: yaml.Node, loc: Loc, msg: str) -> int:
    """Lines from a template's node to its problem: a block scalar (``slack: |``) starts on the
    next line, so a template's line N is N lines below the key; 0 when that is not known."""
    if (
        loc[:1] != ("templates",)
        or not isinstance(at, yaml.ScalarNode)
        or at.style not in ("|", ">")
    ):
        return 0
    m = _TEMPLATE_LINE.match(msg.partition(": ")[2])
    return int(m[1]) if m else 0


def _subscriber_entries(
    data: dict[str, Any], root: yaml.Node | None, name: str, out: ProfileSet, errors: list[ENSError]
) -> None:
    """The ``subscribers`` list, and the profiles that name one it lacks."""
    subs = data.get("subscribers") or []
    if not isinstance(subs, list):
        errors.append(ProfileError(f"{name}: 'subscribers' must be a list"))
        subs = []
    sub_ids: set[str] = set()
    snodes = _node_get(root, "subscribers")
    snode_items = snodes.value if isinstance(snodes, yaml.SequenceNode) else []
    for i, sub in enumerate(subs):
        problems = subscriber_messages(sub, i + 1)
        if not problems:
            out.subscribers.append(sub)
            sub_ids.add(sub["id"])
            continue
        node = snode_items[i] if i < len(snode_items) else None
        out.subscriber_problems += len(problems)
        for msg, loc, bad_key in problems:  # every problem, at the line of what it concerns
            if bad_key:  # FILE:LINE:COL of the key itself
                key_node = _key_node(_node_at(node, loc[:-1]), str(loc[-1]))
                errors.append(ProfileError(f"{_at(name, key_node)}: {msg}"))
                continue
            at = _node_at(node, loc)
            line = at.start_mark.line + 1 + _template_line(at, loc, msg) if at is not None else None
            errors.append(ProfileError(msg, file_line=line))
    if subs:
        unknown = [
            p for p in out.profiles if p.subscriber is not None and p.subscriber not in sub_ids
        ]
        for p in unknown:  # the profile is not valid after all
            errors.append(ProfileError(f"unknown subscriber {p.subscriber!r}", p.id))
        bad = {p.id for p in unknown}
        out.profiles = [p for p in out.profiles if p.id not in bad]
        out.alarms = {k: v for k, v in out.alarms.items() if k not in bad}
        out.invalid += len(unknown)
        out.profile_problems += len(unknown)


def read_profile_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ENSError(
            f"{path}: not UTF-8 text (a profile file is YAML or JSON in UTF-8)"
        ) from None
    except OSError as e:
        raise ENSError(f"cannot read profile file {path}: {e.strerror}") from None


def load_profile_file(path: str | Path) -> ProfileSet:
    """Load a profile file or raise (every problem at once)."""
    pset, errors = parse_profile_document(read_profile_text(path), str(path))
    if errors:
        if len(errors) == 1:
            raise errors[0]
        raise ManyErrors(errors)
    return pset
