"""The tasks' idempotent writes: notifications to the outbox, late records to ``ens:late``.

Spark re-executes a micro-batch after a crash from the offsets and state it checkpointed; the
re-execution gives the same notification ids (`adapters.spark.live`) and late event keys, and
these writers skip what was written already (a marker key with a TTL, one Lua script per chunk).
"""

from __future__ import annotations

from typing import Any

from adapters.service.late import LATE, LateRecord
from notifiers import store

WRITTEN = "ens:spark:written:"  # + notification id: written to the outbox (TTL)
LATE_WRITTEN = "ens:spark:late:"  # + event key: its late record written to ens:late (TTL)

_WRITE = """
local n = 0
for i = 2, #ARGV, 2 do
  if redis.call('SET', KEYS[1] .. ARGV[i], '1', 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[2], '*', 'n', ARGV[i + 1])
    n = n + 1
  end
end
return n
"""

# ARGV: ttl, maxlen, then per record: event key, number of field/value items, the items
_WRITE_LATE = """
local n = 0
local i = 3
while i <= #ARGV do
  local k = tonumber(ARGV[i + 1])
  if redis.call('SET', KEYS[1] .. ARGV[i], '1', 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, i + 2, i + 1 + k))
    n = n + 1
  end
  i = i + 2 + k
end
return n
"""


class Outbox:
    """Idempotent outbox writes: an id already written (within `ttl` s) is not written again."""

    def __init__(self, r: Any, ttl: int = 7 * 86400) -> None:
        self.script = r.register_script(_WRITE)
        self.ttl = ttl

    def write(self, records: list[dict[str, Any]], chunk: int = 500) -> int:
        n = 0
        for i in range(0, len(records), chunk):
            args: list[Any] = [self.ttl]
            for rec in records[i : i + chunk]:
                args += [rec["id"], store.dumps(rec)]
            n += int(self.script(keys=[WRITTEN, store.OUTBOX], args=args))
        return n


class LateOutput:
    """Idempotent writes of late records to ``ens:late`` (the service's late output, trimmed
    to about `maxlen`): an event key whose record was written (within `ttl` s) is not written
    again, so a micro-batch re-executed after a crash, or an event late for both its key's
    engine and the global engine, gives one record."""

    def __init__(self, r: Any, ttl: int = 7 * 86400, maxlen: int = 10_000) -> None:
        self.script = r.register_script(_WRITE_LATE)
        self.ttl = ttl
        self.maxlen = maxlen

    def write(self, records: list[LateRecord], chunk: int = 500) -> int:
        n = 0
        for i in range(0, len(records), chunk):
            args: list[Any] = [self.ttl, self.maxlen]
            for rec in records[i : i + chunk]:
                items = [x for kv in rec.fields().items() for x in kv]
                args += [rec.key, len(items), *items]
            n += int(self.script(keys=[LATE_WRITTEN, LATE], args=args))
        return n
