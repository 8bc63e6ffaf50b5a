import os

from hypothesis import HealthCheck, settings

# Profiles: "ci" (default, quick) and "thorough" (>= 1000 examples per property, run by hand:
# HYPOTHESIS_PROFILE=thorough python -m pytest tests -k property).
settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
