"""The output end both engines share: numbered notifications, taken in batches.

Runtimes append a `Notification` per detection, numbered in the order they are detected
(`_nseq`); the caller (`ens replay`, the service's worker, `ens spark`) takes them after each
event or batch. One implementation, so the single-step engine and its two-step baseline hand
out notifications the same way.
"""

from __future__ import annotations

from filters.notification import Notification


class NotificationOutput:
    """The engine's outgoing notifications (a base of both engines)."""

    def __init__(self) -> None:
        self._nseq = 0  # the last notification's number
        self._out: list[Notification] = []  # runtimes append here (the hot path: a plain list)

    def collect_into(self, out: list[Notification]) -> None:
        """Append notifications to `out` from now on, until `take_notifications` starts a new
        list: instrumentation (`bench/paper.py` time-stamps every append)."""
        self._out = out

    def take_notifications(self) -> list[Notification]:
        """The notifications produced since the last call, in detection order."""
        out, self._out = self._out, []
        return out

    def pending(self) -> int:
        """Notifications produced and not taken yet."""
        return len(self._out)
