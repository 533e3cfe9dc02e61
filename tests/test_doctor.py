"""``ray-triton-shm doctor`` against real Tritons set up each way a deployment goes wrong.

Each misconfiguration gets a Triton of its own: in its own mount namespace with its own
``/dev/shm`` (``unshare --mount``), running as another uid (``setpriv``), locked down with keys;
and the doctor itself runs in a 64 MB ``/dev/shm``, and against a port where nothing listens.
``--ray`` runs on a two-node ``cluster_utils`` cluster. Every run is checked to leave nothing in
``/dev/shm`` or in Triton.

A Triton with its own ``/dev/shm`` is where models go by value (``transport="auto"``): the
``region`` check warns, saying so and why, and fails only with ``--transport shm``. The log
line of each switch is checked here too, against a Triton that restarts in and out of such a
``/dev/shm``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from _helpers import (
    ADMIN,
    INFER,
    OWN_DEV_SHM,
    READ,
    free_port_pair,
    free_ports,
    local_triton,
    model_repository,
    need_unshare,
    our_regions,
    registered_on,
    start_cluster,
    wait_for,
)

from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm._wire._keys import env_var_for
from ray_triton_shm.local._server import LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")
#: A Triton started under this runs as nobody. It keeps the right to read any file (root's
#: Python installation is private here), but not to write one: it cannot open a 0600 region.
OTHER_UID = (
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=+dac_read_search",
    "--ambient-caps=+dac_read_search",
)
#: The identity model's tensors at their largest, for a pool of its own.
SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
CHECKS = ["tls", "triton", "region", "http", "keys", "models", "dev_shm", "leftovers", "versions"]


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any key or URL of ours, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_TRITON_SHM_HEADER_") and k != "RAY_TRITON_SHM_URL"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def _doctor(
    *args: str, env: Mapping[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any], str]:
    """Runs ``doctor --json``; returns its exit status, its report and its whole output."""
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "ray_triton_shm", "doctor", "--json", *args],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else _env(),
        timeout=120,
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout), done.stdout + done.stderr


def _checks(report: dict[str, Any], node: int = 0) -> dict[str, dict[str, Any]]:
    checks = report["nodes"][node]["checks"]
    assert [c["name"] for c in checks] == CHECKS
    return {c["name"]: c for c in checks}


def _statuses(checks: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {name: check["status"] for name, check in checks.items()}


@pytest.fixture
def leaves_nothing(triton: LocalTritonServer) -> Iterator[None]:
    """Fails the test if anything of ours appeared in /dev/shm or in the shared Triton."""
    shm, registered = our_regions(), registered_on(triton.grpc_url)
    yield
    assert our_regions() == shm
    assert registered_on(triton.grpc_url) == registered


@pytest.fixture
def other_uid_triton(tmp_path: Path) -> Iterator[LocalTritonServer]:
    """A Triton started as another uid (:data:`OTHER_UID`)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running Triton as another uid needs root and setpriv")
    # One model, not every one: the checks need none, and it starts in a third of the time.
    # Outside tmp_path, which another uid cannot enter.
    repository = Path(tempfile.mkdtemp(prefix="rtshm-test-odd-"))
    repository.chmod(0o755)
    try:
        with local_triton(
            model_repository(repository, "identity"),
            launcher=OTHER_UID,
            log_path=tmp_path / "tritonserver.log",
        ) as server:
            yield server
    finally:
        shutil.rmtree(repository)


def test_a_healthy_node_passes_every_check_and_leaves_nothing(
    triton: LocalTritonServer, leaves_nothing: None
) -> None:
    code, report, _ = _doctor("--url", triton.grpc_url, "--model", "classifier:8")
    checks = _checks(report)
    assert code == 0 and not report["failed"], report
    assert set(_statuses(checks).values()) == {"ok"}, report
    assert checks["triton"]["details"]["version"] == "2.51.0"
    assert "system_shared_memory" in checks["triton"]["details"]["extensions"]
    # The classifier's pool: 8 slots of 8 images of 3x224x224 float32 in, 1000 floats out.
    pool = checks["dev_shm"]["details"]["new"]["classifier"]
    assert 8 * 8 * (3 * 224 * 224 + 1000) * 4 <= pool < 1.1 * 8 * 8 * (3 * 224 * 224 + 1000) * 4
    versions = checks["versions"]["details"]
    assert versions["triton"] == "2.51.0" and versions["numpy"].startswith("2.")
    assert report["nodes"][0]["url_source"] == "--url"
    assert checks["models"]["summary"] == "Triton serves classifier"


def test_a_model_triton_does_not_serve_fails_naming_those_it_serves(
    triton: LocalTritonServer,
) -> None:
    code, report, output = _doctor("--url", triton.grpc_url, "--model", "classifer:4")
    models = _checks(report)["models"]
    assert code == 1 and report["failed"]
    assert models["status"] == "fail"
    assert models["details"]["missing"] == ["classifer"]
    served = models["details"]["served"]
    assert {"classifier", "identity"} <= set(served)
    assert f"it serves {', '.join(served)}" in models["summary"]
    assert "'classifer': did you mean 'classifier'?" in models["summary"]
    # The text report: a failing line, with its fix.
    done = subprocess.run(
        [sys.executable, "-m", "ray_triton_shm", "doctor", "--url", triton.grpc_url]
        + ["--model", "nosuch"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if line.split()[1:2] == ["models"])
    assert line.split()[0] == "fail" and "does not serve 'nosuch'" in line, done.stdout


def test_the_url_comes_from_the_environment_as_the_node_actor_reads_it(
    triton: LocalTritonServer,
) -> None:
    code, report, _ = _doctor(env=_env(RAY_TRITON_SHM_URL=triton.grpc_url))
    assert code == 0, report
    assert report["nodes"][0]["url"] == triton.grpc_url
    assert report["nodes"][0]["url_source"] == "$RAY_TRITON_SHM_URL"


def test_an_unreachable_triton_fails_in_seconds_and_says_where_it_looked() -> None:
    url = f"127.0.0.1:{free_ports(1)[0]}"
    started = time.monotonic()
    code, report, text = _doctor("--url", url)
    took = time.monotonic() - started
    checks = _checks(report)
    assert code == 1 and report["failed"]
    assert checks["triton"]["status"] == "fail"
    assert f"nothing listens at {url}" in checks["triton"]["summary"]
    assert "RAY_TRITON_SHM_URL" in checks["triton"]["fix"]
    assert checks["region"]["status"] == checks["keys"]["status"] == "skip"
    # Not the 60 s a request waits for Triton by default (reconnect_timeout_s).
    assert took < 30, took


def test_the_text_report_gives_each_check_its_status_and_each_failure_its_fix() -> None:
    url = f"127.0.0.1:{free_ports(1)[0]}"
    done = subprocess.run(
        [sys.executable, "-m", "ray_triton_shm", "doctor", "--url", url],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert f"Triton at {url} (from --url), checked in " in lines[0]
    assert lines[1].split()[:2] == ["skip", "tls"]
    assert lines[2].split()[:2] == ["fail", "triton"]
    assert lines[3].split()[0] == "fix:"
    assert [line.split()[:2] for line in lines[4:7]] == [
        ["skip", "region"],
        ["skip", "http"],
        ["skip", "keys"],
    ]
    assert lines[-1] == "1 node(s): 1 with a failed check"


def test_a_host_that_does_not_resolve_is_told_apart() -> None:
    code, report, _ = _doctor("--url", "no-such-host.invalid:8001")
    triton = _checks(report)["triton"]
    assert code == 1 and triton["status"] == "fail"
    assert "does not resolve" in triton["summary"]


def test_a_triton_with_its_own_dev_shm_is_named(triton_elsewhere: LocalTritonServer) -> None:
    before = our_regions()
    # transport auto (the default): the models go by value, a warning that says why.
    code, report, _ = _doctor("--url", triton_elsewhere.grpc_url)
    checks = _checks(report)
    assert code == 0 and not report["failed"], report
    expected = {**dict.fromkeys(CHECKS, "ok"), "region": "warn", "http": "skip"}
    assert _statuses(checks) == expected, report
    region = checks["region"]
    assert region["details"] == {"cause": "dev_shm", "transport": "inline", "asked": "auto"}
    assert region["summary"].startswith("transport auto: inline, because Triton cannot see")
    assert "another /dev/shm" in region["summary"] and "by value" in region["summary"]
    assert region["fix"].startswith("for shared memory: share /dev/shm")
    assert "--ipc=container:" in region["fix"] and "medium: Memory" in region["fix"]
    assert "by value" in checks["http"]["summary"]
    assert "statistics" in checks["http"]["summary"]

    # transport shm: registering would fail, and the doctor fails.
    code, report, _ = _doctor("--url", triton_elsewhere.grpc_url, "--transport", "shm")
    checks = _checks(report)
    assert code == 1 and report["failed"]
    expected = {**dict.fromkeys(CHECKS, "ok"), "region": "fail", "http": "skip"}
    assert _statuses(checks) == expected, report
    region = checks["region"]
    assert region["details"] == {"cause": "dev_shm", "transport": None, "asked": "shm"}
    assert "SharedMemoryUnreachableError" in region["summary"]
    assert "--ipc=container:" in region["fix"] and "transport='auto'" in region["fix"]
    assert our_regions() == before
    assert not registered_on(triton_elsewhere.grpc_url)


def test_a_triton_running_as_another_uid_is_named(other_uid_triton: LocalTritonServer) -> None:
    status = Path(f"/proc/{other_uid_triton.pid}/status").read_text()
    assert "Uid:\t65534" in status  # the set-up really runs Triton as another user
    before = our_regions()
    code, report, _ = _doctor("--url", other_uid_triton.grpc_url, "--transport", "shm")
    checks = _checks(report)
    assert code == 1
    expected = {**dict.fromkeys(CHECKS, "ok"), "region": "fail", "http": "skip"}
    assert _statuses(checks) == expected, report
    region = checks["region"]
    assert region["details"]["cause"] == "uid"
    assert "another user" in region["summary"] and "0600" in region["summary"]
    assert "runAsUser" in region["fix"] and "--user" in region["fix"]
    # transport auto: by value, a warning naming the same cause.
    code, report, _ = _doctor("--url", other_uid_triton.grpc_url)
    region = _checks(report)["region"]
    assert code == 0 and region["status"] == "warn", report
    assert region["details"] == {
        "cause": "uid",
        "uid": os.getuid(),
        "transport": "inline",
        "asked": "auto",
    }
    assert region["summary"].startswith("transport auto: inline, because Triton runs as another")
    assert our_regions() == before
    assert not registered_on(other_uid_triton.grpc_url)


def _switches(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    """The INFO lines of the library about ``model`` so far."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("ray_triton_shm")
        and r.levelno == logging.INFO
        and f"model {model!r}" in r.getMessage()
    ]


def test_going_by_value_and_each_switch_is_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Registered where Triton has its own /dev/shm: one line. Triton restarted there after
    it mapped the region: one line; back where it maps it: one line."""
    import numpy as np

    from ray_triton_shm import TritonSHMClient

    need_unshare("--mount")
    caplog.set_level(logging.INFO, logger="ray_triton_shm")
    repository = model_repository(tmp_path / "models", "identity")
    grpc_port, http_port = free_port_pair()
    metrics_port = next(p for p in free_ports(3) if p not in (grpc_port, http_port))
    ports = {"grpc_port": grpc_port, "http_port": http_port, "metrics_port": metrics_port}
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    before = our_regions()

    def start(launcher: tuple[str, ...] = ()) -> LocalTritonServer:
        server = LocalTritonServer(
            repository, launcher=launcher, log_path=tmp_path / "tritonserver.log", **ports
        )
        server.start()
        return server

    server = start()
    try:
        with TritonSHMClient(server.grpc_url, config_check_interval_s=0.5) as client:
            client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
            assert client.shm_stats("identity").transport == "shm"
            assert _switches(caplog, "identity") == []
            # Triton restarts with a /dev/shm of its own: the next call goes on by value.
            server.kill()
            server.close()
            server = start(OWN_DEV_SHM)
            np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
            stats = client.shm_stats("identity")
            assert stats.transport == "inline", stats.transport_reason
            switches = _switches(caplog, "identity")
            assert switches and "could not open /dev/shm/" in switches[-1], switches
            assert stats.transport_reason in switches[-1]
            # Registered there: one line, with the reason.
            caplog.clear()
            with TritonSHMClient(server.grpc_url) as other:
                other.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
                (by_value,) = _switches(caplog, "identity")
                assert other.shm_stats("identity").transport_reason in by_value
            # Back where Triton maps the region: a call finds out within the interval.
            caplog.clear()
            server.kill()
            server.close()
            server = start()

            def back_on_shm() -> bool:
                client.infer_shm("identity", {"INPUT0": x})
                return client.shm_stats("identity").transport == "shm"

            wait_for(
                back_on_shm,
                every_s=0.1,
                what=lambda: f"a call back on shm; switches: {_switches(caplog, 'identity')}",
            )
            (back,) = _switches(caplog, "identity")
            assert "transport shm" in back, back
    finally:
        server.kill()
        server.close()
    assert our_regions() == before
    # Checked last, so that the checks above run whatever this says.
    assert len(switches) == 1, (
        "the switch to by value after Triton moved logs more than one INFO line (_registry's "
        "_replace logs it, and so does the _create it calls):\n" + "\n".join(switches)
    )


def test_a_restricted_triton_without_keys_names_each_missing_header_never_a_value(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    code, report, text = _doctor("--url", restricted.grpc_url)
    checks = _checks(report)
    assert code == 1
    assert checks["keys"]["status"] == "fail"
    assert checks["keys"]["details"]["refused"] == {
        "health": READ,
        "metadata": READ,
        "model-config": READ,
        "shared-memory": ADMIN,
        "inference": INFER,
    }
    for header in (ADMIN, INFER, READ):
        assert header in checks["keys"]["summary"]
        assert env_var_for(header) in checks["keys"]["fix"]
    # Triton answered (it is not down), but would not say whether it is live.
    assert checks["triton"]["status"] == "fail" and "restricted" in checks["triton"]["summary"]
    assert checks["region"]["status"] == "skip"

    # Every key but a wrong inference key: only that one is named, as set but wrong.
    env = {env_var_for(h): v for h, v in keys.items()}
    code, report, text = _doctor(
        "--url", restricted.grpc_url, env=_env(**{**env, env_var_for(INFER): "not-the-key"})
    )
    checks = _checks(report)
    assert code == 1 and checks["keys"]["details"]["refused"] == {"inference": INFER}
    assert "set, but not to Triton's key" in checks["keys"]["summary"]
    assert "but not to the key Triton expects" in checks["keys"]["fix"]
    assert checks["region"]["status"] == "ok"

    code, report, text = _doctor("--url", restricted.grpc_url, env=_env(**env))
    assert code == 0, report
    assert set(_statuses(_checks(report)).values()) == {"ok"}
    for value in keys.values():
        assert value not in text
    assert not registrations_left(restricted, keys)


def test_key_files_that_cannot_be_read_fail_keys_and_the_environment_s_keys_do_the_rest(
    restricted: LocalTritonServer, keys: dict[str, str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-secret"
    env = {env_var_for(h): v for h, v in keys.items()}
    code, report, text = _doctor(
        "--url", restricted.grpc_url, env=_env(**env, RAY_TRITON_SHM_KEYS_DIR=str(missing))
    )
    checks = _checks(report)
    assert code == 1 and checks["keys"]["status"] == "fail", report
    assert str(missing) in checks["keys"]["summary"]
    assert "RAY_TRITON_SHM_KEYS_DIR" in checks["keys"]["fix"]
    # The other checks ask Triton with the environment's keys, which it takes.
    assert checks["triton"]["status"] == "ok" and checks["region"]["status"] == "ok", report
    for value in keys.values():
        assert value not in text
    assert not registrations_left(restricted, keys)


def registrations_left(server: LocalTritonServer, keys: Mapping[str, str]) -> list[str]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        status = client.get_system_shared_memory_status(headers=dict(keys), as_json=True)
    return list(status.get("regions", {}))


def test_a_64_mb_dev_shm_is_flagged_and_a_pool_that_does_not_fit_fails(
    triton: LocalTritonServer, leaves_nothing: None
) -> None:
    need_unshare("--mount")
    small = ("unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && "$@"')
    prefix = (*small, "doctor")

    code, report, _ = _doctor("--url", triton.grpc_url, prefix=prefix)
    dev_shm = _checks(report)["dev_shm"]
    assert dev_shm["status"] == "warn" and "Docker's default" in dev_shm["summary"]
    assert dev_shm["details"]["total"] == 64 * 2**20

    # Pools in shared memory (this doctor's /dev/shm is not Triton's: with transport auto they
    # would go by value, as below).
    shm = ("--transport", "shm")
    code, report, _ = _doctor(
        "--url", triton.grpc_url, "--model", "large_image:4", *shm, prefix=prefix
    )
    checks = _checks(report)
    dev_shm = checks["dev_shm"]
    assert code == 1 and dev_shm["status"] == "fail", report
    assert dev_shm["details"]["new"]["large_image"] > 64 * 2**20
    assert "does not fit" in dev_shm["summary"]
    assert "--shm-size=" in dev_shm["fix"] and "sizeLimit" in dev_shm["fix"]
    # This doctor sees a /dev/shm of its own, and says so: each cause has its own message.
    assert checks["region"]["details"]["cause"] == "dev_shm"
    # By value a pool holds a region of its header alone: the same pool fits.
    code, report, _ = _doctor("--url", triton.grpc_url, "--model", "large_image:4", prefix=prefix)
    checks = _checks(report)
    assert code == 0 and checks["region"]["status"] == "warn", report
    assert checks["dev_shm"]["status"] == "ok", report
    assert checks["dev_shm"]["details"]["new"]["large_image"] <= 2**20

    # A pool that follows its load is counted at its largest (64 slots): 2 slots of the
    # classifier fit, 64 do not: it will stop growing short of them, which is a warning...
    code, report, _ = _doctor(
        "--url", triton.grpc_url, "--model", "classifier", *shm, prefix=prefix
    )
    dev_shm = _checks(report)["dev_shm"]
    assert dev_shm["status"] == "warn" and "stop growing" in dev_shm["summary"], report
    least, most = (
        dev_shm["details"]["new_least"]["classifier"],
        dev_shm["details"]["new"]["classifier"],
    )
    slot = (most - least) // 62  # the header, then 2 slots; or 64
    assert least < 64 * 2**20 < most and least == REGION_HEADER_BYTES + 2 * slot
    # ...but where not even its smallest size fits, it fails.
    code, report, _ = _doctor(
        "--url", triton.grpc_url, "--model", "large_image", *shm, prefix=prefix
    )
    assert code == 1 and _checks(report)["dev_shm"]["status"] == "fail", report


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_doctor_ray_checks_every_node_of_a_cluster(
    triton: LocalTritonServer, leaves_nothing: None
) -> None:
    import ray

    from ray_triton_shm.ray import URL_ENV_VAR, get_node_actor

    if ray.is_initialized():
        ray.shutdown()
    old = os.environ.get(URL_ENV_VAR)
    cluster = None
    try:
        # The nodes read Triton's address from their own environment, as in production.
        os.environ[URL_ENV_VAR] = triton.grpc_url
        # A head without CPUs, as KubeRay's production heads: no replica runs there. Two
        # raylets on one host: each dashboard agent on a port of its own.
        ports = free_ports(2)
        cluster, (head, worker) = start_cluster(
            lambda c: (
                c.add_node(
                    num_cpus=0, include_dashboard=False, dashboard_agent_listen_port=ports[0]
                ),
                c.add_node(num_cpus=1, dashboard_agent_listen_port=ports[1]),
            )
        )
        cluster.wait_for_nodes()
        # A node actor on the worker, holding a pool: the doctor counts it there.
        ray.init(address=cluster.address)
        actor = get_node_actor(node_id=worker.node_id)
        ray.get(actor.register.remote("classifier", pool_size=2))
        ray.shutdown()

        code, report, _ = _doctor("--ray", "--address", cluster.address)
        assert code == 0, report
        nodes = {n["node"]: n for n in report["nodes"]}
        assert set(nodes) == {head.node_id, worker.node_id}
        (skipped,) = nodes[head.node_id]["checks"]
        assert skipped["status"] == "skip" and "num-cpus: 0" in skipped["summary"], skipped
        assert {c["status"] for c in nodes[worker.node_id]["checks"]} == {"ok"}, report

        code, report, _ = _doctor("--ray", "--address", cluster.address, "--all-nodes")
        assert code == 0, report
        nodes = {n["node"]: n for n in report["nodes"]}
        assert set(nodes) == {head.node_id, worker.node_id}
        raylets = {n.node_id: n.all_processes["raylet"][0].process.pid for n in (head, worker)}
        for node_id, node in nodes.items():
            checks = {c["name"]: c for c in node["checks"]}
            assert {c["status"] for c in checks.values()} == {"ok"}, node
            assert node["url"] == triton.grpc_url
            held = checks["dev_shm"]["details"]["held"]
            assert list(held) == (["classifier"] if node_id == worker.node_id else [])
            # Two raylets share this host: each node's own raylet was looked at.
            assert checks["dev_shm"]["details"]["raylet"] == raylets[node_id]
        assert nodes[worker.node_id]["url_source"] == "the node actor"
        assert nodes[head.node_id]["url_source"] == f"${URL_ENV_VAR}"

        ray.init(address=cluster.address)
        ray.get(get_node_actor(node_id=worker.node_id).shutdown.remote())
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if old is None:
            os.environ.pop(URL_ENV_VAR, None)
        else:
            os.environ[URL_ENV_VAR] = old
