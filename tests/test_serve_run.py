"""`serve run deployments/classifier.yaml`, as a user runs it, against the session's Triton.

The config is used as shipped, except for its HTTP port and Triton address (free ports here).
Ctrl-C then tears the whole local Ray down, the detached node actor with it: nothing of it may
stay in ``/dev/shm`` or registered in Triton.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from _helpers import free_ports, wait_for

from ray_triton_shm import region_status
from ray_triton_shm.local._server import LocalTritonServer

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deployments.classifier import synthetic_images  # noqa: E402

CONFIG = ROOT / "deployments" / "classifier.yaml"


def _config_for(triton: LocalTritonServer, port: int, path: Path) -> Path:
    text = CONFIG.read_text()
    edits = {"port: 8000": f"port: {port}", '"localhost:8001"': f'"{triton.grpc_url}"'}
    for old, new in edits.items():
        assert text.count(old) == 1, f"{CONFIG.name} no longer has {old!r}"
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _leftovers(url: str) -> list[str]:
    """Regions of ours, in /dev/shm or registered in Triton, whose owner is gone."""
    return [r.name for r in region_status(url).regions if r.owner == "dead"]


@pytest.mark.soak  # minutes of make test: CI's soak tier runs it
def test_serve_run_answers_http_and_ctrl_c_leaves_nothing(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    config = _config_for(triton, port, tmp_path / "classifier.yaml")
    serve_bin = Path(sys.executable).with_name("serve")
    # RAY_ADDRESS=local: a Ray of its own, never a cluster another test left running.
    env = {**os.environ, "RAY_ADDRESS": "local"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(serve_bin), "run", str(config)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/classify"

    def tail() -> str:
        return (tmp_path / "serve.log").read_text()[-4000:]

    def answered() -> Any:
        """The app's answer, once it answers (refused, 404 or 503 while it deploys)."""
        assert proc.poll() is None, tail()
        try:
            reply = requests.post(url, json={"seed": 0, "batch": 3}, timeout=30)
        except requests.ConnectionError:
            return None
        return reply.json() if reply.status_code == 200 else None

    try:
        answer = wait_for(
            answered, timeout_s=240, every_s=0.25, what=lambda: f"an answer; its log:\n{tail()}"
        )
        images = synthetic_images(0, 3)
        expected = images.reshape(3, -1)[:, :150000].reshape(3, 1000, 150).mean(axis=2)
        assert len(answer["top_k"]) == 3
        for row, scores in zip(answer["top_k"], expected, strict=True):
            classes = [entry["class"] for entry in row]
            assert classes == list(np.argsort(-scores, kind="stable")[:5])
            np.testing.assert_allclose([e["score"] for e in row], scores[classes], rtol=1e-5)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()

    # The node actor was killed with Ray, not shut down: its reaper cleans up after it.
    wait_for(
        lambda: _leftovers(triton.grpc_url) == [],
        timeout_s=30,
        what="the killed node actor's reaper to clean up after it",
    )
