"""The Hypothesis profiles, for every test module (HYPOTHESIS_PROFILE picks one; tests/conftest.py loads it), and
the number of examples a test scales by under it."""

import os

from hypothesis import HealthCheck, settings

# `ci`, the default, is derandomized so that a CI run is reproducible; `random` draws the same number of examples
# afresh each run (reproduce one with --hypothesis-seed=N); `long` draws 20x as many.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=60, derandomize=True, database=None, deadline=None,
                          suppress_health_check=_QUIET)
settings.register_profile("random", max_examples=60, database=None, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("long", max_examples=1200, database=None, deadline=None, suppress_health_check=_QUIET)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
SCALE = {"ci": 1, "random": 1, "long": 20}[PROFILE]
