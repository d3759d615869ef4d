"""How auxiliary profiles enter and leave the primitive pool: the three variants of the engine.

A partial match waiting for a component has that component's filter in the pool as an
*auxiliary profile* (with the partition's `per` values and the where-values bound so far as
equality predicates). A partition counts, per registration key (leaf, eqs), the PMs waiting
on it (`Partition.regs`); the variant decides what happens when that count leaves or
reaches zero:

- `dynamic`: insert on the first waiting PM, delete after the last one.
- `marking`: keep an auxiliary profile without bound where-values in the pool, unmarked,
  until the partition is released; the next PM marks it again for free.
- `references`: like marking, but the profile's owner stays on it too (*dormant*): the next
  PM takes it back for free, and the first event it receives while dormant takes it off.
  A profile without `per` has its value-free auxiliary profiles indexed, ownerless, from
  the moment it is added until it goes: an event that reaches one while nobody waits still
  reaches no profile, and a partial match's insert is an owner count (no index update); as
  that costs no index update, its owner leaves with the last waiting PM (no dormancy: an
  event reaching a dormant owner took the general path to take it off).

The engine picks one implementation when it is built (`VARIANTS[name](pool)`); runtimes call
it only when a count changes between 0 and 1, never per event.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from filters.eager.matches import Partition
from filters.pattern import Pattern
from filters.pool.primitive import Entry, Eqs, PrimitivePool
from filters.runtime import RegKey


class AuxOwner(Protocol):
    """The composite runtime, as the registrations see it."""

    idx: int
    pat: Pattern
    aux_entries: dict[int, Entry]  # leaf -> its auxiliary profile, planned once (`prepare`)
    owners: tuple[tuple[int, int], ...]  # leaf -> (idx, leaf): its owner in the pool, one object
    aux_pins: tuple[Entry, ...]  # what `prepare` pinned (`drop_profile` unpins)
    start_set: frozenset[int]  # its starting leaves (in the pool while it lives)


def full_eqs(part: Partition, eqs: Eqs) -> Eqs:
    """The equality predicates of a registration in `part`: its `per` values, then `eqs`."""
    if part.values:
        return tuple(part.values.items()) + eqs
    return eqs


def hold(part: Partition, key: RegKey) -> None:
    """Record that `part` keeps `key`'s auxiliary profile in the pool (its set made on demand)."""
    held = part.held
    if held is None:
        part.held = {key}
    else:
        held.add(key)


def entry_of(rt: AuxOwner, part: Partition, key: RegKey) -> Entry:
    """The pool entry a registration holds: without `per` and bound values, the runtime's own
    for the leaf (one partition has it: no dict per partition), else the partition's."""
    if not key[1] and not part.values:
        return rt.aux_entries[key[0]]
    return part.entries[key]  # type: ignore[index]  # made by the insert that registered it


class AuxiliaryRegistrations(ABC):
    """One variant: what a partition's first waiting PM inserts and its last one leaves."""

    name: str = ""
    prepares = True  # plans auxiliary profiles without bound values once per profile
    # `remove` leaves the owner on a value-free profile of a `per` partition (references)
    keeps_dormant = False
    # a profile's value-free auxiliary profiles are indexed when it is added and stay for its
    # life, ownerless while nobody waits (references): a partial match adds its owner, a count
    preindexes = False

    def __init__(self, pool: PrimitivePool) -> None:
        self.pool = pool

    @abstractmethod
    def insert(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        """The first PM of `part` waits on `key` (`part.regs[key]` was just set to 1)."""

    @abstractmethod
    def remove(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        """The last PM of `part` waiting on `key` stopped (`part.regs[key]` is 1): drop the
        count (or leave it 0, dormant) and the pool entry as the variant says."""

    @abstractmethod
    def restore(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        """Put a restored snapshot's registration back into a fresh pool."""

    def prepare(self, rt: AuxOwner) -> None:
        """Plan, once, the auxiliary profiles that do not depend on bound values (no where-
        equality): a partial match then inserts its own by an index update only."""
        if not self.prepares:
            return
        pool = self.pool
        eqb = rt.pat.eq_bindings
        pins = self.preindexes and not rt.aux_pins  # (pinned once per runtime)
        for lf in rt.pat.leaves:
            if lf.clock is None and not eqb.get(lf.idx):
                entry = rt.aux_entries.get(lf.idx)  # (a converted runtime's PMs made some)
                if entry is None:
                    entry = pool.prepare(lf.filter)
                if pins and lf.idx not in rt.start_set:  # (a start is indexed anyway)
                    entry = pool.pin(entry)
                    rt.aux_pins += (entry,)
                rt.aux_entries[lf.idx] = entry

    def drop_profile(self, rt: AuxOwner) -> None:
        """The profile goes: its pinned auxiliary profiles leave if nobody else holds them;
        unpinned ones out of the pool (`dynamic`) leave `prepare`'s cache."""
        pins = rt.aux_pins
        if pins:
            rt.aux_pins = ()
            for entry in pins:
                self.pool.unpin(entry)
        elif not self.preindexes:
            for entry in rt.aux_entries.values():
                if not entry.indexed:
                    self.pool.forget(entry)

    @abstractmethod
    def release(self, rt: AuxOwner, part: Partition) -> None:
        """The partition emptied: take its kept auxiliary profiles out of the pool."""

    def retire(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        """`remove` when the profile goes next (`once`, reported): nothing needs to stay."""
        self.remove(rt, part, key)

    def drop_dormant(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        """A dormant registration received an event (nobody waits): take our owner off."""
        del part.regs[key]
        part.dormant -= 1
        self.pool.release(entry_of(rt, part, key), rt.owners[key[0]], True)


class Dynamic(AuxiliaryRegistrations):
    """Insert an auxiliary profile for the first waiting PM, delete it after the last."""

    name = "dynamic"
    holds = False  # keeps value-free auxiliary profiles in `part.held` (references)

    def insert(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        leaf, eqs = key
        pool = self.pool
        owner = rt.owners[leaf]
        if not eqs and not part.values:  # the runtime's entry, planned with the profile
            aux = rt.aux_entries.get(leaf)
            if aux is None:
                aux = rt.aux_entries[leaf] = pool.prepare(rt.pat.leaves[leaf].filter)
            elif aux.indexed:  # `revive` of an entry in the pool (kept by references), inline:
                if self.holds and not aux.pins:  # (a pinned one stays while the profile lives)
                    hold(part, key)
                owners = aux.owners  # a waiting PM's next component, every cycle of a key
                prev = owners.get(owner, 0)
                owners[owner] = prev + 1
                if not prev:
                    pool.owner_count += 1
                    aux.solo = aux.fanout = None
                return
            if self.holds:
                hold(part, key)
            live = pool.revive(aux, owner)  # kept in the pool (references): a count
            if live is not aux:  # the pool's own entry: the next PM's `revive` is a count
                rt.aux_entries[leaf] = live
            return
        entries = part.entries
        if entries is None:
            entries = part.entries = {}
        entry = entries.get(key)  # references: kept in the pool without owners
        if entry is not None and pool.claim(entry, owner):
            return
        if self.holds and not eqs:
            hold(part, key)
        entries[key] = pool.add(rt.pat.leaves[leaf].filter, owner, full_eqs(part, eqs))

    def remove(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        del part.regs[key]
        if key[1] or part.values:
            entry = part.entries.pop(key)  # type: ignore[union-attr]  # made by `insert`
        else:
            entry = rt.aux_entries[key[0]]
        self.pool.release(entry, rt.owners[key[0]])

    def restore(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        leaf, eqs = key
        entry = self.pool.add(rt.pat.leaves[leaf].filter, rt.owners[leaf], full_eqs(part, eqs))
        if eqs or part.values:
            if part.entries is None:
                part.entries = {}
            part.entries[key] = entry
        else:
            rt.aux_entries[leaf] = entry
        if self.holds and not eqs and not entry.pins:
            hold(part, key)

    def release(self, rt: AuxOwner, part: Partition) -> None:
        pool = self.pool
        regs = part.regs
        held = part.held
        if part.dormant:
            owners = rt.owners
            for key in [k for k, n in regs.items() if not n]:
                del regs[key]
                # held: it leaves for good (as in the loop below): our owner, then the entry
                # if that was the last (every `once` completion)
                if held and key in held:
                    held.discard(key)
                    if key[1] or part.values:
                        entry = part.entries.pop(key)  # type: ignore[union-attr]
                    else:  # (a pinned one stays indexed: see `drop_profile`)
                        entry = rt.aux_entries[key[0]]
                    pool.release(entry, owners[key[0]])
                else:
                    pool.release(entry_of(rt, part, key), owners[key[0]], True)
            part.dormant = 0
        if not held:
            return
        entries = part.entries
        for key in held:
            if key in regs:
                continue
            if key[1] or part.values:
                entry = entries.pop(key, None) if entries else None
            else:
                entry = rt.aux_entries.get(key[0])
            if entry is not None and entry.indexed:  # the pool's entry for the key: no look-up
                if not entry.owners:  # (`purge_entry`'s test: others share it, e.g. `once` ends)
                    pool.purge_entry(entry)
            else:
                pool.purge(rt.pat.leaves[key[0]].filter, full_eqs(part, key[1]))
        held.clear()


class References(Dynamic):
    """Keep value-free auxiliary profiles with their owner (dormant) until the partition goes
    (`per` partitions); index those of a profile without `per` while it lives (`preindexes`)."""

    name = "references"
    keeps_dormant = True
    holds = True
    preindexes = True

    def remove(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        if not key[1] and part.values:  # dormant: our owner stays on the partition's entry
            part.regs[key] = 0
            part.dormant += 1
            return
        super().remove(rt, part, key)  # (no `per`: our owner off, a pinned entry stays indexed)

    def retire(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        held = part.held
        if held:
            held.discard(key)  # (`release` finds nothing left to purge)
        super().remove(rt, part, key)  # never dormant: the profile goes


class Marking(AuxiliaryRegistrations):
    """Keep value-free auxiliary profiles in the pool, unmarked, until the partition goes."""

    name = "marking"
    prepares = False

    def insert(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        held = part.held
        if held and key in held:
            return  # already in the pool, unmarked: marking it is the count
        hold(part, key)
        leaf, eqs = key
        self.pool.add(rt.pat.leaves[leaf].filter, rt.owners[leaf], full_eqs(part, eqs))

    def remove(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        del part.regs[key]
        leaf, eqs = key
        if not eqs:
            return  # stays in the pool, unmarked, until the partition is released
        if part.held:
            part.held.discard(key)
        self.pool.remove(rt.pat.leaves[leaf].filter, rt.owners[leaf], full_eqs(part, eqs))

    def restore(self, rt: AuxOwner, part: Partition, key: RegKey) -> None:
        leaf, eqs = key
        self.pool.add(rt.pat.leaves[leaf].filter, rt.owners[leaf], full_eqs(part, eqs))
        if not eqs:
            hold(part, key)

    def release(self, rt: AuxOwner, part: Partition) -> None:
        regs = part.regs
        held = part.held
        if not held:
            return
        for key in held:  # never dormant: `remove` drops every count
            if key not in regs:
                leaf, eqs = key
                self.pool.remove(rt.pat.leaves[leaf].filter, rt.owners[leaf], full_eqs(part, eqs))
        held.clear()


VARIANTS: dict[str, type[AuxiliaryRegistrations]] = {
    cls.name: cls for cls in (Dynamic, Marking, References)
}
