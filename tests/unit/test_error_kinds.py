"""Failed calls are counted under the kind of their error (the ``kind`` of the errors metric)."""

from __future__ import annotations

import pytest

from ray_triton_shm import (
    AccessDeniedError,
    InvalidInputError,
    ModelChangedError,
    ModelNotLoadedError,
    OverloadedError,
    ServerUnreachableError,
    SlotTimeoutError,
    TLSHandshakeError,
    TritonServerError,
    TritonSHMError,
)
from ray_triton_shm._exceptions import ERROR_KINDS, error_kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OverloadedError("full"), "overloaded"),
        (SlotTimeoutError("late"), "deadline"),
        (TritonServerError("late", status="StatusCode.DEADLINE_EXCEEDED"), "deadline"),
        (AccessDeniedError("no"), "access_denied"),
        (TLSHandshakeError("no"), "tls"),
        (ServerUnreachableError("gone"), "unavailable"),
        (ModelChangedError("changed"), "model_changed"),
        (InvalidInputError("bad"), "bad_input"),
        (ModelNotLoadedError("unloaded"), "other"),
        (TritonServerError("failed", status="StatusCode.INTERNAL"), "other"),
        (TritonSHMError("anything"), "other"),
    ],
)
def test_each_error_has_its_kind(error: TritonSHMError, kind: str) -> None:
    assert error_kind(error) == kind
    assert kind in ERROR_KINDS
