"""The errors of the engines, under `profiles.errors.ENSError`."""

from __future__ import annotations

from profiles.errors import ENSError


class StateError(ENSError):
    """An engine snapshot that this release cannot read (and why, and what to do)."""
