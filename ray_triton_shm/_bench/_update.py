"""The bench's model update under load: a model's config reloaded while callers keep calling.

Nothing to choose here: the run shows what a change of the model on Triton costs callers whose
pool follows it. A Triton of its own in ``--model-control-mode=explicit`` serves the
``changing`` model (shipped beside this module; each output is computed from the config it was
loaded with, so every answer says which config gave it). ``UPDATE_CALLERS`` threads call it
through one ``TritonSHMClient`` on ``UPDATE_SLOTS`` slots, every answer checked against its own
input; halfway, the config is edited (the output grown from 16 to 32 values per sample, past
the slots) and loaded. The run reports the answers from each config, the requests that failed
(with Triton's status), the wrong answers, how long Triton's reload took, the time from the
reload's start to the first answer from the new config, the latencies, and whether a region
of the old layout was left.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ray_triton_shm._bench._results import UPDATE_CALLERS, UPDATE_SLOTS, UpdateResult

__all__ = ["MODEL_TEMPLATE", "run_model_update"]

#: The ``changing`` model's repository entry.
MODEL_TEMPLATE = Path(__file__).resolve().parent / "models" / "changing"
_OLD_WIDTH, _NEW_WIDTH = 16, 32
#: How long the old region may take to go once the run ends (Triton done with it, then gone).
_RETIRE_WAIT_S = 30.0


def _expected(x: np.ndarray, width: int) -> np.ndarray:
    sums = x.astype(np.float64).sum(axis=1)
    return (sums[:, None] + np.arange(width)[None, :]).astype(np.float32)


def run_model_update(
    *,
    duration_s: float,
    startup_timeout_s: float = 180.0,
    callers: int = UPDATE_CALLERS,
    server_options: Mapping[str, Any] | None = None,
) -> UpdateResult:
    """Runs the model update for ``duration_s`` (the change at half of it); never raises for
    what it measures (``UpdateResult.error`` says what went wrong). ``server_options``: more
    arguments of its ``LocalTritonServer`` (its supervision)."""
    import tritonclient.grpc as grpcclient

    from ray_triton_shm._client import TritonSHMClient, registry_of
    from ray_triton_shm._slots._shm import SHM_DIR, region_of
    from ray_triton_shm.local import LocalTritonServer

    result = UpdateResult(callers=callers)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rts-update-")))
        shutil.copytree(MODEL_TEMPLATE, root / "changing")
        config_path = root / "changing" / "config.pbtxt"
        server = LocalTritonServer(
            root,
            startup_timeout_s=startup_timeout_s,
            install=True,
            extra_args=["--model-control-mode=explicit", "--load-model=changing"],
            **(server_options or {}),
        )
        try:
            stack.enter_context(contextlib.closing(server)).start()
            client = stack.enter_context(
                TritonSHMClient(server.grpc_url, config_check_interval_s=None)
            )
            admin = stack.enter_context(grpcclient.InferenceServerClient(server.grpc_url))
            client.register_shm_model("changing", pool_size=UPDATE_SLOTS)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        old_region = registry_of(client).get("changing").region.name
        stop = threading.Event()
        lock = threading.Lock()
        latencies: list[float] = []
        changed_at: list[float] = []

        def call(seed: int) -> None:
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                x = rng.integers(0, 1000, (int(rng.integers(1, 9)), 4)).astype(np.float32)
                sent = time.monotonic()
                try:
                    out = client.infer_shm("changing", {"INPUT0": x})["OUTPUT0"]
                except Exception as exc:  # counted: the run reports them
                    with lock:
                        result.failed += 1
                        if len(result.errors) < 5:
                            result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    continue
                done = time.monotonic()
                new = out.shape[1] == _NEW_WIDTH
                right = out.shape[1] in (_OLD_WIDTH, _NEW_WIDTH) and np.array_equal(
                    out, _expected(x, out.shape[1])
                )
                with lock:
                    latencies.append(done - sent)
                    result.wrong_answers += not right
                    if new:
                        result.new_config_answers += 1
                        if result.first_new_answer_s is None and changed_at:
                            result.first_new_answer_s = done - changed_at[0]
                    else:
                        result.old_config_answers += 1

        threads = [threading.Thread(target=call, args=(seed,)) for seed in range(callers)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(duration_s / 2)
            text = config_path.read_text()
            config_path.write_text(
                text.replace(f"dims: [ {_OLD_WIDTH} ]", f"dims: [ {_NEW_WIDTH} ]")
            )
            changed_at.append(time.monotonic())
            admin.load_model("changing")
            result.reload_s = time.monotonic() - changed_at[0]
            time.sleep(max(0.0, duration_s / 2 - result.reload_s))
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        result.duration_s = time.monotonic() - started
        if latencies:
            ms = np.array(latencies) * 1000
            result.p50_ms, result.p99_ms = (float(v) for v in np.percentile(ms, [50, 99]))
            result.max_ms = float(ms.max())

        def left() -> int:
            status = admin.get_system_shared_memory_status(as_json=True).get("regions", {})
            registered = {region_of(name) for name in status}
            return int((SHM_DIR / old_region).exists()) + int(old_region in registered)

        deadline = time.monotonic() + _RETIRE_WAIT_S
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        result.old_regions_left = left()
    return result
