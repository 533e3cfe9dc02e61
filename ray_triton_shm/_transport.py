"""The gRPC side of shared-memory inference.

Builds the small ``ModelInferRequest`` that points Triton at a slot (one prebuilt message per
slot, only shapes and sizes change per call), bridges gRPC futures to asyncio, and is the one
place where errors from Triton become :class:`TritonServerError`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from ._exceptions import (
    AccessDeniedError,
    ModelNotLoadedError,
    SharedMemoryNotAllowedError,
    TritonServerError,
)
from ._headers import KEYS_DIR_ENV_VAR, env_var_for
from ._specs import ModelSpec, SlotLayout

__all__ = [
    "SlotRequests",
    "as_asyncio_future",
    "expected_header",
    "is_in_use",
    "is_missing_region",
    "is_queue_refusal",
    "is_unknown_model",
    "never_reached",
    "status_and_message",
    "translate_error",
]

_REFUSAL_WORDS = ("not allowed", "disabled", "not enabled", "not permitted", "allow-client-shm")
#: Triton's answer to a call of a restricted protocol without its key, or with a wrong one
#: (gRPC: "This protocol is restricted, ..."; HTTP: "This API is restricted, ...").
_RESTRICTED = re.compile(r"is restricted, expecting header '([^']*)'")
#: What Triton answers when ``shm_open`` of a region fails (for any reason: it does not say).
_UNOPENABLE = "Unable to open shared memory region"
#: Triton's own ``UNAVAILABLE`` answers to a request it queued: not a server that is down.
_QUEUE_REFUSALS = ("Request timeout expired", "Exceeds maximum queue size")
#: Triton's answer for a model it does not serve now (unloaded, or never loaded).
_UNKNOWN_MODEL = "Request for unknown model"


def status_and_message(exc: BaseException) -> tuple[str | None, str]:
    """The gRPC status name and the message of a gRPC or tritonclient error."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return str(exc.code()), exc.details() or ""
    if isinstance(exc, InferenceServerException):
        return exc.status(), exc.message() or ""
    return None, str(exc)


def is_queue_refusal(exc: BaseException) -> bool:
    """Whether Triton refused a request from its queue (its own timeout expired, or the queue
    was full): an answer, which Triton sends ``UNAVAILABLE`` like a server that is down."""
    _, message = status_and_message(exc)
    return any(words in message for words in _QUEUE_REFUSALS)


def is_unknown_model(exc: BaseException) -> bool:
    """Whether Triton answered that it serves no version of the model now."""
    status, message = status_and_message(exc)
    return status == str(grpc.StatusCode.NOT_FOUND) and _UNKNOWN_MODEL in message


def never_reached(exc: BaseException) -> bool:
    """Whether a call failed because nothing listens at Triton's address (no connection was
    made: the request never left, and no Triton process serves there any more)."""
    status, message = status_and_message(exc)
    return status == str(grpc.StatusCode.UNAVAILABLE) and "failed to connect" in message.lower()


def is_in_use(exc: BaseException) -> bool:
    """Whether Triton refused to unregister a region because a request still uses it."""
    _, message = status_and_message(exc)
    return "currently in use" in message


def is_missing_region(exc: BaseException) -> bool:
    """Whether Triton no longer knows our region (it restarted, or someone unregistered it)."""
    _, message = status_and_message(exc)
    return "Unable to find shared memory region" in message


def expected_header(exc: BaseException) -> str | None:
    """The header Triton wants if ``exc`` is its refusal of a restricted protocol, else ``None``.

    Triton answers such a call ``UNAVAILABLE``, like a server that is down: this tells them
    apart.
    """
    _, message = status_and_message(exc)
    match = _RESTRICTED.search(message)
    return None if match is None else match.group(1)


def translate_error(
    exc: BaseException, *, model: str | None = None, action: str = "request"
) -> TritonServerError:
    """Turns a gRPC or tritonclient error into our own, keeping Triton's status and message.

    Args:
        exc: The error raised by gRPC or tritonclient.
        model: The model concerned, for the message.
        action: What was being done, e.g. ``"inference"``, for the message.
    """
    status, message = status_and_message(exc)
    about = f" for model {model!r}" if model else ""
    header = expected_header(exc)
    if header is not None:
        return AccessDeniedError(
            f"{action}{about} was refused: Triton restricts that protocol, and the request did "
            f"not carry its key (or not the key Triton has now; the key files were read again). "
            f"Triton expects the header {header!r}: put its key in a file named {header!r} in "
            f"${KEYS_DIR_ENV_VAR} (a mounted Secret), give it to "
            f"TritonSHMClient(headers={{{header!r}: ...}}), or set ${env_var_for(header)} where "
            "keys are read from the environment.",
            header=header,
            status=status,
            server_message=message,
            model=model,
        )
    if _UNOPENABLE in message:
        return TritonServerError(
            f"Triton could not open the shared memory region{about} ({message}). Either Triton "
            "runs as another user than this process (regions are created mode 0600, readable "
            "by their owner only), or it sees another /dev/shm (another container or host). "
            "Run Triton and the client as the same uid, and let them share /dev/shm: `docker "
            "run --ipc=host` (or --ipc=container:<triton>) for both, or in Kubernetes put them "
            "in one pod or set hostIPC: true.",
            status=status,
            server_message=message,
            model=model,
        )
    if is_unknown_model(exc) and model:
        return ModelNotLoadedError(
            f"model {model!r} is not loaded on Triton ({message}). Load it (in "
            "--model-control-mode=explicit: load_model), or check Triton's log for why it "
            "failed to load; calls work again once it is loaded, with no new registration.",
            status=status,
            server_message=message,
            model=model,
        )
    lower = message.lower()
    if ("shared memory" in lower or "shm" in lower) and any(w in lower for w in _REFUSAL_WORDS):
        return SharedMemoryNotAllowedError(
            f"Triton refuses client shared memory{about}: {message!r}. Start tritonserver with "
            "--allow-client-shm=true (newer releases need it), or use plain gRPC.",
            status=status,
            server_message=message,
            model=model,
        )
    return TritonServerError(
        f"{action}{about} failed: Triton answered {status}: {message}",
        status=status,
        server_message=message,
        model=model,
    )


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
        request.id = request_id
        last_shapes, last_sizes = self._shapes[slot], self._sizes[slot]
        for index, tensor in enumerate(self._spec.inputs):
            sample_shape = sample_shapes[tensor.name]
            shape = sample_shape if rows is None else (rows, *sample_shape)
            if last_shapes[index] != shape:
                last_shapes[index] = shape
                entry = request.inputs[index]
                del entry.shape[:]
                entry.shape.extend(shape)
            if last_sizes[index] != byte_sizes[index]:
                last_sizes[index] = byte_sizes[index]
                parameters = request.inputs[index].parameters
                parameters["shared_memory_byte_size"].int64_param = byte_sizes[index]
        return request


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
