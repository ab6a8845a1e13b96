"""Shared test setup. Fixtures `mofa_pm`, `mofa_predictor` and `mofa_fake_distribution` come
from mofa_framework.testing.pytest_plugin (the same ones plugin authors get)."""

import os

from hypothesis import HealthCheck, settings

# The suite is deterministic: the same examples on every run and machine, so a landing run never
# fails on a draw the author never saw. `HYPOTHESIS_PROFILE=explore` draws fresh random examples
# (more of them) to hunt for new counterexamples; fix what it finds and the suite keeps it.
_quiet = [HealthCheck.too_slow]
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=_quiet)
settings.register_profile("dev", max_examples=15, deadline=None, derandomize=True, suppress_health_check=_quiet)
settings.register_profile("explore", max_examples=200, deadline=None, suppress_health_check=_quiet)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
