"""What node batching of a model is asked to do (:class:`NodeBatching`), and which models it
can merge (see :mod:`._batching` for how)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._exceptions import ModelSpecError
from .._slots._board import MAX_OUTPUTS, MAX_ROW_DIMS
from .._slots._specs import ModelSpec

__all__ = ["NodeBatching", "batching_refusal", "node_batching_of"]


@dataclass(frozen=True, kw_only=True)
class NodeBatching:
    """Node batching of a model: small calls of every process on the machine merged into one
    Triton request (see the guide's *Node batching*).

    Args:
        max_delay_s: The most a batch waits for company while the model's earlier batches are
            in Triton (as Triton's ``max_queue_delay_microseconds``); a caller alone never
            waits.
        max_rows: The most rows of one merged request (``None``: the model's
            ``max_batch_size``); a call of more rows goes alone.
        max_in_triton: A batch goes out at once while fewer of the model's batches than this
            are in Triton.
        force: Batch a model whose config has no ``dynamic_batching`` (a sign that its rows may
            not be independent of each other: only you know).
    """

    max_delay_s: float = 0.002
    max_rows: int | None = None
    max_in_triton: int = 1
    force: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_delay_s) and self.max_delay_s >= 0):
            raise ValueError(f"max_delay_s must be >= 0 s, got {self.max_delay_s!r}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {self.max_rows!r}")
        if self.max_in_triton < 1:
            raise ValueError(f"max_in_triton must be >= 1, got {self.max_in_triton!r}")

    def capacity(self, spec: ModelSpec) -> int:
        """The most rows of one merged request of ``spec``."""
        return min(self.max_rows or spec.batch_capacity, spec.batch_capacity)


def batching_refusal(spec: ModelSpec, policy: NodeBatching) -> ModelSpecError | None:
    """Why ``spec`` cannot be batched on the node (``None``: it can)."""
    why = _why_not(spec, policy)
    if why is None:
        return None
    return ModelSpecError(
        f"model {spec.name!r} cannot be batched on the node: {why}", model=spec.name
    )


def _why_not(spec: ModelSpec, policy: NodeBatching) -> str | None:
    if spec.max_batch_size <= 0:
        return "its max_batch_size is 0 (its tensors have no batch dimension to merge along)"
    if spec.decoupled:
        return "it is a streaming model (decoupled)"
    strings = [t.name for t in (*spec.inputs, *spec.outputs) if t.is_bytes]
    if strings:
        return f"BYTES tensors {strings} have no fixed place per row"
    if len(spec.outputs) > MAX_OUTPUTS:
        return f"it has {len(spec.outputs)} outputs, more than the {MAX_OUTPUTS} a batch records"
    deep = [t.name for t in spec.outputs if len(t.shape) > MAX_ROW_DIMS]
    if deep:
        return f"outputs {deep} have more than {MAX_ROW_DIMS} dims per row"
    if not spec.dynamic_batching and not policy.force:
        return (
            "its config has no dynamic_batching, a sign that its rows may not be independent "
            "of each other (a row's answer would then depend on other callers' rows); add "
            "dynamic_batching to its config, or pass NodeBatching(force=True) if each row's "
            "answer depends on that row alone"
        )
    return None


def node_batching_of(
    model: str, value: NodeBatching | bool | Mapping[str, Any] | None
) -> NodeBatching | None:
    """``node_batching`` as given (``True``: the defaults; a mapping: the fields) as a
    :class:`NodeBatching`, or ``None``.

    Raises:
        ModelSpecError: anything else, or fields out of range.
    """
    if value is None or value is False:
        return None
    if value is True:
        return NodeBatching()
    if isinstance(value, NodeBatching):
        return value
    if isinstance(value, Mapping):
        try:
            return NodeBatching(**value)
        except (TypeError, ValueError) as exc:
            raise ModelSpecError(
                f"model {model!r}: node_batching {dict(value)!r}: {exc}", model=model
            ) from None
    raise ModelSpecError(
        f"model {model!r}: node_batching must be a NodeBatching, True, a mapping of its fields "
        f"or None, got {value!r}",
        model=model,
    )
