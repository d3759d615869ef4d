"""The rare-first runtime of `seq(c1, ..., cn) within T`: a rare component drives (issue 16).

`lazy_base.py` holds the per-partition buffers and the drivers (`LazyBase`, `LazyPartition`),
`lazy.py` the entry point and the handlers of deferred components (`LazySeqRuntime`). It sees
the engine only through `filters.runtime.EngineHost`, and imports nothing of `filters/eager/`.
"""
