"""The rare-first runtime of `seq`: a rare component drives (issue 16)."""
