"""Headers and access keys, alone: the environment scheme, redaction, Triton's refusals."""

from __future__ import annotations

import pickle

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from ray_triton_shm import AccessDeniedError, TritonServerError, headers_from_env
from ray_triton_shm._headers import Metadata, env_var_for, normalize, redact
from ray_triton_shm._reconnect import is_restart_symptom, is_unreachable
from ray_triton_shm._transport import expected_header, translate_error
from ray_triton_shm.local import LocalTritonServer
from ray_triton_shm.local._server import _shown

SECRET = "s3cret-value-never-shown"
REFUSAL = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"


def refused(message: str = REFUSAL) -> InferenceServerException:
    return InferenceServerException(msg=message, status="StatusCode.UNAVAILABLE")


def test_headers_come_from_one_variable_each() -> None:
    environ = {
        "RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_INFER_KEY": SECRET,
        "RAY_TRITON_SHM_HEADER_X_TEAM": "vision",
        "RAY_TRITON_SHM_HEADER_": "no name: ignored",
        "RAY_TRITON_SHM_URL": "localhost:8001",
        "PATH": "/bin",
    }
    assert headers_from_env(environ) == {
        "triton-grpc-protocol-infer-key": SECRET,
        "x-team": "vision",
    }
    assert headers_from_env({}) == {}
    for header in headers_from_env(environ):
        assert headers_from_env({env_var_for(header): "v"}) == {header: "v"}
    assert env_var_for("triton-grpc-protocol-admin-key") == (
        "RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_ADMIN_KEY"
    )


def test_headers_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_ADMIN_KEY", SECRET)
    assert headers_from_env()["triton-grpc-protocol-admin-key"] == SECRET


def test_values_are_redacted_and_names_kept() -> None:
    headers = {"triton-grpc-protocol-admin-key": SECRET, "x-team": "vision"}
    assert redact(headers) == {"triton-grpc-protocol-admin-key": "***", "x-team": "***"}
    assert redact(None) == {}
    metadata = Metadata(headers.items())
    assert list(metadata) == list(headers.items())  # what gRPC sends
    for shown in (repr(metadata), str(metadata), f"{metadata}"):
        assert SECRET not in shown and "triton-grpc-protocol-admin-key" in shown


def test_header_names_are_lowercased_and_bad_types_refused_without_the_value() -> None:
    assert normalize({"Triton-GRPC-Protocol-Admin-Key": SECRET}) == {
        "triton-grpc-protocol-admin-key": SECRET
    }
    assert normalize(None) == {}
    with pytest.raises(TypeError, match="'x-key'") as info:
        normalize({"x-key": SECRET.encode()})  # type: ignore[dict-item]
    assert SECRET not in str(info.value)
    with pytest.raises(TypeError, match="mapping"):
        normalize([("x-key", SECRET)])  # type: ignore[arg-type]


def test_a_restricted_protocol_is_access_denied_not_a_restart() -> None:
    answer = refused()
    assert expected_header(answer) == "triton-grpc-protocol-admin-key"
    assert not is_unreachable(answer) and not is_restart_symptom(answer)
    error = translate_error(answer, model="m", action="registering shared memory")
    assert isinstance(error, AccessDeniedError)
    assert isinstance(error, TritonServerError) and isinstance(error, PermissionError)
    assert error.header == "triton-grpc-protocol-admin-key"
    assert (error.status, error.server_message, error.model) == (
        "StatusCode.UNAVAILABLE",
        REFUSAL,
        "m",
    )
    message = str(error)
    assert "'triton-grpc-protocol-admin-key'" in message and "headers=" in message
    assert "RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_ADMIN_KEY" in message
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is AccessDeniedError and copy.__dict__ == error.__dict__
    # Triton's HTTP endpoint words it differently, and a real outage stays a restart.
    assert expected_header(refused("This API is restricted, expecting header 'k'")) == "k"
    assert is_restart_symptom(refused("failed to connect to all addresses"))


def test_a_grpc_refusal_is_recognised_too() -> None:
    class Refusal(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return REFUSAL

    assert isinstance(translate_error(Refusal(), action="inference"), AccessDeniedError)
    assert not is_restart_symptom(Refusal())


def test_a_region_triton_cannot_open_says_why_and_what_to_do() -> None:
    answer = InferenceServerException(
        msg="Unable to open shared memory region: '/rtshm_1-2_ab_m'", status="StatusCode.INTERNAL"
    )
    error = translate_error(answer, model="m", action="registering shared memory")
    assert type(error) is TritonServerError
    message = str(error)
    for words in ("another user", "/dev/shm", "0600", "same uid", "--ipc=host", "hostIPC"):
        assert words in message, words


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"restricted_protocols": {"shared-memory,nope": ("k", SECRET)}}, r"unknown.*'nope'"),
        ({"restricted_protocols": {"inference": ("Bad Key", SECRET)}}, "lowercase"),
        ({"restricted_protocols": {"inference": ("k", "")}}, "non-empty"),
        ({"restricted_protocols": {"inference": ("k", SECRET + "\n")}}, "printable"),
        ({"restricted_protocols": {"inference": SECRET}}, r"\(key, value\) pair"),
        (
            {"restricted_protocols": {"inference": ("a", SECRET), "inference,health": ("b", "x")}},
            "more than once",
        ),
        (
            {"restricted_protocols": {"inference": ("k", SECRET), "health": ("k", "other")}},
            "two values",
        ),
        ({"tls_cert": "server.crt"}, "tls_cert and tls_key"),
    ],
)
def test_local_server_options_are_checked_without_showing_a_value(
    kwargs: dict[str, object], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern) as info:
        LocalTritonServer(**kwargs)  # type: ignore[arg-type]
    assert SECRET not in str(info.value)


def test_local_server_headers_and_repr() -> None:
    server = LocalTritonServer(
        restricted_protocols={
            "shared-memory,model-repository": ("admin-key", SECRET),
            "inference": ("infer-key", "other"),
        }
    )
    try:
        assert server.grpc_headers() == {
            "triton-grpc-protocol-admin-key": SECRET,
            "triton-grpc-protocol-infer-key": "other",
        }
        assert server.grpc_headers("shared-memory") == {"triton-grpc-protocol-admin-key": SECRET}
        assert server.grpc_headers("health") == {}
        with pytest.raises(ValueError, match="unknown"):
            server.grpc_headers("shm")
        assert "admin-key" in repr(server) and SECRET not in repr(server)
    finally:
        server.close()


def test_the_logged_command_line_shows_no_value() -> None:
    shown = _shown(
        [
            "tritonserver",
            f"--grpc-restricted-protocol=shared-memory,model-repository:admin-key={SECRET}",
            f"--http-restricted-api=inference:infer-key={SECRET}=",
            "--grpc-port=8001",
        ]
    )
    assert SECRET not in shown
    assert shown == (
        "tritonserver --grpc-restricted-protocol=shared-memory,model-repository:admin-key=*** "
        "--http-restricted-api=inference:infer-key=*** --grpc-port=8001"
    )
