"""The archiver role: ``ens:archive:feed`` (what the engine processed, in its order) ->
Parquet files of the event archive (`adapters.archive`), exactly once.

It keeps its own position in ``ens:archive:position`` (the last feed entry archived and the
next ``seq``). A flush takes the entries read since the last one, marks their range as
being flushed, writes their files (each whole, renamed into place; named by the flush's first
``seq``), then in one MULTI/EXEC commits the new position, clears the mark and trims the feed
up to it. After a ``kill -9`` the start finds the mark and writes the same range again: the
feed entries are still there (trimmed only after the commit) and give the same rows, the same
``seq`` and the same file names, so files already renamed are kept and the missing ones
written. Nothing the engine committed is lost or archived twice.

It runs in a thread of its own (or its own process, ``ens serve --role archive``): the engine
only appends to the feed in its commits and never waits for it; the lag is reported as
``ens_archive_lag_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from adapters.archive.layout import SCHEMA, ingest_times, open_archive
from adapters.archive.retention import prune
from adapters.archive.writer import write_columns
from adapters.service import metrics as m
from adapters.service import redis_store as rs
from adapters.service.archive_feed import FEED, POSITION, ArchiverConfig, read_feed_entry

log = logging.getLogger("ens.service.archiver")


class Archiver:
    """Reads the feed from its committed position, writes files, commits the position."""

    def __init__(self, r: redis.Redis, cfg: ArchiverConfig) -> None:
        self.r = r
        self.cfg = cfg
        self.arc = open_archive(cfg.uri)
        self.started = False
        # (feed id, its columns) read, not archived yet
        self.pending: list[tuple[str, dict[str, list[Any]]]] = []
        self.rows_pending = 0
        self.read_id = "0-0"
        self.seq = 0
        self.last_flush = time.monotonic()
        self.last_prune = 0.0
        self.totals = {"events": 0, "files": 0, "bytes": 0}

    # ----------------------------------------------------------------------- position

    def start(self) -> None:
        """Load the position; finish a flush a crash interrupted."""
        pos: Any = self.r.hgetall(POSITION)
        pos = {rs.text(k): rs.text(v) for k, v in pos.items()}
        self.read_id = pos.get("id", "0-0")
        self.seq = int(pos.get("seq", 0))
        self.pending, self.rows_pending = [], 0
        flushing = pos.get("flushing")
        if flushing:
            first, last = flushing.split()
            entries: Any = self.r.xrange(FEED, min=first, max=last)
            self.pending = [(rs.text(i), read_feed_entry(f)) for i, f in entries]
            log.info(
                "archive: finishing the flush of feed entries %s..%s a stop interrupted",
                first,
                last,
            )
            self.flush()
        self.started = True
        log.info(
            "archive: writing %s from feed position %s (seq %d)",
            self.cfg.uri,
            self.read_id,
            self.seq,
        )

    def flush(self) -> None:
        """Write the pending rows as files, then commit the position past them."""
        if not self.pending:
            return
        first, last = self.pending[0][0], self.pending[-1][0]
        seq0 = self.seq
        cols: dict[str, list[Any]] = {n: [] for n in SCHEMA.names}
        for _fid, entry in self.pending:
            for name, values in entry.items():
                cols[name].extend(values)
        n = len(cols["key"])
        cols["late"] = [bool(x) for x in cols["late"]]
        cols["seq"] = list(range(seq0, seq0 + n))
        cols["ingest_ts"] = ingest_times(cols["key"])
        self.r.hset(POSITION, "flushing", f"{first} {last}")
        t0 = time.perf_counter()
        files, size = write_columns(self.arc, cols, seq0)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(POSITION, mapping={"id": last, "seq": seq0 + n})
        pipe.hdel(POSITION, "flushing")
        pipe.xtrim(FEED, minid=rs.next_id(last), approximate=False)
        pipe.execute()
        self.read_id, self.seq = last, seq0 + n
        self.pending, self.rows_pending = [], 0
        self.last_flush = time.monotonic()
        m.ARCHIVE_EVENTS.inc(n)
        m.ARCHIVE_FILES.inc(files)
        m.ARCHIVE_BYTES.inc(size)
        self.totals["events"] += n
        self.totals["files"] += files
        self.totals["bytes"] += size
        log.debug(
            "archive: %d events in %d files (%d bytes) in %.3f s",
            n,
            files,
            size,
            time.perf_counter() - t0,
        )

    # ----------------------------------------------------------------------- loop

    def step(self, block: float | None = None) -> int:
        """Read feed entries; flush when due; prune when due. Returns entries read."""
        if not self.started:
            self.start()
        wait = self.cfg.block if block is None else block
        if self.pending:
            wait = min(wait, max(self.cfg.flush - (time.monotonic() - self.last_flush), 0.0))
        last = self.pending[-1][0] if self.pending else self.read_id
        resp: Any = self.r.xread({FEED: last}, count=1000, block=int(wait * 1000) or None)
        got = 0
        for _stream, entries in resp or []:
            for fid, fields in entries:
                entry = read_feed_entry(fields)
                self.pending.append((rs.text(fid), entry))
                self.rows_pending += len(entry["key"])
                got += 1
                if self.rows_pending >= self.cfg.max_rows:  # files of at most about max_rows
                    self.flush()
        if self.pending and (
            self.rows_pending >= self.cfg.max_rows
            or time.monotonic() - self.last_flush >= self.cfg.flush
        ):
            self.flush()
        if not self.pending:
            self.last_flush = time.monotonic()  # the next event waits at most `flush`
        self._prune()
        return got

    def _prune(self) -> None:
        cfg = self.cfg
        if cfg.retention is None and not cfg.max_bytes:
            return
        mono = time.monotonic()
        if mono - self.last_prune < cfg.prune_every:
            return
        self.last_prune = mono
        gone = prune(self.arc, time.time(), cfg.retention, cfg.max_bytes)
        if gone:
            m.ARCHIVE_PRUNED.inc(len(gone))
            log.info("archive: retention removed %d partitions: %s", len(gone), ", ".join(gone))

    def run_forever(self, stop: threading.Event) -> None:
        """Step until ``stop``; a Redis or file error restarts from the committed position."""
        while not stop.is_set():
            if self.pending:  # gather the engine's commits for a while: one read, not one each
                due = self.cfg.flush - (time.monotonic() - self.last_flush)
                stop.wait(max(min(self.cfg.poll, due), 0.0))
            try:
                self.step()
            except (redis.RedisError, OSError) as exc:
                m.ARCHIVE_ERRORS.inc()
                log.error("archive: %s; starting again from the committed position in 1 s", exc)
                self.started = False
                stop.wait(1.0)
        try:
            if self.started:
                self.flush()
        except (redis.RedisError, OSError) as exc:
            log.error("archive: final flush failed (%s); the next start writes it", exc)
        log.info("archiver stopped: %s", self.totals)
