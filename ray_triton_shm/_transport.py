"""The small request that points Triton at a slot, and the bridge from gRPC futures to asyncio.

Builds the ``ModelInferRequest`` of each slot (one prebuilt message per slot, only shapes and
sizes change per call) and its JSON for Triton's HTTP endpoint (written again only when they
change). What Triton's errors say is :mod:`._triton_errors`'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from ._http import http_body, http_path
from ._specs import ModelSpec, SlotLayout

__all__ = ["SlotRequests", "as_asyncio_future"]


class SlotRequests:
    """One reusable ``ModelInferRequest`` per slot, pointing at that slot's tensors.

    A slot is used by one call at a time, so its message can be updated in place.

    Args:
        spec: The model.
        layout: Where each tensor lives inside a slot.
        slot_keys: The name each slot is registered under in Triton.
        bases: Where each slot starts in its registration (a system slot's registration is
            the whole region; a GPU slot's, the slot alone).
    """

    def __init__(
        self,
        spec: ModelSpec,
        layout: SlotLayout,
        slot_keys: Sequence[str],
        bases: Sequence[int],
    ) -> None:
        self._spec = spec
        self._requests = [
            self._build(spec, layout, key, base) for key, base in zip(slot_keys, bases)
        ]
        slot_count = len(slot_keys)
        # Shapes and byte sizes each slot's request was last sent with: most calls repeat them.
        self._shapes: list[list[tuple[int, ...] | None]] = [
            [None] * len(spec.inputs) for _ in range(slot_count)
        ]
        self._sizes: list[list[int]] = [[-1] * len(spec.inputs) for _ in range(slot_count)]
        #: Each slot's request as Triton's JSON, while it is as last sent (see :meth:`body`).
        self._bodies: list[bytes | None] = [None] * slot_count
        #: The path of the model's inference requests over HTTP (empty: its name cannot be
        #: in one, the requests go over gRPC).
        self.path = http_path(spec.name, spec.version) or b""

    @staticmethod
    def _build(
        spec: ModelSpec, layout: SlotLayout, region_name: str, base: int
    ) -> service_pb2.ModelInferRequest:
        request = service_pb2.ModelInferRequest(model_name=spec.name, model_version=spec.version)
        for tensor in spec.inputs:
            entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype)
            _point_at(entry.parameters, region_name, base + layout.input_offsets[tensor.name])
        for tensor in spec.outputs:
            entry = request.outputs.add(name=tensor.name)
            if tensor.name in spec.inline_outputs:
                continue  # answered in the response
            _point_at(entry.parameters, region_name, base + layout.output_offsets[tensor.name])
            entry.parameters["shared_memory_byte_size"].int64_param = layout.capacities[
                f"out:{tensor.name}"
            ]
        return request

    def prepare(
        self,
        slot: int,
        rows: int | None,
        sample_shapes: Mapping[str, tuple[int, ...]],
        byte_sizes: Sequence[int],
        request_id: str,
    ) -> service_pb2.ModelInferRequest:
        """Returns the slot's request, updated for this chunk.

        Args:
            slot: The slot.
            rows: Samples in this chunk; ``None`` for a model that does not batch.
            sample_shapes: Actual per-sample shape of each input.
            byte_sizes: Bytes written for each input.
            request_id: Triton request id (may be empty).
        """
        request = self._requests[slot]
        if request.id != request_id:
            request.id = request_id
            self._bodies[slot] = None
        last_shapes, last_sizes = self._shapes[slot], self._sizes[slot]
        for index, tensor in enumerate(self._spec.inputs):
            sample_shape = sample_shapes[tensor.name]
            shape = sample_shape if rows is None else (rows, *sample_shape)
            if last_shapes[index] != shape:
                last_shapes[index] = shape
                entry = request.inputs[index]
                del entry.shape[:]
                entry.shape.extend(shape)
                self._bodies[slot] = None
            if last_sizes[index] != byte_sizes[index]:
                last_sizes[index] = byte_sizes[index]
                parameters = request.inputs[index].parameters
                parameters["shared_memory_byte_size"].int64_param = byte_sizes[index]
                self._bodies[slot] = None
        return request

    def body(self, slot: int, request: service_pb2.ModelInferRequest) -> bytes | None:
        """``request``, prepared on ``slot``, as Triton's JSON (see :func:`._http.http_body`):
        written once per slot and shape while the slot's own request is sent (a call with
        options sends a copy, written each time)."""
        if not self.path:
            return None
        if request is not self._requests[slot]:
            return http_body(request)
        body = self._bodies[slot]
        if body is None:
            body = self._bodies[slot] = http_body(request)
        return body


def _point_at(parameters: Any, region_name: str, offset: int) -> None:
    parameters["shared_memory_region"].string_param = region_name
    parameters["shared_memory_offset"].int64_param = offset


def as_asyncio_future(
    call: grpc.Future, loop: asyncio.AbstractEventLoop
) -> asyncio.Future[service_pb2.ModelInferResponse]:
    """An asyncio future that completes with a gRPC future, without a thread waiting on it."""
    result: asyncio.Future[service_pb2.ModelInferResponse] = loop.create_future()

    def transfer(done: grpc.Future) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
            return
        error = done.exception()
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(done.result())

    def on_done(done: grpc.Future) -> None:
        try:
            loop.call_soon_threadsafe(transfer, done)
        except RuntimeError:
            pass  # the loop is closed; nobody is waiting any more

    call.add_done_callback(on_done)
    return result
