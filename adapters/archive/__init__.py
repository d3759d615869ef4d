"""The event archive: every event the service's engine processed, as Parquet files partitioned
by the event's UTC date and hour (``date=YYYY-MM-DD/hour=HH/part-<seq>.parquet``, zstd).

`layout` (schema, paths, file systems), `writer` (files appear whole: written under a hidden
name, then renamed), `reader` (a time range, in engine order; corrupt files named, skipped and
counted), `retention` (by age or size). The service's archiver role
(`adapters.service.archiver`) writes it; `ens archive`, `ens replay --archive`,
`ens spark replay --archive` and `ens backtest` read it. docs/archive.md.
"""
