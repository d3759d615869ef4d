"""Notifications per profile: the table of `ens replay --summary` and of `ens demo`, its JSON
form (`--json`) and the hourly plot (`--plot`).

One summary, three renderings: the table, the JSON document and the plot are built from the
same `ProfileRow`s, so what a script reads is what a person sees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.console import Console
    from rich.table import Table

TOP_PARTITIONS = 5  # partition values shown per profile (the rest are counted)
TOP_PROFILES = 8  # series of the plot; the other profiles are summed as "other"
OTHER = "other"
SILENT_ROWS = 20  # profiles without notifications listed one by one; more are counted in a row


def when(ts: float | None, seconds: bool = False) -> str:
    """A notification time as the tables show it (UTC)."""
    if ts is None:
        return "-"
    fmt = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return datetime.fromtimestamp(ts, UTC).strftime(fmt)


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def partition_label(partition: dict[str, Any]) -> str:
    """``room=101`` (``building=B1,room=101`` for several `per` attributes)."""
    return ",".join(f"{k}={v}" for k, v in partition.items())


@dataclass
class ProfileRow:
    """One profile's notifications: how many, when, and per partition value how many."""

    profile: str
    subscriber: str | None
    count: int = 0
    first: float | None = None
    last: float | None = None
    # per partition (its `per` attributes and values, in order) the notifications
    partitions: Counter[tuple[tuple[str, Any], ...]] = field(default_factory=Counter)

    def top(self, n: int = TOP_PARTITIONS) -> list[tuple[dict[str, Any], int]]:
        """The ``n`` partitions with most notifications (ties by label, for a stable order)."""
        ranked = sorted(self.partitions.items(), key=lambda kv: (-kv[1], repr(kv[0])))
        return [(dict(p), c) for p, c in ranked[:n]]

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "subscriber": self.subscriber,
            "matches": self.count,
            "first": _rfc3339(self.first),
            "last": _rfc3339(self.last),
            "partitions": len(self.partitions),
            "top_partitions": [{"partition": p, "count": c} for p, c in self.top()],
        }


def summary_rows(profiles: Iterable[Any], notes: Iterable[dict[str, Any]]) -> list[ProfileRow]:
    """A row per profile (in the profiles' order, those without notifications too), from
    notification records (`Notification.to_json`, or outbox records)."""
    rows = {p.id: ProfileRow(p.id, p.subscriber) for p in profiles}
    for n in notes:
        row = rows.setdefault(n["profile"], ProfileRow(n["profile"], n.get("subscriber")))
        row.count += 1
        row.first = n["ts"] if row.first is None else min(row.first, n["ts"])
        row.last = n["ts"] if row.last is None else max(row.last, n["ts"])
        if n.get("partition") is not None:
            row.partitions[tuple(n["partition"].items())] += 1
    return list(rows.values())


def summary_json(rows: Sequence[ProfileRow], events: int | None = None) -> dict[str, Any]:
    """The document of `ens replay --summary --json`: the table's content."""
    doc: dict[str, Any] = {
        "notifications": sum(r.count for r in rows),
        "profiles": [r.to_json() for r in rows],
    }
    if events is not None:
        doc["events"] = events
    return doc


def _top_cell(row: ProfileRow) -> str:
    if not row.partitions:
        return "-"
    lines = [f"{partition_label(p)}: {c}" for p, c in row.top()]
    more = len(row.partitions) - TOP_PARTITIONS
    return "\n".join(lines + ([f"+{more} more"] if more > 0 else []))


def table(rows: Sequence[ProfileRow], title: str, partitions: bool = True) -> Table:
    """Profiles, subscribers, notifications, first and last (and the top partitions).

    A row per profile, in the order given; more than `SILENT_ROWS` profiles without
    notifications (an index of 10^5 profiles) are counted in one row instead.
    """
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    t.add_column("profile")
    t.add_column("subscriber")
    t.add_column("notifications", justify="right")
    if partitions:
        t.add_column(f"top {TOP_PARTITIONS} partitions: notifications")
    t.add_column("first (UTC)")
    t.add_column("last (UTC)")
    silent = [r for r in rows if not r.count]
    fold = len(silent) > SILENT_ROWS  # a large profile set: its silent profiles in one row
    for row in rows:
        if fold and not row.count:
            continue
        cells = [row.profile, row.subscriber or "-", str(row.count)]
        if partitions:
            cells.append(_top_cell(row))
        cells += [when(row.first), when(row.last)]
        # Text, not markup: a partition value like "[lab]" is shown as it is
        t.add_row(*(Text(c) for c in cells), style=None if row.count else "dim")
    if fold:
        cells = [f"({len(silent)} profiles without notifications)", "", "0"]
        t.add_row(*cells, *([""] * (len(t.columns) - len(cells))), style="dim")
    t.add_section()
    total = ["total", "", str(sum(r.count for r in rows))]
    t.add_row(*total, *([""] * (len(t.columns) - len(total))))
    return t


# ----------------------------------------------------------------------------- the plot


def hourly_series(
    notes: Sequence[dict[str, Any]], top: int = TOP_PROFILES
) -> tuple[list[float], dict[str, list[int]]]:
    """Notifications per hour: the hours (epoch seconds, every hour from the first
    notification's to the last's) and per series the counts. The ``top`` profiles with most
    notifications have a series each (by count, ties by id); the rest are summed as "other"."""
    if not notes:
        return [], {}
    per_profile = Counter(n["profile"] for n in notes)
    ranked = sorted(per_profile, key=lambda p: (-per_profile[p], p))
    shown = set(ranked[:top])
    names = ranked[:top] + ([OTHER] if len(ranked) > top else [])
    first = int(min(n["ts"] for n in notes) // 3600)
    last = int(max(n["ts"] for n in notes) // 3600)
    series = {name: [0] * (last - first + 1) for name in names}
    for n in notes:
        name = n["profile"] if n["profile"] in shown else OTHER
        series[name][int(n["ts"] // 3600) - first] += 1
    return [float(h * 3600) for h in range(first, last + 1)], series


def _color(i: int, name: str) -> str:
    return "0.75" if name == OTHER else f"C{i % 10}"


def plot_hourly(
    notes: Sequence[dict[str, Any]], path: Path, top: int = TOP_PROFILES, title: str = ""
) -> Figure:
    """Write the notifications per hour per profile to ``path`` (PNG) and return the figure.

    A `Figure` of its own (no pyplot): no global state, nothing to close.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.figure import Figure

    hours, series = hourly_series(notes, top)
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title or "Notifications per hour")
    ax.set_ylabel("notifications per hour (stacked)")
    ax.set_xlabel("hour (UTC)")
    if hours:
        # one step per hour, stacked (lines of equal counts would hide each other); the extra
        # edge closes the last hour
        x = [date2num(datetime.fromtimestamp(h, UTC)) for h in [*hours, hours[-1] + 3600]]
        ys = [[*counts, counts[-1]] for counts in series.values()]
        colors = [_color(i, name) for i, name in enumerate(series)]
        labels = [f"{name} ({sum(counts)})" for name, counts in series.items()]
        ax.stackplot(x, *ys, labels=labels, colors=colors, step="post")
        ax.set_xlim(x[0], x[-1])
        ax.xaxis_date(tz=UTC)
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        handles, names = ax.get_legend_handles_labels()
        ax.legend(  # top of the stack first
            handles[::-1],
            names[::-1],
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize="small",
            frameon=False,
        )
    else:
        ax.text(0.5, 0.5, "no notifications", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(bottom=0)
    fig.savefig(path, format="png", dpi=100)
    return fig


# ----------------------------------------------------------------------------- `ens replay`


def check_plot_path(path: Path) -> None:
    """Refuse a --plot that cannot be written before the replay runs, not after."""
    from profiles.errors import ENSError

    if path.is_dir():
        raise ENSError(f"--plot {path} is a directory; give a file name (FILE.png)")
    if not path.parent.is_dir():
        raise ENSError(f"cannot write --plot {path}: no directory {path.parent}")


def report(
    profiles: Iterable[Any],
    notes: Sequence[dict[str, Any]],
    source: str,
    *,
    show: bool = True,
    as_json: bool = False,
    plot: Path | None = None,
    top: int = TOP_PROFILES,
    console: Console | None = None,
) -> None:
    """What `ens replay --summary/--json/--plot` prints (on ``console``) and writes."""
    import json
    import sys

    from profiles.errors import ENSError

    rows = summary_rows(profiles, notes)
    if plot is not None:
        try:
            plot_hourly(notes, plot, top, f"Notifications per hour ({source})")
        except OSError as exc:
            raise ENSError(f"cannot write --plot {plot}: {exc.strerror or exc}") from None
    if as_json:
        sys.stdout.write(json.dumps(summary_json(rows), indent=2, ensure_ascii=False) + "\n")
    elif show:
        if console is None:
            from rich.console import Console

            console = Console()
        console.print(table(rows, f"Notifications per profile ({source})"))
