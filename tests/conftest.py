"""Shared fixtures: a real local Triton server with the example and test-only models.

Nothing is skipped: if tritonserver cannot be found, installed or started, the tests that
need it fail with the server's error (including its log tail).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_triton_shm._server import EXAMPLE_MODEL_REPOSITORY, LocalTritonServer

#: Test-only Python-backend models (slow_identity, fail_on_negative, strings,
#: variable_output).
TEST_MODEL_REPOSITORY: Path = Path(__file__).resolve().parent / "models"

#: Both repositories, as served by the ``triton`` and ``fresh_triton`` fixtures.
MODEL_REPOSITORIES: tuple[Path, ...] = (EXAMPLE_MODEL_REPOSITORY, TEST_MODEL_REPOSITORY)


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A Triton server shared by the whole session (do not stop or restart it)."""
    log_path = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    server = LocalTritonServer(list(MODEL_REPOSITORIES), log_path=log_path)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fresh_triton(tmp_path: Path) -> Iterator[LocalTritonServer]:
    """A Triton server of the test's own, free to be stopped, restarted or killed."""
    server = LocalTritonServer(
        list(MODEL_REPOSITORIES), log_path=tmp_path / "tritonserver.log", stop_grace_s=5.0
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def grpc_url(triton: LocalTritonServer) -> str:
    """The session server's gRPC endpoint, ``"127.0.0.1:PORT"``."""
    return triton.grpc_url
