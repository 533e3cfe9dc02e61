"""Triton's errors in words: each answer of Triton's the library recognizes, by what its
message says (the one module that reads them: 2.51's wording), what it means, and
:func:`translate_error`, where an error of Triton's becomes one of ours.

Triton answers several things ``UNAVAILABLE`` that are no server down: a restricted protocol
called without its key (:func:`expected_header`), a request its queue refused
(:func:`is_queue_refusal`); only a call that never connected (:func:`never_reached`) or any
other ``UNAVAILABLE`` is Triton being away (:func:`is_unreachable`).
"""

from __future__ import annotations

import re

import grpc
from tritonclient.utils import InferenceServerException

from .._exceptions import (
    AccessDeniedError,
    ModelNotLoadedError,
    SharedMemoryNotAllowedError,
    TritonServerError,
)
from ._keys import GRPC_KEY_PREFIX, KEYS_DIR_ENV_VAR, env_var_for

__all__ = [
    "answered_or_never_sent",
    "expected_header",
    "header_named_as_grpc",
    "is_change_symptom",
    "is_in_use",
    "is_missing_region",
    "is_queue_refusal",
    "is_restart_symptom",
    "is_unknown_model",
    "is_unopenable",
    "is_unreachable",
    "never_reached",
    "output_overflow",
    "status_and_message",
    "translate_error",
]

_REFUSAL_WORDS = ("not allowed", "disabled", "not enabled", "not permitted", "allow-client-shm")
#: Triton's answer to a call of a restricted protocol without its key, or with a wrong one
#: (gRPC: "This protocol is restricted, ..."; HTTP: "This API is restricted, ...").
_RESTRICTED = re.compile(r"(is restricted, expecting header ')([^']*)'")
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


def is_unopenable(exc: BaseException) -> bool:
    """Whether Triton could not open a region it was asked to register (it runs as another
    uid, or sees another ``/dev/shm``: it does not say which)."""
    _, message = status_and_message(exc)
    return _UNOPENABLE in message


def expected_header(exc: BaseException) -> str | None:
    """The header Triton wants if ``exc`` is its refusal of a restricted protocol, else ``None``.

    Triton answers such a call ``UNAVAILABLE``, like a server that is down: this tells them
    apart.
    """
    _, message = status_and_message(exc)
    match = _RESTRICTED.search(message)
    return None if match is None else match.group(2)


def header_named_as_grpc(message: str) -> str:
    """Triton's message, its refusal of a restricted API over HTTP (which names the key's HTTP
    header, ``<key>``) naming the header as gRPC sends it everywhere else
    (``triton-grpc-protocol-<key>``); any other message as it is."""
    return _RESTRICTED.sub(rf"\g<1>{GRPC_KEY_PREFIX}\g<2>'", message)


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


#: Triton's answer when an output does not fit the shared memory the request gave it.
_OVERFLOW = re.compile(r"for output '([^']+)' \((\d+) bytes\) should be at least (\d+) bytes")


def output_overflow(server_message: str) -> re.Match[str] | None:
    """Triton's answer that an output did not fit the room the request gave it: the output's
    name, the bytes given and the bytes needed are its groups 1 to 3."""
    return _OVERFLOW.search(server_message)


#: Triton's refusals of a request laid out for another config of the model (2.51's wording).
_REFUSALS = re.compile(
    "|".join(
        (
            r"unexpected shape for input",
            r"batch-size must be <=",
            r"data-type is '[^']*', but model '[^']*' expects",
            r"unexpected datatype",
            r"unexpected inference (input|output)",
            r"missing required input",
            r"expected \d+ inputs but got",
            r"should be at least \d+ bytes to hold the results",
        )
    )
)


def is_change_symptom(exc: BaseException) -> bool:
    """Whether Triton refused a request in a way a change of the model's config explains."""
    status, message = status_and_message(exc)
    if status not in (str(grpc.StatusCode.INVALID_ARGUMENT), str(grpc.StatusCode.INTERNAL)):
        return False
    return _REFUSALS.search(message) is not None


def is_unreachable(exc: BaseException) -> bool:
    """Whether a gRPC or tritonclient error means Triton could not be reached (and not that
    it refused a restricted protocol, which it also answers ``UNAVAILABLE``)."""
    status, _ = status_and_message(exc)
    return (
        status == str(grpc.StatusCode.UNAVAILABLE)
        and expected_header(exc) is None
        and not is_queue_refusal(exc)
    )


def is_restart_symptom(exc: BaseException) -> bool:
    """Whether an error may come from Triton restarting: it was unreachable, or its model had
    no versions loaded (what a server shutting down answers)."""
    if is_unreachable(exc):
        return True
    status, message = status_and_message(exc)
    return status == str(grpc.StatusCode.NOT_FOUND) and "no available versions" in message


def answered_or_never_sent(exc: grpc.RpcError) -> bool:
    """Whether a failed call was answered by Triton, or never reached it: either way Triton
    does not run it. A call cut off on the way (a lost connection, a cancellation) may still
    run there. An error that knows (the HTTP route's: an HTTP status is an answer) says so in
    its ``answered``."""
    answered = getattr(exc, "answered", None)
    if isinstance(answered, bool):
        return answered
    code = exc.code() if hasattr(exc, "code") else None
    if code is None:
        return False
    if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
        return False
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        return never_reached(exc) or expected_header(exc) is not None or is_queue_refusal(exc)
    return True
