"""Compatibility only: the names ``tests/test_perf_analyzer.py`` imports from here, now in
:mod:`.paths._base` and :mod:`._load`. Remove once it imports them from there."""

from ray_triton_shm._bench._load import SliceSummary
from ray_triton_shm._bench.paths._base import BenchTarget, SkipPath

__all__ = ["BenchTarget", "SkipPath", "SliceSummary"]
