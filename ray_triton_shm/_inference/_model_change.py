"""When the model changes on Triton: telling a changed model from a bad request.

Triton's model can change under a running client: a new version, a config edited and reloaded
(``--model-control-mode=poll`` or ``explicit``), a restart on an edited repository. A pool laid
out for the old config then meets one of these, which this module recognises:

* Triton refuses the request: an input of an unexpected shape, datatype or name, a missing
  input, an output it no longer has, a batch larger than its ``max_batch_size``, or an output
  too large for its place in the slot (:func:`is_change_symptom`);
* Triton answers, but an output comes back with another datatype or shape than the pool was
  laid out for, or under a name it does not know (:func:`answer_mismatch`): a datatype change
  would otherwise be read as the old one, a wrong answer.

Either way the client reads Triton's configuration again (once per change, see
``TritonSHMClient``): a pool whose specs came from the configuration (:attr:`Registration.
follows`) moves to a new layout; one registered with specs given by hand gets a
:class:`ModelChangedError` saying what changed (:func:`changed_error`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import ModelChangedError, ModelSpecError
from .._slots import _cuda, _gpu_choice
from .._slots._memory import CUDA, check_memory_options
from .._slots._sizing import SlotAutoscaling, pool_sizing
from .._slots._specs import ModelSpec, SpecLike, TensorSpec, resolve_model_spec
from .._wire._triton_errors import status_and_message
from ._node_batching import NodeBatching, node_batching_of
from ._transport import check_transport

__all__ = [
    "Registration",
    "answer_mismatch",
    "changed_error",
    "differences",
    "plan_registration",
]


def answer_mismatch(
    spec: ModelSpec, answered: Iterable[tuple[str, str, tuple[int, ...], bytes]]
) -> str | None:
    """What in Triton's answer does not fit the pool's spec, or ``None`` if all of it does.

    Args:
        spec: The pool's spec.
        answered: Name, datatype, shape (batch dim included) and inline contents of each
            output answered.
    """
    known = spec.outputs_by_name
    for name, datatype, shape, _ in answered:
        tensor = known.get(name)
        if tensor is None:
            return f"Triton answered an output {name!r} the pool does not know"
        if datatype != tensor.datatype:
            return f"output {name!r} came back as {datatype}, registered as {tensor.datatype}"
        sample = shape[1:] if spec.batched else shape
        if sample != tensor.shape and not tensor.fits(sample):
            return (
                f"output {name!r} came back with {sample} per sample, registered as {tensor.shape}"
            )
    return None


@dataclass(frozen=True)
class Registration:
    """What ``register_shm_model`` was given, kept to lay the pool out again.

    Attributes:
        inputs, outputs, max_batch_size: The specs given by hand (``None``: from Triton).
        model_version: The version asked for.
        max_shapes, max_element_bytes: Sizing hints, kept for every later layout.
        memory: Where the slots live: ``"system"`` or ``"cuda"`` (see :mod:`.._slots._memory`).
        device: For ``"cuda"``, the GPU's UUID.
        triton_device_id: For ``"cuda"``, the index Triton knows that GPU by.
        transport: How the tensors reach Triton: ``"auto"``, ``"shm"`` or ``"inline"`` (see
            :mod:`._transport`).
        node_batching: How calls of several processes merge into one request (``None``:
            they do not; see :mod:`._batching`).
    """

    inputs: tuple[SpecLike, ...] | None = None
    outputs: tuple[SpecLike, ...] | None = None
    max_batch_size: int | None = None
    model_version: str = ""
    max_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    max_element_bytes: tuple[tuple[str, int], ...] = ()
    memory: str = "system"
    device: str | None = None
    triton_device_id: int | None = None
    transport: str = "auto"
    node_batching: NodeBatching | None = None

    @classmethod
    def of(
        cls,
        *,
        inputs: Sequence[SpecLike] | None,
        outputs: Sequence[SpecLike] | None,
        max_batch_size: int | None,
        model_version: str,
        max_shapes: Mapping[str, Sequence[int]] | None,
        max_element_bytes: Mapping[str, int] | None,
        memory: str = "system",
        device: str | None = None,
        triton_device_id: int | None = None,
        transport: str = "auto",
        node_batching: NodeBatching | None = None,
    ) -> Registration:
        """The registration of these arguments (hashable, comparable)."""
        return cls(
            inputs=None if inputs is None else tuple(_frozen(s) for s in inputs),
            outputs=None if outputs is None else tuple(_frozen(s) for s in outputs),
            max_batch_size=max_batch_size,
            model_version=model_version,
            max_shapes=tuple(sorted((k, tuple(v)) for k, v in (max_shapes or {}).items())),
            max_element_bytes=tuple(sorted((max_element_bytes or {}).items())),
            memory=memory,
            device=device,
            triton_device_id=triton_device_id,
            transport=transport,
            node_batching=node_batching,
        )

    @property
    def follows(self) -> bool:
        """Whether the specs all come from Triton's config, so the pool follows the model."""
        return self.inputs is None and self.outputs is None and self.max_batch_size is None

    def resolve(self, model: str, load_config: Callable[[], Mapping[str, Any]]) -> ModelSpec:
        """The spec these arguments give against the config ``load_config`` returns."""
        return resolve_model_spec(
            model,
            inputs=self.inputs,
            outputs=self.outputs,
            max_batch_size=self.max_batch_size,
            model_version=self.model_version,
            max_shapes=dict(self.max_shapes),
            load_config=load_config,
            max_element_bytes=dict(self.max_element_bytes),
        )

    def resolve_from_config(self, model: str, config: Mapping[str, Any]) -> ModelSpec | None:
        """What Triton's ``config`` alone says, with these sizing hints (``None`` if it needs
        a hint that was not given)."""
        try:
            return Registration(
                model_version=self.model_version,
                max_shapes=self.max_shapes,
                max_element_bytes=self.max_element_bytes,
            ).resolve(model, lambda: config)
        except ModelSpecError:
            return None


def _frozen(spec: SpecLike) -> SpecLike:
    if isinstance(spec, (tuple, list)) and len(spec) == 3:
        name, shape, dtype = spec
        try:
            return (name, tuple(shape), dtype)
        except TypeError:
            return (name, shape, dtype)  # type: ignore[return-value]
    return spec


@dataclass(frozen=True)
class Difference:
    """One way the registered spec and Triton's config differ."""

    tensor: str | None
    registered: str
    current: str


def differences(registered: ModelSpec, current: ModelSpec) -> list[Difference]:
    """How hand-given specs ``registered`` are wrong for ``current`` (Triton's config now).

    Only what makes them wrong counts: dims that no longer fit, another dtype, a tensor gone
    or a new input, a batch above the model's maximum (or batching turned on or off).
    """
    found: list[Difference] = []
    if registered.max_batch_size != current.max_batch_size and (
        current.max_batch_size < registered.max_batch_size
        or (current.max_batch_size == 0) != (registered.max_batch_size == 0)
    ):
        found.append(
            Difference(
                None,
                f"max_batch_size {registered.max_batch_size}",
                f"max_batch_size {current.max_batch_size}",
            )
        )
    for kind, old, new in (
        ("input", registered.inputs, current.inputs),
        ("output", registered.outputs, current.outputs),
    ):
        now = {t.name: t for t in new}
        before = {t.name: t for t in old}
        for tensor in old:
            other = now.get(tensor.name)
            if other is None:
                found.append(
                    Difference(tensor.name, f"{kind} {_describe(tensor)}", "no such " + kind)
                )
            elif tensor.dtype != other.dtype or not _dims_fit(tensor, other):
                found.append(
                    Difference(tensor.name, f"{kind} {_describe(tensor)}", _describe(other))
                )
        for tensor in new:
            if tensor.name not in before and kind == "input":
                found.append(
                    Difference(tensor.name, "not registered", f"{kind} {_describe(tensor)}")
                )
    return found


def _dims_fit(registered: TensorSpec, current: TensorSpec) -> bool:
    return len(registered.shape) == len(current.shape) and all(
        c == -1 or r == c for r, c in zip(registered.shape, current.shape)
    )


def _describe(tensor: TensorSpec) -> str:
    return f"{tensor.datatype} {tensor.shape}"


def changed_error(
    registered: ModelSpec, found: Sequence[Difference], cause: BaseException | None
) -> ModelChangedError:
    """The error of a pool with hand-given specs whose model changed on Triton."""
    first = found[0]
    what = "max_batch_size" if first.tensor is None else f"tensor {first.tensor!r}"
    more = f" (and {len(found) - 1} more difference(s))" if len(found) > 1 else ""
    status, message = status_and_message(cause) if cause is not None else (None, "")
    return ModelChangedError(
        f"model {registered.name!r} changed on Triton: {what} was registered as "
        f"{first.registered}, Triton's config now says {first.current}{more}. Register it "
        f"again with the new specs (register_shm_model({registered.name!r}, ..., replace=True) "
        "or ShmModel.reregister(...)), or leave inputs, outputs and max_batch_size out so "
        "that the pool follows the model's config",
        tensor=first.tensor,
        registered=first.registered,
        current=first.current,
        status=status,
        server_message=message,
        model=registered.name,
    )


#: The size of a pool in GPU memory when none is given (GPU pools do not follow their load).
_GPU_POOL_SIZE = 4


def plan_registration(
    model_name: str,
    *,
    inputs: Sequence[SpecLike] | None,
    outputs: Sequence[SpecLike] | None,
    max_batch_size: int | None,
    pool_size: int | None,
    autoscaling: SlotAutoscaling | Mapping[str, Any] | None,
    model_version: str,
    max_shapes: Mapping[str, Sequence[int]] | None,
    max_element_bytes: Mapping[str, int] | None,
    memory: str,
    device: int | str | None,
    triton_device_id: int | None,
    transport: str = "auto",
    node_batching: NodeBatching | bool | Mapping[str, Any] | None = None,
) -> tuple[Registration, int | SlotAutoscaling]:
    """What ``register_shm_model``'s arguments ask for: the registration and the pool's size,
    checked (a GPU given by its UUID: the same in every process and every layout).

    Raises:
        ModelSpecError: options that do not go together.
        CudaError: ``memory="cuda"`` and the GPU cannot be found.
    """
    check_memory_options(model_name, memory, device, triton_device_id)
    check_transport(model_name, transport)
    if memory == CUDA and pool_size is None:
        if autoscaling is not None:
            raise ModelSpecError(
                f"model {model_name!r}: a pool in GPU memory has a fixed size: pass "
                "pool_size, not autoscaling",
                model=model_name,
            )
        pool_size = _GPU_POOL_SIZE
    sizing = pool_sizing(model_name, pool_size, autoscaling)
    gpu = None
    if memory == CUDA:
        gpu = _cuda.find_device(device)
        if triton_device_id is None:
            triton_device_id = _gpu_choice.triton_device_id(gpu)
    registration = Registration.of(
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        model_version=model_version,
        max_shapes=max_shapes,
        max_element_bytes=max_element_bytes,
        memory=memory,
        device=None if gpu is None else gpu.uuid,
        triton_device_id=triton_device_id,
        transport=transport,
        node_batching=node_batching_of(model_name, node_batching),
    )
    return registration, sizing
