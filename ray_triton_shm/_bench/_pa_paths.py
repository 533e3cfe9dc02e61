"""Compatibility only: the names ``tests/test_perf_analyzer.py`` imports from here, now in
:mod:`.paths._perf_analyzer`. Remove once it imports them from there."""

from ray_triton_shm._bench.paths._perf_analyzer import PATHS, UNCHECKED, perf_analyzer_args

__all__ = ["PATHS", "UNCHECKED", "perf_analyzer_args"]
