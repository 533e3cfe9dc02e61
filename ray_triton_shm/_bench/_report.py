"""Compatibility only: the names ``tests/test_perf_analyzer.py`` imports from here, now in
:mod:`.report._console` and :mod:`.report._json`. Remove once it imports them from there."""

from ray_triton_shm._bench.report._console import print_results
from ray_triton_shm._bench.report._json import bench_json

__all__ = ["bench_json", "print_results"]
