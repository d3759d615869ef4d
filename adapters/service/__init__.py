"""`ens serve`: the Redis-backed ENS service.

Gateways POST events over HTTP (`api`); they are appended to the durable ingest stream; the
engine worker (`worker`) feeds them to the single-step engine in time order and writes
notifications to the outbox of `notifiers.store`, journalling its inputs with them and
snapshotting its state so that a crash neither loses nor duplicates a notification. `server` runs everything in one process;
`cli` holds the `ens serve | profile | subscriber | gateway | post` commands. See docs/service.md.
"""
