"""TritonSHMClient against a real Triton: results, chunking, variable shapes, lifecycle."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from _helpers import classifier_expected, in_threads, our_regions, registered_on, wait_for

from ray_triton_shm import (
    ClientClosedError,
    InvalidInputError,
    ModelNotRegisteredError,
    ModelSpecError,
    SlotTimeoutError,
    TritonServerError,
    TritonSHMClient,
)
from ray_triton_shm.local import LocalTritonServer

rng = np.random.default_rng(0)


def my_model_expected(x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = x0.shape[0]
    out0 = x0.reshape(b, -1)[:, :512] + x1.sum(axis=1, keepdims=True).astype(np.float32)
    return out0, x1[:, :5] * 2


# ---------------------------------------------------------------- results


def test_specs_come_from_the_server_config(client: TritonSHMClient) -> None:
    spec = client.register_shm_model("my_model")
    assert spec.max_batch_size == 8
    assert [(t.name, t.shape, t.dtype) for t in spec.inputs] == [
        ("INPUT0", (3, 224, 224), np.dtype(np.float32)),
        ("INPUT1", (10,), np.dtype(np.int32)),
    ]
    assert [(t.name, t.shape, t.datatype) for t in spec.outputs] == [
        ("OUTPUT0", (512,), "FP32"),
        ("OUTPUT1", (5,), "INT32"),
    ]


def test_classifier_values(client: TritonSHMClient) -> None:
    client.register_shm_model("classifier")
    x = rng.random((8, 3, 224, 224), dtype=np.float32)
    out = client.infer_shm("classifier", {"INPUT0": x})["OUTPUT0"]
    assert out.shape == (8, 1000)
    np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5)


def test_large_model_values(client: TritonSHMClient) -> None:
    client.register_shm_model("large_image", pool_size=2)
    x = rng.random((3, 3, 1024, 1024), dtype=np.float32)  # two chunks: 2 + 1
    out = client.infer_shm("large_image", {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(out, 1.0 - x)


def test_chunking_reassembles_in_order(client: TritonSHMClient) -> None:
    client.register_shm_model("my_model", pool_size=3)
    x0 = rng.random((100, 3, 224, 224), dtype=np.float32)
    x1 = rng.integers(0, 100, size=(100, 10), dtype=np.int32)
    out = client.infer_shm("my_model", {"INPUT0": x0, "INPUT1": x1})
    expected0, expected1 = my_model_expected(x0, x1)
    np.testing.assert_allclose(out["OUTPUT0"], expected0, rtol=1e-5)
    np.testing.assert_array_equal(out["OUTPUT1"], expected1)
    assert client.shm_stats("my_model").in_use == 0


def test_lists_of_samples_and_odd_arrays(client: TritonSHMClient) -> None:
    client.register_shm_model("my_model")
    x0 = rng.random((11, 3, 224, 224), dtype=np.float32)
    x1 = np.asfortranarray(rng.integers(0, 9, size=(11, 10), dtype=np.int32))  # not C-contiguous
    x0.flags.writeable = False  # as Ray hands arrays over
    out = client.infer_shm("my_model", {"INPUT0": list(x0), "INPUT1": x1})
    expected0, expected1 = my_model_expected(x0, x1)
    np.testing.assert_allclose(out["OUTPUT0"], expected0, rtol=1e-5)
    np.testing.assert_array_equal(out["OUTPUT1"], expected1)


def test_outputs_belong_to_the_caller(client: TritonSHMClient) -> None:
    client.register_shm_model("large_image", pool_size=1)
    first_in = np.zeros((1, 3, 1024, 1024), np.float32)
    first = client.infer_shm("large_image", {"INPUT0": first_in})["OUTPUT0"]
    client.infer_shm("large_image", {"INPUT0": np.full_like(first_in, 5.0)})
    assert first.flags.owndata and first.flags.writeable
    np.testing.assert_array_equal(first, 1.0 - first_in)


def test_explicit_seed_style_specs(client: TritonSHMClient) -> None:
    client.register_shm_model(
        model_name="my_model",
        inputs=[("INPUT0", (3, 224, 224), np.float32), ("INPUT1", (10,), "INT32")],
        outputs=[("OUTPUT0", (512,), "TYPE_FP32"), ("OUTPUT1", (5,), np.int32)],
        max_batch_size=8,
        pool_size=2,
    )
    x0 = rng.random((3, 3, 224, 224), dtype=np.float32)
    x1 = rng.integers(0, 9, size=(3, 10), dtype=np.int32)
    out = client.infer_shm("my_model", {"INPUT0": x0, "INPUT1": x1})
    np.testing.assert_array_equal(out["OUTPUT1"], x1[:, :5] * 2)


def test_variable_dims_need_a_maximum(client: TritonSHMClient) -> None:
    with pytest.raises(ModelSpecError, match="INPUT0.*max_shapes") as info:
        client.register_shm_model("identity")
    assert info.value.tensor == "INPUT0"
    client.register_shm_model("identity", max_shapes={"INPUT0": (32,), "OUTPUT0": (32,)})
    for width in (1, 7, 32):
        x = rng.random((5, width), dtype=np.float32)
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
    with pytest.raises(InvalidInputError, match=r"INPUT0.*\(batch, <=32\).*\(5, 33\)"):
        client.infer_shm("identity", {"INPUT0": np.zeros((5, 33), np.float32)})


def test_output_shapes_come_from_the_response(client: TritonSHMClient) -> None:
    client.register_shm_model("variable_output", max_shapes={"OUTPUT0": (64,)})
    for n in (0, 3, 64):
        out = client.infer_shm("variable_output", {"INPUT0": np.full((4, 1), n, np.int32)})
        np.testing.assert_array_equal(
            out["OUTPUT0"], np.tile(np.arange(n, dtype=np.float32), (4, 1))
        )


def test_output_larger_than_registered_is_a_server_error(client: TritonSHMClient) -> None:
    client.register_shm_model("variable_output", max_shapes={"OUTPUT0": (8,)})
    with pytest.raises(TritonServerError):
        client.infer_shm("variable_output", {"INPUT0": np.full((2, 1), 100, np.int32)})
    assert client.shm_stats("variable_output").in_use == 0


def test_model_without_batching(client: TritonSHMClient) -> None:
    spec = client.register_shm_model("add_nobatch")
    assert spec.max_batch_size == 0 and not spec.batched
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    out = client.infer_shm("add_nobatch", {"INPUT0": a, "INPUT1": b})["OUTPUT0"]
    np.testing.assert_array_equal(out, a + b)
    with pytest.raises(InvalidInputError, match=r"INPUT0.*\(4,\).*\(1, 4\)"):
        client.infer_shm("add_nobatch", {"INPUT0": a[None], "INPUT1": b})


def test_empty_batch_gives_empty_outputs(client: TritonSHMClient) -> None:
    client.register_shm_model("my_model")
    out = client.infer_shm(
        "my_model",
        {"INPUT0": np.empty((0, 3, 224, 224), np.float32), "INPUT1": np.empty((0, 10), np.int32)},
    )
    assert out["OUTPUT0"].shape == (0, 512) and out["OUTPUT0"].dtype == np.float32
    assert out["OUTPUT1"].shape == (0, 5) and out["OUTPUT1"].dtype == np.int32


def test_plain_grpc_methods_still_work(client: TritonSHMClient) -> None:
    assert client.is_server_ready()
    assert client.is_model_ready("classifier")
    x = np.ones((1, 4), np.float32)
    plain_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    plain_input.set_data_from_numpy(x)
    result = client.infer("identity", [plain_input])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


# ---------------------------------------------------------------- registration lifecycle


def test_registering_again_is_a_noop_unless_specs_differ(client: TritonSHMClient) -> None:
    client.register_shm_model("classifier", pool_size=2)
    regions = our_regions(os.getpid())
    client.register_shm_model("classifier", pool_size=2)
    assert our_regions(os.getpid()) == regions
    with pytest.raises(ModelSpecError, match="already registered"):
        client.register_shm_model("classifier", pool_size=3)
    client.unregister_shm_model("classifier")
    client.unregister_shm_model("classifier")
    assert our_regions(os.getpid()) == set()
    with pytest.raises(ModelNotRegisteredError):
        client.infer_shm("classifier", {"INPUT0": np.zeros((1, 3, 224, 224), np.float32)})


def test_unknown_model_on_the_server(client: TritonSHMClient) -> None:
    with pytest.raises(TritonServerError) as info:
        client.register_shm_model("no_such_model")
    assert "no_such_model" in str(info.value) and info.value.status
    assert our_regions(os.getpid()) == set()


def test_close_unregisters_and_unlinks(grpc_url: str) -> None:
    with TritonSHMClient(url=grpc_url) as shm_client:
        shm_client.register_shm_model("classifier")
        shm_client.register_shm_model("my_model")
        names = our_regions(os.getpid())
        assert len(names) == 2 and names <= registered_on(grpc_url)
    assert our_regions(os.getpid()) == set()
    assert not names & registered_on(grpc_url)
    shm_client.close()  # idempotent
    with pytest.raises(ClientClosedError):
        shm_client.register_shm_model("classifier")
    with pytest.raises(ClientClosedError):
        shm_client.infer_shm("classifier", {"INPUT0": np.zeros((1, 3, 224, 224), np.float32)})


def test_a_dropped_client_is_collected_and_cleaned_up(grpc_url: str) -> None:
    shm_client = TritonSHMClient(url=grpc_url)
    shm_client.register_shm_model("classifier")
    names = our_regions(os.getpid())
    ref = weakref.ref(shm_client)
    del shm_client
    gc.collect()
    assert ref() is None, "the cleanup must not keep the client alive"
    assert our_regions(os.getpid()) == set()
    assert not names & registered_on(grpc_url)


def test_cleanup_at_interpreter_exit(grpc_url: str) -> None:
    script = (
        "import sys, numpy as np\n"
        "from ray_triton_shm import TritonSHMClient\n"
        "from ray_triton_shm._client import registry_of\n"
        f"c = TritonSHMClient(url={grpc_url!r})\n"
        "c.register_shm_model('classifier')\n"
        "c.infer_shm('classifier', {'INPUT0': np.zeros((2, 3, 224, 224), np.float32)})\n"
        "print(registry_of(c).get('classifier').region.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    name = done.stdout.strip()
    assert name.startswith("rtshm_")
    assert not os.path.exists(f"/dev/shm/{name}")
    assert name not in registered_on(grpc_url)
    assert "leaked" not in done.stderr


def test_killed_owner_is_cleaned_up_by_its_reaper(
    grpc_url: str, register_then_sigkill: Callable[..., str]
) -> None:
    name = register_then_sigkill(grpc_url, crash_cleanup=True)
    assert name.startswith("rtshm_")
    # No other client involved: the killed process's watchdog unregisters and unlinks.
    wait_for(lambda: name not in registered_on(grpc_url), timeout_s=30)
    wait_for(lambda: not os.path.exists(f"/dev/shm/{name}"))


def test_reaper_is_not_held_up_by_a_forked_child(grpc_url: str) -> None:
    script = (
        "import os, signal, time\n"
        "from ray_triton_shm import TritonSHMClient\n"
        "from ray_triton_shm._client import registry_of\n"
        f"c = TritonSHMClient(url={grpc_url!r})\n"
        "c.register_shm_model('classifier', pool_size=1)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
        "    time.sleep(120)\n"  # the load itself: a child that holds the fds until killed
        "    os._exit(0)\n"
        "print(registry_of(c).get('classifier').region.name, child, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    # Not waiting for stderr: the resource tracker holds it until the child exits.
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    name, child = proc.stdout.readline().split()
    try:
        assert proc.wait(timeout=60) == -9
        # The child still runs, holding a copy of every fd it inherited but the reaper's pipe.
        assert os.path.exists(f"/proc/{child}")
        wait_for(lambda: name not in registered_on(grpc_url), timeout_s=30)
    finally:
        os.kill(int(child), signal.SIGKILL)


def test_killed_owner_is_reclaimed_by_the_next_client(
    grpc_url: str, register_then_sigkill: Callable[..., str]
) -> None:
    name = register_then_sigkill(grpc_url, crash_cleanup=False)
    assert name in registered_on(grpc_url)  # SIGKILL ran no cleanup, and no reaper ran
    with TritonSHMClient(url=grpc_url) as shm_client:
        shm_client.register_shm_model("identity", max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)})
        assert name not in registered_on(grpc_url)
    # The killed process's resource tracker unlinks its /dev/shm name once it notices.
    wait_for(lambda: not os.path.exists(f"/dev/shm/{name}"))


def test_server_restart_is_survived(
    fresh_triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    shm_client = make_client(fresh_triton.grpc_url)
    shm_client.register_shm_model("classifier", pool_size=2)
    x = rng.random((12, 3, 224, 224), dtype=np.float32)
    shm_client.infer_shm("classifier", {"INPUT0": x})
    fresh_triton.restart()
    assert registered_on(fresh_triton.grpc_url) == set()
    out = shm_client.infer_shm("classifier", {"INPUT0": x})["OUTPUT0"]  # two chunks
    np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5)
    assert our_regions(os.getpid()) == registered_on(fresh_triton.grpc_url)
    fresh_triton.restart()
    small = x[:3]
    out = shm_client.infer_shm("classifier", {"INPUT0": small})["OUTPUT0"]  # one chunk
    np.testing.assert_allclose(out, classifier_expected(small), rtol=1e-5)
    assert shm_client.shm_stats("classifier").in_use == 0


# ---------------------------------------------------------------- backpressure and concurrency


def test_blocks_when_every_slot_is_busy(client: TritonSHMClient) -> None:
    client.register_shm_model(
        "slow_identity", pool_size=1, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)}
    )
    x = np.ones((2, 4), np.float32)
    started = threading.Event()

    def hold_the_slot() -> None:
        started.set()
        client.infer_shm("slow_identity", {"INPUT0": x})

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    started.wait()
    wait_for(lambda: client.shm_stats("slow_identity").in_use == 1)
    with pytest.raises(SlotTimeoutError) as info:
        client.infer_shm("slow_identity", {"INPUT0": x}, slot_timeout_s=0.01)
    assert isinstance(info.value, TimeoutError)
    out = client.infer_shm("slow_identity", {"INPUT0": x * 3})  # waits, then runs
    np.testing.assert_array_equal(out["OUTPUT0"], x * 3)
    holder.join()
    stats = client.shm_stats("slow_identity")
    assert (stats.size, stats.in_use, stats.waiting, stats.abandoned) == (1, 0, 0, 0)
    assert (stats.min_size, stats.max_size, stats.limited_by) == (1, 1, "")  # fixed: pool_size


def test_chunks_in_flight_are_bounded_by_the_pool(client: TritonSHMClient) -> None:
    client.register_shm_model(
        "slow_identity", pool_size=3, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)}
    )
    x = rng.random((8 * 6, 4), dtype=np.float32)
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(client.shm_stats("slow_identity").in_use)
            time.sleep(0.005)  # the watch itself: its sampling period, not a wait

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = client.infer_shm("slow_identity", {"INPUT0": x})["OUTPUT0"]
    finally:
        done.set()
        watcher.join()
    np.testing.assert_array_equal(out, x)
    assert max(seen) == 3


def test_many_threads_share_a_small_pool(client: TritonSHMClient) -> None:
    client.register_shm_model("my_model", pool_size=2)

    def work(seed: int) -> None:
        local = np.random.default_rng(seed)
        for _ in range(3):
            n = int(local.integers(1, 20))
            x0 = local.random((n, 3, 224, 224), dtype=np.float32)
            x1 = local.integers(0, 50, size=(n, 10), dtype=np.int32)
            out = client.infer_shm("my_model", {"INPUT0": x0, "INPUT1": x1})
            np.testing.assert_array_equal(out["OUTPUT1"], x1[:, :5] * 2)

    in_threads(work, range(6))
    assert client.shm_stats("my_model").in_use == 0


def test_import_does_not_import_ray() -> None:
    code = "import sys, ray_triton_shm; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exceptions_pickle_round_trip(client: TritonSHMClient) -> None:
    client.register_shm_model("classifier")
    with pytest.raises(InvalidInputError) as info:
        client.infer_shm("classifier", {"INPUT0": np.zeros((1, 3, 224, 224), np.float64)})
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is InvalidInputError and str(copy) == str(info.value)
    assert (copy.model, copy.tensor, copy.expected, copy.actual) == (
        "classifier",
        "INPUT0",
        "float32",
        "float64",
    )
