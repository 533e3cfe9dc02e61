"""Triton's per-request options, as the shared-memory paths take them; and the options of the
public signatures, each written once.

tritonclient's ``infer`` takes ``priority``, ``timeout`` (microseconds), ``sequence_id``,
``sequence_start``, ``sequence_end``, ``parameters`` and ``outputs``; so does every
shared-memory path, under the library's names (``queue_timeout_s`` in seconds,
``requested_outputs``). A call without options costs nothing: :func:`request_options` returns
``None``, and the slot's prebuilt request goes as it is. A call with options sends a copy of it
with the options set.

The options the public signatures share (:data:`REQUEST_OPTIONS`, :data:`CALL_OPTIONS`,
:data:`REGISTRATION_OPTIONS`) are each written once here: name, default and meaning. Every
signature that takes one still spells it out, keyword by keyword, for IDEs and the API
reference; ``tests/unit/test_signatures.py`` holds each of them (the core client's,
``ShmModel``'s, ``ShmPredictor``'s, the node actor's registration) to these tables.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2

from .._exceptions import InvalidInputError
from .._slots._memory import SYSTEM
from .._slots._specs import ModelSpec

__all__ = [
    "CALL_OPTIONS",
    "NOT_GIVEN",
    "REGISTRATION_OPTIONS",
    "RENAMED_REQUEST_OPTIONS",
    "REQUEST_OPTIONS",
    "RESERVED_PARAMETERS",
    "NotGiven",
    "Option",
    "RequestOptions",
    "options_without_sequence",
    "over_defaults",
    "renamed_outputs",
    "request_options",
    "select_outputs",
]

#: Parameter names the library or Triton use themselves (a prefix ends with ``_``).
RESERVED_PARAMETERS = (
    "shared_memory_",
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "binary_data",
    "binary_data_output",
    "binary_data_size",
    "triton_",
    "headers",
)

ParameterValue = str | int | float | bool


class NotGiven(enum.Enum):
    """An argument left out, where ``None`` means something (httpx's ``USE_CLIENT_DEFAULT``)."""

    NOT_GIVEN = "NOT_GIVEN"


NOT_GIVEN = NotGiven.NOT_GIVEN


@dataclass(frozen=True)
class Option:
    """A keyword option of the public signatures, written once.

    Attributes:
        name: Its keyword.
        default: Its default where it is the caller's own (a handle's calls may default to
            ``None``: the handle's).
        meaning: What it means, as the docstring that defines it says (the others refer to
            that one).
    """

    name: str
    default: Any
    meaning: str


#: Triton's request options: the calls of ``TritonSHMClient`` (``infer_shm``,
#: ``infer_shm_async``, ``lease``: no sequence) and of ``ShmModel``, whose handles also take
#: ``priority``, ``queue_timeout_s``, ``parameters`` and ``requested_outputs`` as defaults.
REQUEST_OPTIONS = (
    Option(
        "priority",
        0,
        "Triton's priority level of the request (``0``: the model's default; ``1`` is the "
        "highest), for a model whose scheduler has ``priority_levels``.",
    ),
    Option(
        "queue_timeout_s",
        None,
        "Triton's own timeout: past it, a request still waiting in Triton's queue is rejected "
        "there and its slot is free at once (the model needs ``default_queue_policy { "
        "timeout_action: REJECT allow_timeout_override: true }``). Unlike "
        "``client_timeout_s``, Triton does not run such a request at all.",
    ),
    Option(
        "sequence_id",
        0,
        "The sequence of a stateful model (int, or str for a model with string ids); its steps "
        "are never chunked.",
    ),
    Option("sequence_start", False, "This request starts the sequence."),
    Option("sequence_end", False, "This request ends the sequence."),
    Option(
        "parameters",
        None,
        "Custom parameters for the model (str, int, float or bool values); names the library "
        "or Triton use themselves are refused.",
    ),
    Option(
        "requested_outputs",
        None,
        "Ask for these outputs only (``None``: all); only they are returned.",
    ),
)
#: The request options' earlier names: each still works, with a :class:`DeprecationWarning`.
RENAMED_REQUEST_OPTIONS = (
    Option(
        "outputs",
        None,
        "Deprecated: the earlier name of ``requested_outputs``; given, it sets it, with a "
        ":class:`DeprecationWarning`.",
    ),
)
#: How a call is made, besides Triton's options: the calls of ``TritonSHMClient``
#: (``lease``: but ``outputs_as``); ``ShmModel`` takes ``slot_timeout_s``, ``client_timeout_s``,
#: ``headers`` and ``outputs_as`` as its calls' settings.
CALL_OPTIONS = (
    Option(
        "slot_timeout_s",
        None,
        "How long to wait for a free slot (``None``: as long as it takes).",
    ),
    Option(
        "client_timeout_s",
        None,
        "How long to wait for Triton's answer to each request (each chunk), from when it is "
        "sent; past it the call raises :class:`TritonServerError` with ``status`` "
        '``"StatusCode.DEADLINE_EXCEEDED"``. Triton still runs the request (it cannot be '
        "recalled): its slot is used again only once Triton has answered it.",
    ),
    Option("headers", None, "gRPC headers of this call, merged over the client's."),
    Option("request_id", "", "Triton request id, sent with every chunk."),
    Option(
        "reconnect_timeout_s",
        None,
        "How long to wait for Triton while it is unreachable; ``None`` for the client's "
        "``reconnect_timeout_s``.",
    ),
    Option(
        "outputs_as",
        "numpy",
        '``"numpy"`` (the default), or for a pool in GPU memory ``"torch"`` or ``"cupy"``: '
        "tensors on the pool's GPU, never through the host.",
    ),
)
#: What ``TritonSHMClient.register_shm_model`` takes; so do the node actor's ``register`` and
#: ``ShmModel`` (but ``replace``: its ``reregister()``).
REGISTRATION_OPTIONS = (
    Option("inputs", None, "Input specs, or ``None`` to read them from the server."),
    Option("outputs", None, "Output specs, or ``None`` to read them from the server."),
    Option(
        "max_batch_size",
        None,
        "Samples per slot; ``None`` reads it from the server; ``0`` for a model that does not "
        "batch.",
    ),
    Option(
        "pool_size",
        None,
        "A fixed number of slots, i.e. requests in flight at once for this model; ``None`` "
        "(the default): as many as its callers need at once, within ``autoscaling``'s bounds.",
    ),
    Option(
        "autoscaling",
        None,
        "How a pool without ``pool_size`` follows its load: a :class:`SlotAutoscaling`, or a "
        "mapping of its fields (``min_slots``, ``max_slots``, ``upscale_delay_s``, "
        "``downscale_delay_s``); ``None``: the defaults, 2 to 64 slots. It grows while "
        "callers wait for a slot, and shrinks after ``downscale_delay_s`` with fewer callers. "
        "A pool in GPU memory has a fixed size (4 by default).",
    ),
    Option("model_version", "", 'Model version; ``""`` lets the server choose.'),
    Option(
        "max_shapes",
        None,
        'Per-sample maximum for tensors with ``-1`` dims, e.g. ``{"INPUT0": (16,)}``: slots '
        "are sized for it.",
    ),
    Option(
        "max_element_bytes",
        None,
        'The longest element of each BYTES (string) tensor, e.g. ``{"TEXT": 256, "UPPER": '
        "256}``: slots are sized for it.",
    ),
    Option(
        "replace",
        False,
        "If the model is registered with other specs, lay its pool out anew for these (calls "
        "in flight finish on the old pool) instead of raising.",
    ),
    Option(
        "memory",
        SYSTEM,
        'Where the slots live: ``"system"`` (POSIX shared memory) or ``"cuda"`` (GPU memory, '
        "through Triton's CUDA shared memory: inputs may then also be GPU tensors, and "
        "outputs come back as GPU tensors on request, see :meth:`infer_shm`). GPU memory needs "
        "an NVIDIA GPU and driver here and in Triton's reach, and the ``[cuda]`` extra; models "
        "with BYTES tensors stay in system memory.",
    ),
    Option(
        "device",
        None,
        'For ``memory="cuda"``, the GPU: an index in this process (``0``, ``"cuda:1"``), a '
        'UUID (``"GPU-..."``), or ``None`` for the current CUDA device.',
    ),
    Option(
        "triton_device_id",
        None,
        'For ``memory="cuda"``, the index Triton knows that GPU by; ``None`` guesses it from '
        "``CUDA_VISIBLE_DEVICES`` (right where Triton sees every GPU of the machine, as in its "
        "container by default).",
    ),
    Option(
        "transport",
        "auto",
        'How the tensors reach Triton. ``"auto"`` (the default): through shared memory where '
        "Triton proves it maps this process's (it opens the region, and a probe request, one "
        "per registration, lands in it), else by value, in the requests (a Triton on another "
        "host, in a container with its own ``/dev/shm``); GPU memory Triton cannot open falls "
        "back to system memory first. Proven again when Triton restarts elsewhere, and every "
        '``config_check_interval_s`` while by value. ``"shm"``: shared memory or '
        ':class:`SharedMemoryUnreachableError`; ``"inline"``: by value. The same API, errors, '
        "answers and backpressure either way (but :meth:`lease`, which needs shared memory). "
        "``shm_stats()`` says which, and why.",
    ),
    Option(
        "node_batching",
        None,
        "Merge calls of a few rows, from every thread and process on this machine that uses "
        "the model's pool, into one Triton request (see the guide's *Node batching*): a "
        ":class:`NodeBatching`, ``True`` for its defaults, or ``None`` (the default): each "
        "call sends its own requests. Only for a model with ``max_batch_size > 0``, "
        "``dynamic_batching`` in its config (else ``NodeBatching(force=True)``) and no BYTES "
        "tensors; in system shared memory (by value or in GPU memory, each call goes alone).",
    ),
)


@dataclass(frozen=True)
class RequestOptions:
    """The options of one call, checked.

    Attributes:
        priority: Triton's priority level (``0``: the model's default; ``1`` is the highest).
        queue_timeout_us: Triton's own timeout in microseconds (``0``: the model's default).
        sequence_id: The sequence of a stateful model (``0`` or ``""``: none).
        sequence_start: This request starts the sequence.
        sequence_end: This request ends the sequence.
        parameters: Custom parameters for the model, in order.
        outputs: The outputs to ask for (``None``: all of them), in the model's order.
    """

    priority: int = 0
    queue_timeout_us: int = 0
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    parameters: tuple[tuple[str, ParameterValue], ...] = ()
    outputs: tuple[str, ...] | None = None

    @property
    def is_sequence(self) -> bool:
        """Whether the call is a step of a sequence (never chunked)."""
        return self.sequence_id not in (0, "")

    def apply(self, request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferRequest:
        """A copy of a slot's prebuilt request with these options set."""
        copy = service_pb2.ModelInferRequest()
        copy.CopyFrom(request)
        if self.outputs is not None:
            kept = [o for o in copy.outputs if o.name in self.outputs]
            del copy.outputs[:]
            copy.outputs.extend(kept)
        parameters = copy.parameters
        if self.priority:
            parameters["priority"].uint64_param = self.priority
        if self.queue_timeout_us:
            parameters["timeout"].int64_param = self.queue_timeout_us
        if self.is_sequence:
            if isinstance(self.sequence_id, str):
                parameters["sequence_id"].string_param = self.sequence_id
            else:
                parameters["sequence_id"].int64_param = self.sequence_id
            parameters["sequence_start"].bool_param = self.sequence_start
            parameters["sequence_end"].bool_param = self.sequence_end
        for name, value in self.parameters:
            if isinstance(value, bool):
                parameters[name].bool_param = value
            elif isinstance(value, int):
                parameters[name].int64_param = value
            elif isinstance(value, float):
                parameters[name].double_param = value
            else:
                parameters[name].string_param = value
        return copy


def request_options(
    model: str,
    *,
    priority: int,
    queue_timeout_s: float | None,
    sequence_id: int | str,
    sequence_start: bool,
    sequence_end: bool,
    parameters: Mapping[str, ParameterValue] | None,
    requested_outputs: Sequence[str] | None,
) -> RequestOptions | None:
    """Checks a call's options (each as the public signatures take it, their defaults in
    :data:`REQUEST_OPTIONS`); ``None`` when every one is left at its default.

    Output names are checked against the model's spec by :func:`select_outputs`.

    Raises:
        InvalidInputError: an option of the wrong type or range, a reserved parameter name,
            or a sequence flag without a ``sequence_id``.
    """
    if (
        not priority
        and queue_timeout_s is None
        and not sequence_id
        and not sequence_start
        and not sequence_end
        and not parameters
        and requested_outputs is None
    ):
        return None
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise _bad(model, "priority", "an int >= 0 (1 is the highest level)", priority)
    timeout_us = 0
    if queue_timeout_s is not None:
        if isinstance(queue_timeout_s, bool) or not isinstance(queue_timeout_s, (int, float)):
            raise _bad(model, "queue_timeout_s", "seconds > 0", queue_timeout_s)
        if not queue_timeout_s > 0 or math.isinf(queue_timeout_s):
            raise _bad(model, "queue_timeout_s", "seconds > 0", queue_timeout_s)
        timeout_us = max(1, round(queue_timeout_s * 1e6))
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)):
        raise _bad(model, "sequence_id", "an int > 0 or a non-empty str", sequence_id)
    if isinstance(sequence_id, int) and not 0 <= sequence_id < 2**63:
        raise _bad(model, "sequence_id", "an int > 0 or a non-empty str", sequence_id)
    if (sequence_start or sequence_end) and sequence_id in (0, ""):
        raise _bad(model, "sequence_start/sequence_end", "a sequence_id with them", sequence_id)
    checked: list[tuple[str, ParameterValue]] = []
    for name, value in (parameters or {}).items():
        if not isinstance(name, str) or not name:
            raise _bad(model, "parameters", "str names", name)
        if any(name == r or (r.endswith("_") and name.startswith(r)) for r in RESERVED_PARAMETERS):
            raise _bad(
                model,
                f"parameters[{name!r}]",
                "a name the library and Triton do not use themselves (not "
                + ", ".join(f"{r}*" if r.endswith("_") else r for r in RESERVED_PARAMETERS)
                + "; use the option of that name)",
                name,
            )
        if not isinstance(value, (str, int, float, bool)):
            raise _bad(model, f"parameters[{name!r}]", "a str, int, float or bool", value)
        checked.append((name, value))
    names = None
    if requested_outputs is not None:
        wanted = requested_outputs
        if isinstance(wanted, str) or not all(isinstance(o, str) for o in wanted):
            raise _bad(model, "requested_outputs", "a sequence of output names", wanted)
        names = tuple(dict.fromkeys(wanted))
        if not names:
            raise _bad(model, "requested_outputs", "at least one output name", list(wanted))
    return RequestOptions(
        priority=priority,
        queue_timeout_us=timeout_us,
        sequence_id=sequence_id,
        sequence_start=bool(sequence_start),
        sequence_end=bool(sequence_end),
        parameters=tuple(checked),
        outputs=names,
    )


def options_without_sequence(
    model: str,
    *,
    priority: int,
    queue_timeout_s: float | None,
    parameters: Mapping[str, ParameterValue] | None,
    requested_outputs: Sequence[str] | None,
) -> RequestOptions | None:
    """The options of a call that is no step of a sequence (a lease's, a handle's defaults),
    checked: see :func:`request_options`.

    Raises:
        InvalidInputError: as :func:`request_options`.
    """
    return request_options(
        model,
        priority=priority,
        queue_timeout_s=queue_timeout_s,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        parameters=parameters,
        requested_outputs=requested_outputs,
    )


def over_defaults(
    defaults: RequestOptions | None, own: RequestOptions | None, *, priority_given: bool
) -> RequestOptions | None:
    """A call's options (``own``, checked) over a handle's ``defaults``: what the call gives
    wins, what it leaves out takes the default (a ``priority`` it gives wins even as ``0``,
    Triton's default level); its parameters are merged over the defaults'. ``None`` when every
    option is Triton's default: such a call costs nothing."""
    if defaults is None:
        return own
    own = own or _NONE
    merged = dataclasses.replace(
        own,
        priority=own.priority if priority_given else defaults.priority,
        queue_timeout_us=own.queue_timeout_us or defaults.queue_timeout_us,
        parameters=tuple({**dict(defaults.parameters), **dict(own.parameters)}.items()),
        outputs=defaults.outputs if own.outputs is None else own.outputs,
    )
    return None if merged == _NONE else merged


def renamed_outputs(
    requested_outputs: Sequence[str] | None, outputs: Sequence[str], *, stacklevel: int
) -> Sequence[str]:
    """``outputs=``, the deprecated name of ``requested_outputs=`` (see
    :data:`RENAMED_REQUEST_OPTIONS`), given to a call: warns at the caller's line
    (``stacklevel`` frames up), and gives what to ask for.

    Raises:
        TypeError: both names given.
    """
    if requested_outputs is not None:
        raise TypeError("give requested_outputs= alone (outputs= is its deprecated name)")
    warnings.warn(
        "outputs= of a call is deprecated: it is requested_outputs= (outputs= names the "
        "specs where a model is registered)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return outputs


_NONE = RequestOptions()


def select_outputs(spec: ModelSpec, options: RequestOptions | None) -> RequestOptions | None:
    """``options`` with its outputs checked against ``spec`` and put in the model's order.

    Raises:
        InvalidInputError: an output the model does not have.
    """
    if options is None or options.outputs is None:
        return options
    known = [t.name for t in spec.outputs]
    unknown = [name for name in options.outputs if name not in known]
    if unknown:
        raise InvalidInputError(
            f"model {spec.name!r}: requested_outputs= names {unknown[0]!r}, which the model "
            f"does not have (outputs: {known})",
            model=spec.name,
            tensor=unknown[0],
            expected=known,
            actual=list(options.outputs),
        )
    ordered = tuple(name for name in known if name in options.outputs)
    return options if ordered == options.outputs else dataclasses.replace(options, outputs=ordered)


def _bad(model: str, option: str, expected: str, actual: Any) -> InvalidInputError:
    return InvalidInputError(
        f"model {model!r}: {option} must be {expected}, got {actual!r}",
        model=model,
        tensor=None,
        expected=expected,
        actual=actual,
    )
