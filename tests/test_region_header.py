"""The region header's stamp (a magic word and a layout version) against a real Triton: a
region of another layout is refused by name, random bytes over a live header never take a
caller down, and ``status`` and ``reclaim`` say which regions are foreign."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable

import numpy as np
import pytest

from ray_triton_shm import ForeignRegionError, TritonSHMClient, TritonSHMError
from ray_triton_shm._client import registry_of
from ray_triton_shm._pools._reclaim import reclaim_regions
from ray_triton_shm._slots._header import _VERSION, LAYOUT_VERSION, MAGIC, RegionHeader
from ray_triton_shm._slots._shm import SHM_DIR, SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm._tools._region_status import region_status

X = np.arange(12, dtype=np.float32).reshape(3, 4)
SHAPES = {"INPUT0": (4,), "OUTPUT0": (4,)}


def _overwrite(region: str, data: bytes, offset: int = 0) -> None:
    fd = os.open(SHM_DIR / region, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _identity_region(client: TritonSHMClient) -> str:
    client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": X})["OUTPUT0"], X)
    return registry_of(client).get("identity").region.name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_over_a_live_header_are_refused_by_name(
    client: TritonSHMClient, seed: int
) -> None:
    """Issue 63: 4,096 random bytes over the live region's header, then one call, raised the
    internal ``PoolRetired`` ("replaced by a new layout": false), the random ``retired`` word
    believed. Now the call is refused by name, nothing is written into the header, its slot
    is free, and registering the model again (a new region) answers right."""
    region = _identity_region(client)
    _overwrite(region, np.random.default_rng(seed).bytes(4096))
    written = (SHM_DIR / region).read_bytes()[:REGION_HEADER_BYTES]
    with pytest.raises(ForeignRegionError) as info:
        client.infer_shm("identity", {"INPUT0": X})
    # the failure was not counted into the foreign header: not a byte of it changed
    assert (SHM_DIR / region).read_bytes()[:REGION_HEADER_BYTES] == written
    error = info.value
    assert isinstance(error, TritonSHMError)
    assert error.region == region and error.model == "identity"
    assert error.version is None and error.expected_version == LAYOUT_VERSION
    assert "no ray-triton-shm stamp" in str(error) and "register the model again" in str(error)
    assert pickle.loads(pickle.dumps(error)).region == region
    assert client.shm_stats("identity").in_use == 0
    client.unregister_shm_model("identity")
    client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": X})["OUTPUT0"], X)


def test_a_retired_word_is_believed_only_of_our_header(client: TritonSHMClient) -> None:
    """A ``retired`` word set in a header whose layout version was written over is not
    believed (no ``PoolRetired``): the region is refused by name."""
    region = _identity_region(client)
    _overwrite(region, np.int64(7).tobytes(), offset=8)  # the retired word
    _overwrite(region, np.int64(0).tobytes(), offset=_VERSION * 8)
    with pytest.raises(ForeignRegionError) as info:
        client.infer_shm("identity", {"INPUT0": X})
    assert info.value.version is None or info.value.version == 0
    assert client.shm_stats("identity").in_use == 0


def test_another_layout_version_is_refused_at_attach(
    grpc_url: str, make_client: Callable[..., TritonSHMClient]
) -> None:
    """A process that attaches a region of another layout version (the Ray layer's way: a
    node actor of another version) is refused, with both versions named."""
    owner, other = make_client(grpc_url), make_client(grpc_url)
    region = _identity_region(owner)
    pool = registry_of(owner).get("identity")
    _overwrite(region, np.int64(LAYOUT_VERSION + 1).tobytes(), offset=_VERSION * 8)
    with pytest.raises(ForeignRegionError) as info:
        registry_of(other).attach_region(pool.spec, region, pool.memory.slot_count, lambda: None)
    assert info.value.version == LAYOUT_VERSION + 1
    assert f"layout version {LAYOUT_VERSION + 1}" in str(info.value)
    assert f"reads version {LAYOUT_VERSION}" in str(info.value)
    _overwrite(region, np.int64(LAYOUT_VERSION).tobytes(), offset=_VERSION * 8)
    np.testing.assert_array_equal(owner.infer_shm("identity", {"INPUT0": X})["OUTPUT0"], X)


def test_status_and_reclaim_say_which_regions_are_foreign(client: TritonSHMClient) -> None:
    """A region of ours without a stamp (a version before it) and one of this version: only
    the first is foreign, in ``status`` and in ``reclaim`` (which leaves it: its owner lives)."""
    ours = _identity_region(client)
    old = SharedMemoryRegion.create(new_region_name("old-version"), 2 * REGION_HEADER_BYTES)
    try:
        regions = {r.name: r for r in region_status(url=None).regions}
        assert regions[old.name].foreign and regions[old.name].layout_version is None
        assert regions[old.name].transport is None
        assert not regions[ours].foreign and regions[ours].layout_version == LAYOUT_VERSION
        assert regions[ours].transport == "shm"
        assert old.name in reclaim_regions(url=None).foreign
        assert ours not in reclaim_regions(url=None).foreign
    finally:
        old.unlink()
        old.close()


def test_a_stamped_header_reads_as_ours() -> None:
    buffer = bytearray(REGION_HEADER_BYTES)
    assert not RegionHeader(buffer, 1).intact
    header = RegionHeader.new(buffer, 1, region="r")
    assert header.intact and np.frombuffer(buffer, np.int64, 1, 9 * 8)[0] == MAGIC
    assert RegionHeader.open(bytes(buffer), 1, region="r").intact
    with pytest.raises(ForeignRegionError, match="too small"):
        RegionHeader.open(bytearray(64), 1, region="r")
