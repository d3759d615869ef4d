"""The eager composite runtime (CompAS single-step detection) and its state.

One class built in layers, a module each (docs/engine.md): `composite_base.py` (tables,
partitions, registrations) <- `binding.py` <- `lifecycle.py` <- `stepping.py` <- `composite.py`
(`CompositeRuntime`, the entry point and fast paths); `matches.py` holds the state
(`PartialMatch`, `Partition`), `auxiliary.py` the variants by which auxiliary profiles enter and
leave the pool. It sees the engine only through `filters.runtime.EngineHost`, and imports
nothing of `filters/rarefirst/` or `filters/plans/`.
"""
