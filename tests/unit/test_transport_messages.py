"""What the transport says when Triton cannot map this process's memory, without a server:
the reason names a region one can tell is gone, the forced-shm error reads as sentences and
says plainly what was proven, and a lease on a model by value names its cause (issue 64)."""

from __future__ import annotations

import os
import pickle
from typing import Any

import grpc
import pytest

from ray_triton_shm import (
    InvalidInputError,
    LeaseByValueError,
    SharedMemoryUnreachableError,
    TritonServerError,
)
from ray_triton_shm._inference._transport import (
    OTHER_DEV_SHM,
    OTHER_UID,
    Unmappable,
    refusal_reason,
    unopenable_cause,
    unreachable_error,
)
from ray_triton_shm._slots._shm import REGION_PREFIX, SHM_DIR
from ray_triton_shm._wire._triton_errors import translate_error

URL = "triton:8001"
KEY = "rtshm_1-a_d19ae5b0_classifier@0"
UNOPENABLE = f"Unable to open shared memory region: '{KEY}'"


class _Refusal(grpc.RpcError):
    """Triton's refusal to register a region, as gRPC raises it."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL

    def details(self) -> str:
        return UNOPENABLE


class _Stub:
    """Triton's shared-memory registration, opening regions of ``opens`` modes only."""

    def __init__(self, *, opens_anyones: bool) -> None:
        self.opens_anyones = opens_anyones
        self.modes: list[int] = []

    def SystemSharedMemoryRegister(self, request: Any, **_: Any) -> None:  # noqa: N802
        self.modes.append(os.stat(SHM_DIR / request.name).st_mode & 0o777)
        if not self.opens_anyones:
            raise _Refusal()

    def SystemSharedMemoryUnregister(self, request: Any, **_: Any) -> None:  # noqa: N802
        pass


def _ours() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{REGION_PREFIX}_{os.getpid()}-*")}


@pytest.mark.parametrize(("opens", "cause"), [(False, OTHER_DEV_SHM), (True, OTHER_UID)])
def test_a_region_anyone_may_open_tells_a_dev_shm_from_a_uid(opens: bool, cause: str) -> None:
    before = _ours()
    stub = _Stub(opens_anyones=opens)
    assert unopenable_cause(stub, (), 1.0) == cause
    assert stub.modes == [0o666]
    assert _ours() == before  # the trial region is gone


def test_the_reason_says_the_region_it_names_is_gone_and_what_was_proven() -> None:
    for cause, plain in (
        (OTHER_DEV_SHM, "it has another /dev/shm than this process"),
        (OTHER_UID, "it runs as another user than this process"),
        (None, "or as a user that cannot open it"),
    ):
        reason = refusal_reason(URL, KEY, _Refusal(), cause)
        assert reason.startswith(f"Triton at {URL} could not open /dev/shm/{KEY} ("), reason
        assert "removed since" in reason and UNOPENABLE in reason and plain in reason, reason
        if cause == OTHER_DEV_SHM:
            assert "another user" not in reason and "as a user" not in reason, reason


def _refused(cause: str | None) -> Unmappable:
    error = translate_error(_Refusal(), model="classifier", action="registering shared memory")
    assert str(error).endswith("hostIPC: true.")  # the fix text that was joined with ".."
    return Unmappable(refusal_reason(URL, KEY, _Refusal(), cause), error, cause)


def test_the_forced_shm_error_reads_as_sentences_and_says_another_dev_shm_plainly() -> None:
    error = unreachable_error("classifier", URL, [_refused(OTHER_DEV_SHM)])
    message = str(error)
    assert ".." not in message and "true." not in message, message
    assert "it has another /dev/shm than this process" in message, message
    assert "another user" not in message and "same uid" not in message, message
    assert "Run Triton where it shares /dev/shm" in message and "transport='auto'" in message
    assert error.model == "classifier" and error.status == "StatusCode.INTERNAL"
    assert UNOPENABLE in error.server_message and "removed since" in error.reason


def test_the_forced_shm_error_of_another_uid_or_of_either_says_which_fix() -> None:
    uid = str(unreachable_error("classifier", URL, [_refused(OTHER_UID)]))
    assert "same uid" in uid and "shares /dev/shm" not in uid and ".." not in uid, uid
    either = str(unreachable_error("classifier", URL, [_refused(None)]))
    assert "shares /dev/shm" in either and "same uid" in either and ".." not in either, either
    probed = Unmappable("a probe request's outputs never reached it (another /dev/shm)", None)
    plain = str(unreachable_error("classifier", URL, ["Triton at x refused.", probed]))
    assert "refused; a probe" in plain and ".." not in plain, plain


def test_a_lease_by_value_error_names_its_cause_is_catchable_as_before_and_pickles() -> None:
    error = LeaseByValueError(
        "model 'm': a lease ...",
        node="n1",
        reason="why",
        model="m",
        expected="transport 'shm'",
        actual="inline",
    )
    for kind in (SharedMemoryUnreachableError, TritonServerError, InvalidInputError, ValueError):
        assert isinstance(error, kind)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is LeaseByValueError and str(copy) == str(error)
    attributes = ("model", "node", "reason", "expected", "actual", "tensor", "status")
    for name in attributes:
        assert getattr(copy, name) == getattr(error, name), name
    assert copy.tensor is None and copy.actual == "inline" and copy.node == "n1"
