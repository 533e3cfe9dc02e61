"""The workloads: one per example model, with the batch each request carries.

The ``upper`` cases carry BYTES tensors: one text per sample, of ``element_bytes`` bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

__all__ = ["CASES", "ModelCase", "TensorSpec"]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a request, per sample (without the batch dimension).

    Attributes:
        shape: The per-sample shape, all dimensions concrete.
        dtype: The numpy dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def is_bytes(self) -> bool:
        """Whether this is a BYTES (string) tensor."""
        return self.dtype.kind == "O"

    @property
    def triton_datatype(self) -> str:
        """The Triton datatype string (``"FP32"``, ``"INT32"``, ...)."""
        from tritonclient.utils import np_to_triton_dtype

        return str(np_to_triton_dtype(self.dtype))


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A benchmark workload: a model, its batch size and the tensors of one request.

    Attributes:
        model: The model name on the server.
        batch_size: Samples per request (the model's max batch size).
        inputs: Input specs by name, per sample.
        outputs: Output specs by name, per sample.
        max_shapes: Per-sample maxima for variable (-1) dimensions, as
            ``TritonSHMClient.register_shm_model(max_shapes=...)`` expects; ``None`` if the
            model has none.
        identity: The model returns ``INPUT0`` unchanged as ``OUTPUT0`` (an extra check).
        name: The case's name (``--models``, tables); the model's name unless one model has
            several cases.
        element_bytes: Bytes of each element of a BYTES input (and output).
    """

    model: str
    batch_size: int
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    max_shapes: Mapping[str, tuple[int, ...]] | None = None
    identity: bool = False
    name: str = ""
    element_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.model)

    @property
    def has_bytes(self) -> bool:
        """Whether any tensor is a BYTES tensor."""
        return any(s.is_bytes for s in (*self.inputs.values(), *self.outputs.values()))

    @property
    def max_element_bytes(self) -> dict[str, int] | None:
        """The ``max_element_bytes`` to register the model with."""
        specs = {**self.inputs, **self.outputs}
        maxima = {name: self.element_bytes for name, spec in specs.items() if spec.is_bytes}
        return maxima or None

    def _nbytes(self, spec: TensorSpec) -> int:
        itemsize = self.element_bytes if spec.is_bytes else np.dtype(spec.dtype).itemsize
        return int(np.prod(self.batched_shape(spec))) * itemsize

    def batched_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """The shape of one request's tensor for ``spec``."""
        return (self.batch_size, *spec.shape)

    @property
    def input_nbytes(self) -> int:
        """Bytes of input per request (of text, for BYTES tensors)."""
        return sum(self._nbytes(s) for s in self.inputs.values())

    @property
    def output_nbytes(self) -> int:
        """Bytes of output per request (of text, for BYTES tensors)."""
        return sum(self._nbytes(s) for s in self.outputs.values())

    def make_inputs(self, *, seed: int = 0) -> dict[str, np.ndarray]:
        """Build one request's inputs (deterministic for a given seed).

        Args:
            seed: Random seed.

        Returns:
            C-contiguous arrays by input name.
        """
        rng = np.random.default_rng(seed)
        arrays: dict[str, np.ndarray] = {}
        for name, spec in self.inputs.items():
            shape = self.batched_shape(spec)
            if spec.is_bytes:
                letters = rng.integers(97, 123, (int(np.prod(shape)), self.element_bytes))
                texts = [row.astype(np.uint8).tobytes() for row in letters]
                arrays[name] = np.array(texts, dtype=np.object_).reshape(shape)
            elif np.issubdtype(spec.dtype, np.floating):
                arrays[name] = rng.standard_normal(shape, dtype=np.float32).astype(spec.dtype)
            else:
                arrays[name] = rng.integers(-1000, 1000, size=shape).astype(spec.dtype)
        return arrays


_FP32 = np.dtype(np.float32)
_INT32 = np.dtype(np.int32)
_BYTES = np.dtype(np.object_)
_UPPER_IN = {"TEXT": TensorSpec((1,), _BYTES)}
_UPPER_OUT = {"UPPER": TensorSpec((1,), _BYTES), "LENGTH": TensorSpec((1,), _INT32)}

#: The example models (``ray_triton_shm/local/models``) and how the benchmark drives them.
CASES: dict[str, ModelCase] = {
    case.name: case
    for case in (
        ModelCase(
            model="identity",
            batch_size=8,
            inputs={"INPUT0": TensorSpec((16,), _FP32)},
            outputs={"OUTPUT0": TensorSpec((16,), _FP32)},
            max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)},
            identity=True,
        ),
        ModelCase(
            model="classifier",
            batch_size=1,
            inputs={"INPUT0": TensorSpec((3, 224, 224), _FP32)},
            outputs={"OUTPUT0": TensorSpec((1000,), _FP32)},
            name="classifier-1",
        ),
        ModelCase(
            model="classifier",
            batch_size=8,
            inputs={"INPUT0": TensorSpec((3, 224, 224), _FP32)},
            outputs={"OUTPUT0": TensorSpec((1000,), _FP32)},
        ),
        ModelCase(
            model="my_model",
            batch_size=8,
            inputs={
                "INPUT0": TensorSpec((3, 224, 224), _FP32),
                "INPUT1": TensorSpec((10,), _INT32),
            },
            outputs={
                "OUTPUT0": TensorSpec((512,), _FP32),
                "OUTPUT1": TensorSpec((5,), _INT32),
            },
        ),
        ModelCase(
            model="large_image",
            batch_size=2,
            inputs={"INPUT0": TensorSpec((3, 1024, 1024), _FP32)},
            outputs={"OUTPUT0": TensorSpec((3, 1024, 1024), _FP32)},
        ),
        ModelCase(
            model="upper",
            batch_size=8,
            inputs=_UPPER_IN,
            outputs=_UPPER_OUT,
            name="upper-short",
            element_bytes=64,
        ),
        ModelCase(
            model="upper",
            batch_size=8,
            inputs=_UPPER_IN,
            outputs=_UPPER_OUT,
            name="upper-long",
            element_bytes=64 * 1024,
        ),
    )
}
