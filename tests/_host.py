"""One Ray worker node as a host of its own, for the multi-node tests: run under
``unshare --mount --propagation private``, it mounts a tmpfs of its own at ``/dev/shm``,
starts its own Triton there (unless ``--url`` names another), then joins the Ray cluster with
``ray start --block``. SIGTERM stops Ray, then kills Triton; the namespace, and its
``/dev/shm``, go with the last process.

Usage: python tests/_host.py --name node_a --head 127.0.0.1:6379 --grpc-port 18001 ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True, help="the node's custom resource")
    parser.add_argument("--head", required=True, help="the Ray head's address")
    parser.add_argument("--shm-size", default="1g")
    parser.add_argument("--grpc-port", type=int, help="its own Triton's ports (else no Triton)")
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--url", help="RAY_TRITON_SHM_URL instead of its own Triton")
    parser.add_argument("--agent-port", type=int, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()

    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={args.shm_size},mode=1777", "tmpfs", "/dev/shm"],
        check=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = None
    url = args.url
    if args.grpc_port is not None:
        from _helpers import model_repository

        from ray_triton_shm.local import LocalTritonServer

        os.environ["WHOAMI"] = str(args.grpc_port)  # what its whoami model answers
        server = LocalTritonServer(
            model_repository(args.workdir / "models", "whoami", "identity"),
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            metrics_port=args.metrics_port,
            log_path=args.workdir / "tritonserver.log",
            stop_grace_s=5.0,
        )
        server.start()
        url = server.grpc_url
    env = {**os.environ, "RAY_TRITON_SHM_URL": url or "", "RAY_raylet_start_wait_time_s": "120"}
    ray_bin = Path(sys.executable).with_name("ray")
    # "host": a node with a Triton of its own, where replicas and predictors may run.
    resources = {args.name: 1, **({"host": 1} if server is not None else {})}
    ray = subprocess.Popen(
        [
            str(ray_bin), "start", "--block", f"--address={args.head}", "--num-cpus=1",
            f"--resources={json.dumps(resources)}",
            f"--dashboard-agent-listen-port={args.agent_port}", "--disable-usage-stats",
        ],
        env=env,
    )  # fmt: skip
    print(json.dumps({"pid": os.getpid(), "url": url}), flush=True)
    while not stop.wait(0.2) and ray.poll() is None:
        pass
    ray.send_signal(signal.SIGINT)  # `ray start --block` stops its node's processes then
    try:
        ray.wait(timeout=30)
    except subprocess.TimeoutExpired:
        ray.kill()
    if server is not None:
        server.kill()  # nobody waits on its graceful end (test_server.py's): seconds sooner
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
