"""The modules' names before they moved into layer folders still import, as the same modules:
a pickle of an older release, which names its classes by those modules, loads."""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import pytest

import ray_triton_shm
from ray_triton_shm._moved import MOVED
from ray_triton_shm._slots._specs import TensorSpec


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_name_imports_the_module_that_moved(old: str, new: str) -> None:
    assert importlib.import_module(f"ray_triton_shm.{old}") is importlib.import_module(
        f"ray_triton_shm.{new}"
    )


def test_a_pickle_naming_an_old_module_loads_as_the_class_of_today() -> None:
    assert pickle.loads(b"cray_triton_shm._specs\nTensorSpec\n.") is TensorSpec
    spec = TensorSpec("INPUT0", "FP32", (4,))
    old = pickle.dumps(spec, protocol=0).replace(
        b"ray_triton_shm._slots._specs", b"ray_triton_shm._specs"
    )
    assert b"ray_triton_shm._specs\n" in old
    assert pickle.loads(old) == spec


def test_no_old_name_is_a_file_and_other_names_are_not_found() -> None:
    package = Path(ray_triton_shm.__file__).parent
    assert [old for old in MOVED if (package / f"{old}.py").exists()] == []
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ray_triton_shm._no_such_module")
