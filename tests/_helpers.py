"""Helpers shared by the tests (the test tree's own, not the library's privates)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
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
    # The half-started node's processes would otherwise linger until the session ends.
    ray_cli = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True, check=False)
    return ray.init(**kwargs)
