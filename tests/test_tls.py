"""Mutual TLS against a real Triton (``--grpc-use-ssl-mutual``) with a CA made by the tests:
calls work, a client Triton would refuse is told so at once, and certificates rotate under
load as cert-manager rotates them, with no restart of any caller."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _helpers import CertificateAuthority as CA
from _helpers import Load, figures, local_triton, model_repository, wait_for, write_secret

from ray_triton_shm import CheckResult, TlsFiles, TLSHandshakeError, TritonSHMClient, check_node
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm._wire._tls import TLS_DIR_ENV_VAR
from ray_triton_shm.local import LocalTritonServer

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: A refusal is one handshake; this bounds it far from reconnect_timeout_s (60 s).
REFUSED_WITHIN_S = 5.0
#: Answers the callers get at each step of a rotation: before it, between the client's new
#: certificate and Triton's restart, and after the restart.
ANSWERS = 20


@dataclass
class MutualTLS:
    server: LocalTritonServer
    ca: CA
    tls_dir: Path  # the client's files, as a mounted cert-manager Secret
    server_files: Path  # Triton's: server.crt, server.key, clients-ca.crt
    work: Path

    def client_files(self, ca: CA, name: str, trusted: list[CA]) -> dict[str, str]:
        cert, key = ca.issue(name, self.work / name)
        return {
            "ca.crt": "".join(c.cert.read_text() for c in trusted),
            "tls.crt": cert.read_text(),
            "tls.key": key.read_text(),
        }

    def server_trusts(self, issuer: CA, clients: list[CA]) -> None:
        """Triton's files for its next start: a certificate from ``issuer``; clients' CAs."""
        cert, key = issuer.issue("server", self.work / f"server-{time.monotonic_ns()}")
        (self.server_files / "server.crt").write_text(cert.read_text())
        (self.server_files / "server.key").write_text(key.read_text())
        (self.server_files / "clients-ca.crt").write_text(
            "".join(c.cert.read_text() for c in clients)
        )


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MutualTLS]:
    work = tmp_path_factory.mktemp("mtls")
    ca = CA(work / "ca")
    server_files = work / "triton"
    server_files.mkdir()
    setup = MutualTLS(None, ca, work / "client-tls", server_files, work)  # type: ignore[arg-type]
    setup.server_trusts(ca, [ca])
    write_secret(setup.tls_dir, setup.client_files(ca, "client", [ca]))
    with local_triton(
        model_repository(work / "models", "identity"),
        log_path=work / "tritonserver.log",
        stop_grace_s=5.0,
        tls_cert=server_files / "server.crt",
        tls_key=server_files / "server.key",
        tls_client_ca=server_files / "clients-ca.crt",
    ) as setup.server:
        yield setup


def ours() -> set[str]:
    return {r.name for r in list_local_regions() if r.owner.pid == os.getpid()}


def test_mutual_tls_calls_work_from_a_directory_or_tritonclient_paths(
    mtls: MutualTLS, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.arange(20 * 16, dtype=np.float32).reshape(20, 16)
    paths = {
        "ssl": True,
        "root_certificates": str(mtls.tls_dir / "ca.crt"),
        "private_key": str(mtls.tls_dir / "tls.key"),
        "certificate_chain": str(mtls.tls_dir / "tls.crt"),
    }
    monkeypatch.setenv(TLS_DIR_ENV_VAR, str(mtls.tls_dir))
    for options in ({}, {"tls_dir": mtls.tls_dir}, paths):
        with TritonSHMClient(mtls.server.grpc_url, **options) as client:  # type: ignore[arg-type]
            client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
            np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
            out = asyncio.run(client.infer_shm_async("identity", {"INPUT0": x[:3]}))["OUTPUT0"]
            np.testing.assert_array_equal(out, x[:3])
            assert client.get_model_config("identity").config.name == "identity"
            assert "mutual" in repr(client._channel)
    assert not ours()
    # What travels to Ray workers is where the files are, never what they hold.
    files = TlsFiles.from_dir(mtls.tls_dir)
    assert files.mutual and pickle.loads(pickle.dumps(files)) == files
    assert b"PRIVATE KEY" not in pickle.dumps(files)


def _foreign(mtls: MutualTLS) -> dict[str, object]:
    other = CA(mtls.work / "other", "other-ca")
    files = mtls.client_files(other, "intruder", [mtls.ca])
    write_secret(mtls.work / "intruder-tls", files)
    return {"tls_dir": mtls.work / "intruder-tls"}


def _untrusting(mtls: MutualTLS) -> dict[str, object]:
    other = CA(mtls.work / "third", "third-ca")
    files = mtls.client_files(mtls.ca, "client-2", [other])
    write_secret(mtls.work / "untrusting-tls", files)
    return {"tls_dir": mtls.work / "untrusting-tls"}


def _no_certificate(mtls: MutualTLS) -> dict[str, object]:
    return {"ssl": True, "root_certificates": str(mtls.tls_dir / "ca.crt")}


@pytest.mark.parametrize(
    ("client", "reason", "named"),
    [
        (lambda m: {}, "tls_required", "Triton speaks TLS"),
        (_no_certificate, "client_certificate_required", "wants a client certificate"),
        (_foreign, "client_certificate_refused", "refused this client's certificate"),
        (_untrusting, "server_certificate_untrusted", "does not trust Triton's certificate"),
    ],
    ids=["plain", "no certificate", "foreign certificate", "untrusted server"],
)
def test_a_client_triton_refuses_is_told_why_at_once(
    mtls: MutualTLS, client: object, reason: str, named: str
) -> None:
    options = client(mtls)  # type: ignore[operator]
    with TritonSHMClient(mtls.server.grpc_url, reconnect_timeout_s=60, **options) as refused:
        started = time.monotonic()
        with pytest.raises(TLSHandshakeError) as info:
            refused.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
        assert time.monotonic() - started < REFUSED_WITHIN_S
    error = info.value
    assert error.reason == reason and named in str(error), str(error)
    assert isinstance(error, ConnectionError) and error.url == mtls.server.grpc_url
    assert pickle.loads(pickle.dumps(error)).reason == reason
    assert not ours()


def test_certificates_rotated_under_load_keep_calls_working(
    mtls: MutualTLS, capsys: pytest.CaptureFixture[str]
) -> None:
    # A CA rotation as cert-manager and trust-manager do it: Triton trusts the old and the new
    # CA; the client's certificate is renewed from the new CA (the kubelet swaps its files);
    # Triton restarts with a certificate of the new CA, trusting the new CA alone. A client
    # that kept its old certificate would be refused from then on.
    new_ca = CA(mtls.work / "new-ca", "new-ca")
    mtls.server_trusts(mtls.ca, [mtls.ca, new_ca])
    mtls.server.restart()
    write_secret(mtls.tls_dir, mtls.client_files(mtls.ca, "client", [mtls.ca, new_ca]))
    client = TritonSHMClient(mtls.server.grpc_url, tls_dir=mtls.tls_dir, reconnect_timeout_s=60)
    with client:
        client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)  # 4 callers
        load = Load(4, lambda x: client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"])
        load.wait_for_answers(ANSWERS)
        channel = client._channel._channel  # read, not current(): the callers are to reload
        write_secret(mtls.tls_dir, mtls.client_files(new_ca, "client-new", [mtls.ca, new_ca]))
        # A call reads the new files and makes a new channel: the calls after it go on it.
        wait_for(
            lambda: client._channel._channel is not channel,
            what="the client's new channel, with its new certificate",
        )
        load.wait_for_answers(ANSWERS)
        mtls.server_trusts(new_ca, [new_ca])
        down = time.time()
        mtls.server.restart()
        up = time.time()
        load.wait_for_answers(ANSWERS)
        result = figures(load.stop(), down, up)
    assert result["wrong"] == 0 and result["answers"] > 0
    assert not result["errors_while_up"], result["errors"]
    assert result["first_answer_after_s"] < 5.0, result
    assert not ours()
    with capsys.disabled():
        print(
            f"\ncertificate rotation (4 callers on 2 slots): {result['answers']} answers, "
            f"{result['wrong']} wrong, {len(result['errors'])} errors "
            f"({len(result['errors_while_up'])} while Triton was up); Triton down "
            f"{result['down_s']:.1f} s, first answer {result['first_answer_after_s']:.2f} s after "
            "it was back"
        )


def test_doctor_checks_tls_and_names_what_is_missing(
    mtls: MutualTLS, monkeypatch: pytest.MonkeyPatch
) -> None:
    def checks(**options: object) -> dict[str, CheckResult]:
        report = check_node(url=mtls.server.grpc_url, models={"identity": 2}, **options)  # type: ignore[arg-type]
        return {c.name: c for c in report.checks}

    monkeypatch.delenv(TLS_DIR_ENV_VAR, raising=False)
    plain = checks()
    assert plain["tls"].status == "fail" and plain["tls"].details["reason"] == "tls_required"
    assert TLS_DIR_ENV_VAR in plain["tls"].fix
    assert plain["triton"].status == "fail" and "see tls" in plain["triton"].summary

    no_cert = checks(root_certificates=str(mtls.tls_dir / "ca.crt"))
    assert no_cert["tls"].status == "fail"
    assert "client certificate" in no_cert["tls"].summary and "tls.crt" in no_cert["tls"].fix

    monkeypatch.setenv(TLS_DIR_ENV_VAR, str(mtls.tls_dir))  # as the node's clients find it
    good = checks()
    assert good["tls"].status == "ok" and "mutual TLS" in good["tls"].summary
    assert good["tls"].details == {"tls": True, "mutual": True}
    assert {c.status for c in good.values()} == {"ok"}, good

    monkeypatch.setenv(TLS_DIR_ENV_VAR, str(mtls.work / "nowhere"))
    missing = checks()
    assert missing["tls"].status == "fail" and "nowhere" in missing["tls"].summary
