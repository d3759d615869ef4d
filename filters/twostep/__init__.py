"""The two-step baseline engine (shares only the pool and the leaf modules)."""
