"""Headers and access keys, alone: the environment scheme, redaction, Triton's refusals."""

from __future__ import annotations

import logging
import pickle
import shutil
import time
from pathlib import Path

import grpc
import pytest
from _helpers import write_secret
from tritonclient.utils import InferenceServerException

from ray_triton_shm import AccessDeniedError, TritonServerError, headers_from_env
from ray_triton_shm._wire._keys import (
    KEYS_DIR_ENV_VAR,
    Keys,
    Metadata,
    env_var_for,
    headers_from_dir,
    normalize,
    redact,
)
from ray_triton_shm._wire._triton_errors import (
    expected_header,
    is_restart_symptom,
    is_unreachable,
    translate_error,
)
from ray_triton_shm.local import LocalTritonServer
from ray_triton_shm.local._config import shown as _shown

SECRET = "s3cret-value-never-shown"
ADMIN, INFER, READ = (f"triton-grpc-protocol-{k}-key" for k in ("admin", "infer", "read"))
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


def test_keys_come_from_a_mounted_secret_in_either_naming(tmp_path: Path) -> None:
    write_secret(
        tmp_path,
        {
            "triton-grpc-protocol-admin-key": SECRET,
            "RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_INFER_KEY": "infer",
            "X-Team": "vision",
        },
    )
    (tmp_path / ".hidden").write_text("not a key")
    assert headers_from_dir(tmp_path) == {
        "triton-grpc-protocol-admin-key": SECRET,  # the trailing newline is not part of it
        "triton-grpc-protocol-infer-key": "infer",
        "x-team": "vision",
    }
    plain = tmp_path / "plain"  # docker secrets, or files written by hand
    plain.mkdir()
    (plain / "triton-grpc-protocol-read-key").write_text("read")
    assert headers_from_dir(plain) == {"triton-grpc-protocol-read-key": "read"}
    (plain / "triton-grpc-protocol-read-key").write_bytes(b"\xff" + SECRET.encode())
    with pytest.raises(ValueError, match="not UTF-8") as info:
        headers_from_dir(plain)
    assert SECRET not in str(info.value)


def test_keys_merge_sources_and_follow_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_var_for(ADMIN), "from-env")
    monkeypatch.setenv(env_var_for(READ), "read-from-env")
    write_secret(tmp_path, {ADMIN: "admin-1", INFER: "infer-1"})
    keys = Keys({INFER: "given"}, keys_dir=tmp_path, environ=True, check_interval_s=3600)
    # Given in code, over key files, over the environment.
    assert keys.headers == {ADMIN: "admin-1", INFER: "given", READ: "read-from-env"}
    assert keys.names == [ADMIN, INFER, READ]
    first = keys.metadata()

    write_secret(tmp_path, {ADMIN: "admin-2"})
    assert keys.metadata() is first  # not looked at again before check_interval_s
    assert keys.refresh() and keys.headers[ADMIN] == "admin-2"
    assert not keys.refresh()  # nothing changed since

    # Triton refuses the new keys (it has not restarted yet): the older ones are used, and
    # the new ones again when Triton refuses those.
    new = keys.metadata()
    assert keys.refused(new) and keys.metadata() == first
    assert keys.refused(first) and keys.metadata() == new
    # Another caller already turned: send again with the keys in use, no turn.
    assert keys.refused(first) and keys.metadata() == new
    # Keys that never changed are final: nothing to turn to, nothing to send again.
    fixed = Keys({ADMIN: "given"}, keys_dir=tmp_path)
    assert not fixed.refused(fixed.metadata()) and not Keys().refused(Keys().metadata())

    # The interval elapsed: the next call reads the files.
    quick = Keys(keys_dir=tmp_path, check_interval_s=0.01)
    write_secret(tmp_path, {ADMIN: "admin-3"})
    time.sleep(0.02)  # the interval itself: the time under test, no event marks it
    assert dict(quick.metadata()) == {ADMIN: "admin-3"}

    # RAY_TRITON_SHM_KEYS_DIR names the directory; without it, no key files.
    monkeypatch.setenv(KEYS_DIR_ENV_VAR, str(tmp_path))
    assert Keys().headers == {ADMIN: "admin-3"} and Keys().keys_dir == tmp_path
    monkeypatch.delenv(KEYS_DIR_ENV_VAR)
    assert Keys().headers == {} and Keys().keys_dir is None


def test_keys_never_show_a_value(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ray_triton_shm")
    write_secret(tmp_path, {ADMIN: SECRET})
    keys = Keys({INFER: SECRET + "-given"}, keys_dir=tmp_path)
    write_secret(tmp_path, {ADMIN: SECRET + "-2"})
    assert keys.refresh()
    keys.refused(keys.metadata())
    shown = [repr(keys), str(keys), repr(keys.metadata()), caplog.text]
    assert all(SECRET not in text for text in shown), shown
    assert ADMIN in repr(keys) and "changed" in caplog.text
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(keys)

    # A key directory that cannot be read: named, and no value shown. At run time the last
    # keys stay in use (a mount mid-change, or gone).
    with pytest.raises(ValueError, match="RAY_TRITON_SHM_KEYS_DIR") as info:
        Keys(keys_dir=tmp_path / "missing")
    assert str(tmp_path / "missing") in str(info.value)
    shutil.rmtree(tmp_path)
    assert not keys.refresh() and dict(keys.metadata())[ADMIN] == SECRET  # the older, in use
    assert "keeping the last keys" in caplog.text and SECRET not in caplog.text
