"""Which GPU a pool lives on, without a GPU: what ``device=`` names, which GPU that is among
those a process sees (its own ``CUDA_VISIBLE_DEVICES``), the UUID a region's table carries
between processes, the index Triton gets, and what the Ray node actor sees. Pure functions of
GPU lists and environments (:mod:`ray_triton_shm._slots._gpu_choice`); CUDA itself is not involved,
nor mocked. The same choices on a real GPU are in ``test_gpu.py``."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from ray_triton_shm import CudaError
from ray_triton_shm._slots import _cuda
from ray_triton_shm._slots._gpu_choice import (
    VISIBLE_DEVICES_ENV_VAR,
    Device,
    choose_device,
    parse_device,
    triton_device_id,
    uuid_bytes,
    uuid_name,
)

#: A machine's four GPUs, by their index on the machine (as nvidia-smi -L lists them).
MACHINE = [
    "GPU-1f0c8a4e-5d2b-6c3e-8f1a-2b3c4d5e6f70",
    "GPU-2a7d9b1c-3e4f-5a6b-9c8d-7e6f5a4b3c21",
    "GPU-3b8e0c2d-4f5a-6b7c-ad9e-8f7a6b5c4d32",
    "GPU-4c9f1d3e-5a6b-7c8d-be0f-9a8b7c6d5e43",
]
MIG = "MIG-6a1f1a47-2a4c-5b8e-9d3e-0c1d2e3f4a5b"


def _sees(*machine_indices: int) -> list[Device]:
    """The GPUs a process sees whose CUDA_VISIBLE_DEVICES lists these GPUs of the machine, in
    that order: CUDA numbers them from 0 in the order given."""
    return [Device(i, MACHINE[m], "NVIDIA H200") for i, m in enumerate(machine_indices)]


def _env(visible: str | None) -> dict[str, str]:
    return {} if visible is None else {VISIBLE_DEVICES_ENV_VAR: visible}


# --- what device= names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (0, 0),
        (1, 1),
        ("1", 1),
        ("cuda:1", 1),
        ("cuda:0", 0),
        (MACHINE[2], MACHINE[2]),
        (MACHINE[2][:12], MACHINE[2][:12]),  # a prefix of the UUID
        (None, None),  # the current CUDA device, resolved by _cuda
    ],
)
def test_device_is_an_index_a_uuid_or_the_current_one(given: Any, named: Any) -> None:
    assert parse_device(given) == named
    assert type(parse_device(given)) is type(named)


@pytest.mark.parametrize("given", [1.5, True, False, b"0", [0]])
def test_a_device_of_another_kind_is_refused(given: Any) -> None:
    with pytest.raises(CudaError, match="device must be a GPU index, 'cuda:N' or a GPU UUID"):
        parse_device(given)


def test_find_device_refuses_a_bad_device_before_looking_for_gpus() -> None:
    # No CUDA call is made for it: the same error with or without a GPU, bindings or driver.
    with pytest.raises(CudaError, match="device must be a GPU index"):
        _cuda.find_device(1.5)  # type: ignore[arg-type]


# --- which GPU that is, among those a process sees ------------------------------------------


def test_an_index_is_one_in_the_process_not_on_the_machine() -> None:
    seen = _sees(2, 3)  # CUDA_VISIBLE_DEVICES="2,3"
    assert choose_device(0, seen, _env("2,3")).uuid == MACHINE[2]
    assert choose_device(1, seen, _env("2,3")).uuid == MACHINE[3]
    with pytest.raises(CudaError, match=r"GPU 2 is not visible to this process"):
        choose_device(2, seen, _env("2,3"))


def test_a_uuid_or_its_prefix_finds_the_gpu_at_whatever_index_the_process_has() -> None:
    seen = _sees(3, 1)  # CUDA_VISIBLE_DEVICES="3,1"
    assert choose_device(MACHINE[1], seen, _env("3,1")) == Device(1, MACHINE[1], "NVIDIA H200")
    assert choose_device(MACHINE[3][:13], seen, _env("3,1")).index == 0


@pytest.mark.parametrize(
    ("visible", "seen", "says"),
    [
        ("0,1", _sees(0, 1), "CUDA_VISIBLE_DEVICES='0,1'; it sees 0: "),
        (MACHINE[0], _sees(0), f"CUDA_VISIBLE_DEVICES='{MACHINE[0]}'; it sees 0: {MACHINE[0]}"),
        (None, _sees(0, 1, 3), f"CUDA_VISIBLE_DEVICES unset; it sees 0: {MACHINE[0]}, 1: "),
        ("", [], "CUDA_VISIBLE_DEVICES=''; it sees none"),
    ],
)
def test_a_uuid_not_visible_is_a_clear_error(visible: str | None, seen: Any, says: str) -> None:
    with pytest.raises(CudaError) as caught:
        choose_device(MACHINE[2], seen, _env(visible))
    message = str(caught.value)
    assert message.startswith(f"GPU '{MACHINE[2]}' is not visible to this process ("), message
    assert says in message, message
    assert "num_gpus" in message and "name one it sees" in message
    assert caught.value.device == MACHINE[2]


def test_a_prefix_of_several_gpus_names_none() -> None:
    with pytest.raises(CudaError, match="is not visible"):
        choose_device("GPU-", _sees(0, 1), _env(None))
    assert choose_device("GPU-", _sees(1), _env("1")).uuid == MACHINE[1]


# --- the UUID a region carries between processes --------------------------------------------


def test_a_uuid_goes_through_a_regions_table_unchanged() -> None:
    for name in MACHINE:
        raw = uuid_bytes(name)
        assert len(raw) == 16
        assert uuid_name(raw) == name
        assert uuid_name(raw) == f"GPU-{uuid.UUID(bytes=raw)}"  # nvidia-smi's spelling
    with pytest.raises(ValueError):
        uuid_bytes("GPU-not-a-uuid")


# --- the index Triton gets ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "index", "triton"),
    [
        (None, 1, 1),  # the process sees every GPU: its index is the machine's
        ("2,3", 1, 3),
        (" 2 , 3 ", 1, 3),
        ("3", 0, 3),
        (f"{MACHINE[2]},{MACHINE[3]}", 1, 1),  # UUIDs: the machine's index is unknown here
        (f"{MIG},{MIG.replace('6a', '7b')}", 1, 1),  # MIG instances: the same
        ("GPU-1f00,GPU-1f01", 0, 0),  # UUID prefixes
        (f"{MACHINE[0]},3", 1, 3),  # mixed: this GPU's entry is an index
        ("", 0, 0),
        ("2", 1, 1),  # fewer entries than the index: the process's index
    ],
)
def test_triton_gets_the_gpus_index_on_the_machine_where_it_is_known(
    visible: str | None, index: int, triton: int
) -> None:
    device = Device(index, MACHINE[0], "NVIDIA H200")
    assert triton_device_id(device, _env(visible)) == triton


# --- in Ray: a replica, the node actor, other callers ---------------------------------------


def test_a_pool_in_ray_lives_on_the_replicas_gpu_whoever_opens_it() -> None:
    """A Serve replica holds the machine's GPU 2 (Ray gave it CUDA_VISIBLE_DEVICES="2"); the
    node actor sees every GPU; a caller holding GPUs 3 and 2 opens the region; one holding
    GPU 0 cannot."""
    # The replica binds: its current device (None -> index 0 here) named by its UUID.
    replica = choose_device(0, _sees(2), _env("2"))
    assert parse_device(None) is None and replica.uuid == MACHINE[2]
    # The node actor allocates the slots on the GPU of that UUID, among all of the node's.
    actor_env = _env(None)
    on = choose_device(replica.uuid, _sees(0, 1, 2, 3), actor_env)
    assert on.index == 2
    assert triton_device_id(on, actor_env) == 2  # Triton sees every GPU too
    # It writes the UUID into the region's table; another caller finds the GPU by it.
    table = uuid_bytes(on.uuid)
    caller = choose_device(uuid_name(table), _sees(3, 2), _env("3,2"))
    assert (caller.index, caller.uuid) == (1, MACHINE[2])
    with pytest.raises(CudaError, match=r"CUDA_VISIBLE_DEVICES='0'; it sees 0: GPU-"):
        choose_device(uuid_name(table), _sees(0), _env("0"))


def test_ray_leaves_the_node_actor_every_gpu_of_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ray does to a worker's CUDA_VISIBLE_DEVICES (Ray's own code, no GPU needed): with
    the node actor's environment it keeps the node's; without, a worker without GPUs (the
    actor asks for none) would see none."""
    pytest.importorskip("ray")
    from ray_triton_shm.ray._actor import NODE_ACTOR_ENV_VARS, NOSET_VISIBLE_DEVICES_ENV_VAR
    from ray_triton_shm.ray._ray_internals import noset_visible_gpus_env_var, set_visible_gpus

    assert noset_visible_gpus_env_var() == NOSET_VISIBLE_DEVICES_ENV_VAR
    assert dict(NODE_ACTOR_ENV_VARS) == {NOSET_VISIBLE_DEVICES_ENV_VAR: "1"}
    monkeypatch.setenv(VISIBLE_DEVICES_ENV_VAR, "0,1,2,3")  # the node's, as Ray was started
    for name, value in NODE_ACTOR_ENV_VARS.items():
        monkeypatch.setenv(name, value)
    set_visible_gpus([])
    assert os.environ[VISIBLE_DEVICES_ENV_VAR] == "0,1,2,3"
    monkeypatch.delenv(NOSET_VISIBLE_DEVICES_ENV_VAR)
    set_visible_gpus([])
    assert os.environ[VISIBLE_DEVICES_ENV_VAR] == ""
