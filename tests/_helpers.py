"""Helpers shared by the tests (the test tree's own, not the library's privates)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import html
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from ray_triton_shm import ClientClosedError
from ray_triton_shm.local._server import LocalTritonServer

#: The headers of the access keys of the ``restricted`` Triton fixture.
ADMIN = "triton-grpc-protocol-admin-key"
INFER = "triton-grpc-protocol-infer-key"
READ = "triton-grpc-protocol-read-key"

T = TypeVar("T")

#: Seconds a new Ray node's raylet may take to register with its GCS (Ray's default: 30). A
#: start that has not registered by then is started again (init_ray, start_cluster): on 2
#: busy cores a raylet registers within seconds, or sits out any window.
RAYLET_START_WAIT_S = 60


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def free_port_pair(host: str = "127.0.0.1", taken: Collection[int] = ()) -> tuple[int, int]:
    """A free gRPC port whose port below is free too, for Triton's layout: ``(grpc, http)``."""
    while True:
        (port,) = free_ports(1, host)
        pair = (port, port - 1)
        if set(taken).isdisjoint(pair) and port_is_free(host, port - 1):
            return pair


def port_is_free(host: str, port: int) -> bool:
    """Whether ``port`` is free on ``host`` right now."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def raylet_start_window(seconds: int = RAYLET_START_WAIT_S) -> Iterator[None]:
    """Ray nodes started inside get ``seconds``, not Ray's 30, to register with their GCS.

    Starting a node (``ray.init`` with no address or ``address="local"``,
    ``ray.cluster_utils.Cluster.add_node``) blocks in ``ray._private.node.Node`` until the GCS
    lists the new raylet. The wait is the GCS client's ``GetNode``, which retries for
    ``RayConfig.raylet_start_wait_time_s`` (30 s; Ray's own message on a miss says "Try
    increase the RAY_raylet_start_wait_time_s config"); ``Node``'s own 30 s check runs only
    after that call gives up. A raylet registers once its dashboard and runtime-env agents (two
    Python processes per node) are up, which on a loaded 2-core machine can take longer:
    "The current node timed out during startup".

    RayConfig reads its ``RAY_*`` variables once per process, so the variable is set and the
    config re-read (``_ray_internals.reread_ray_config``, as Ray does itself when it turns token
    auth on), then the variable is restored, and so is the config if no driver is connected
    (a connected driver's config came from its cluster; it keeps the wider wait). The node
    processes started inside inherit the variable: for them too it only widens that wait.
    """
    import ray

    from ray_triton_shm.ray._ray_internals import reread_ray_config

    name = "RAY_raylet_start_wait_time_s"
    old = os.environ.get(name)
    if old is not None and old.isdigit() and int(old) >= seconds:
        yield
        return
    os.environ[name] = str(seconds)
    read = reread_ray_config()  # False: a Ray without that config, which keeps its 30 s
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
        if read and not ray.is_initialized():
            reread_ray_config()


#: What Ray says when a node's start-up timed out.
_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


def init_ray(**kwargs: Any) -> Any:
    """``ray.init(**kwargs)`` in a :func:`raylet_start_window`, started a second time if the
    first start timed out all the same (or on a Ray without that setting)."""
    import ray

    try:
        with raylet_start_window():
            return ray.init(**kwargs)
    except Exception as exc:
        # The raylet missed its window, or the GCS did not write its port in time (Ray's
        # own wait for it), both on a loaded machine.
        if not any(words in str(exc) for words in _START_TIMEOUTS):
            raise
    ray.shutdown()
    _kill_ray_children()
    with raylet_start_window():
        return ray.init(**kwargs)


def start_cluster(add_nodes: Callable[[Any], T]) -> tuple[Any, T]:
    """A ``ray.cluster_utils.Cluster`` with the nodes ``add_nodes(cluster)`` adds, in a
    :func:`raylet_start_window`; started a second time if a node's start-up timed out all the
    same (a GCS overwhelmed by several raylets on 2 busy cores is Ray's, not what a test
    tests). Returns the cluster and what ``add_nodes`` returned."""
    from ray.cluster_utils import Cluster

    for attempt in (1, 2):
        cluster = None
        try:
            with raylet_start_window():
                cluster = Cluster()
                added = add_nodes(cluster)
            return cluster, added
        except Exception as exc:
            if cluster is not None:
                cluster.shutdown()
            if attempt == 2 or not any(words in str(exc) for words in _START_TIMEOUTS):
                raise
            _kill_ray_children()
    raise AssertionError("unreachable")


def _kill_ray_children() -> None:
    """Kills the processes of a half-started Ray node: this process's descendants run from
    Ray's package (GCS, raylet, log monitor...), and nothing else (not the test's Triton)."""
    import ray

    ray_dir = str(Path(ray.__file__).parent) + os.sep
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    ours, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - ours
        ours |= frontier
    for pid in ours:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(part.decode(errors="replace").startswith(ray_dir) for part in argv):
                os.kill(pid, signal.SIGKILL)


def identity_job(ds: Any, max_shapes: Any, **options: Any) -> Any:
    """Ray Data ``ds`` through ``ShmPredictor`` on the ``identity`` model: batches of 8 on a
    pool of 2 predictor actors, with ``map_batches``' other ``options``."""
    import ray

    from ray_triton_shm.ray import ShmPredictor

    return ds.map_batches(
        ShmPredictor,
        fn_constructor_kwargs={"model_name": "identity", "max_shapes": max_shapes},
        batch_size=8,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0,
        **options,
    )


@contextlib.contextmanager
def node_actor_of_module(**options: Any) -> Iterator[Any]:
    """This node's actor (made with ``options``) for a module's tests; shut down and killed
    after them, leaving no region of it in ``/dev/shm``."""
    import ray

    from ray_triton_shm._slots._shm import list_local_regions
    from ray_triton_shm.ray import get_node_actor

    actor = get_node_actor(**options)
    try:
        yield actor
    finally:
        pid = ray.get(actor.stats.remote()).pid
        ray.get(actor.shutdown.remote())
        ray.kill(actor)
        assert [r.name for r in list_local_regions() if r.owner.pid == pid] == []


def end_node_actor() -> None:
    """Shuts down and kills this node's actor of the connected Ray, if it has one (a later
    ``get_node_actor`` then makes a new one)."""
    import ray

    from ray_triton_shm.ray._actor import find_node_actor

    actor = find_node_actor()
    if actor is None:
        return
    with contextlib.suppress(Exception):
        ray.get(actor.shutdown.remote(), timeout=30)
    ray.kill(actor)


def classifier_expected(images: Any) -> Any:
    """The example ``classifier`` model's formula, in numpy."""
    b = images.shape[0]
    return images.reshape(b, -1)[:, :150000].reshape(b, 1000, 150).mean(axis=2)


#: Where POSIX shared memory lives.
SHM_DIR = Path("/dev/shm")


def our_regions(pid: int | None = None) -> set[str]:
    """The library's regions in ``/dev/shm``: every one, or those of process ``pid`` (a
    slot's name counts as its region's)."""
    from ray_triton_shm._slots._shm import REGION_PREFIX, region_of

    prefix = f"{REGION_PREFIX}_" if pid is None else f"{REGION_PREFIX}_{pid}-"
    return {region_of(p.name) for p in SHM_DIR.iterdir() if p.name.startswith(prefix)}


def wait_for(
    condition: Callable[[], T],
    *,
    timeout_s: float = 30.0,
    what: str | Callable[[], str] = "it",
    every_s: float = 0.02,
) -> T:
    """Waits until ``condition()`` is truthy and returns it; fails the test, saying ``what``
    it waited for (and the last value seen, but ``None`` or ``False``), past ``timeout_s``.
    The one wait of the tests: for an event, never for time standing in for it. In a
    coroutine: ``await asyncio.to_thread(wait_for, ...)`` (the loop runs on meanwhile).

    Args:
        condition: The event. It may fail the test itself (an ``assert``) where what it
            watches died, to end the wait at once.
        timeout_s: How long the event may take.
        what: What is waited for; or a function that says it at the deadline, with what it
            finds then (a log's tail).
        every_s: How often ``condition`` is asked; ``0`` for one that blocks until something
            happens (a line read from a pipe).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            last = "" if value is None or value is False else f" (last: {value!r})"
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {said}{last}")
        time.sleep(every_s)


def queued_in_triton(metrics_url: str, model: str) -> int:
    """How many requests wait in Triton's queue of ``model`` now (its metric
    ``nv_inference_pending_request_count``): an event a test can wait for, where one request
    must be running and others queued behind it."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    prefix = f'nv_inference_pending_request_count{{model="{model}",'
    return sum(
        int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines() if line.startswith(prefix)
    )


def request_sent(pool: Any) -> bool:
    """Whether a request of ``pool`` (a ``ModelPool``) has left for Triton: its slot says
    since when it is busy."""
    header = pool.header
    return any(header.busy_since(slot) for slot in range(header.slot_count))


@contextlib.contextmanager
def runs_in_triton(server: LocalTritonServer, model: str) -> Iterator[Callable[[], int]]:
    """Counts the requests of ``model`` (a Python-backend model) that ``server`` began to
    run while inside, from its verbose log, switched on meanwhile: an event a test can wait
    for where a request must be *in* Triton, holding its slot's registration, before its
    caller goes away (sent, :func:`request_sent`, is not yet there)."""
    import tritonclient.grpc as grpcclient

    started = re.compile(rf"model {re.escape(model)}, instance \S+, executing (\d+) requests")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        settings = client.get_log_settings(as_json=True)["settings"]
        verbose = int(settings["log_verbose_level"]["uint32_param"])
        start = server.log_path.stat().st_size
        client.update_log_settings({"log_verbose_level": max(verbose, 1)})

        def runs() -> int:
            with server.log_path.open("rb") as log:
                log.seek(start)
                text = log.read().decode(errors="replace")
            return sum(int(n) for n in started.findall(text))

        try:
            yield runs
        finally:
            client.update_log_settings({"log_verbose_level": verbose})


def registered_on(url: str, headers: Mapping[str, str] | None = None) -> set[str]:
    """The regions with a shared-memory registration, system or CUDA, in the Triton at
    ``url`` (a region's slots are registered one by one, under names of their own), asked
    with ``headers`` (a Triton with keys wants its shared-memory key)."""
    import tritonclient.grpc as grpcclient

    from ray_triton_shm._slots._shm import region_of

    asked = {"headers": dict(headers or {}), "as_json": True}
    with grpcclient.InferenceServerClient(url) as client:
        names = [*client.get_system_shared_memory_status(**asked).get("regions", {})]
        names += client.get_cuda_shared_memory_status(**asked).get("regions", {})
    return {region_of(name) for name in names}


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, made here."""
    cert, key = directory / "server.crt", directory / "server.key"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key),
             "-out", str(cert), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def write_secret(directory: Path, files: dict[str, str]) -> None:
    """Writes ``files`` into ``directory`` as the kubelet updates a mounted Secret: a new
    timestamped directory, the ``..data`` symlink swapped to it atomically, one symlink per
    key through ``..data``, and the old version removed."""
    directory.mkdir(exist_ok=True)
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir()
    for name, value in files.items():
        (version / name).write_text(value + "\n")  # `kubectl create secret --from-file` style
    data = directory / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    os.symlink(version.name, directory / "..data_tmp")
    os.rename(directory / "..data_tmp", data)
    for name in files:
        if not (directory / name).is_symlink():
            os.symlink(f"..data/{name}", directory / name)
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith(".") and entry.name not in files:
            entry.unlink()  # a key removed from the Secret
    if old is not None:
        shutil.rmtree(directory / old)


class CertificateAuthority:
    """A certificate authority made for a test (openssl), issuing certificates for 127.0.0.1
    and localhost, for servers and clients alike."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = directory / f"{name}.crt", directory / f"{name}.key"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "1", "-subj", f"/CN={name}", "-keyout", self.key, "-out", self.cert,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def issue(self, name: str, into: Path | None = None) -> tuple[Path, Path]:
        """A certificate and its key, signed by this CA; written as ``<name>.crt`` and
        ``<name>.key`` in ``into`` (this CA's directory by default)."""
        into = into or self.directory
        into.mkdir(parents=True, exist_ok=True)
        cert, key, request = into / f"{name}.crt", into / f"{name}.key", into / f"{name}.csr"
        extensions = into / f"{name}.ext"
        extensions.write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", f"/CN={name}", "-keyout", key, "-out", request,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", request, "-CA", self.cert, "-CAkey", self.key,
            "-CAcreateserial", "-days", "1", "-out", cert, "-extfile", extensions,
        )  # fmt: skip
        request.unlink()
        extensions.unlink()
        return cert, key


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@dataclass
class Outcome:
    started: float
    ended: float
    error: BaseException | None = None
    wrong: bool = False


class Load:
    """``callers`` threads calling ``call(x)`` in a loop, each answer checked against ``x``
    (of 1 to ``max_rows`` rows)."""

    def __init__(
        self, callers: int, call: Callable[[np.ndarray], np.ndarray], *, max_rows: int = 11
    ) -> None:
        self.outcomes: list[Outcome] = []
        self._max_rows = max_rows
        self._stop = threading.Event()
        self._call = call
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(callers)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, caller: int) -> None:
        rng = np.random.default_rng(caller)
        while not self._stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, self._max_rows + 1)), 16), np.float32)
            outcome = Outcome(time.time(), 0.0)
            try:
                outcome.wrong = not np.array_equal(self._call(x), x)
            except Exception as exc:
                outcome.error = exc
            outcome.ended = time.time()
            self.outcomes.append(outcome)
            if isinstance(outcome.error, ClientClosedError):
                return  # nothing more can come (a test that failed left its load running)

    def wait_for_answers(self, n: int, *, timeout_s: float = 60.0) -> None:
        """Waits until the callers got ``n`` answers more than they had (an error is no
        answer; a wrong one is, for the test to count)."""
        start = len(self.outcomes)
        wait_for(
            lambda: sum(o.error is None for o in self.outcomes[start:]) >= n,
            timeout_s=timeout_s,
            what=f"{n} more answers",
        )

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
            assert not thread.is_alive()
        return self.outcomes


def figures(outcomes: list[Outcome], down: float, up: float) -> dict[str, Any]:
    """What a rotation cost: the errors (and whether all fell while Triton was down), and
    how long after Triton was back the first call answered."""
    errors = [o for o in outcomes if o.error is not None]
    # Triton may answer a moment before its restart() returns: 0 then.
    back = [max(0.0, o.ended - up) for o in outcomes if o.error is None and o.started >= up - 0.05]
    waited = [o for o in outcomes if o.error is None and o.started < down < o.ended]
    return {
        "answers": sum(o.error is None for o in outcomes),
        "wrong": sum(o.wrong for o in outcomes),
        "errors": [f"{type(o.error).__name__}: {o.error}" for o in errors],
        "errors_while_up": [o for o in errors if o.ended < down or o.started > up],
        "down_s": up - down,
        "first_answer_after_s": min(back, default=float("inf")),
        "rode_the_outage": len(waited),
    }


#: The models of the ``fresh_triton`` fixture (the tests that restart or kill Triton).
FRESH_MODELS = ("classifier", "identity", "large_image", "delay_echo", "captioner")
#: The models of the ``triton_elsewhere`` fixture (a Triton with a /dev/shm of its own).
ELSEWHERE_MODELS = ("identity", "upper", "add_nobatch", "echo_parameters", "captioner")


def model_repository(directory: Path, *models: str) -> Path:
    """A model repository holding only ``models`` (links into the example repository or the
    tests' own): a Triton serving it starts and restarts in a few seconds, not one per
    model."""
    from ray_triton_shm.local import EXAMPLE_MODEL_REPOSITORY

    directory.mkdir(parents=True, exist_ok=True)
    for model in models:
        source = EXAMPLE_MODEL_REPOSITORY / model
        if not source.is_dir():
            source = Path(__file__).parent / "models" / model  # the tests' own models
        (directory / model).symlink_to(source, target_is_directory=True)
    return directory


@contextlib.contextmanager
def local_triton(
    repository: str | Path | Sequence[str | Path], **options: Any
) -> Iterator[LocalTritonServer]:
    """A ``LocalTritonServer`` of ``repository`` with ``options``, started (every model
    ready); killed and closed on the way out, however the block ends: nobody waits on a test's
    Triton's graceful end (``tests/test_server.py`` tests that one)."""
    server = LocalTritonServer(repository, **options)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        server.close()


#: A launcher (``LocalTritonServer(launcher=...)``) under which Triton sees a ``/dev/shm`` of
#: its own, in a mount namespace of its own (the container mistake): it maps no region of ours.
OWN_DEV_SHM = ("unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"')


@functools.cache
def unshare_reason(*flags: str) -> str | None:
    """Why ``unshare`` with these ``flags`` cannot run here, or ``None`` where it can (the
    bench's own look)."""
    from ray_triton_shm._bench._elsewhere import unshare_refusal  # the bench, only if asked

    return unshare_refusal(*flags)


def need_unshare(*flags: str) -> None:
    """Skips the test where ``unshare`` with these ``flags`` cannot run, saying why."""
    reason = unshare_reason(*flags)
    if reason:
        pytest.skip(reason)


def in_threads(work: Callable[[int], object], seeds: Iterable[int], timeout_s: float = 120) -> None:
    """Runs ``work(seed)`` for each of ``seeds`` at once, each on a thread of its own, and
    waits for them all. The first error of one (a failed assertion too) is raised here, once
    every thread is done; a thread still running after ``timeout_s`` fails the test."""
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            work(seed)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(seed,), daemon=True) for seed in seeds]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not [t for t in threads if t.is_alive()], f"threads still ran after {timeout_s:g} s"
    if errors:
        raise errors[0]


#: A bench run's own numbers for an elastic pool (its ``extra``): the pool grew from 2 to 16
#: slots 0.4 s into its load, and stayed there.
GREW: dict[str, Any] = {
    "pool_sizes": [[0.0, 2], [0.2, 2], [0.4, 16], [0.6, 16], [1.5, 16]],
    "min_slots": 2,
    "max_slots": 64,
    "pool_size_max": 16,
    "pool_size_max_s": 0.4,
    "pool_size_settled": 16,
    "limited_by": "",
    "warmup_s": 1.0,
    "warmup_requests_per_s": 900.0,
}


#: The probe the browser tests add to a page: what the reader would see, as JSON in a <pre>.
_PROBE = """<script>
window.addEventListener("load", () => {
  const root = document.documentElement;
  const images = [...document.images].map((img) => ({
    alt: img.alt, loaded: img.complete && img.naturalWidth > 0,
    width: img.getBoundingClientRect().width,
  }));
  const sections = [...document.querySelectorAll("section")].map((s) => ({
    id: s.id, heading: s.querySelector("h2")?.textContent, height: s.offsetHeight,
  }));
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    viewport: window.innerWidth, page_width: root.scrollWidth, images, sections,
  });
  document.body.appendChild(probe);
});
</script>"""


def chromium() -> str | None:
    """The headless Chromium's path, or ``None`` where none is installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Opens ``page`` in headless Chromium (a profile of its own, no network of its own
    making: no updates, no sync) with Chromium's other ``flags``; its ``stdout`` is the page's
    DOM once loaded. Fails the test where no Chromium is installed."""
    path = chromium()
    if path is None:
        pytest.fail("headless Chromium is missing: apt-get install chromium (.ci/run does)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                path,
                *("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"),
                *("--disable-background-networking", "--disable-component-update"),
                *("--disable-sync", f"--user-data-dir={profile}"),
                *flags,
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def browse(page: Path, width: int, height: int = 900) -> dict[str, Any]:
    """Opens ``page`` in headless Chromium in a ``width`` x ``height`` window; returns what
    the page's reader gets (:data:`_PROBE`): the viewport and the page's width, each image
    (loaded or not, its width on screen), each section (id, heading, height)."""
    probed = page.with_name(f"probed-{width}-{page.name}")
    probed.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    done = dump_dom(probed, f"--window-size={width},{height}")
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found is not None, f"no probe in Chromium's page (rc {done.returncode}): {done.stderr}"
    return json.loads(html.unescape(found.group(1)))  # type: ignore[no-any-return]
