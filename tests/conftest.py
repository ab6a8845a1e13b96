"""Shared test setup. Fixtures `mofa_pm`, `mofa_predictor` and `mofa_fake_distribution` come
from mofa_framework.testing.pytest_plugin (the same ones plugin authors get)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
