"""A script that streams and exits without closing its client exits at once, whatever state
its streams are in, leaving no region in ``/dev/shm`` and no registration in Triton.

Each case is a small script run many times, in processes of its own: the hang it guards
against (gRPC's channel closed by tritonclient's ``__del__`` at the interpreter's end, with a
call still owed an event by a thread that no longer runs) came once in a few runs. Each
script arms faulthandler as it ends, so a run that hangs dies printing every thread's stack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
from _helpers import our_regions, registered_on

from ray_triton_shm._slots._shm import REGION_PREFIX

#: Runs of each case. Before the fix, 1 to 3 runs in 20 hung in "complete", "async" and
#: "daemon_thread" (each case alone catches it in about half its test runs, the three
#: together in most), and every run of "never_exhausted" waited 30 s for its slot.
RUNS = 10
#: The runs of a case at once (the machine has 2 cores).
AT_ONCE = 3
#: How long a script may take from its last line to its exit.
EXIT_LIMIT_S = 5.0
#: Past this after its last line, a run dumps every thread's stack and dies (a hang).
HANG_S = 15.0

#: Every script's start: a client (no watchdog process, which would clean up after it and
#: hide what it left), captioner's pool, and ``request(count, delay_us)``.
PRELUDE = """
import asyncio, faulthandler, os, sys, threading, time
import numpy as np
from ray_triton_shm import TritonSHMClient

def request(count, delay_us=0):
    image = np.random.rand(3, 224, 224).astype(np.float32)
    return {"IMAGE": image, "COUNT": np.array([count], np.int32),
            "DELAY_US": np.array([delay_us], np.int32)}

client = TritonSHMClient(os.environ["TRITON_URL"], crash_cleanup=False)
client.register_shm_model("captioner", pool_size=2)
"""

#: What each script does before it ends; none closes its client. A long stream is 1000
#: responses 2 ms apart: Triton still sends when the script ends.
CASES = {
    "complete": """
        assert sum(1 for _ in client.stream("captioner", request(8))) == 8
        assert sum(1 for _ in client.stream("captioner", request(3))) == 3
    """,
    "broken_off": """
        for response in client.stream("captioner", request(1000, 2000)):
            break
    """,
    "never_exhausted": """
        responses = client.stream("captioner", request(1000, 2000))
        first = next(responses)
    """,
    "async": """
        async def main():
            async for _ in client.stream_async("captioner", request(8)):
                pass
            async for _ in client.stream_async("captioner", request(1000, 2000)):
                break
            pending = client.stream_async("captioner", request(1000, 2000))
            await pending.__anext__()
        asyncio.run(main())
    """,
    "guide_example": """
        with_cleanup = TritonSHMClient(os.environ["TRITON_URL"])  # the guide's, as it was
        with_cleanup.register_shm_model("captioner")
        for response in with_cleanup.stream("captioner", request(8)):
            print(response.index, response["TOKEN"], response["FEATURE"])
    """,
    "daemon_thread": """
        started = threading.Event()
        def read():
            for _ in client.stream("captioner", request(1000, 2000)):
                started.set()
        threading.Thread(target=read, daemon=True).start()
        assert started.wait(30)
    """,
}


class Run(NamedTuple):
    pid: int
    returncode: int
    exit_s: float
    output: str


def script(case: str) -> str:
    """The script of ``case``: it arms faulthandler and prints when it ends."""
    return script_of(CASES[case])


def script_of(body: str) -> str:
    """The script that runs ``body``: it arms faulthandler and prints when it ends."""
    ending = f"""
        faulthandler.dump_traceback_later({HANG_S}, exit=True)
        print("ENDING", time.time(), flush=True)
    """
    return PRELUDE + textwrap.dedent(body) + textwrap.dedent(ending)


def run(path: Path, url: str) -> Run:
    """Runs the script at ``path`` to its end; how long it took to exit after its last line."""
    env = {**os.environ, "TRITON_URL": url}
    process = subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        output, _ = process.communicate(timeout=HANG_S + 60)
    except subprocess.TimeoutExpired:
        process.kill()  # faulthandler could not end it
        output, _ = process.communicate()
    exited = time.time()
    ending = [line for line in output.splitlines() if line.startswith("ENDING ")]
    exit_s = exited - float(ending[-1].split()[1]) if ending else float("inf")
    return Run(process.pid, process.returncode, exit_s, output)


# The cases that hung or waited before the fix in make test; each once more in the soak.
def runs_exited_clean(path: Path, url: str, count: int) -> list[tuple[Run, str]]:
    """``count`` runs of the script at ``path`` (:data:`AT_ONCE` at a time), each checked to
    have exited at once with 0, printed no traceback, and left no region in ``/dev/shm`` nor
    registered in Triton; each run with its output's tail (for further checks' messages)."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(lambda _: run(path, url), range(count)))
    registered = registered_on(url)
    checked = []
    for done in runs:
        said = f"run {done.pid} of {path.stem!r}:\n{done.output[-6000:]}"
        assert done.returncode == 0, said
        assert done.exit_s < EXIT_LIMIT_S, f"took {done.exit_s:.1f} s to exit; {said}"
        assert "Traceback" not in done.output, f"printed an error as it exited; {said}"
        assert our_regions(done.pid) == set(), f"left regions in /dev/shm; {said}"
        ours = f"{REGION_PREFIX}_{done.pid}-"
        left = {name for name in registered if name.startswith(ours)}
        assert left == set(), f"left registrations in Triton; {said}"
        checked.append((done, said))
    return checked


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case, marks=() if case in ("never_exhausted", "complete") else pytest.mark.soak
        )
        for case in sorted(CASES)
    ],
)
def test_a_script_that_streams_exits_at_once_without_close_leaving_nothing(
    case: str, grpc_url: str, tmp_path: Path
) -> None:
    path = tmp_path / f"{case}.py"
    path.write_text(script(case))
    runs_exited_clean(path, grpc_url, RUNS)


#: Streams the exit hook ends under their callers, none closed: a daemon thread waiting for a
#: response (blocking, and on an event loop), a daemon thread whose stream is suspended and
#: that reads on once the hook ran, and the main thread reading a suspended stream after the
#: hook (an exit handler registered before the first stream runs after the library's).
ENDED_UNDER_THEIR_CALLERS = """
    import atexit
    from ray_triton_shm import ClientClosedError

    other = TritonSHMClient(os.environ["TRITON_URL"], crash_cleanup=False)
    other.register_shm_model("captioner", pool_size=2)
    resume = threading.Event()

    def read(responses, started, pause=False):
        for _ in responses:
            started.set()
            if pause:
                resume.wait()
        print("READ TO THE END", flush=True)  # a stream ended by the exit did not end

    async def read_async(started):
        async for _ in other.stream_async("captioner", request(1000, 2000)):
            started.set()
        print("READ TO THE END", flush=True)

    def after_the_hook():
        resume.set()
        try:
            next(held)
        except ClientClosedError as exc:
            print("MAIN GOT ClientClosedError:", exc, flush=True)
        paused.join(1.5)
        print("PAUSED THREAD", "WAITS" if paused.is_alive() else "ENDED", flush=True)

    atexit.register(after_the_hook)
    started = [threading.Event() for _ in range(3)]
    threads = [
        threading.Thread(target=read, args=(client.stream("captioner", request(1000, 2000)),
                                            started[0]), daemon=True),
        threading.Thread(target=read, args=(client.stream("captioner", request(1000, 2000)),
                                            started[1], True), daemon=True),
        threading.Thread(target=lambda: asyncio.run(read_async(started[2])), daemon=True),
    ]
    paused = threads[1]
    for thread in threads:
        thread.start()
    held = other.stream("captioner", request(1000, 2000))
    next(held)
    assert all(event.wait(30) for event in started)
"""


def test_streams_the_exit_ends_under_their_callers_print_nothing_and_leave_nothing(
    grpc_url: str, tmp_path: Path
) -> None:
    """Streams read by daemon threads (blocking and async) and by the main thread when the
    exit hook ends them: no traceback printed (a daemon thread printed
    ``StreamInterruptedError``), the main thread gets ``ClientClosedError``, nothing left."""
    path = tmp_path / "ended_under_their_callers.py"
    path.write_text(script_of(ENDED_UNDER_THEIR_CALLERS))
    for done, said in runs_exited_clean(path, grpc_url, AT_ONCE):
        assert "Exception" not in done.output, said
        assert "READ TO THE END" not in done.output, said
        assert "PAUSED THREAD WAITS" in done.output, said
        assert "MAIN GOT ClientClosedError:" in done.output, said
        assert "the interpreter exits" in done.output, said
