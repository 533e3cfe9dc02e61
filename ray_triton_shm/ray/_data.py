"""``ShmPredictor``: run a Triton model over a Ray Data dataset through shared memory.

A callable class for :meth:`ray.data.Dataset.map_batches`; Ray Data builds one per worker
actor, and each builds its :class:`ShmModel` there, so every worker writes its batches straight
into a slot of its own::

    import ray
    from ray_triton_shm.ray import ShmPredictor

    predictions = ds.map_batches(
        ShmPredictor,
        fn_constructor_kwargs={"model_name": "classifier", "input_columns": {"image": "INPUT0"}},
        batch_format="numpy",
        batch_size=64,
        compute=ray.data.ActorPoolStrategy(size=2),  # the actors: one ShmModel each
    )
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._exceptions import InvalidInputError, ModelSpecError
from .._slots._specs import ModelSpec
from ._handle import ShmModel

__all__ = ["ShmPredictor"]


class ShmPredictor:
    """Runs ``model_name`` on every batch of a dataset; use with ``map_batches``.

    Args:
        model_name: The model on the node's Triton.
        input_columns: Column name -> model input name. ``None``: every model input is read
            from the column of the same name. Every model input must be covered.
        output_columns: Output name -> column name (only the outputs named are returned), or a
            prefix put before every output name (``"pred_"`` gives ``pred_OUTPUT0``). ``None``:
            columns named like the outputs.
        keep_columns: Also return the columns of the incoming batch: ``True`` for all of them,
            or the names of those to keep (e.g. ``["id"]``). Outputs must not collide with them.
        cast: Convert input columns to the model's dtypes (e.g. float64 -> float32) instead of
            rejecting them.
        **model_options: Passed to :class:`ShmModel` (``url``, ``max_shapes``, ``transport``
            (``"auto"``, ``"shm"`` or ``"inline"``: by value, for a Triton that cannot map the
            node's shared memory; ``"auto"`` finds which),
            ``memory="cuda"`` for slots on the GPU, ``slot_timeout_s``, ``actor_options``,
            and Triton's request options ``priority``,
            ``queue_timeout_s``, ``parameters``...). Only the outputs ``output_columns``
            names are asked of Triton.

    Raises:
        ModelSpecError: ``input_columns`` or ``output_columns`` do not match the model (a
            ``ValueError``, raised when the worker builds the predictor).
        InvalidInputError: a batch lacks a column, or holds a ragged or mistyped one (raised by
            :meth:`__call__`).

    Example:
        >>> ds.map_batches(ShmPredictor, fn_constructor_kwargs={"model_name": "classifier"},
        ...                batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=2))
    """

    def __init__(
        self,
        model_name: str,
        *,
        input_columns: Mapping[str, str] | None = None,
        output_columns: Mapping[str, str] | str | None = None,
        keep_columns: bool | Sequence[str] = False,
        cast: bool = False,
        **model_options: Any,
    ) -> None:
        self._model = ShmModel(model_name, **model_options)
        self._keep_columns: bool | tuple[str, ...] = (
            keep_columns if isinstance(keep_columns, bool) else tuple(keep_columns)
        )
        self._cast = cast
        #: Whether batches go through slot leases where their columns allow (see _in_place).
        self._leases = True
        # Binding here (inside the worker) fails fast on a bad model or mapping, before data
        # flows, and registers the model once per worker.
        self._spec: ModelSpec = self._model.spec
        self._columns = _input_columns(self._spec, input_columns)
        self._outputs = _output_columns(self._spec, output_columns)
        self._requested = (
            None if len(self._outputs) == len(self._spec.outputs) else list(self._outputs)
        )

    def __repr__(self) -> str:
        return f"ShmPredictor({self._spec.name!r}, inputs={self._columns})"

    @property
    def input_columns(self) -> dict[str, str]:
        """Model input name -> the column it is read from."""
        return dict(self._columns)

    @property
    def output_columns(self) -> dict[str, str]:
        """Model output name -> the column it is written to."""
        return dict(self._outputs)

    @property
    def zero_copy(self) -> bool:
        """Whether this worker writes batches straight into shared memory (else by value)."""
        return self._model.zero_copy

    @property
    def transport(self) -> str:
        """How this worker's batches reach Triton: ``"shm"`` or ``"inline"`` (by value)."""
        return self._model.shm_stats().transport

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the model on one batch (``batch_format="numpy"``).

        Batches larger than the model's ``max_batch_size`` are split into several requests.
        """
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"ShmPredictor({self._spec.name!r}) takes dict-of-numpy batches, got "
                f"{type(batch).__name__}; pass batch_format='numpy' to map_batches"
            )
        outputs = self._in_place(batch) if self._leases else None
        if outputs is None:
            inputs = {n: self._column(batch, n, column) for n, column in self._columns.items()}
            outputs = self._infer(inputs)
        result: dict[str, np.ndarray] = {}
        if self._keep_columns is True:
            result.update((column, np.asarray(values)) for column, values in batch.items())
        elif self._keep_columns:
            for column in self._keep_columns:
                if column not in batch:
                    raise InvalidInputError(
                        f"ShmPredictor({self._spec.name!r}): keep_columns names {column!r}, "
                        f"which the batch does not have (columns: {sorted(batch)})",
                        model=self._spec.name,
                        tensor=None,
                        expected=column,
                        actual=sorted(batch),
                    )
                result[column] = np.asarray(batch[column])
        for name, column in self._outputs.items():
            if column in result:
                raise InvalidInputError(
                    f"ShmPredictor({self._spec.name!r}): output {name!r} would overwrite column "
                    f"{column!r} of the batch (keep_columns); choose other output_columns",
                    model=self._spec.name,
                    tensor=name,
                    expected="a new column name",
                    actual=column,
                )
            result[column] = outputs[name]
        return result

    def _in_place(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """Runs the batch through a slot lease, its columns written straight into the slot
        (stacked there, for a column of per-row arrays; cast there, with ``cast``): one copy
        where building arrays first makes two. ``None`` where the columns do not allow it
        (BYTES, more rows than one request takes, ragged or mistyped columns: the plain path
        then says what is wrong), or where this worker cannot lease (by value, GPU memory)."""
        spec = self._spec
        if not spec.batched:
            return None
        columns: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {}
        for name, column in self._columns.items():
            values, tensor = batch.get(column), spec.input(name)
            if not isinstance(values, np.ndarray) or tensor.is_bytes:
                return None
            if values.dtype == object:
                if not _holds_arrays(values):
                    return None
                first = np.asarray(values[0])
                kind = first.dtype
                if any(np.shape(row) != first.shape for row in values):
                    return None
                sample = first.shape
            else:
                kind, sample = values.dtype, values.shape[1:]
            if kind != tensor.dtype and not (self._cast and kind.kind in "biuf"):
                return None
            columns[name] = (values, sample)
        rows = {len(values) for values, _ in columns.values()}
        if len(rows) != 1 or not 1 <= (count := rows.pop()) <= spec.batch_capacity:
            return None
        shapes = {name: sample for name, (_, sample) in columns.items()}
        try:
            with self._model.lease(
                batch=count, shapes=shapes, requested_outputs=self._requested
            ) as lease:
                for name, (values, _) in columns.items():
                    target = lease.inputs[name]
                    if values.dtype == object:
                        np.stack(list(values), out=target, casting="unsafe")
                    else:
                        np.copyto(target, values, casting="unsafe")
                answer = lease.infer()
                return {name: np.array(answer[name]) for name in self._outputs}
        except InvalidInputError as exc:
            if exc.tensor is None:
                self._leases = False  # by value, or GPU memory: never here
            return None

    def _infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._spec.batched:
            return self._model.infer(inputs, requested_outputs=self._requested)
        # A model without a batch dimension: one request per row, outputs stacked.
        rows = len(next(iter(inputs.values())))
        per_row = [
            self._model.infer(
                {k: v[i] for k, v in inputs.items()}, requested_outputs=self._requested
            )
            for i in range(rows)
        ]
        return {
            t.name: (
                np.stack([r[t.name] for r in per_row])
                if per_row
                else np.empty((0, *(max(d, 0) for d in t.shape)), t.dtype)
            )
            for t in self._spec.outputs
            if t.name in self._outputs
        }

    def _column(self, batch: Mapping[str, Any], name: str, column: str) -> np.ndarray:
        model = self._spec.name
        if column not in batch:
            raise InvalidInputError(
                f"ShmPredictor({model!r}): input {name!r} is read from column {column!r}, which "
                f"the batch does not have (columns: {sorted(batch)}); map columns to inputs with "
                "input_columns={column: input}",
                model=model,
                tensor=name,
                expected=column,
                actual=sorted(batch),
            )
        values = batch[column]
        array = values if isinstance(values, np.ndarray) else np.asarray(values)
        tensor = self._spec.input(name)
        if tensor.is_bytes and array.dtype.kind in "OSU" and not _holds_arrays(array):
            # A string column: one element per row, as a tensor of one element per sample.
            if array.ndim == 1 and tensor.shape == (1,):
                array = array.reshape(-1, 1)
            return array
        if array.dtype == object:
            array = _stack_rows(model, name, column, array)
        dtype = tensor.dtype
        if self._cast and array.dtype != dtype and array.dtype.kind in "biuf":
            array = array.astype(dtype)
        return array


def _holds_arrays(array: np.ndarray) -> bool:
    return array.dtype == object and array.size > 0 and isinstance(array.flat[0], np.ndarray)


def _stack_rows(model: str, name: str, column: str, rows: np.ndarray) -> np.ndarray:
    """Ray Data gives variable-shaped tensor columns as object arrays of per-row arrays."""
    arrays = [np.asarray(row) for row in rows]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise InvalidInputError(
            f"ShmPredictor({model!r}): column {column!r} (input {name!r}) holds rows of "
            f"different shapes in one batch ({sorted(shapes)[:4]}); a request needs one shape "
            "per batch: pad the rows to a common shape, or use batch_size=1",
            model=model,
            tensor=name,
            expected="rows of one shape",
            actual=sorted(shapes),
        )
    if not arrays:
        raise InvalidInputError(
            f"ShmPredictor({model!r}): column {column!r} (input {name!r}) is an empty object "
            "column; its tensor shape is unknown",
            model=model,
            tensor=name,
            expected="a numeric tensor column",
            actual="object",
        )
    return np.stack(arrays)


def _input_columns(spec: ModelSpec, mapping: Mapping[str, str] | None) -> dict[str, str]:
    """Model input -> column, checked against the model's inputs."""
    names = [t.name for t in spec.inputs]
    if mapping is None:
        return {name: name for name in names}
    if not isinstance(mapping, Mapping):
        raise ModelSpecError(
            f"ShmPredictor({spec.name!r}): input_columns must map column names to input names, "
            f"got {type(mapping).__name__}",
            model=spec.name,
        )
    by_input: dict[str, str] = {}
    for column, name in mapping.items():
        if name not in names:
            raise ModelSpecError(
                f"ShmPredictor({spec.name!r}): input_columns maps column {column!r} to "
                f"{name!r}, which is not an input of the model (inputs: {names})",
                model=spec.name,
            )
        if name in by_input:
            raise ModelSpecError(
                f"ShmPredictor({spec.name!r}): input_columns maps both {by_input[name]!r} and "
                f"{column!r} to input {name!r}",
                model=spec.name,
            )
        by_input[name] = column
    missing = [name for name in names if name not in by_input]
    if missing:
        raise ModelSpecError(
            f"ShmPredictor({spec.name!r}): input_columns gives no column for input(s) "
            f"{missing} (mapping: {dict(mapping)}; inputs: {names})",
            model=spec.name,
        )
    return {name: by_input[name] for name in names}


def _output_columns(spec: ModelSpec, mapping: Mapping[str, str] | str | None) -> dict[str, str]:
    """Model output -> column."""
    names = [t.name for t in spec.outputs]
    if mapping is None:
        return {name: name for name in names}
    if isinstance(mapping, str):
        return {name: f"{mapping}{name}" for name in names}
    unknown = [name for name in mapping if name not in names]
    if unknown:
        raise ModelSpecError(
            f"ShmPredictor({spec.name!r}): output_columns names {unknown}, which are not "
            f"outputs of the model (outputs: {names})",
            model=spec.name,
        )
    columns = list(mapping.values())
    if len(set(columns)) != len(columns):
        raise ModelSpecError(
            f"ShmPredictor({spec.name!r}): output_columns writes two outputs to one column "
            f"({dict(mapping)})",
            model=spec.name,
        )
    return dict(mapping)
