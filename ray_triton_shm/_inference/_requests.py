"""The requests of a pool's slots: pointing at shared memory, or carrying the tensors by value.

:class:`SlotRequests` builds the small request that points Triton at a slot in shared memory
(one prebuilt ``ModelInferRequest`` per slot, only shapes and sizes change per call) and its
JSON for Triton's HTTP endpoint (written again only when they change). :class:`ValueRequests`
builds the request of a pool by value, for a Triton that cannot map this process's memory: the
tensors travel in it, as plain gRPC sends them, but written once, straight from the caller's
arrays into the message's bytes (a plain client copies them three times: into a ``bytes``, into
the message, and into its serialization); over Triton's HTTP endpoint, once proven, the same
bytes follow the request's JSON as binary data. What Triton's errors say is
:mod:`.._wire._triton_errors`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tritonclient.grpc import service_pb2

from .._slots._memory import SlotIO
from .._slots._specs import ModelSpec, SlotLayout
from .._wire._http import BinaryBody, http_body, http_path
from ._inputs import Batch
from ._options import RequestOptions

__all__ = ["SlotRequests", "ValueRequests"]

#: The tag of ``ModelInferRequest.raw_input_contents`` (field 7, length-delimited).
_RAW_INPUT_TAG = b"\x3a"


class _Requests:
    """What both kinds of requests share: one reusable ``ModelInferRequest`` per slot, updated
    in place (a slot is used by one call at a time), and what it was last encoded to, dropped
    whenever it changes.

    Args:
        spec: The model.
        requests: Each slot's request.
    """

    #: Whether the tensors travel in the requests, by value (else they are in the slots).
    by_value = False
    #: The path of the model's inference requests over HTTP (empty: over gRPC).
    path = b""

    def __init__(self, spec: ModelSpec, requests: list[service_pb2.ModelInferRequest]) -> None:
        self._spec = spec
        self._requests = requests
        #: The shape of each input each slot's request was last sent with.
        self._shapes: list[list[tuple[int, ...] | None]] = [
            [None] * len(spec.inputs) for _ in requests
        ]
        #: Each slot's request encoded, while it is as last sent: its JSON for Triton's HTTP
        #: endpoint (see :meth:`SlotRequests.body`), or by value, its head serialized.
        self._encoded: list[bytes | None] = [None] * len(requests)

    def write(
        self,
        slot: int,
        views: SlotIO,
        batch: Batch,
        start: int,
        stop: int,
        request_id: str,
        options: RequestOptions | None,
    ) -> tuple[Any, list[int]]:
        """Rows ``start:stop`` of ``batch`` on ``slot``: their inputs written into the slot's
        ``views`` (by value: taken from the caller's arrays), and what is sent for them (a
        copy of the slot's request with ``options``), with the bytes of each input."""
        rows = stop - start if batch.batched else None
        if self.by_value:
            inputs: Any = batch.chunk_values(start, stop)
        else:
            inputs = batch.write_chunk(views, start, stop)
        request = self._update(slot, rows, batch.sample_shapes, request_id)
        return self._with_inputs(slot, request, inputs, options)

    def _update(
        self,
        slot: int,
        rows: int | None,
        sample_shapes: Mapping[str, tuple[int, ...]],
        request_id: str,
    ) -> service_pb2.ModelInferRequest:
        """The slot's request with this id and these shapes; what it was encoded to is
        dropped if either changed."""
        request = self._requests[slot]
        if request.id != request_id:
            request.id = request_id
            self._encoded[slot] = None
        if _reshape(request, self._spec, self._shapes[slot], rows, sample_shapes):
            self._encoded[slot] = None
        return request

    def _with_inputs(
        self, slot: int, request: Any, inputs: Any, options: RequestOptions | None
    ) -> tuple[Any, list[int]]:
        """What is sent for the chunk (see :meth:`write`)."""
        raise NotImplementedError

    def body(self, slot: int, request: Any) -> bytes | BinaryBody | None:
        """``request``, prepared on ``slot``, as the body of Triton's HTTP request; ``None``:
        it goes over gRPC."""
        return None


class SlotRequests(_Requests):
    """The requests that point Triton at each slot's tensors in shared memory: only shapes and
    sizes change per call.

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
        super().__init__(
            spec, [self._build(spec, layout, key, base) for key, base in zip(slot_keys, bases)]
        )
        # The byte sizes each slot's request was last sent with: most calls repeat them.
        self._sizes: list[list[int]] = [[-1] * len(spec.inputs) for _ in slot_keys]
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

    def _with_inputs(
        self, slot: int, request: Any, inputs: Any, options: RequestOptions | None
    ) -> tuple[service_pb2.ModelInferRequest, list[int]]:
        """The slot's request for inputs of ``inputs`` bytes each (a copy with ``options``):
        the byte size of each input whose size changed since the slot's last request is set."""
        last_sizes = self._sizes[slot]
        for index in range(len(last_sizes)):
            if last_sizes[index] != inputs[index]:
                last_sizes[index] = inputs[index]
                parameters = request.inputs[index].parameters
                parameters["shared_memory_byte_size"].int64_param = inputs[index]
                self._encoded[slot] = None
        return (request if options is None else options.apply(request)), inputs

    def prepare(
        self,
        slot: int,
        rows: int | None,
        sample_shapes: Mapping[str, tuple[int, ...]],
        byte_sizes: Sequence[int],
        request_id: str,
    ) -> service_pb2.ModelInferRequest:
        """Returns the slot's request, updated for inputs written into the slot by hand (a
        lease's, the probe's).

        Args:
            slot: The slot.
            rows: Samples in this chunk; ``None`` for a model that does not batch.
            sample_shapes: Actual per-sample shape of each input.
            byte_sizes: Bytes written for each input.
            request_id: Triton request id (may be empty).
        """
        request = self._update(slot, rows, sample_shapes, request_id)
        return self._with_inputs(slot, request, byte_sizes, None)[0]

    def body(self, slot: int, request: service_pb2.ModelInferRequest) -> bytes | None:
        """``request``, prepared on ``slot``, as Triton's JSON (see
        :func:`.._wire._http.http_body`): written once per slot and shape while the slot's own
        request is sent (a call with options sends a copy, written each time)."""
        if not self.path:
            return None
        if request is not self._requests[slot]:
            return http_body(request)
        body = self._encoded[slot]
        if body is None:
            body = self._encoded[slot] = http_body(request)
        return body


class ValueRequests(_Requests):
    """The requests of a pool by value: each one's tensors in its own bytes, serialized here.

    Per slot, the request without its tensors (model, shapes, id) is serialized once per
    shape; a call appends its inputs' bytes as ``raw_input_contents`` fields (protobuf merges
    repeated fields written one after another), and Triton answers its outputs in the
    response. Sent as bytes, over gRPC (see :attr:`.._wire._channel.Channel.infer_bytes`),
    or over Triton's HTTP endpoint where the client proved one (see :meth:`body`).

    Args:
        spec: The model.
        slot_count: Slots of the pool.
    """

    by_value = True

    def __init__(self, spec: ModelSpec, slot_count: int) -> None:
        super().__init__(spec, [self._build(spec) for _ in range(slot_count)])
        self.path = http_path(spec.name, spec.version) or b""
        #: Per slot, what it last sent (not its tensors, which only its call holds): the
        #: request's head, the message the head came from, and the bytes of each input.
        self._sent: list[tuple[bytes, Any, list[int]] | None] = [None] * slot_count
        #: Per slot, its last JSON over HTTP: the head and input sizes it was written for.
        self._json: list[tuple[bytes, list[int], bytes] | None] = [None] * slot_count

    @staticmethod
    def _build(spec: ModelSpec) -> service_pb2.ModelInferRequest:
        request = service_pb2.ModelInferRequest(model_name=spec.name, model_version=spec.version)
        for tensor in spec.inputs:
            request.inputs.add(name=tensor.name, datatype=tensor.datatype)
        for tensor in spec.outputs:
            request.outputs.add(name=tensor.name)
        return request

    def _with_inputs(
        self, slot: int, request: Any, inputs: Any, options: RequestOptions | None
    ) -> tuple[bytes, list[int]]:
        """The serialized request carrying ``inputs``, the chunk's values."""
        if options is not None:  # a copy, serialized each time
            request = options.apply(request)
            head = request.SerializeToString()
        else:
            head = self._encoded[slot] or request.SerializeToString()
            self._encoded[slot] = head
        parts: list[Any] = [head]
        written = []
        for value in inputs:
            size = len(value)
            written.append(size)
            parts.append(_RAW_INPUT_TAG)
            parts.append(_varint(size))
            parts.append(value)
        self._sent[slot] = (head, request, written)
        return b"".join(parts), written

    def body(self, slot: int, request: Any) -> BinaryBody | None:
        """``request``, the slot's last, as Triton's JSON followed by its inputs' bytes (views
        of ``request``'s, not copies); ``None`` for a model whose name a path cannot carry,
        or a request this slot did not write last."""
        sent = self._sent[slot]
        if not self.path or sent is None:
            return None
        head, message, sizes = sent
        view = memoryview(request)
        tensors = []
        offset = len(head)
        for size in sizes:
            offset += len(_RAW_INPUT_TAG) + len(_varint(size))
            tensors.append(view[offset : offset + size])
            offset += size
        if offset != len(view):
            return None
        cached = self._json[slot]
        if cached is not None and cached[0] is head and cached[1] == sizes:
            document = cached[2]
        else:
            document = http_body(message, sizes) or b""
            self._json[slot] = (head, sizes, document)
        return BinaryBody(document, tensors)


def _reshape(
    request: service_pb2.ModelInferRequest,
    spec: ModelSpec,
    last: list[tuple[int, ...] | None],
    rows: int | None,
    sample_shapes: Mapping[str, tuple[int, ...]],
) -> bool:
    """Sets the shape of each input of ``request`` whose shape differs from ``last`` (which
    it updates): ``rows`` samples (``None``: a model that does not batch) of its sample shape.
    Whether any did."""
    changed = False
    for index, tensor in enumerate(spec.inputs):
        sample_shape = sample_shapes[tensor.name]
        shape = sample_shape if rows is None else (rows, *sample_shape)
        if last[index] != shape:
            last[index] = shape
            entry = request.inputs[index]
            del entry.shape[:]
            entry.shape.extend(shape)
            changed = True
    return changed


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _point_at(parameters: Any, region_name: str, offset: int) -> None:
    parameters["shared_memory_region"].string_param = region_name
    parameters["shared_memory_offset"].int64_param = offset
