"""Triton's access controls against a real Triton started restricted, and TLS.

The module's server restricts three groups of protocols, each with its own key:

- ``shared-memory,model-repository``: the admin key (registering regions);
- ``inference``: the inference key;
- ``health,metadata,model-config,statistics``: a read key (readiness, model configuration).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import secrets
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from _helpers import (
    ADMIN,
    INFER,
    READ,
    local_triton,
    model_repository,
    our_regions,
    self_signed_certificate,
)
from tritonclient.utils import InferenceServerException

from ray_triton_shm import (
    AccessDeniedError,
    ModelNotRegisteredError,
    TritonServerError,
    TritonSHMClient,
    TritonSHMError,
)
from ray_triton_shm._client import registry_of
from ray_triton_shm._pools import _registry
from ray_triton_shm._slots._shm import (
    SHM_DIR,
    SharedMemoryRegion,
    region_of,
    unlink_region,
)
from ray_triton_shm._wire._keys import env_var_for
from ray_triton_shm.local import LocalTritonServer

IMAGES = np.random.default_rng(0).standard_normal((5, 3, 224, 224), dtype=np.float32)
MY_MODEL = {
    "INPUT0": np.random.default_rng(1).standard_normal((2, 3, 224, 224), dtype=np.float32),
    "INPUT1": np.arange(20, dtype=np.int32).reshape(2, 10),
}
#: A refusal takes one round trip; this bounds it far from reconnect_timeout_s (60 s).
REFUSED_WITHIN_S = 10.0


def only(keys: dict[str, str], *names: str) -> dict[str, str]:
    return {name: keys[name] for name in names}


def registrations(server: LocalTritonServer) -> set[str]:
    """The regions registered (slot by slot) in ``server``."""
    with grpcclient.InferenceServerClient(server.grpc_url) as plain:
        status = plain.get_system_shared_memory_status(
            headers=server.grpc_headers("shared-memory"), as_json=True
        )
    return {region_of(name) for name in status.get("regions", {})}


def refused_at_once(call: Callable[[], Any], header: str) -> AccessDeniedError:
    started = time.monotonic()
    with pytest.raises(AccessDeniedError) as info:
        call()
    assert time.monotonic() - started < REFUSED_WITHIN_S
    error = info.value
    assert isinstance(error, PermissionError) and isinstance(error, TritonServerError)
    assert error.header == header and repr(header) in str(error)
    return error


def classifier_expected(images: np.ndarray) -> np.ndarray:
    b = images.shape[0]
    return images.reshape(b, -1)[:, :150000].reshape(b, 1000, 150).mean(axis=2)


def test_with_every_key_registration_and_inference_work(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    with TritonSHMClient(restricted.grpc_url, headers=keys) as client:
        client.register_shm_model("classifier", pool_size=2)  # max_batch_size 8, from Triton
        region = registry_of(client).get("classifier").region.name
        assert region in registrations(restricted)
        one = client.infer_shm("classifier", {"INPUT0": IMAGES})
        np.testing.assert_allclose(one["OUTPUT0"], classifier_expected(IMAGES), rtol=1e-5)
        many = np.concatenate([IMAGES] * 4)  # 20 samples: three chunks on two slots
        chunked = client.infer_shm("classifier", {"INPUT0": many})
        np.testing.assert_allclose(chunked["OUTPUT0"], classifier_expected(many), rtol=1e-5)
        coro = client.infer_shm_async("classifier", {"INPUT0": many})
        np.testing.assert_allclose(
            asyncio.run(coro)["OUTPUT0"], classifier_expected(many), rtol=1e-5
        )
        assert client.shm_stats("classifier").in_use == 0
    assert region not in registrations(restricted)
    assert region not in our_regions(os.getpid())


@pytest.mark.parametrize("given", ["missing", "wrong"])
def test_without_the_shared_memory_key_registration_is_refused_at_once_leaving_nothing(
    restricted: LocalTritonServer, keys: dict[str, str], given: str
) -> None:
    headers = only(keys, INFER, READ)
    if given == "wrong":
        headers[ADMIN] = "not-" + keys[ADMIN]
    before = our_regions(os.getpid())
    with TritonSHMClient(restricted.grpc_url, headers=headers) as client:
        error = refused_at_once(lambda: client.register_shm_model("classifier"), ADMIN)
        assert error.model == "classifier"
        assert isinstance(error.__cause__, grpc.RpcError)  # the registration's own call
        assert client.registered_models == {}
    assert our_regions(os.getpid()) == before
    assert not registrations(restricted)
    for secret in keys.values():
        assert secret not in str(error) and secret not in repr(error)


def test_without_the_inference_key_inference_is_refused_and_the_pool_stays_whole(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    with TritonSHMClient(restricted.grpc_url, headers=only(keys, ADMIN, READ)) as client:
        client.register_shm_model("classifier", pool_size=2)
        many = np.concatenate([IMAGES] * 4)
        calls = {
            "one chunk": lambda: client.infer_shm("classifier", {"INPUT0": IMAGES}),
            "chunked": lambda: client.infer_shm("classifier", {"INPUT0": many}),
            "async": lambda: asyncio.run(client.infer_shm_async("classifier", {"INPUT0": many})),
        }
        for case, call in calls.items():
            error = refused_at_once(call, INFER)
            assert error.model == "classifier", case
            stats = client.shm_stats("classifier")
            assert (stats.in_use, stats.waiting) == (0, 0), case
        # The pool is intact for the next call that has the key (a call's headers are merged
        # over the client's).
        out = client.infer_shm("classifier", {"INPUT0": many}, headers=only(keys, INFER))
        np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(many), rtol=1e-5)
        out = asyncio.run(
            client.infer_shm_async("classifier", {"INPUT0": IMAGES}, headers=only(keys, INFER))
        )
        np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(IMAGES), rtol=1e-5)
        region = registry_of(client).get("classifier").region.name
        client.unregister_shm_model("classifier")
    assert region not in registrations(restricted)


def test_no_public_call_lets_a_tritonclient_or_grpc_error_escape(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    seen: list[BaseException] = []

    def attempt(call: Callable[[], Any]) -> None:
        try:
            call()
        except BaseException as exc:
            seen.append(exc)

    images = {"INPUT0": IMAGES}
    my_model_specs: dict[str, Any] = {
        "inputs": [("INPUT0", (3, 224, 224), np.float32), ("INPUT1", (10,), np.int32)],
        "outputs": [("OUTPUT0", (512,), np.float32), ("OUTPUT1", (5,), np.int32)],
        "max_batch_size": 8,
    }
    for headers in ({}, only(keys, READ), only(keys, ADMIN, READ), only(keys, ADMIN)):
        client = TritonSHMClient(restricted.grpc_url, headers=headers, reconnect_timeout_s=60)
        attempt(lambda c=client: c.register_shm_model("classifier", pool_size=2))
        attempt(lambda c=client: c.register_shm_model("my_model", **my_model_specs))
        attempt(lambda c=client: c.infer_shm("classifier", images))
        attempt(lambda c=client: asyncio.run(c.infer_shm_async("classifier", images)))
        attempt(lambda c=client: c.infer_shm("my_model", MY_MODEL))
        attempt(lambda c=client: c.shm_stats("classifier"))
        attempt(lambda c=client: c.registered_models)
        attempt(lambda c=client: c.unregister_shm_model("classifier"))
        attempt(lambda c=client: c.unregister_shm_model("my_model"))
        attempt(client.close)
        attempt(client.close)
    assert seen  # every client was refused something
    escaped = [exc for exc in seen if isinstance(exc, (InferenceServerException, grpc.RpcError))]
    assert not escaped, escaped
    assert all(isinstance(exc, TritonSHMError) for exc in seen), seen
    denied = {exc.header for exc in seen if isinstance(exc, AccessDeniedError)}
    assert denied == {ADMIN, INFER, READ}
    assert any(isinstance(exc, ModelNotRegisteredError) for exc in seen)
    assert not registrations(restricted)


def test_a_refused_readiness_question_is_an_error_at_once(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    # Readiness is asked while Triton seems to restart: after an outage, or after a model
    # answered "no available versions". Without the key of health, both are refusals.
    outage = InferenceServerException(msg="Socket closed", status="StatusCode.UNAVAILABLE")
    vanished = InferenceServerException(
        msg="Request for unknown model: 'classifier' has no available versions",
        status="StatusCode.NOT_FOUND",
    )
    with TritonSHMClient(restricted.grpc_url, headers=only(keys, ADMIN, INFER)) as client:
        for symptom in (outage, vanished):
            reconnect = client._triton.reconnect("classifier")
            refused_at_once(lambda r=reconnect, s=symptom: r.wait(s), READ)
            reconnect = client._triton.reconnect("classifier")
            refused_at_once(lambda r=reconnect, s=symptom: asyncio.run(_wait_async(r, s)), READ)
    with TritonSHMClient(restricted.grpc_url, headers=keys) as client:
        client._triton.reconnect("classifier").wait(outage)  # with the key: Triton is ready


async def _wait_async(reconnect: Any, symptom: BaseException) -> None:
    await reconnect.wait_async(symptom, asyncio.get_running_loop())


def test_keys_from_the_environment_and_the_sweep_of_a_killed_owner(
    restricted: LocalTritonServer,
    keys: dict[str, str],
    make_client: Callable[..., TritonSHMClient],
) -> None:
    # A process with its keys in its environment registers a region and is SIGKILLed without
    # a watchdog: its registration stays in Triton until the next client's sweep, which needs
    # the admin key to see and drop it.
    script = (
        "import os, signal\n"
        "from ray_triton_shm import TritonSHMClient, headers_from_env\n"
        "from ray_triton_shm._client import registry_of\n"
        f"c = TritonSHMClient({restricted.grpc_url!r}, headers=headers_from_env(), "
        "crash_cleanup=False)\n"
        "c.register_shm_model('classifier', pool_size=1)\n"
        "print(registry_of(c).get('classifier').region.name, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, **{env_var_for(name): value for name, value in keys.items()}}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == -9, done.stderr
    dead = done.stdout.strip()
    assert dead in registrations(restricted)
    client = make_client(restricted.grpc_url, headers=keys)
    client.register_shm_model("classifier", pool_size=1)
    assert dead not in registrations(restricted)


def test_plain_tritonclient_methods_send_the_client_headers(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    with TritonSHMClient(restricted.grpc_url, headers=keys) as client:
        assert client.is_server_ready()
        assert client.get_model_config("classifier", as_json=True)["config"]["name"]
        assert client.get_system_shared_memory_status(as_json=True) == {}
        # A call's own headers are merged over the client's (tritonclient's own error here:
        # these are tritonclient's methods, unchanged).
        with pytest.raises(InferenceServerException, match=READ):
            client.get_model_config("classifier", headers={READ: "wrong"})
    with TritonSHMClient(restricted.grpc_url) as client:
        assert client.get_model_config("classifier", headers=only(keys, READ))


def test_no_secret_in_reprs_errors_logs_or_verbose_output(
    restricted: LocalTritonServer, keys: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = {name: "not-" + value for name, value in keys.items()}
    shown: list[str] = []
    with TritonSHMClient(restricted.grpc_url, verbose=True, headers=keys) as client:
        shown.append(repr(client))
        assert client.is_server_ready()
        client.register_shm_model("classifier", pool_size=1)
        client.infer_shm("classifier", {"INPUT0": IMAGES}, headers=wrong | only(keys, INFER))
        with pytest.raises(AccessDeniedError) as info:
            client.infer_shm("classifier", {"INPUT0": IMAGES}, headers=wrong)
        error = info.value
        shown += [str(error), repr(error), repr(error.__dict__)]
        shown.append("".join(traceback.format_exception(error)))
        shown.append(pickle.dumps(error).decode("latin-1"))
        shown.append(repr(client))
    captured = capsys.readouterr()
    shown += [captured.out, captured.err, repr(restricted), restricted.log_path.read_text()]
    assert "triton-grpc-protocol-admin-key" in shown[0] and "metadata" in captured.out
    for secret in (*keys.values(), *wrong.values()):
        for text in shown:
            assert secret not in text


def test_regions_are_created_owner_only(
    restricted: LocalTritonServer,
    keys: dict[str, str],
    make_client: Callable[..., TritonSHMClient],
) -> None:
    client = make_client(restricted.grpc_url, headers=keys)
    client.register_shm_model("classifier", pool_size=1)
    region = registry_of(client).get("classifier").region.name
    mode = os.stat(SHM_DIR / region).st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_a_region_triton_cannot_open_is_an_error_that_says_why(
    restricted: LocalTritonServer, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class ElsewhereRegion(SharedMemoryRegion):
        """A region Triton cannot find: as if it saw another /dev/shm."""

        @classmethod
        def create(
            cls, name: str, size: int, *, slots: int = 0, backed: int | None = None
        ) -> SharedMemoryRegion:
            region = SharedMemoryRegion.create(name, size, slots=slots, backed=backed)
            unlink_region(name)
            return region

    monkeypatch.setattr(_registry, "SharedMemoryRegion", ElsewhereRegion)
    before = our_regions(os.getpid())
    with TritonSHMClient(restricted.grpc_url, headers=keys) as client:
        with pytest.raises(TritonServerError) as info:  # SharedMemoryUnreachableError
            client.register_shm_model("classifier", pool_size=1, transport="shm")
        message = str(info.value)
        assert "Unable to open shared memory region" in info.value.server_message
        # Triton opens a region anyone may open (this one's file alone was unlinked): a uid.
        for words in ("another user", "0600", "same uid"):
            assert words in message, words
        assert client.registered_models == {}
    assert our_regions(os.getpid()) == before
    assert not registrations(restricted)


def test_tls_round_trip_with_every_call_keyed_across_a_restart(tmp_path: Path) -> None:
    # TLS, and every protocol restricted under one key: registration, model configuration,
    # readiness while Triton restarts, registering again, inference and unregistration all
    # carry the client's headers, over TLS.
    cert, key = self_signed_certificate(tmp_path)
    secret = f"secret-{secrets.token_hex(8)}"
    everything = ",".join(
        ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository")
    )
    with local_triton(
        model_repository(tmp_path / "models", "classifier"),
        log_path=tmp_path / "tritonserver.log",
        stop_grace_s=5.0,
        restricted_protocols={everything: ("key", secret)},
        tls_cert=cert,
        tls_key=key,
    ) as server:
        headers = server.grpc_headers()
        assert headers == {"triton-grpc-protocol-key": secret}
        plain = TritonSHMClient(server.grpc_url, reconnect_timeout_s=0)
        with plain, pytest.raises(TritonServerError):  # TLS only: a plain channel gets nowhere
            plain.register_shm_model("classifier")
        with TritonSHMClient(
            server.grpc_url, ssl=True, root_certificates=str(cert), headers=headers
        ) as client:
            client.register_shm_model("classifier", pool_size=2)
            many = np.concatenate([IMAGES] * 4)
            out = client.infer_shm("classifier", {"INPUT0": many})
            np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(many), rtol=1e-5)
            server.restart()  # Triton forgets the registration; the client waits, registers again
            out = client.infer_shm("classifier", {"INPUT0": IMAGES})
            np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(IMAGES), rtol=1e-5)
            out = asyncio.run(client.infer_shm_async("classifier", {"INPUT0": many}))
            np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(many), rtol=1e-5)
            region = registry_of(client).get("classifier").region.name
            status = client.get_system_shared_memory_status(as_json=True)
            assert region in {region_of(name) for name in status["regions"]}
        with grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(cert)
        ) as check:
            status = check.get_system_shared_memory_status(headers=headers, as_json=True)
        assert region not in status.get("regions", {})
        assert secret not in server.log_path.read_text()
