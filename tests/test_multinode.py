"""Ray worker nodes as separate hosts on this machine: each in its own mount namespace
(``unshare``), with its own tmpfs at ``/dev/shm`` and its own Triton, as pods or hosts are.

A region that crossed nodes would go unnoticed with one ``/dev/shm`` for all: here it cannot
be opened. Tasks pinned to each node, a Serve app with a replica per node behind one proxy
and a Ray Data job spread over the nodes all infer zero-copy, each on its own node's Triton
(the ``whoami`` model says which Triton answered); each node's regions exist only in its own
``/dev/shm``; ``doctor --ray`` passes on the healthy nodes; and a third node whose
``RAY_TRITON_SHM_URL`` points at another node's Triton fails the doctor's ``region`` check
alone, and a call made there fails at once, naming ``/dev/shm``.

The head (0 CPUs, as KubeRay's) runs in this machine's namespace; the nodes are
``tests/_host.py`` under ``unshare --mount``, started one after another.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from _helpers import free_port_pair, free_ports, our_regions, registered_on

ray = pytest.importorskip("ray")

HOST_SCRIPT = Path(__file__).with_name("_host.py")
SHAPES = {"DATA": (16,), "ECHO": (16,)}
#: The Ray processes of this module: tokens off (a local ray.init() elsewhere turned them on
#: for `ray start`), and Ray's fixed 30 s for a raylet to register widened.
#: How long a node's raylet may take to register (these nodes are started once, no retry).
NODE_START_WAIT_S = 120
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_raylet_start_wait_time_s": str(NODE_START_WAIT_S)}


def _unshare_reason() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    done = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return None if done.returncode == 0 else "`unshare --mount` needs root here"


pytestmark = pytest.mark.skipif(_unshare_reason() is not None, reason=str(_unshare_reason()))


@dataclass
class Host:
    """A Ray worker node in a mount namespace of its own."""

    name: str
    proc: subprocess.Popen[str]
    url: str
    port: int | None  # its own Triton's gRPC port (what whoami answers), if any
    mnt_ns: str = ""
    node_id: str = ""

    @property
    def shm(self) -> Path:
        """Its /dev/shm, seen from here."""
        return Path(f"/proc/{self.proc.pid}/root/dev/shm")

    def regions(self) -> set[str]:
        return {p.name for p in self.shm.iterdir() if p.name.startswith("rtshm_")}

    def processes(self) -> list[int]:
        """Every process in its mount namespace."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == self.mnt_ns:
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids


def _reread_ray_config() -> None:
    """RayConfig, and the auth token Ray cached, read again from the environment (a driver
    that ran a local Ray before has token auth on; these nodes have it off)."""
    ray._raylet.Config.initialize("")
    loader = getattr(ray._raylet, "AuthenticationTokenLoader", None)
    if loader is not None:
        loader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The head, ``node_a`` and ``node_b`` with their own Triton, and ``node_c`` whose
    ``RAY_TRITON_SHM_URL`` is ``node_a``'s Triton."""
    if ray.is_initialized():
        ray.shutdown()
    head_port, serve_port, *ports = free_ports(13)
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_TRITON_SHM_URL", None)
    ray_bin = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [
            ray_bin, "start", "--head", "--block", f"--port={head_port}", "--num-cpus=0",
            "--include-dashboard=false", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={ports.pop()}",
        ],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"127.0.0.1:{head_port}"
    hosts: dict[str, Host] = {}
    left_behind: dict[str, list[int]] = {}
    here_before = our_regions()
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    try:
        os.environ.update(RAY_ENV)
        _reread_ray_config()  # this driver reads RAY_AUTH_MODE again
        deadline = time.monotonic() + NODE_START_WAIT_S
        while True:
            try:
                ray.init(address=address, log_to_driver=False)
                break
            except Exception:
                if time.monotonic() > deadline or head.poll() is not None:
                    raise
                time.sleep(1)
        for name in ("node_a", "node_b", "node_c"):
            workdir = tmp_path_factory.mktemp(name)
            command = [
                "unshare", "--mount", "--propagation", "private", sys.executable,
                str(HOST_SCRIPT), f"--name={name}", f"--head={address}",
                f"--agent-port={ports.pop()}", f"--workdir={workdir}",
            ]  # fmt: skip
            if name == "node_c":
                command.append(f"--url={hosts['node_a'].url}")
            else:
                # Triton's layout, HTTP next below gRPC, where the clients look for it.
                grpc, http = free_port_pair(taken=ports)
                metrics = ports.pop()
                command += [f"--grpc-port={grpc}", f"--http-port={http}"]
                command.append(f"--metrics-port={metrics}")
            proc = subprocess.Popen(
                command, env=env, start_new_session=True, stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            started = json.loads(proc.stdout.readline() or "{}")
            assert started, f"{name} did not start (see {workdir})"
            host = Host(name, proc, started["url"], None if name == "node_c" else grpc)
            host.mnt_ns = os.readlink(f"/proc/{proc.pid}/ns/mnt")
            assert host.mnt_ns != os.readlink("/proc/self/ns/mnt")
            hosts[name] = host
            # One node after another: each registers before the next starts.
            while not (node := _node_with(name)):
                assert time.monotonic() < deadline + 120 and proc.poll() is None, name
                time.sleep(0.5)
            host.node_id = node
        yield {"address": address, "hosts": hosts, "serve_port": serve_port}
    finally:
        if ray.is_initialized():
            from ray import serve

            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
        for host in hosts.values():
            host.proc.send_signal(signal.SIGTERM)
        for host in hosts.values():
            try:
                host.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
            left = host.processes()
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            if left:
                left_behind[host.name] = left
        head.send_signal(signal.SIGINT)
        try:
            head.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
        # `ray start --head` left its address for `ray.init()` to find: a later local
        # ray.init() of another module would try to join this gone cluster.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.is_file() and current.read_text().strip().endswith(f":{head_port}"):
            current.unlink()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reread_ray_config()
    # Said once the head is stopped too: a failed check must not leave a cluster running.
    assert not left_behind, f"processes left in the nodes' namespaces: {left_behind}"
    # Nothing of the nodes ever reached this machine's /dev/shm.
    assert our_regions() <= here_before


def _node_with(resource: str) -> str:
    for node in ray.nodes():
        if node.get("Alive") and node.get("Resources", {}).get(resource):
            return str(node["NodeID"])
    return ""


@ray.remote(num_cpus=0)
def _infer_here(seed: int) -> dict[str, Any]:
    """Runs whoami through the node actor of the node it runs on."""
    import os

    import numpy as np
    import ray

    from ray_triton_shm.ray import ShmModel, get_node_actor

    x = np.random.default_rng(seed).standard_normal((5, 16), dtype=np.float32)
    model = ShmModel("whoami", max_shapes={"DATA": (16,), "ECHO": (16,)})
    out = model.infer({"DATA": x})
    stats = ray.get(get_node_actor().stats.remote())
    answer = {
        "node": ray.get_runtime_context().get_node_id(),
        "echo_ok": bool(np.array_equal(out["ECHO"], x)),
        "who": sorted({int(w) for w in out["WHO"].ravel()}),
        "zero_copy": model.zero_copy,
        "dev_shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("rtshm_")),
        "actor_pid": stats.pid,
        "url": stats.url,
    }
    model.close()
    return answer


def test_tasks_on_each_node_use_its_own_triton_and_dev_shm(cluster: dict[str, Any]) -> None:
    hosts: dict[str, Host] = cluster["hosts"]
    healthy = [hosts["node_a"], hosts["node_b"]]
    answers = ray.get(
        [_infer_here.options(resources={h.name: 1}).remote(i) for i, h in enumerate(healthy)]
    )
    for host, answer in zip(healthy, answers):
        assert answer["node"] == host.node_id
        assert answer["echo_ok"] and answer["zero_copy"]
        assert answer["who"] == [host.port], (host.name, answer)  # its own Triton answered
        assert answer["url"] == host.url
        # Its regions are in its own /dev/shm, and nowhere else.
        mine = set(answer["dev_shm"])
        assert mine and mine <= host.regions(), (host.name, mine)
        assert all(f"rtshm_{answer['actor_pid']}-" in name for name in mine)
        others = [h for h in hosts.values() if h is not host]
        assert not mine & (our_regions() | {r for h in others for r in h.regions()})
        assert {n.split("_")[1].split("-")[0] for n in registered_on(host.url)} <= {
            str(answer["actor_pid"])
        }


def test_a_serve_app_with_a_replica_per_node_behind_one_proxy(cluster: dict[str, Any]) -> None:
    from ray import serve

    hosts: dict[str, Host] = cluster["hosts"]
    port_of = {h.node_id: h.port for h in hosts.values()}

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0, "resources": {"host": 1}})
    class Who:
        def __init__(self) -> None:
            from ray_triton_shm.ray import ShmModel

            self.model = ShmModel("whoami", max_shapes={"DATA": (16,), "ECHO": (16,)})

        async def __call__(self, request: Any) -> dict[str, Any]:
            import numpy as np
            import ray

            x = np.asarray((await request.json())["x"], dtype=np.float32)
            out = await self.model.infer_async({"DATA": x})
            return {
                "node": ray.get_runtime_context().get_node_id(),
                "who": sorted({int(w) for w in out["WHO"].ravel()}),
                "echo_ok": bool(np.array_equal(out["ECHO"], x)),
                "zero_copy": self.model.zero_copy,
            }

    serve.start(http_options={"host": "127.0.0.1", "port": cluster["serve_port"]})
    # "host": the nodes with a Triton of their own, one replica each (not node_c).
    serve.run(Who.bind(), name="who", route_prefix="/who")
    url = f"http://127.0.0.1:{cluster['serve_port']}/who"
    seen = {}
    rng = np.random.default_rng(3)
    for _ in range(40):
        x = rng.standard_normal((3, 16), dtype=np.float32)
        answer = requests.post(url, json={"x": x.tolist()}, timeout=60).json()
        assert answer["echo_ok"] and answer["zero_copy"], answer
        assert answer["who"] == [port_of[answer["node"]]], answer
        seen[answer["node"]] = seen.get(answer["node"], 0) + 1
    serve.delete("who", _blocking=False)  # its replicas' graceful end: seconds, not waited on
    assert len(seen) == 2, seen  # one replica on each node, each on its own Triton


def test_a_ray_data_job_spread_over_the_nodes(cluster: dict[str, Any]) -> None:
    from ray_triton_shm.ray import ShmPredictor

    hosts: dict[str, Host] = cluster["hosts"]
    port_of = {h.node_id: h.port for h in hosts.values()}

    class Where(ShmPredictor):
        """The predictor, and the node each batch ran on."""

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            import ray

            out = super().__call__(batch)
            out["node"] = np.full(len(batch["DATA"]), ray.get_runtime_context().get_node_id())
            out["DATA"] = batch["DATA"]
            return out

    x = np.random.default_rng(5).standard_normal((96, 16), dtype=np.float32)
    rows = (
        ray.data.from_numpy(x)
        .rename_columns({"data": "DATA"})
        .repartition(12)
        .map_batches(
            Where,
            fn_constructor_kwargs={"model_name": "whoami", "max_shapes": SHAPES},
            compute=ray.data.ActorPoolStrategy(size=2),
            num_cpus=0,
            resources={"host": 1},  # one predictor on each node with a Triton of its own
            batch_size=8,
        )
        .take_all()
    )
    assert len(rows) == len(x)
    assert sorted(map(tuple, (r["ECHO"].tolist() for r in rows))) == sorted(map(tuple, x.tolist()))
    for row in rows:
        np.testing.assert_array_equal(row["ECHO"], row["DATA"])
        assert int(row["WHO"][0]) == port_of[str(row["node"])]
    assert {str(r["node"]) for r in rows} == {hosts["node_a"].node_id, hosts["node_b"].node_id}


def test_doctor_passes_the_healthy_nodes_and_names_a_triton_across_nodes(
    cluster: dict[str, Any],
) -> None:
    hosts: dict[str, Host] = cluster["hosts"]
    done = subprocess.run(
        [sys.executable, "-m", "ray_triton_shm", "doctor", "--ray", "--json"]
        + ["--address", cluster["address"], "--model", "whoami:4"],
        capture_output=True,
        text=True,
        env={**os.environ, **RAY_ENV},
        timeout=300,
    )
    report = json.loads(done.stdout)
    nodes = {n["node"]: {c["name"]: c for c in n["checks"]} for n in report["nodes"]}
    for name in ("node_a", "node_b"):
        checks = nodes[hosts[name].node_id]
        assert {c["status"] for c in checks.values()} == {"ok"}, (name, checks)
        # Its own 1 GiB /dev/shm; Ray's object store (larger) went to /tmp and is not counted.
        assert checks["dev_shm"]["details"]["total"] == 2**30
        assert checks["dev_shm"]["details"]["object_store"] == 0
    crossed = nodes[hosts["node_c"].node_id]
    failed = {name for name, c in crossed.items() if c["status"] == "fail"}
    assert failed == {"region"}, crossed
    assert "/dev/shm" in crossed["region"]["summary"] + crossed["region"]["fix"]
    assert done.returncode == 1

    # A call made there fails at once, naming the cause.
    @ray.remote(num_cpus=0, resources={"node_c": 1})
    def call_there() -> tuple[float, str]:
        import time

        import numpy as np

        from ray_triton_shm.ray import ShmModel

        started = time.monotonic()
        try:
            ShmModel("whoami", max_shapes={"DATA": (16,), "ECHO": (16,)}).infer(
                {"DATA": np.ones((1, 16), np.float32)}
            )
        except Exception as exc:
            return time.monotonic() - started, f"{type(exc).__name__}: {exc}"
        return time.monotonic() - started, "answered"

    took_s, error = ray.get(call_there.remote(), timeout=120)
    assert "/dev/shm" in error and "another" in error, error
    assert took_s < 15, (took_s, error)
    assert not hosts["node_c"].regions()  # nothing left behind there either
