"""Two Ray worker nodes, each with its own Triton: every node uses its own, nothing crosses.

All nodes of ``ray.cluster_utils.Cluster`` run on this machine, so this checks the wiring
(the URL is read on the actor's node, one actor per node, regions owned by that node's actor)
rather than separate ``/dev/shm``s. ``$RAY_TRITON_SHM_URL`` is set in the environment before
each ``add_node``: the node's raylet inherits it, and so do the workers it starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import tritonclient.grpc as grpcclient
from _helpers import start_cluster
from ray import cloudpickle
from ray.cluster_utils import Cluster

from ray_triton_shm._shm import region_owner
from ray_triton_shm.local._server import EXAMPLE_MODEL_REPOSITORY, LocalTritonServer
from ray_triton_shm.ray import URL_ENV_VAR, ShmModel, get_node_actor
from ray_triton_shm.ray._actor import NAMESPACE, actor_name

# Ship this module's remote functions by value (workers cannot import the test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHM_DIR = Path("/dev/shm")


def _registered(url: str) -> list[str]:
    with grpcclient.InferenceServerClient(url) as client:
        regions = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    return sorted(name for name in regions if name.startswith("rtshm_"))


def _region_pid(name: str) -> int:
    owner = region_owner(name)
    assert owner is not None, name
    return owner.pid


def _reference(url: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        infer_input = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        infer_input.set_data_from_numpy(x)
        return client.infer("classifier", [infer_input]).as_numpy("OUTPUT0")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A head node and two worker nodes ``node_a``/``node_b``, each with its own Triton.

    The Tritons come first, each ready (models loaded) before the next start, so that their
    ports are fixed before a raylet inherits one and their start-up does not compete with the
    raylets'. The three nodes start one after the other, each given
    ``RAYLET_START_WAIT_S`` instead of Ray's fixed 30 s to register (:func:`raylet_start_window`).
    """
    servers: dict[str, LocalTritonServer] = {}
    old = os.environ.pop(URL_ENV_VAR, None)
    cluster: Cluster | None = None
    try:
        for label in ("node_a", "node_b"):
            server = LocalTritonServer(
                [EXAMPLE_MODEL_REPOSITORY],
                log_path=tmp_path_factory.mktemp(label) / "tritonserver.log",
            )
            server.start()
            servers[label] = server
        if ray.is_initialized():
            ray.shutdown()

        def add_nodes(cluster: Cluster) -> None:
            # The head node gets no URL: a node actor there would use localhost:8001.
            cluster.add_node(num_cpus=1, include_dashboard=False)
            for label, server in servers.items():
                os.environ[URL_ENV_VAR] = server.grpc_url
                cluster.add_node(num_cpus=1, resources={label: 1})
            os.environ.pop(URL_ENV_VAR, None)

        cluster, _ = start_cluster(add_nodes)
        assert cluster is not None
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield {"cluster": cluster, "servers": servers}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for server in servers.values():
            server.close()
        if old is None:
            os.environ.pop(URL_ENV_VAR, None)
        else:
            os.environ[URL_ENV_VAR] = old


@ray.remote(num_cpus=0)
def _infer_here(seed: int) -> dict[str, Any]:
    """Runs the classifier through ``ShmModel`` on whatever node this task landed on."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 3, 224, 224), dtype=np.float32)
    model = ShmModel("classifier")
    outputs = model.infer({"INPUT0": x})
    again = model.infer({"INPUT0": x[:1]})
    stats = ray.get(get_node_actor().stats.remote())
    answer = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "env_url": os.environ.get(URL_ENV_VAR),
        "pid": os.getpid(),
        "zero_copy": model.zero_copy,
        "x": x,
        "out": outputs["OUTPUT0"],
        "again": again["OUTPUT0"],
        "stats": stats,
    }
    model.close()
    return answer


def test_each_node_uses_its_own_actor_and_triton(two_nodes: dict[str, Any]) -> None:
    servers: dict[str, LocalTritonServer] = two_nodes["servers"]
    urls = {label: server.grpc_url for label, server in servers.items()}
    before = {label: _registered(url) for label, url in urls.items()}
    answers = ray.get(
        [_infer_here.options(resources={label: 1}).remote(seed) for seed, label in enumerate(urls)]
    )
    answers_by_node = dict(zip(urls, answers, strict=True))

    node_ids = {label: a["node_id"] for label, a in answers_by_node.items()}
    assert node_ids["node_a"] != node_ids["node_b"]
    head = ray.get_runtime_context().get_node_id()
    assert head not in node_ids.values()
    actors = {}
    for label, answer in answers_by_node.items():
        stats = answer["stats"]
        # The URL was inherited by the node's workers, and the actor is that node's.
        assert answer["env_url"] == urls[label]
        assert stats.node_id == answer["node_id"] == node_ids[label]
        assert stats.url == urls[label]
        assert answer["zero_copy"] is True
        assert stats.models["classifier"]["requests"] == 2
        assert stats.models["classifier"]["samples"] == 4
        # The results are right (the same model on both servers).
        np.testing.assert_allclose(answer["out"], _reference(urls[label], answer["x"]), rtol=1e-6)
        np.testing.assert_allclose(answer["again"], answer["out"][:1], rtol=1e-6)
        actors[label] = ray.get_actor(actor_name(node_ids[label]), namespace=NAMESPACE)
        assert ray.get(actors[label].stats.remote()).pid == stats.pid
    pids = {label: a["stats"].pid for label, a in answers_by_node.items()}
    assert pids["node_a"] != pids["node_b"]

    # No shm crossed nodes: each server has registrations only from its own node's actor.
    for label, url in urls.items():
        new = sorted(set(_registered(url)) - set(before[label]))
        assert new, f"{label}: the actor registered nothing"
        assert {_region_pid(name) for name in new} == {pids[label]}, (label, new)
    # No actor on the head node.
    with pytest.raises(ValueError):
        ray.get_actor(actor_name(head), namespace=NAMESPACE)

    for actor in actors.values():
        ray.get(actor.shutdown.remote())
        ray.kill(actor)
    for label, url in urls.items():
        assert _registered(url) == before[label]
        left = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"rtshm_{pids[label]}-")]
        assert left == [], (label, left)
