"""The output end both engines share: numbered notifications, taken in batches.

Runtimes report a detection through `emit`, which numbers it in the order of detection; the
caller (`ens replay`, the service's worker, `ens spark`) takes them after each
event or batch. One implementation, so the single-step engine and its two-step baseline hand
out notifications the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from filters.notification import Notification
from profiles.events import Event


class NotificationOutput:
    """The engine's outgoing notifications (a base of both engines)."""

    def __init__(self) -> None:
        self._nseq = 0  # the last notification's number
        self._out: list[Notification] = []  # runtimes append here (the hot path: a plain list)

    def emit(
        self,
        profile: str,
        ts: float,
        events: dict[str, Event],
        partition: dict[str, Any] | None,
        subscriber: str | None,
    ) -> None:
        """A runtime's detection: numbered (the engine's detection counter) and kept until taken.
        The runtimes' one way to report (`filters.runtime.EngineHost`), so none touches the list."""
        self._nseq = n = self._nseq + 1
        self._out.append(Notification(profile, ts, events, partition, n, subscriber))

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

    def output_state(self) -> tuple[int, list[Notification]]:
        """The detection counter and (a copy of) the notifications not taken yet: what a
        stored engine keeps of its output (`filters.partrecords`' header record)."""
        return self._nseq, list(self._out)

    def restore_output(self, counter: int, pending: Iterable[Notification]) -> None:
        """The output an `output_state` described: the counter set, `pending` appended."""
        self._nseq = counter
        self._out.extend(pending)

    def reset_output(self) -> None:
        """No detection yet, nothing pending (the list emptied in place: one `collect_into`
        gave stays the caller's)."""
        self._nseq = 0
        self._out.clear()
