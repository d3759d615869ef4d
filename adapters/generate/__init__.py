"""Synthetic event feeds with known ground truth (`ens generate ...`).

`facility.generate_facility` builds a building-sensor feed for examples/facility/profiles.yaml
with injected incidents; its truth list says which notification each incident must cause.
"""

from adapters.generate.facility import INCIDENT_TYPES, PROFILES, generate_facility

__all__ = ["INCIDENT_TYPES", "PROFILES", "generate_facility"]
