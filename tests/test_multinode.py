"""Ray worker nodes as separate hosts on this machine: each in its own mount namespace
(``unshare``), with its own tmpfs at ``/dev/shm`` and its own Triton, as pods or hosts are.

A region that crossed nodes would go unnoticed with one ``/dev/shm`` for all: here it cannot
be opened. Tasks pinned to each node, a Serve app with a replica per node behind one proxy
and a Ray Data job spread over the nodes all infer zero-copy (transport ``"shm"``), each on its
own node's Triton (the ``whoami`` model says which Triton answered); each node's regions exist
only in its own ``/dev/shm``; ``doctor --ray`` passes on the healthy nodes. A third node,
``node_c``, has no Triton of its own: its ``RAY_TRITON_SHM_URL`` points at ``node_a``'s Triton,
which cannot open its regions. The doctor warns there, in its ``region`` check alone, that
the models go by value; tasks and a Serve replica there infer by value (transport
``"inline"``, the reason naming ``/dev/shm``), straight from the caller to ``node_a``'s Triton:
nothing of theirs registered there, nothing in ``node_c``'s ``/dev/shm`` but its node actor's
small regions of locks (gone with the actor), and no Ray call per request (Ray's state API
lists the node actor's tasks: control calls alone).

The head (0 CPUs, as KubeRay's; its dashboard serves the state API) runs in this machine's
namespace; the nodes are ``tests/_host.py`` under ``unshare --mount``, started one after
another.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from _helpers import (
    free_port_pair,
    free_ports,
    our_regions,
    registered_on,
    unshare_reason,
    wait_for,
)

ray = pytest.importorskip("ray")

HOST_SCRIPT = Path(__file__).with_name("_host.py")
SHAPES = {"DATA": (16,), "ECHO": (16,)}
#: The Ray processes of this module: tokens off (a local ray.init() elsewhere turned them on
#: for `ray start`), and Ray's fixed 30 s for a raylet to register widened.
#: How long a node's raylet may take to register (these nodes are started once, no retry).
NODE_START_WAIT_S = 120
#: How long a stopped node's processes may take to end by themselves.
LINGER_GRACE_S = 30.0
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_raylet_start_wait_time_s": str(NODE_START_WAIT_S)}


pytestmark = pytest.mark.skipif(
    unshare_reason("--mount") is not None, reason=str(unshare_reason("--mount"))
)


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

    def lingering(self, grace_s: float) -> dict[int, str]:
        """The processes still in its namespace after up to ``grace_s``, with their command
        lines. Ray's workers end by themselves once their raylet is gone, but only when they
        next look at its socket: seconds later on a loaded machine. Only those left after that
        are left behind."""
        deadline = time.monotonic() + grace_s
        while (pids := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return {pid: _command_line(pid) for pid in pids}


def _command_line(pid: int) -> str:
    """``pid``'s command line, or why not."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError as exc:
        return f"<{exc.strerror}>"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def _reread_ray_config() -> None:
    """RayConfig, and the auth token Ray cached, read again from the environment (a driver
    that ran a local Ray before has token auth on; these nodes have it off)."""
    from ray_triton_shm.ray._ray_internals import forget_auth_token, reread_ray_config

    reread_ray_config()
    forget_auth_token()


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
            "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={ports.pop()}", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={ports.pop()}",
        ],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"127.0.0.1:{head_port}"
    hosts: dict[str, Host] = {}
    left_behind: dict[str, dict[int, str]] = {}
    here_before = our_regions()
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    try:
        os.environ.update(RAY_ENV)
        _reread_ray_config()  # this driver reads RAY_AUTH_MODE again
        failures: list[Exception] = []

        def joined() -> bool:
            try:
                ray.init(address=address, log_to_driver=False)
            except Exception as exc:
                if head.poll() is not None:
                    raise
                failures.append(exc)
                return False
            return True

        wait_for(
            joined,
            timeout_s=NODE_START_WAIT_S,
            every_s=0.5,
            what=lambda: f"the head at {address} to take this driver ({failures[-1]!r})",
        )
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
            host.node_id = wait_for(
                functools.partial(_registered, name, proc),
                timeout_s=NODE_START_WAIT_S,
                every_s=0.1,
                what=f"{name} to register with the head",
            )
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
            left = host.lingering(LINGER_GRACE_S)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
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


def _registered(name: str, host: subprocess.Popen[str]) -> str:
    """The id of the node ``name`` once it registered with the head (``""`` before); the
    process of its host must still run."""
    assert host.poll() is None, f"{name} ended before it registered"
    return _node_with(name)


#: (rows, width) of the calls a task makes at once: whoami takes up to 8 rows of up to 16.
SIZES = ((1, 1), (5, 16), (8, 16), (3, 7), (8, 1), (2, 16))
#: The node actor's methods a caller may call: the control plane (a call by value is no
#: method of the actor: it goes straight to Triton).
CONTROL_CALLS = {"__init__", "register", "ensure_registered", "follow", "stats"}


@ray.remote(num_cpus=0)
def _infer_here(seed: int, sizes: Sequence[tuple[int, int]] = ((5, 16),)) -> dict[str, Any]:
    """Runs whoami through the node actor of the node it runs on: one call per size of
    ``sizes`` (rows, width), all at once from threads of its own.

    Returns:
        What the calls answered and which transport they took, the node actor's word, and
        the library's regions in the node's ``/dev/shm`` meanwhile.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import ray

    from ray_triton_shm.ray import ShmModel, get_node_actor

    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(size, dtype=np.float32) for size in sizes]
    model = ShmModel("whoami", max_shapes={"DATA": (16,), "ECHO": (16,)})
    with ThreadPoolExecutor(len(xs)) as threads:
        outs = list(threads.map(lambda x: model.infer({"DATA": x}), xs))
    pool = model.shm_stats()
    stats = ray.get(get_node_actor().stats.remote())
    answer = {
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "echo_ok": all(np.array_equal(out["ECHO"], x) for out, x in zip(outs, xs)),
        "who": sorted({int(w) for out in outs for w in out["WHO"].ravel()}),
        "zero_copy": model.zero_copy,
        "transport": pool.transport,
        "reason": pool.transport_reason,
        "node_transport": stats.models["whoami"]["transport"],
        "node_reason": stats.models["whoami"]["transport_reason"],
        "dev_shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("rtshm_")),
        "actor_pid": stats.pid,
        "url": stats.url,
    }
    model.close()
    return answer


def _registered_by(url: str) -> set[int]:
    """The processes whose regions are registered in the Triton at ``url`` (a region's name
    starts with its owner's pid)."""
    return {int(name.split("_")[1].split("-")[0]) for name in registered_on(url)}


def test_tasks_on_each_node_use_its_own_triton_and_dev_shm(cluster: dict[str, Any]) -> None:
    hosts: dict[str, Host] = cluster["hosts"]
    healthy = [hosts["node_a"], hosts["node_b"]]
    answers = ray.get(
        [_infer_here.options(resources={h.name: 1}).remote(i) for i, h in enumerate(healthy)]
    )
    for host, answer in zip(healthy, answers):
        assert answer["node"] == host.node_id
        assert answer["echo_ok"] and answer["zero_copy"]
        # Proven zero-copy, in the caller and in the node actor alike.
        assert answer["transport"] == answer["node_transport"] == "shm", (host.name, answer)
        assert answer["reason"].startswith(f"Triton at {host.url} "), answer  # its proof
        assert answer["who"] == [host.port], (host.name, answer)  # its own Triton answered
        assert answer["url"] == host.url
        # Its regions are in its own /dev/shm, and nowhere else.
        mine = set(answer["dev_shm"])
        assert mine and mine <= host.regions(), (host.name, mine)
        assert all(f"rtshm_{answer['actor_pid']}-" in name for name in mine)
        others = [h for h in hosts.values() if h is not host]
        assert not mine & (our_regions() | {r for h in others for r in h.regions()})
        assert _registered_by(host.url) <= {answer["actor_pid"]}


def _who() -> Any:
    """The Serve deployment of the tests: whoami through ``ShmModel``, where each answer says
    which node and Triton answered, whether right and by which transport; a request
    ``{"mark": name}`` calls the node actor's ``stats`` as a task named ``name`` instead (a mark
    the state API lists) and answers its transport of whoami."""
    from ray import serve

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0, "resources": {"host": 1}})
    class Who:
        def __init__(self) -> None:
            from ray_triton_shm.ray import ShmModel

            self.model = ShmModel("whoami", max_shapes={"DATA": (16,), "ECHO": (16,)})

        async def __call__(self, request: Any) -> dict[str, Any]:
            import numpy as np
            import ray

            from ray_triton_shm.ray import get_node_actor

            body = await request.json()
            if "mark" in body:
                actor = get_node_actor()
                stats = await actor.stats.options(name=body["mark"]).remote()
                return {"transport": stats.models["whoami"]["transport"]}
            x = np.asarray(body["x"], dtype=np.float32)
            out = await self.model.infer_async({"DATA": x})
            pool = self.model.shm_stats()
            return {
                "node": ray.get_runtime_context().get_node_id(),
                "who": sorted({int(w) for w in out["WHO"].ravel()}),
                "echo_ok": bool(np.array_equal(out["ECHO"], x)),
                "zero_copy": self.model.zero_copy,
                "transport": pool.transport,
                "reason": pool.transport_reason,
            }

    return Who


def _start_serve(cluster: dict[str, Any]) -> str:
    """Starts Serve on the cluster (a no-op once started); its HTTP address."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": cluster["serve_port"]})
    return f"http://127.0.0.1:{cluster['serve_port']}"


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_a_serve_app_with_a_replica_per_node_behind_one_proxy(cluster: dict[str, Any]) -> None:
    from ray import serve

    hosts: dict[str, Host] = cluster["hosts"]
    port_of = {h.node_id: h.port for h in hosts.values()}
    proxy = _start_serve(cluster)
    # "host": the nodes with a Triton of their own, one replica each (not node_c).
    serve.run(_who().bind(), name="who", route_prefix="/who")
    url = f"{proxy}/who"
    seen = {}
    rng = np.random.default_rng(3)
    for _ in range(40):
        x = rng.standard_normal((3, 16), dtype=np.float32)
        answer = requests.post(url, json={"x": x.tolist()}, timeout=60).json()
        assert answer["echo_ok"] and answer["zero_copy"], answer
        assert answer["transport"] == "shm", answer
        assert answer["who"] == [port_of[answer["node"]]], answer
        seen[answer["node"]] = seen.get(answer["node"], 0) + 1
    serve.delete("who", _blocking=False)  # its replicas' graceful end: seconds, not waited on
    assert len(seen) == 2, seen  # one replica on each node, each on its own Triton


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
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


def test_doctor_passes_the_healthy_nodes_and_warns_a_triton_across_nodes_goes_by_value(
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
        assert checks["region"]["details"]["transport"] == "shm", (name, checks["region"])
        # Its own 1 GiB /dev/shm; Ray's object store (larger) went to /tmp and is not counted.
        assert checks["dev_shm"]["details"]["total"] == 2**30
        assert checks["dev_shm"]["details"]["object_store"] == 0
    # node_c's models will go by value to node_a's Triton (transport auto): a warning, with
    # the cause and what would give them shared memory.
    crossed = nodes[hosts["node_c"].node_id]
    assert not {name for name, c in crossed.items() if c["status"] == "fail"}, crossed
    region = crossed["region"]
    assert region["status"] == "warn" and region["details"]["transport"] == "inline", region
    assert "/dev/shm" in region["summary"] and "/dev/shm" in region["fix"], region
    assert done.returncode == 0, done.stderr


def _node_actor_tasks(actor_id: str) -> list[tuple[str, str]]:
    """The tasks of the actor ``actor_id`` as Ray's state API lists them: (name, state) each
    (what the workers reported: a second or so late)."""
    from ray.util.state import list_tasks

    tasks = list_tasks(
        filters=[("actor_id", "=", actor_id)], limit=10_000, raise_on_missing_output=False
    )
    return [(t.name, t.state) for t in tasks]


def _calls_until(actor_id: str, mark: str) -> Counter[str]:
    """The actor's tasks by method, but marks, once the state API lists the task ``mark`` as
    finished (made after the calls counted, by the same process)."""

    def listed() -> list[tuple[str, str]] | None:
        try:
            tasks = _node_actor_tasks(actor_id)
        except Exception:  # the dashboard still starting
            return None
        return tasks if (mark, "FINISHED") in tasks else None

    tasks = wait_for(listed, timeout_s=60, what=f"the state API to list the task {mark!r}")
    return Counter(name.rsplit(".", 1)[-1] for name, _ in tasks if not name.startswith("mark-"))


def test_a_node_without_its_own_triton_infers_by_value_with_no_ray_call_per_request(
    cluster: dict[str, Any],
) -> None:
    """``node_c`` has no Triton: its ``RAY_TRITON_SHM_URL`` is ``node_a``'s, which cannot map
    ``node_c``'s ``/dev/shm``. Tasks and a Serve replica there infer by value, straight to
    ``node_a``'s Triton: right answers, the transport and its reason said by the caller and
    the node actor, nothing registered in ``node_a``'s Triton, no region left but the node
    actor's locks, and no Ray call per request."""
    from ray import serve

    from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
    from ray_triton_shm.ray._actor import NAMESPACE, actor_name

    hosts: dict[str, Host] = cluster["hosts"]
    node_a, node_c = hosts["node_a"], hosts["node_c"]
    there = {"node_c": 0.1}  # several at once on the node

    # Tasks, three at once, each with calls of several sizes at once.
    answers = ray.get([_infer_here.options(resources=there).remote(i, SIZES) for i in range(3)])
    actor_pid = answers[0]["actor_pid"]
    for answer in answers:
        assert answer["node"] == node_c.node_id
        assert answer["echo_ok"], answer
        assert answer["who"] == [node_a.port], answer  # node_a's Triton answered
        assert answer["url"] == node_a.url and answer["actor_pid"] == actor_pid
        assert answer["transport"] == answer["node_transport"] == "inline", answer
        assert not answer["zero_copy"]
        for reason in (answer["reason"], answer["node_reason"]):
            assert "/dev/shm" in reason and node_a.url in reason, reason
        # In node_c's /dev/shm meanwhile: the node actor's regions alone.
        assert all(n.startswith(f"rtshm_{actor_pid}-") for n in answer["dev_shm"]), answer
    callers = {actor_pid} | {answer["pid"] for answer in answers}
    # Nothing of node_c registered in node_a's Triton (its probe was refused, nothing kept).
    assert not _registered_by(node_a.url) & (callers | set(node_c.processes()))
    # Left in node_c's /dev/shm: the node actor's regions of locks, a header each (no slots).
    left = node_c.regions()
    assert left and all(n.startswith(f"rtshm_{actor_pid}-") for n in left), left
    assert {(node_c.shm / n).stat().st_size for n in left} == {REGION_HEADER_BYTES}

    # A Serve replica there: every answer by value and right, and no Ray call per request.
    actor = ray.get_actor(actor_name(node_c.node_id), namespace=NAMESPACE)
    actor_id = actor._actor_id.hex()
    url = f"{_start_serve(cluster)}/whoc"
    deployment = _who().options(
        name="WhoC", num_replicas=1, ray_actor_options={"num_cpus": 0, "resources": there}
    )
    serve.run(deployment.bind(), name="whoc", route_prefix="/whoc")
    rng = np.random.default_rng(7)

    def ask(rows: int, width: int) -> None:
        x = rng.standard_normal((rows, width), dtype=np.float32)
        answer = requests.post(url, json={"x": x.tolist()}, timeout=60).json()
        assert answer["echo_ok"] and answer["who"] == [node_a.port], answer
        assert answer["node"] == node_c.node_id and answer["transport"] == "inline", answer
        assert "/dev/shm" in answer["reason"] and not answer["zero_copy"], answer

    ask(1, 16)  # the replica binds: its control calls
    mark = requests.post(url, json={"mark": "mark-before"}, timeout=60).json()
    assert mark == {"transport": "inline"}
    before = _calls_until(actor_id, "mark-before")
    for i in range(50):
        ask(1 + i % 8, 1 + i % 16)
    requests.post(url, json={"mark": "mark-after"}, timeout=60).raise_for_status()
    after = _calls_until(actor_id, "mark-after")
    serve.delete("whoc", _blocking=False)
    assert after == before, (before, after)  # 50 requests: not one more call of the actor
    assert set(after) <= CONTROL_CALLS and after["register"] >= 4, after  # 3 tasks, a replica

    # The node actor killed (no graceful end): its watchdog unlinks its regions of locks.
    ray.kill(actor, no_restart=True)
    wait_for(lambda: not node_c.regions(), what="node_c's /dev/shm to be empty")
