"""Shared fixtures: a real local Triton server with the example and test-only models.

Nothing is skipped: if tritonserver cannot be found, installed or started, the tests that
need it fail with the server's error (including its log tail).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import (
    ADMIN,
    ELSEWHERE_MODELS,
    FRESH_MODELS,
    INFER,
    OWN_DEV_SHM,
    READ,
    end_node_actor,
    init_ray,
    local_triton,
    model_repository,
    need_unshare,
    our_regions,
    registered_on,
    wait_for,
)

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local._server import EXAMPLE_MODEL_REPOSITORY, LocalTritonServer

#: The repository's root.
ROOT = Path(__file__).resolve().parent.parent
#: Test-only Python-backend models (slow_identity, fail_on_negative, strings,
#: variable_output, mixed_io, delay_echo, sequence_sum, queued, echo_parameters, whoami).
TEST_MODEL_REPOSITORY: Path = Path(__file__).resolve().parent / "models"

#: Both repositories, as served by the ``triton`` fixture.
MODEL_REPOSITORIES: tuple[Path, ...] = (EXAMPLE_MODEL_REPOSITORY, TEST_MODEL_REPOSITORY)

#: How long the chaos soak (tests/test_soak.py) runs unless ``--soak-s`` says otherwise.
DEFAULT_SOAK_S = 25.0
#: How long the swinging load of tests/test_scaling.py runs unless ``--swing-s`` says otherwise.
DEFAULT_SWING_S = 12.0


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--soak-s=SECONDS``: how long the chaos soak runs (longer soaks find rarer races)."""
    parser.addoption(
        "--soak-s",
        type=float,
        default=DEFAULT_SOAK_S,
        metavar="SECONDS",
        help=f"duration of the chaos soak in tests/test_soak.py (default {DEFAULT_SOAK_S:g})",
    )
    parser.addoption(
        "--swing-s",
        type=float,
        default=DEFAULT_SWING_S,
        metavar="SECONDS",
        help="duration of the load swinging between 1 and 32 callers in tests/test_scaling.py "
        f"(default {DEFAULT_SWING_S:g})",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in this process and in every process the tests start. A suite started in
    the background of a non-interactive shell inherits SIGINT ignored, and passes that on:
    ``ray start --block`` would never stop on the SIGINT the tests send it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules on the shared Ray (``ray_local``) run one after another, after the rest,
    each in its own order. A soak may run as long as it is told (``--soak-s``,
    ``--swing-s``): its timeout is that much past the default one."""
    on_shared_ray = {item.module for item in items if "ray_local" in item.fixturenames}
    items.sort(key=lambda item: item.module in on_shared_ray)  # stable: nothing else moves
    longest = max(config.getoption("--soak-s"), config.getoption("--swing-s"))
    default = float(config.getini("timeout") or 0)
    for item in items:
        if item.get_closest_marker("soak") is not None and default:
            item.add_marker(pytest.mark.timeout(default + longest))


@pytest.fixture
def soak_s(request: pytest.FixtureRequest) -> float:
    """The chaos soak's duration in seconds (``--soak-s``)."""
    seconds = float(request.config.getoption("--soak-s"))
    if seconds <= 0:
        raise pytest.UsageError(f"--soak-s must be > 0, got {seconds}")
    return seconds


@pytest.fixture
def swing_s(request: pytest.FixtureRequest) -> float:
    """The swinging load's duration in seconds (``--swing-s``)."""
    return max(4.0, float(request.config.getoption("--swing-s")))


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A Triton server shared by the whole session (do not stop or restart it)."""
    log_path = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with local_triton(list(MODEL_REPOSITORIES), log_path=log_path) as server:
        yield server


@pytest.fixture
def fresh_triton(tmp_path: Path) -> Iterator[LocalTritonServer]:
    """A Triton server of the test's own, free to be stopped, restarted or killed. It serves
    the models such tests use only: it (re)starts in seconds, not one per model."""
    with local_triton(
        model_repository(tmp_path / "models", *FRESH_MODELS),
        log_path=tmp_path / "tritonserver.log",
        # Triton's exit timeout is a second less: unloading delay_echo's 4 instances takes it
        # ~5 s, so every graceful stop would wait that long for the stub processes.
        stop_grace_s=2.0,
    ) as server:
        yield server


@pytest.fixture(scope="session")
def triton_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A Triton in a mount namespace of its own, with a ``/dev/shm`` of its own (the
    container mistake): it maps no region of ours, every pool goes to it by value. Shared by
    the session as ``triton`` is (do not stop it; nothing may stay registered there); the
    tests that need it are skipped where ``unshare --mount`` cannot run."""
    need_unshare("--mount")
    work = tmp_path_factory.mktemp("elsewhere")
    with local_triton(
        model_repository(work / "models", *ELSEWHERE_MODELS),
        launcher=OWN_DEV_SHM,
        log_path=work / "tritonserver.log",
    ) as server:
        yield server


@pytest.fixture
def ray_on_fresh_triton(
    fresh_triton: LocalTritonServer, ray_local: str
) -> Iterator[LocalTritonServer]:
    """The shared local Ray beside a Triton of the test's own (free to be restarted), which
    the test names by its URL; the node actor it made there ends with it."""
    try:
        yield fresh_triton
    finally:
        end_node_actor()


class _SharedRay:
    """The local Ray of the modules that need one as it comes (``ray_local``): started by
    the first of them and kept for the next (they run one after another, see
    :func:`pytest_collection_modifyitems`), unless a module in between started a Ray of its
    own or one of them left it busy."""

    gcs_address: str | None = None

    @classmethod
    def connected(cls) -> bool:
        import ray

        return (
            cls.gcs_address is not None
            and ray.is_initialized()
            and ray.get_runtime_context().gcs_address == cls.gcs_address
        )

    @classmethod
    def left_clean(cls) -> bool:
        """Leaves nothing of a module for the next: the node actor shut down, Serve too, and
        every CPU free again (else the next module gets a Ray of its own)."""
        import ray

        end_node_actor()
        with contextlib.suppress(ValueError):
            ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
            from ray import serve

            serve.shutdown()
        try:
            wait_for(
                lambda: ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"],
                timeout_s=10,
                what="every CPU of the shared Ray free",
            )
        except AssertionError:
            return False
        return True


@pytest.fixture(scope="module")
def ray_local(triton: LocalTritonServer) -> Iterator[str]:
    """A private local Ray whose processes see the session server's URL; yields the URL.

    Shared by the modules that use it (a Ray start costs seconds): each gets it with no node
    actor, no Serve and every CPU free."""
    import ray

    from ray_triton_shm.ray import URL_ENV_VAR

    saved = {name: os.environ.get(name) for name in (URL_ENV_VAR, "PYTHONPATH")}
    # Before the start: Ray's processes inherit them (PYTHONPATH for deployments/, which
    # Serve replicas unpickle by reference).
    os.environ[URL_ENV_VAR] = triton.grpc_url
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    if not _SharedRay.connected():
        if ray.is_initialized():
            ray.shutdown()
        init_ray(address="local", num_cpus=4, include_dashboard=False)
        _SharedRay.gcs_address = ray.get_runtime_context().gcs_address
    try:
        yield triton.grpc_url
    finally:
        if not (_SharedRay.connected() and _SharedRay.left_clean()):
            ray.shutdown()
            _SharedRay.gcs_address = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def _shared_ray_ends() -> Iterator[None]:
    """The shared Ray ends with the session."""
    yield
    if _SharedRay.connected():
        import ray

        ray.shutdown()


@pytest.fixture
def grpc_url(triton: LocalTritonServer) -> str:
    """The session server's gRPC endpoint, ``"127.0.0.1:PORT"``."""
    return triton.grpc_url


@pytest.fixture
def make_client() -> Iterator[Callable[..., TritonSHMClient]]:
    """``make_client(url, **options)``: a ``TritonSHMClient`` of the Triton at ``url`` (one
    that outlives the test). After the test each is closed, and nothing of them may be left:
    no region of this process in ``/dev/shm``, none registered in those Tritons that was not
    before (asked with the client's ``headers``: with keys, they hold the shared-memory one)."""
    made: list[tuple[TritonSHMClient, str, dict[str, str], set[str]]] = []

    def make(url: str, **options: Any) -> TritonSHMClient:
        headers = dict(options.get("headers") or {})
        registered = registered_on(url, headers)
        made.append((TritonSHMClient(url, **options), url, headers, registered))
        return made[-1][0]

    yield make
    for shm_client, *_ in made:
        shm_client.close()
    assert our_regions(os.getpid()) == set(), "a region of this process survived close()"
    for _, url, headers, registered in made:
        assert registered_on(url, headers) - registered == set(), "a registration survived close()"


@pytest.fixture
def client(grpc_url: str, make_client: Callable[..., TritonSHMClient]) -> TritonSHMClient:
    """A ``TritonSHMClient`` on the session server, checked as :func:`make_client` checks
    its own."""
    return make_client(grpc_url)


@pytest.fixture
def register_then_sigkill() -> Callable[..., str]:
    """``f(url, *, crash_cleanup)``: runs a process that registers a pool and is SIGKILLed.

    Returns the region's name. With ``crash_cleanup=False`` no watchdog cleans up after it:
    its region stays registered in Triton.
    """
    return _register_then_sigkill


def _register_then_sigkill(url: str, *, crash_cleanup: bool) -> str:
    script = (
        "import os, signal\n"
        "from ray_triton_shm import TritonSHMClient\n"
        "from ray_triton_shm._client import registry_of\n"
        f"c = TritonSHMClient(url={url!r}, crash_cleanup={crash_cleanup})\n"
        "c.register_shm_model('classifier', pool_size=1)\n"
        "print(registry_of(c).get('classifier').region.name, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="session")
def keys() -> dict[str, str]:
    """Fresh access keys by header, unique enough that finding one anywhere is a leak (do not
    change them: ``restricted`` keeps them for the session)."""
    return {name: f"secret-{secrets.token_hex(8)}" for name in (ADMIN, INFER, READ)}


@pytest.fixture(scope="session")
def restricted(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]
) -> Iterator[LocalTritonServer]:
    """A Triton locked down with three keys: the admin key (shared-memory,
    model-repository), the inference key, and a read key (health, metadata, model-config,
    statistics). Shared by the session as ``triton`` is (do not stop or restart it; nothing
    may stay registered there)."""
    work = tmp_path_factory.mktemp("restricted")
    with local_triton(
        model_repository(work / "models", "classifier", "identity", "my_model"),
        log_path=work / "tritonserver.log",
        restricted_protocols={
            "shared-memory,model-repository": ("admin-key", keys[ADMIN]),
            "inference": ("infer-key", keys[INFER]),
            "health,metadata,model-config,statistics": ("read-key", keys[READ]),
        },
    ) as server:
        yield server
