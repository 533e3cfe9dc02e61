"""The embedded Triton never outlives its owner: a process holding a ``LocalTritonServer``,
or ``ray-triton-shm serve-local``, killed without a chance to clean up leaves no
``tritonserver``, no Python-backend stub and no region in ``/dev/shm`` of its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from _helpers import model_repository, wait_for

from ray_triton_shm.local import LocalTritonServer

ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")
#: How long after its owner died the server may still be around.
GONE_WITHIN_S = 5.0

_OWNER = """
import os, signal, sys, time
from ray_triton_shm.local import LocalTritonServer
server = LocalTritonServer(sys.argv[1], grpc_port=0, http_port=0, metrics_port=0).start()
if sys.argv[2:] == ["crash"]:  # the supervisor restarts it, from its watcher thread
    from _helpers import wait_for
    crashed = server.pid
    os.kill(crashed, signal.SIGKILL)
    wait_for(lambda: server.pid not in (None, crashed) and not server.is_restarting)
    assert len(server.crashes) == 1
forked = 0
if sys.argv[2:] == ["fork"]:  # a child that shares the owner's file descriptors
    forked = os.fork()
    if forked == 0:
        time.sleep(600)  # the load itself: a child that lives on until killed
        os._exit(0)
print(os.getpid(), server.pid, server.shm_prefix, server.grpc_url, forked, flush=True)
time.sleep(600)  # the load itself: an owner that lives on until killed
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The tests' directory too: a crashed owner waits for the restart with wait_for.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def _group(pgid: int) -> list[int]:
    """The live processes of the process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def _regions(prefix: str) -> list[str]:
    return [p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix)]


def _prefix_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    flag = "--backend-config=python,shm-region-prefix-name="
    return next(a.removeprefix(flag) for a in argv if a.startswith(flag))


def _assert_serving(pgid: int, prefix: str, grpc_url: str) -> None:
    """The server runs with its stub and its region, and answers."""
    assert len(_group(pgid)) >= 2, "tritonserver and the identity model's stub"
    assert _regions(prefix)
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.is_model_ready("identity")


def _wait_gone(pgid: int, prefix: str) -> None:
    wait_for(
        lambda: not _group(pgid) and not _regions(prefix),
        timeout_s=GONE_WITHIN_S,
        what=f"the server's process group {pgid} and its regions {prefix}* to be gone",
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts: killed after it whatever happened (their servers then go
    with them)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("sig", "mode"),
    [
        (signal.SIGKILL, None),
        (signal.SIGTERM, None),
        (signal.SIGKILL, "crash"),
        (signal.SIGKILL, "fork"),
    ],
    ids=["SIGKILL", "SIGTERM", "SIGKILL-after-a-restart", "SIGKILL-with-a-forked-child-left"],
)
def test_a_killed_owner_takes_its_server_along(
    sig: signal.Signals, mode: str | None, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    repo = model_repository(tmp_path / "repo", "identity")
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(repo), *([mode] if mode else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    processes.append(owner)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, f"the owner ended before its server was ready ({owner.wait()})"
    owner_pid, server_pid, prefix, grpc_url, forked = line.split()
    assert int(owner_pid) == owner.pid
    pgid = int(server_pid)
    try:
        _assert_serving(pgid, prefix, grpc_url)
        owner.send_signal(sig)
        assert owner.wait(timeout=10) == -sig
        _wait_gone(pgid, prefix)
    finally:
        if int(forked):
            os.kill(int(forked), signal.SIGKILL)


def test_a_killed_serve_local_takes_its_server_along_and_says_its_free_ports(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    repo = model_repository(tmp_path / "repo", "identity")
    command = [sys.executable, "-m", "ray_triton_shm", "serve-local", "--model-repository"]
    command += [str(repo), "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_env())
    processes.append(cli)
    assert cli.stdout is not None
    said: dict[str, str] = {}
    pid = 0
    for line in cli.stdout:
        found = re.match(r"\s*(gRPC|HTTP|metrics):\s+(\S+)", line)
        if found:
            said[found[1]] = found[2]
        ready = re.match(r"Triton is ready \(pid (\d+)\)", line)
        if ready:
            pid = int(ready[1])
        if line.startswith("Press Ctrl-C"):
            break
    else:
        raise AssertionError(f"serve-local ended before Triton was ready ({cli.wait()})")
    ports = [int(said[name].removesuffix("/metrics").rpartition(":")[2]) for name in said]
    assert sorted(said) == ["HTTP", "gRPC", "metrics"]
    assert 0 not in ports and len(set(ports)) == 3, said
    prefix = _prefix_of(pid)
    _assert_serving(pid, prefix, said["gRPC"])

    cli.kill()
    assert cli.wait(timeout=10) == -signal.SIGKILL
    _wait_gone(pid, prefix)


def test_port_0_is_a_free_port(tmp_path: Path) -> None:
    repo = model_repository(tmp_path / "repo", "identity")
    with LocalTritonServer(repo, grpc_port=0, http_port=0, metrics_port=0) as server:
        ports = (server.grpc_port, server.http_port, server.metrics_port)
        assert all(isinstance(p, int) and p > 0 for p in ports) and len(set(ports)) == 3
        assert server.grpc_url == f"127.0.0.1:{server.grpc_port}"
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.is_model_ready("identity")
    with pytest.raises(ValueError, match="http_port must be a TCP port"):
        LocalTritonServer(repo, http_port=70000)


def test_a_closed_server_dismisses_its_guard(tmp_path: Path) -> None:
    """A normal close ends the guard at once, without killing anything."""
    server = LocalTritonServer(model_repository(tmp_path / "repo", "identity")).start()
    guard = server._box.guard.pid
    assert guard is not None and server.pid is not None
    server.close()
    with pytest.raises(ProcessLookupError):
        os.kill(guard, 0)
