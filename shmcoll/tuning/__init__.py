"""Which schedule runs: the algorithms with their cost formulas (algorithms/), the
cost table and overrides (selector), a path's cached decisions (decider), and the
machine parameters that price them (calibration, reference_calibration.json)."""
