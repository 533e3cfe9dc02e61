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
from dataclasses import dataclass, field
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


@dataclass
class _Load:
    """The callers' load on the ``changing`` model, and what they count into ``result``.

    Attributes:
        client: The ``TritonSHMClient`` they call through.
        result: What they count into.
        stop: Set to stop them.
        latencies: Each answered request's latency, in seconds.
        changed_at: When the config was changed (``time.monotonic()``), once it was.
    """

    client: Any
    result: UpdateResult
    stop: threading.Event = field(default_factory=threading.Event)
    latencies: list[float] = field(default_factory=list)
    changed_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def call(self, seed: int) -> None:
        """One caller: calls with random inputs until :attr:`stop`, each answer checked."""
        rng = np.random.default_rng(seed)
        while not self.stop.is_set():
            x = rng.integers(0, 1000, (int(rng.integers(1, 9)), 4)).astype(np.float32)
            sent = time.monotonic()
            try:
                out = self.client.infer_shm("changing", {"INPUT0": x})["OUTPUT0"]
            except Exception as exc:  # counted: the run reports them
                self._failed(exc)
                continue
            self._answered(x, out, sent, time.monotonic())

    def _failed(self, exc: Exception) -> None:
        """Counts a failed request, and keeps its error among the first five."""
        with self._lock:
            self.result.failed += 1
            if len(self.result.errors) < 5:
                self.result.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def _answered(self, x: np.ndarray, out: np.ndarray, sent: float, done: float) -> None:
        """Counts an answer to ``x``: from which config, whether right, and its latency."""
        new = out.shape[1] == _NEW_WIDTH
        right = out.shape[1] in (_OLD_WIDTH, _NEW_WIDTH) and np.array_equal(
            out, _expected(x, out.shape[1])
        )
        result = self.result
        with self._lock:
            self.latencies.append(done - sent)
            result.wrong_answers += not right
            if new:
                result.new_config_answers += 1
                if result.first_new_answer_s is None and self.changed_at is not None:
                    result.first_new_answer_s = done - self.changed_at
            else:
                result.old_config_answers += 1


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
    from ray_triton_shm._client import registry_of

    result = UpdateResult(callers=callers)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rts-update-")))
        shutil.copytree(MODEL_TEMPLATE, root / "changing")
        try:
            client, admin = _serve(stack, root, startup_timeout_s, server_options)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        old_region = registry_of(client).get("changing").region.name
        load = _Load(client, result)
        threads = [threading.Thread(target=load.call, args=(seed,)) for seed in range(callers)]
        for thread in threads:
            thread.start()
        try:
            _change_halfway(root / "changing" / "config.pbtxt", admin, load, duration_s)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            load.stop.set()
            for thread in threads:
                thread.join()
        result.duration_s = time.monotonic() - started
        if load.latencies:
            ms = np.array(load.latencies) * 1000
            result.p50_ms, result.p99_ms = (float(v) for v in np.percentile(ms, [50, 99]))
            result.max_ms = float(ms.max())
        result.old_regions_left = _old_regions_left(admin, old_region)
    return result


def _serve(
    stack: contextlib.ExitStack,
    root: Path,
    startup_timeout_s: float,
    server_options: Mapping[str, Any] | None,
) -> tuple[Any, Any]:
    """A Triton of its own serving the models under ``root``, explicitly, the ``changing`` one
    registered on :data:`UPDATE_SLOTS` slots: its client and an admin client (both closed with
    ``stack``)."""
    import tritonclient.grpc as grpcclient

    from ray_triton_shm._client import TritonSHMClient
    from ray_triton_shm.local import LocalTritonServer

    server = LocalTritonServer(
        root,
        startup_timeout_s=startup_timeout_s,
        install=True,
        extra_args=["--model-control-mode=explicit", "--load-model=changing"],
        **(server_options or {}),
    )
    stack.enter_context(contextlib.closing(server)).start()
    client = stack.enter_context(TritonSHMClient(server.grpc_url, config_check_interval_s=None))
    admin = stack.enter_context(grpcclient.InferenceServerClient(server.grpc_url))
    client.register_shm_model("changing", pool_size=UPDATE_SLOTS)
    return client, admin


def _change_halfway(config_path: Path, admin: Any, load: _Load, duration_s: float) -> None:
    """Waits half of ``duration_s``, grows the model's output in its config, reloads it, and
    waits out the rest."""
    time.sleep(duration_s / 2)
    text = config_path.read_text()
    config_path.write_text(text.replace(f"dims: [ {_OLD_WIDTH} ]", f"dims: [ {_NEW_WIDTH} ]"))
    load.changed_at = time.monotonic()
    admin.load_model("changing")
    load.result.reload_s = time.monotonic() - load.changed_at
    time.sleep(max(0.0, duration_s / 2 - load.result.reload_s))


def _old_regions_left(admin: Any, old_region: str) -> int:
    """Whether the old layout's region is still in ``/dev/shm`` and registered with Triton
    (0 to 2), once it had :data:`_RETIRE_WAIT_S` to go."""
    from ray_triton_shm._slots._shm import SHM_DIR, region_of

    def left() -> int:
        status = admin.get_system_shared_memory_status(as_json=True).get("regions", {})
        registered = {region_of(name) for name in status}
        return int((SHM_DIR / old_region).exists()) + int(old_region in registered)

    deadline = time.monotonic() + _RETIRE_WAIT_S
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    return left()
