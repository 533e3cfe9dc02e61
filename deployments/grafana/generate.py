"""Regenerates the checked-in Grafana dashboard and its ConfigMap from the panel definitions.

Run from anywhere, in the environment with the library and Ray::

    python deployments/grafana/generate.py

It writes ``deployments/grafana/ray_triton_shm_grafana_dashboard.json`` and
``deployments/kuberay/grafana-dashboard-configmap.yaml`` (Ray's ``RAY_GRAFANA_RAY_TRITON_SHM_*``
overrides are ignored: the checked-in copies are the defaults). ``tests/test_grafana_dashboard.py``
fails while they differ from what ``ray_triton_shm/ray/_dashboard.py`` makes.
"""

from __future__ import annotations

from pathlib import Path

from ray_triton_shm.ray._dashboard import _write_deployments

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    for path in _write_deployments(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
