"""What was renamed or retired still works, and says so: a call's ``outputs=`` (now
``requested_outputs=``), and the node actor's ``infer`` (requests by value through the actor);
and the node actor's registration, with every option of ``register_shm_model``. Against the
session's Triton (the same in a real Ray: tests/test_ray_actor.py)."""

from __future__ import annotations

import asyncio
import logging
import warnings

import numpy as np
import pytest

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.ray import RegionReplacedError
from ray_triton_shm.ray._actor import NodeActorConfig, TritonNodeActor

X = {"INPUT0": np.array([3.0, 4.0], np.float32)}


def test_a_calls_outputs_is_requested_outputs_with_a_warning(client: TritonSHMClient) -> None:
    client.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
    new = client.infer_shm("echo_parameters", X, requested_outputs=["DOUBLE"])
    assert list(new) == ["DOUBLE"]
    np.testing.assert_array_equal(new["DOUBLE"], [6.0, 8.0])
    with pytest.warns(DeprecationWarning, match="requested_outputs") as warned:
        old = client.infer_shm("echo_parameters", X, outputs=["DOUBLE"])
    assert warned[0].filename == __file__  # the caller's line
    assert list(old) == ["DOUBLE"]
    with pytest.warns(DeprecationWarning, match="requested_outputs"):
        awaited = asyncio.run(client.infer_shm_async("echo_parameters", X, outputs=["DOUBLE"]))
    assert list(awaited) == ["DOUBLE"]
    with pytest.warns(DeprecationWarning, match="requested_outputs"):
        lease = client.lease("echo_parameters", outputs=["DOUBLE"])
    with lease:
        lease.inputs["INPUT0"][:] = X["INPUT0"]
        assert list(lease.infer()) == ["DOUBLE"]
    with pytest.raises(TypeError, match="requested_outputs= alone"):
        client.infer_shm("echo_parameters", X, outputs=["DOUBLE"], requested_outputs=["DOUBLE"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns of nothing
        assert set(client.infer_shm("echo_parameters", X)) == {"PARAMETERS", "DOUBLE"}


def test_the_node_actors_deprecated_infer_serves_by_value_and_warns_once(
    grpc_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``TritonNodeActor.infer`` (deprecated, once how callers that could not map the node's
    region sent their tensors) answers through the actor's client, on the node's slots."""
    node = TritonNodeActor(NodeActorConfig(url=grpc_url, metrics_interval_s=60.0))
    try:
        registration = node.register("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
        incarnation = registration.incarnation
        with caplog.at_level(logging.WARNING, logger="ray_triton_shm.ray._actor"):
            with pytest.warns(DeprecationWarning, match="use ShmModel"):
                answer = node.infer("echo_parameters", incarnation, X)
            np.testing.assert_array_equal(answer["DOUBLE"], [6.0, 8.0])
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once per actor
                only = node.infer(
                    "echo_parameters", incarnation, X, options={"requested_outputs": ["DOUBLE"]}
                )
        assert list(only) == ["DOUBLE"]
        deprecated = [
            r for r in caplog.records if "TritonNodeActor.infer is deprecated" in r.message
        ]
        assert len(deprecated) == 1
        with pytest.raises(RegionReplacedError, match="restarted"):
            node.infer("echo_parameters", "another-incarnation", X)
    finally:
        node.shutdown()


def test_the_node_actors_registration_takes_a_transport_of_its_own(grpc_url: str) -> None:
    """Its registration takes every option of ``register_shm_model``: ``transport`` too, whose
    ``"auto"`` is the actor's own."""
    node = TritonNodeActor(NodeActorConfig(url=grpc_url, metrics_interval_s=60.0))
    try:
        assert node.register("add_nobatch").transport == "shm"  # the actor's "auto": proven
        shapes = {"INPUT0": (16,), "OUTPUT0": (16,)}
        by_value = node.register("identity", max_shapes=shapes, transport="inline")
        assert by_value.transport == "inline"
        assert "transport='inline' was asked for" in by_value.transport_reason
    finally:
        node.shutdown()
