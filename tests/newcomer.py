"""A newcomer's path, walked for real (``make newcomer``, run by CI after ``make test``).

From a wheel built from this checkout, in a fresh virtual environment with an empty HOME, it
follows ``docs/guide/own-model.md`` as a new user would, and fails at the first step that
breaks:

1. install the wheel with its ``ray`` and ``bench`` extras;
2. ``ray-triton-shm setup-server --with scikit-learn`` (a server environment of its own);
3. ``ray-triton-shm serve-local --model-repository docs/examples/iris/models --log-file ...``;
4. the page's Python (the core client), as the page has it;
5. a local Ray (``ray start``), the page's Serve app (``docs/examples/iris/app.py``) answering
   HTTP requests exactly as the model called directly does;
6. ``ray-triton-shm doctor --ray --model iris:4``: every check ok;
7. a short ``ray-triton-shm bench`` with its report;
8. everything stopped through its own processes (never ``ray stop``, which would stop every
   Ray of the user's), and nothing of ours left in ``/dev/shm``.

pip's download cache is shared with the machine's (``PIP_CACHE_DIR``): the newcomer's HOME is
empty, the downloads need not be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guide" / "own-model.md"
EXAMPLE = ROOT / "docs" / "examples" / "iris"
#: The flowers the Serve app is asked about, and the classes the model gives them.
FLOWERS = [[5.1, 3.5, 1.4, 0.2], [5.9, 3.0, 4.2, 1.5], [6.7, 3.0, 5.2, 2.3], [6.3, 2.5, 5.0, 1.9]]


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Newcomer:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.home = work / "home"
        self.home.mkdir()
        self.venv = work / "venv"
        cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
        self.env = {
            "HOME": str(self.home),
            "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "PIP_CACHE_DIR": cache,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "LANG": "C.UTF-8",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_raylet_start_wait_time_s": "60",
        }
        self.background: list[subprocess.Popen[str]] = []

    def run(self, *command: str | Path, timeout: float = 900, **env: str) -> str:
        shown = " ".join(str(c) for c in command)
        print(f"$ {shown}", flush=True)
        done = subprocess.run(
            [str(c) for c in command],
            cwd=ROOT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise SystemExit(f"FAILED (exit {done.returncode}): {shown}\n{output[-6000:]}")
        return output

    def start(
        self, *command: str | Path, ready: str, log: Path, timeout: float = 300, **env: str
    ) -> None:
        print(f"$ {' '.join(str(c) for c in command)} &", flush=True)
        with open(log, "w") as out:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [str(c) for c in command],
                cwd=ROOT,
                env={**self.env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.background.append(process)
        deadline = time.monotonic() + timeout
        while ready not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: {command[0]} did not get ready:\n{log.read_text()}")
            time.sleep(0.5)

    def stop(self) -> None:
        for process in reversed(self.background):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        self.background = []


def stop_processes_under(work: Path) -> None:
    """SIGKILLs what is left of the processes started here: those whose command line names
    ``work`` (Ray's daemons carry its --temp-dir there), and nothing else on the machine."""
    mark = str(work).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def page_python(url: str) -> str:
    """The page's runnable Python blocks, one script, at ``url``."""
    text = PAGE.read_text()
    blocks = re.findall(r"(?:^|\n)(<!-- not-run:[^\n]*\n)?```python\n(.*?)```", text, re.S)
    code = "\n".join(body for marker, body in blocks if not marker)
    return code.replace('"localhost:8001"', repr(url))


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="newcomer-"))
    user = Newcomer(work)
    python = user.venv / "bin" / "python"
    tool = user.venv / "bin" / "ray-triton-shm"
    started = time.monotonic()
    before = {p.name for p in Path("/dev/shm").glob("rtshm_*")}
    try:
        step("1. a wheel of this checkout, installed in a fresh venv (empty HOME)")
        user.run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work / "dist", ".")
        (wheel,) = (work / "dist").glob("ray_triton_shm-*.whl")
        user.run(sys.executable, "-m", "venv", user.venv)
        user.run(python, "-m", "pip", "install", "-q", f"{wheel}[ray,bench]")

        step("2. the model's packages in the server's environment")
        out = user.run(tool, "setup-server", "--with", "scikit-learn")
        print(out[-600:])
        assert "scikit-learn:" in out and "numpy<2" in out, out

        step("3. Triton with the iris model")
        grpc, http = free_port(), free_port()
        log = work / "triton.log"
        user.start(
            tool, "serve-local", "--model-repository", EXAMPLE / "models", "--grpc-port", grpc,
            "--http-port", http, "--log-file", log,
            ready="Triton is ready", log=work / "serve-local.out",
        )  # fmt: skip
        url = f"127.0.0.1:{grpc}"
        assert "iris" in (work / "serve-local.out").read_text()

        step("4. the page's core client")
        print(user.run(python, "-c", page_python(url))[-400:])

        step("5. a local Ray, and the page's Serve app over HTTP")
        ray_port, serve_port = free_port(), free_port()
        # In the foreground (--block) with a temp dir of its own: stopped through its own
        # processes, never with `ray stop`, which stops every Ray of the user's.
        ray_dir = work / "ray"
        user.start(
            user.venv / "bin" / "ray", "start", "--head", "--block", f"--port={ray_port}",
            f"--temp-dir={ray_dir}", "--num-cpus=4", "--include-dashboard=false",
            ready="Ray runtime started", log=work / "ray-start.out", RAY_TRITON_SHM_URL=url,
        )  # fmt: skip
        address = f"127.0.0.1:{ray_port}"
        driver = f"""
import json, sys, urllib.request
import numpy as np, ray
from ray import serve
sys.path.insert(0, {str(EXAMPLE)!r})
from app import app
ray.init(address={address!r})
serve.start(http_options={{"host": "127.0.0.1", "port": {serve_port}}})
serve.run(app, route_prefix="/")
request = urllib.request.Request(
    "http://127.0.0.1:{serve_port}/", data=json.dumps({{"features": {FLOWERS!r}}}).encode()
)
answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
import tritonclient.grpc as grpcclient
direct = grpcclient.InferenceServerClient({url!r})
features = grpcclient.InferInput("FEATURES", [{len(FLOWERS)}, 4], "FP32")
features.set_data_from_numpy(np.array({FLOWERS!r}, np.float32))
expected = direct.infer("iris", [features]).as_numpy("CLASS").ravel().tolist()
print("serve:", answer, "direct:", expected)
assert answer["class"] == expected, (answer, expected)
assert answer["species"][0] == "setosa"
"""
        print(user.run(python, "-c", driver, RAY_ADDRESS=address)[-600:])

        step("6. doctor on every node")
        out = user.run(
            tool, "doctor", "--ray", "--address", address, "--model", "iris:4",
            RAY_TRITON_SHM_URL=url,
        )  # fmt: skip
        print(out[-1500:])  # its exit status is 1 if any check fails

        step("7. a short bench, with its report")
        report = work / "report.html"
        out = user.run(
            tool, "bench", "--url", url, "--http-url", f"127.0.0.1:{http}", "--models", "iris",
            "--quick", "--no-progress", "--report", report, "--plot", work / "bench.png",
            "--json", work / "bench.json",
        )  # fmt: skip
        print(out[-1500:])
        assert report.is_file() and "iris" in report.read_text()
        results = json.loads((work / "bench.json").read_text())
        assert results["failures"] == [], results["failures"]
        assert {r["path"] for r in results["runs"]} >= {"grpc", "http", "shm-client"}
    finally:
        step("8. everything stopped")
        user.stop()
        stop_processes_under(work)
    shutil.rmtree(work, ignore_errors=True)
    leftovers = sorted({p.name for p in Path("/dev/shm").glob("rtshm_*")} - before)
    if leftovers:
        raise SystemExit(f"FAILED: regions left in /dev/shm: {leftovers}")
    print(f"\nthe newcomer's path works ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
