"""Triton's per-request options, as the shared-memory paths take them.

tritonclient's ``infer`` takes ``priority``, ``timeout`` (microseconds), ``sequence_id``,
``sequence_start``, ``sequence_end``, ``parameters`` and ``outputs``; so does every
shared-memory path, under the library's names (``queue_timeout_s`` in seconds). A call without
options costs nothing: :func:`request_options` returns ``None``, and the slot's prebuilt request
goes as it is. A call with options sends a copy of it with the options set.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2

from .._exceptions import InvalidInputError
from .._slots._specs import ModelSpec

__all__ = [
    "NOT_GIVEN",
    "RESERVED_PARAMETERS",
    "NotGiven",
    "RequestOptions",
    "over_defaults",
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
    priority: int = 0,
    queue_timeout_s: float | None = None,
    sequence_id: int | str = 0,
    sequence_start: bool = False,
    sequence_end: bool = False,
    parameters: Mapping[str, ParameterValue] | None = None,
    outputs: Sequence[str] | None = None,
) -> RequestOptions | None:
    """Checks a call's options; ``None`` when every one is left at its default.

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
        and outputs is None
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
    if outputs is not None:
        if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs):
            raise _bad(model, "outputs", "a sequence of output names", outputs)
        names = tuple(dict.fromkeys(outputs))
        if not names:
            raise _bad(model, "outputs", "at least one output name", list(outputs))
    return RequestOptions(
        priority=priority,
        queue_timeout_us=timeout_us,
        sequence_id=sequence_id,
        sequence_start=bool(sequence_start),
        sequence_end=bool(sequence_end),
        parameters=tuple(checked),
        outputs=names,
    )


def over_defaults(
    model: str,
    defaults: RequestOptions | None,
    *,
    priority: int | None = None,
    queue_timeout_s: float | None = None,
    sequence_id: int | str = 0,
    sequence_start: bool = False,
    sequence_end: bool = False,
    parameters: Mapping[str, ParameterValue] | None = None,
    outputs: Sequence[str] | None = None,
) -> RequestOptions | None:
    """A call's options over a handle's ``defaults`` (see :func:`request_options`): what the
    call gives wins, ``None`` leaving the default (``priority=0`` is Triton's default level,
    over a handle's own); its parameters are merged over the defaults'. ``None`` when every
    option is Triton's default: such a call costs nothing.

    Raises:
        InvalidInputError: as :func:`request_options`.
    """
    own = request_options(
        model,
        priority=priority or 0,
        queue_timeout_s=queue_timeout_s,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
        parameters=parameters,
        outputs=outputs,
    )
    if defaults is None:
        return own
    own = own or RequestOptions()
    merged = dataclasses.replace(
        own,
        priority=defaults.priority if priority is None else own.priority,
        queue_timeout_us=own.queue_timeout_us or defaults.queue_timeout_us,
        parameters=tuple({**dict(defaults.parameters), **dict(own.parameters)}.items()),
        outputs=defaults.outputs if outputs is None else own.outputs,
    )
    return None if merged == _NONE else merged


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
            f"model {spec.name!r}: outputs= names {unknown[0]!r}, which the model does not "
            f"have (outputs: {known})",
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
