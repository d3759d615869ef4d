"""Evaluation plans: eager or rare-first per profile, and moving a profile between them.

`choose.py` is the pure planner (`Rates` from `ens spark stats`, the cost model, `choose`);
`replan.py` is `PlanSwitching`, mixed into `filters.engine.Engine`: plans per profile, rates
counted online, a runtime's state converted when its plan changes. The one subpackage that
imports both `filters/eager/` and `filters/rarefirst/`.
"""
