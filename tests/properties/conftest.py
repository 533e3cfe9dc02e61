"""The property tests (Hypothesis): generated inputs on every surface the library reads but did
not write. In the soak profile (``RAY_TRITON_SHM_PROPERTIES=soak``, ``make test-soak``) they
are marked soak, and allowed the time they take; the session ends with the inputs each surface
tried."""

from __future__ import annotations

import pytest
from _counts import PROFILE, TRIED

#: A test's timeout in the soak profile (pytest-timeout's default is 240 s).
SOAK_TIMEOUT_S = 1200


@pytest.hookimpl(tryfirst=True)  # before -m soak deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the soak profile, every property test is a soak."""
    if PROFILE != "soak":
        return
    for item in items:
        if "properties" in item.path.parts:
            item.add_marker(pytest.mark.soak)
            item.add_marker(pytest.mark.timeout(SOAK_TIMEOUT_S))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The inputs tried, by surface."""
    if not TRIED:
        return
    terminalreporter.section(f"property tests: inputs tried (profile {PROFILE!r})")
    for surface, count in sorted(TRIED.items()):
        terminalreporter.write_line(f"{surface:<28} {count:>9,}")
    terminalreporter.write_line(f"{'total':<28} {sum(TRIED.values()):>9,}")
