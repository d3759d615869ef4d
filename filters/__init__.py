"""The detection engines: a pure, deterministic core (no I/O, no clock: time is passed in).

The core sits at the top: the single-step engine (`engine.py`, its public interface
`interface.py`, its state by partition `partstate.py` and `partitions.py`, the state format
`state.py`, `restore.py`), what every runtime shares (`runtime.py`: `EngineHost`, the engine as
a runtime sees it) and the leaf modules both engines use (`compile.py`, `pattern.py`,
`temporal.py`, `notification.py`, `output.py`, `caps.py`, `localclock.py`, `canon.py`,
`errors.py`). Below it, one subpackage per part:

- `filters/pool/`: the primitive pool (Gough-style index), shared by both engines;
- `filters/eager/`: the eager composite runtime (CompAS single-step detection);
- `filters/rarefirst/`: the rare-first runtime of `seq`;
- `filters/plans/`: evaluation plans, and switching a profile between the two runtimes;
- `filters/twostep/`: the two-step baseline engine, apart from the single-step one.

A package's `__init__` imports nothing: modules import each other by module path. How they may
import each other is checked by `lint-imports` (pyproject.toml): docs/engine.md.
"""
