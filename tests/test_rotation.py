"""Keys that rotate without restarting anyone, as production rotates them, under load.

Triton's keys live in a Kubernetes Secret, mounted as files into every pod
(``RAY_TRITON_SHM_KEYS_DIR``). A rotation changes the Secret: the kubelet swaps the files of
every mounted copy (``..data``), and Triton takes the new keys when it restarts. The two
happen at different times; callers must ride both, with no restart of their own.

The module's Triton also wants mutual TLS, with the client's files found as the keys are
(``RAY_TRITON_SHM_TLS_DIR``): every Ray process of a node takes both from its environment.
"""

from __future__ import annotations

import inspect
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from _helpers import (
    ADMIN,
    INFER,
    READ,
    CertificateAuthority,
    Load,
    Outcome,
    figures,
    init_ray,
    local_triton,
    model_repository,
    wait_for,
    write_secret,
)

from ray_triton_shm import AccessDeniedError, TritonSHMClient
from ray_triton_shm._slots._shm import list_local_regions, region_of
from ray_triton_shm._wire._keys import Keys
from ray_triton_shm.local import LocalTritonServer

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: Triton's protocol groups and the key each wants, as in production.
GROUPS = {
    "shared-memory,model-repository": ADMIN,
    "inference": INFER,
    "health,metadata,model-config,statistics": READ,
}
#: Answers every caller gets at each step of a rotation: before it, between the files' change
#: and Triton's restart, and after the restart.
ANSWERS = 20
#: How soon a process's calls read changed key files (every process checks them this often).
KEYS_CHECK_S: float = inspect.signature(Keys).parameters["check_interval_s"].default


def new_keys() -> dict[str, str]:
    """Fresh keys by header, unique enough that finding one anywhere is a leak."""
    return {header: f"secret-{secrets.token_hex(8)}" for header in GROUPS.values()}


def protocols(keys: dict[str, str]) -> dict[str, tuple[str, str]]:
    """``keys`` as :class:`LocalTritonServer`'s ``restricted_protocols``."""
    prefix = "triton-grpc-protocol-"
    return {group: (h.removeprefix(prefix), keys[h]) for group, h in GROUPS.items()}


@dataclass
class Rotation:
    server: LocalTritonServer
    secret: Path
    keys: dict[str, str]
    tls_dir: Path
    seen: list[str] = field(default_factory=list)  # every key value used, to look for leaks

    def rotate_files(self) -> dict[str, str]:
        self.keys = new_keys()
        self.seen += self.keys.values()
        write_secret(self.secret, self.keys)
        return self.keys

    def restart_triton(self, keys: dict[str, str]) -> tuple[float, float]:
        """Restarts Triton with ``keys``; returns when it went down and when it was back."""
        down = time.time()
        self.server.restart(restricted_protocols=protocols(keys))
        return down, time.time()

    def registered(self) -> set[str]:
        import tritonclient.grpc as grpcclient

        tls = {
            "ssl": True,
            "root_certificates": str(self.tls_dir / "ca.crt"),
            "private_key": str(self.tls_dir / "tls.key"),
            "certificate_chain": str(self.tls_dir / "tls.crt"),
        }
        with grpcclient.InferenceServerClient(self.server.grpc_url, **tls) as plain:
            status = plain.get_system_shared_memory_status(headers=self.keys, as_json=True)
        return {region_of(name) for name in status.get("regions", {})}


@pytest.fixture(scope="module")
def rotation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rotation]:
    """A Triton of the module's own, restricted with three keys that the tests rotate, and
    the mounted Secret (a directory in the kubelet's layout) holding them."""
    keys = new_keys()
    secret = tmp_path_factory.mktemp("secret")
    write_secret(secret, keys)
    work = tmp_path_factory.mktemp("rotation")
    ca = CertificateAuthority(work / "ca")
    server_cert, server_key = ca.issue("server")
    client_cert, client_key = ca.issue("client")
    tls_dir = work / "client-tls"
    write_secret(
        tls_dir,
        {
            "ca.crt": ca.cert.read_text(),
            "tls.crt": client_cert.read_text(),
            "tls.key": client_key.read_text(),
        },
    )
    with local_triton(
        model_repository(work / "models", "identity"),
        log_path=work / "tritonserver.log",
        stop_grace_s=5.0,
        restricted_protocols=protocols(keys),
        tls_cert=server_cert,
        tls_key=server_key,
        tls_client_ca=ca.cert,
    ) as server:
        rotation = Rotation(server, secret, keys, tls_dir, seen=list(keys.values()))
        yield rotation
    log = server.log_path.read_text()
    assert "Started GRPCInferenceService" in log  # the log outlived the kill: the check reads it
    assert not [value for value in rotation.seen if value in log]


def ours() -> set[str]:
    """Our regions in /dev/shm."""
    return {r.name for r in list_local_regions() if r.owner.pid == os.getpid()}


def test_core_callers_ride_a_rotation_under_load(
    rotation: Rotation, capsys: pytest.CaptureFixture[str]
) -> None:
    client = TritonSHMClient(
        rotation.server.grpc_url,
        keys_dir=rotation.secret,
        tls_dir=rotation.tls_dir,
        reconnect_timeout_s=60,
    )
    with client:
        client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)  # 4 callers
        load = Load(4, lambda x: client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"])
        load.wait_for_answers(ANSWERS)
        # The kubelet swaps the files first: Triton still wants the old keys, and gets them.
        old = rotation.keys
        keys = rotation.rotate_files()
        # A call reads the new files; Triton refuses them, and the client turns back to the old.
        wait_for(
            lambda: (
                client._triton.keys._older is not None
                and dict(client._triton.keys.metadata()) == old
            ),
            what="the client back on the old keys after reading the new files",
        )
        load.wait_for_answers(ANSWERS)
        # Then Triton restarts with the new keys: callers wait for it, then use the new keys.
        down, up = rotation.restart_triton(keys)
        load.wait_for_answers(ANSWERS)
        outcomes = load.stop()
        result = figures(outcomes, down, up)
        assert result["wrong"] == 0
        assert not result["errors_while_up"], result["errors"]
        assert result["first_answer_after_s"] < 5.0, result
        assert dict(client._triton.keys.metadata()) == keys  # the new keys are the ones in use
        assert rotation.registered() == ours()

        # Triton restarts with newer keys before the files change: refused, named, at once
        # (no key in the message); then the files change and calls work, no restart.
        newer = new_keys()
        rotation.seen += newer.values()
        rotation.restart_triton(newer)
        x = np.ones((3, 16), np.float32)
        started = time.time()
        with pytest.raises(AccessDeniedError) as info:
            client.infer_shm("identity", {"INPUT0": x})
        assert time.time() - started < 10
        assert not [v for v in rotation.seen if v in str(info.value) or v in repr(client)]
        rotation.keys = newer
        write_secret(rotation.secret, newer)
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
    assert not ours()
    assert not rotation.registered()
    with capsys.disabled():
        print(
            f"\nrotation (core, 4 callers on 2 slots): {result['answers']} answers, "
            f"{result['wrong']} wrong, {len(result['errors'])} errors "
            f"({len(result['errors_while_up'])} while Triton was up); Triton down "
            f"{result['down_s']:.1f} s, {result['rode_the_outage']} calls waited it out, first "
            f"answer {result['first_answer_after_s']:.2f} s after it was back"
        )


@pytest.fixture
def ray_keyed(rotation: Rotation, tmp_path: Path) -> Iterator[Path]:
    """A local Ray whose every process finds Triton and the Secret's files through the
    environment, as pods do; yields a file whose creation stops the callers."""
    import ray

    from ray_triton_shm._wire._keys import KEYS_DIR_ENV_VAR
    from ray_triton_shm._wire._tls import TLS_DIR_ENV_VAR
    from ray_triton_shm.ray import URL_ENV_VAR, get_node_actor

    if ray.is_initialized():
        ray.shutdown()
    env = {
        URL_ENV_VAR: rotation.server.grpc_url,
        KEYS_DIR_ENV_VAR: str(rotation.secret),
        TLS_DIR_ENV_VAR: str(rotation.tls_dir),
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # before Ray starts: its processes inherit them
    init_ray(address="local", num_cpus=4, include_dashboard=False)
    try:
        yield tmp_path / "stop"
    finally:
        try:
            from ray import serve

            serve.shutdown()
            actor = get_node_actor()
            ray.get(actor.shutdown.remote())
            ray.kill(actor)
        finally:
            ray.shutdown()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_ray_tasks_and_a_serve_app_ride_a_rotation_under_load(
    rotation: Rotation, ray_keyed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray
    from ray import cloudpickle, serve

    from ray_triton_shm.ray import ShmModel, get_node_actor
    from ray_triton_shm.ray._ray_internals import session_dir

    stop = ray_keyed

    @ray.remote(num_cpus=0.5)
    def caller(seed: int, stop: str) -> list[tuple[float, float, str]]:
        model = ShmModel("identity", max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)})
        rng, outcomes = np.random.default_rng(seed), []
        # A byte per answer: what the test sees of the task's progress before it returns.
        with open(f"{stop}-{seed}", "ab", buffering=0) as answered:
            while not os.path.exists(stop):
                x = rng.standard_normal((int(rng.integers(1, 12)), 16), dtype=np.float32)
                started = time.time()
                try:
                    out = model.infer({"INPUT0": x})["OUTPUT0"]
                    what = "ok" if np.array_equal(out, x) else "wrong"
                except Exception as exc:
                    what = f"{type(exc).__name__}: {exc}"
                outcomes.append((started, time.time(), what))
                if what == "ok":
                    answered.write(b".")
        assert model.zero_copy
        model.close()
        return outcomes

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.5})
    class Echo:
        def __init__(self) -> None:
            self.model = ShmModel("identity", max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)})

        async def __call__(self, x: np.ndarray) -> np.ndarray:
            return (await self.model.infer_async({"INPUT0": x}))["OUTPUT0"]

    actor = get_node_actor(slots=2)  # 2 slots: 2 tasks and 2 Serve callers share them
    incarnation = ray.get(actor.stats.remote()).incarnation
    handle = serve.run(Echo.bind(), name="echo", route_prefix=None)
    tasks = [caller.remote(seed, str(stop)) for seed in range(2)]
    served = Load(2, lambda x: handle.remote(x).result(timeout_s=120))
    progress = [Path(f"{stop}-{seed}") for seed in range(len(tasks))]

    def answering(timeout_s: float = 60.0) -> None:
        """Waits until every task and the Serve app got :data:`ANSWERS` answers more."""
        sizes = lambda: [p.stat().st_size if p.exists() else 0 for p in progress]  # noqa: E731
        start = sizes()
        served.wait_for_answers(ANSWERS, timeout_s=timeout_s)
        wait_for(
            lambda: all(now >= then + ANSWERS for now, then in zip(sizes(), start, strict=True)),
            timeout_s=timeout_s,
            what=f"{ANSWERS} more answers of each task",
        )

    answering(timeout_s=120)  # the tasks bind meanwhile
    keys = rotation.rotate_files()
    # The procedure itself, as an operator waits it out: every process's next call reads the
    # new files (none of them says when it did).
    time.sleep(KEYS_CHECK_S)
    answering()
    down, up = rotation.restart_triton(keys)
    answering()
    stop.touch()
    by_task = []
    for start, end, what in (o for task in ray.get(tasks, timeout=120) for o in task):
        error = None if what in ("ok", "wrong") else RuntimeError(what)
        by_task.append(Outcome(start, end, error, wrong=what == "wrong"))
    by_serve = served.stop()
    report = []
    for who, outcomes in (("tasks", by_task), ("serve", by_serve)):
        result = figures(outcomes, down, up)
        assert result["answers"] > 0 and result["wrong"] == 0, (who, result)
        assert not result["errors_while_up"], (who, result["errors"])
        assert result["first_answer_after_s"] < 10.0, (who, result)
        report.append(
            f"{who}: {result['answers']} answers, {result['wrong']} wrong, "
            f"{len(result['errors'])} errors ({len(result['errors_while_up'])} while Triton was "
            f"up), first answer {result['first_answer_after_s']:.2f} s after Triton was back"
        )
    # No restart of the node actor: the same incarnation, with the new keys.
    stats = ray.get(get_node_actor().stats.remote())
    assert stats.incarnation == incarnation and stats.models["identity"]["shm_bytes"] > 0
    # No key in what Ray keeps or shows: handles' pickles, stats, every log of the session.
    shown = [repr(stats), str(cloudpickle.dumps(ShmModel("identity", max_shapes=SHAPES)))]
    logs = session_dir() / "logs"
    shown += [f.read_text(errors="replace") for f in logs.rglob("*") if f.is_file()]
    assert not [v for v in rotation.seen if any(v in text for text in shown)]
    with capsys.disabled():
        print(f"\nrotation (Ray, Triton down {up - down:.1f} s): " + "; ".join(report))


def test_the_tools_talk_to_triton_as_the_nodes_callers_do(
    rotation: Rotation, tmp_path: Path
) -> None:
    """``bench``, ``status``, ``reclaim`` and ``doctor`` against a Triton that wants keys and
    mutual TLS, with only the node's environment: the key files and the TLS files."""
    import json
    import subprocess
    import sys

    from ray_triton_shm._wire._keys import KEYS_DIR_ENV_VAR
    from ray_triton_shm._wire._tls import TLS_DIR_ENV_VAR

    env = {
        **os.environ,
        KEYS_DIR_ENV_VAR: str(rotation.secret),
        TLS_DIR_ENV_VAR: str(rotation.tls_dir),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ray_triton_shm", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    url = rotation.server.grpc_url
    bench = cli(
        *("bench", "--quick", "--url", url, "--models", "identity", "--no-plot", "--no-report"),
        *("--paths", "grpc", "shm-manual", "shm-client", "--concurrency", "2"),
        *("--json", str(tmp_path / "bench.json")),
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["failures"] == [] and {r["path"] for r in result["runs"]} == {
        "grpc",
        "shm-manual",
        "shm-client",
    }
    doctor = cli("doctor", "--url", url, "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["nodes"][0]["checks"]}
    assert checks["tls"]["status"] == "ok" and checks["keys"]["status"] == "ok", checks
    for command in ("status", "reclaim"):
        done = cli(command, "--url", url)
        assert done.returncode == 0 and "refused" not in done.stdout.lower(), done.stdout
    shown = bench.stdout + bench.stderr + doctor.stdout + (tmp_path / "bench.json").read_text()
    assert not [value for value in rotation.seen if value in shown]
