"""The eager composite runtime (CompAS single-step detection) and its state."""
