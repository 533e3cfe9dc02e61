"""How many inputs each property test tried, by surface, and how many each tries.

``RAY_TRITON_SHM_PROPERTIES`` picks the Hypothesis profile: ``test`` (``make test``: a modest
number of examples) or ``soak`` (``make test-soak``: many more, the tests marked soak). Each
test asks :func:`examples` for its share, and counts every input it tried with :func:`tried`;
``tests/properties/conftest.py`` prints the totals when the session ends.
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

#: The environment variable that picks the profile.
PROFILE_ENV_VAR = "RAY_TRITON_SHM_PROPERTIES"
#: Each profile's factor over a test's own number of examples (its ``make test`` share),
#: unless the test says its soak share itself (the slow ones say less, the fast ones more).
FACTORS = {"test": 1, "soak": 12}

for _name in FACTORS:
    settings.register_profile(
        _name,
        deadline=None,  # a call to a real Triton varies with the machine's load
        database=None,  # nothing written to the tree; a failure prints how to reproduce it
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )

#: The profile of this run.
PROFILE = os.environ.get(PROFILE_ENV_VAR, "test")
if PROFILE not in FACTORS:
    raise ValueError(f"${PROFILE_ENV_VAR} is one of {sorted(FACTORS)}, got {PROFILE!r}")
settings.load_profile(PROFILE)

#: Inputs tried so far, by surface.
TRIED: Counter[str] = Counter()


def examples(make_test: int, *, soak: int | None = None) -> settings:
    """Settings for a test that tries ``make_test`` inputs in ``make test``, and ``soak``
    (default: the soak's factor more) in the soak."""
    if PROFILE == "soak" and soak is not None:
        return settings(max_examples=soak)
    return settings(max_examples=make_test * FACTORS[PROFILE])


def tried(surface: str, count: int = 1) -> None:
    """Counts ``count`` inputs tried on ``surface``."""
    TRIED[surface] += count
