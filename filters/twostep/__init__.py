"""The classic two-step engine: the baseline the single-step engine is measured against.

`engine.py` is `TwoStepEngine` (same public interface, `filters.interface.DetectionEngine`),
`pattern.py` its reading of a composite pattern as a tree. It shares with the single-step engine
only the pool (`filters/pool/`) and the core's leaf modules (compile, temporal pool,
notification, output, caps, local clock): `lint-imports` checks it.
"""
