"""Evaluation plans: eager or rare-first per profile, and switching between them."""
