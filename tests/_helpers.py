"""Helpers shared by the tests (the test tree's own, not the library's privates)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path
from typing import Any


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def init_ray(**kwargs: Any) -> Any:
    """``ray.init(**kwargs)``, started a second time if the first start timed out.

    Ray gives a new raylet a fixed 30 s to register with its GCS. On a loaded 2-core CI machine
    one start in a few hundred misses that ("The current node timed out during startup"); it
    has nothing to do with the library, and a second start succeeds.
    """
    import ray

    try:
        return ray.init(**kwargs)
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
    ray.shutdown()
    _kill_ray_children()
    return ray.init(**kwargs)


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


def classifier_expected(images: Any) -> Any:
    """The example ``classifier`` model's formula, in numpy."""
    b = images.shape[0]
    return images.reshape(b, -1)[:, :150000].reshape(b, 1000, 150).mean(axis=2)


def registered_on(url: str) -> set[str]:
    """The names of the system shared-memory regions registered in the Triton at ``url``."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        return set(client.get_system_shared_memory_status(as_json=True).get("regions", {}))
