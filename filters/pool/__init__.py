"""The primitive pool: filters indexed Gough-style, shared by both engines (no runtime state).

`primitive.py` is the pool (`PrimitivePool`: insert, delete, match; `Entry`), `plan.py` how one
clause is indexed (its access predicate and residual check), `index.py` the index (equality
buckets, sorted ranges), `memo.py` the match memo kept by the equality values. It imports only
`filters.compile` and the profile AST: the engines hold it, it knows nothing of them.
"""
