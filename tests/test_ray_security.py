"""Triton's access keys through the Ray layer: the node actor's control-plane keys, callers'
inference keys, refusals across the process boundary, and no secret in sight."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import (
    ADMIN,
    INFER,
    READ,
    identity_job,
    local_triton,
    model_repository,
    self_signed_certificate,
    wait_for,
)

from ray_triton_shm import AccessDeniedError
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm.local import LocalTritonServer
from ray_triton_shm.ray import ShmModel, get_node_actor
from ray_triton_shm.ray._actor import NodeActorConfig

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}


def _end(actor: Any) -> None:
    pid = ray.get(actor.stats.remote()).pid
    ray.get(actor.shutdown.remote())
    ray.kill(actor)
    assert [r.name for r in list_local_regions() if r.owner.pid == pid] == []
    node = ray.get_runtime_context().get_node_id()
    from ray_triton_shm.ray._actor import NAMESPACE, actor_name

    def gone() -> bool:
        try:
            ray.get_actor(actor_name(node), namespace=NAMESPACE)
        except ValueError:
            return True
        return False

    wait_for(gone, timeout_s=30, what="the killed node actor's name free")


def _only(keys: dict[str, str], *names: str) -> dict[str, str]:
    return {name: keys[name] for name in names}


def test_a_node_actor_without_the_shared_memory_key_is_refused_at_once(
    ray_local: str, restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    actor = get_node_actor(url=restricted.grpc_url, headers=_only(keys, READ))
    try:
        model = ShmModel("identity", max_shapes=SHAPES, headers=_only(keys, INFER, READ))
        started = time.monotonic()
        with pytest.raises(AccessDeniedError) as info:
            model.infer({"INPUT0": np.ones((1, 16), np.float32)})
        assert time.monotonic() - started < 10
        assert info.value.header == ADMIN and isinstance(info.value, PermissionError)
        assert all(value not in str(info.value) for value in keys.values())
        stats = ray.get(actor.stats.remote())
        assert stats.models == {}  # nothing registered, nothing in /dev/shm
    finally:
        _end(actor)


def test_tls_through_the_node_actor_and_shm_model(ray_local: str, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    tls = {"ssl": True, "root_certificates": str(cert)}
    with local_triton(
        model_repository(tmp_path / "models", "identity"),
        log_path=tmp_path / "tritonserver.log",
        tls_cert=cert,
        tls_key=key,
    ) as server:
        actor = get_node_actor(url=server.grpc_url, slots=2, client_options=tls)
        try:
            x = np.arange(20 * 16, dtype=np.float32).reshape(20, 16)
            for zero_copy in (True, False):
                model = ShmModel(
                    "identity", max_shapes=SHAPES, zero_copy=zero_copy, client_options=tls
                )
                np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
                assert model.zero_copy is zero_copy
                model.close()
        finally:
            _end(actor)


@pytest.fixture(scope="module")
def keyed_actor(
    ray_local: str, restricted: LocalTritonServer, keys: dict[str, str]
) -> Iterator[Any]:
    actor = get_node_actor(url=restricted.grpc_url, slots=4, headers=_only(keys, ADMIN, READ))
    try:
        yield actor
    finally:
        _end(actor)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero-copy", "by-value"])
def test_with_the_keys_the_ray_layer_works(
    keyed_actor: Any, keys: dict[str, str], zero_copy: bool
) -> None:
    import asyncio

    model = ShmModel(
        "identity", max_shapes=SHAPES, zero_copy=zero_copy, headers=_only(keys, INFER, READ)
    )
    x = np.arange(20 * 16, dtype=np.float32).reshape(20, 16)  # 3 chunks
    np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
    out = asyncio.run(model.infer_async({"INPUT0": x[:3]}))["OUTPUT0"]
    np.testing.assert_array_equal(out, x[:3])
    assert model.zero_copy is zero_copy
    model.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero-copy", "by-value"])
def test_a_caller_without_the_inference_key_is_refused_and_the_slots_stay_free(
    keyed_actor: Any, keys: dict[str, str], zero_copy: bool
) -> None:
    keyless = ShmModel("identity", max_shapes=SHAPES, zero_copy=zero_copy)
    x = np.ones((20, 16), np.float32)
    started = time.monotonic()
    with pytest.raises(AccessDeniedError) as info:  # by value: raised in the actor
        keyless.infer({"INPUT0": x})
    assert time.monotonic() - started < 10
    assert info.value.header == INFER
    assert all(value not in str(info.value) for value in keys.values())
    assert pickle.loads(pickle.dumps(info.value)).header == INFER
    stats = ray.get(keyed_actor.stats.remote()).models["identity"]
    assert stats["in_use"] == stats["waiting"] == 0
    # The pool is intact for the next caller that has the key.
    keyed = ShmModel("identity", max_shapes=SHAPES, headers=_only(keys, INFER, READ))
    np.testing.assert_array_equal(keyed.infer({"INPUT0": x})["OUTPUT0"], x)
    keyless.close()
    keyed.close()


def test_a_ray_data_job_with_keys_from_the_environment(
    keyed_actor: Any, keys: dict[str, str]
) -> None:
    """The predictors read the inference key from their environment: no secret in the task
    arguments."""
    env = {
        "RAY_TRITON_SHM_HEADER_" + name.upper().replace("-", "_"): keys[name]
        for name in (INFER, READ)
    }
    ds = ray.data.range(32, override_num_blocks=4).map_batches(
        lambda b: {"INPUT0": np.repeat(b["id"][:, None], 16, axis=1).astype(np.float32)}
    )
    out = identity_job(ds, SHAPES, runtime_env={"env_vars": env}).take_all()
    assert sorted(int(row["OUTPUT0"][0]) for row in out) == list(range(32))


def test_no_secret_in_reprs_pickles_or_stats(keyed_actor: Any, keys: dict[str, str]) -> None:
    model = ShmModel(
        "identity",
        max_shapes=SHAPES,
        headers=_only(keys, INFER),
        actor_options={"headers": _only(keys, ADMIN)},
    )
    model.infer({"INPUT0": np.ones((1, 16), np.float32)})
    config = NodeActorConfig(headers=_only(keys, ADMIN))
    stats = ray.get(keyed_actor.stats.remote())
    shown = " ".join([repr(model), str(model), repr(config), repr(stats), str(vars(stats))])
    assert all(value not in shown for value in keys.values())
    model.close()
