import os

from hypothesis import HealthCheck, settings

# Property tests: deterministic in CI (same examples every run), no per-example deadline
# (the machines are shared and slow), a modest number of examples so `make test` stays quick.
settings.register_profile(
    "fusionlab", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fusionlab"))
