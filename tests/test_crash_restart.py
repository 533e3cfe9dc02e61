"""The embedded Triton's supervisor: a crash is recorded and the server comes back by itself.

Triton's Python backend can abort the whole server under concurrent requests of a few MB
(triton-inference-server/server issue 8882). These tests crash a real tritonserver with the
signals such a crash ends in (SIGABRT, SIGSEGV) while a core client and Ray callers load it,
and check that it comes back on the same ports, that every answer before and after is exact,
that the crash is reported with its reason, and that nothing leaks.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _helpers import (
    end_node_actor,
    local_triton,
    model_repository,
    our_regions,
    registered_on,
    wait_for,
)

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local._crashes import RestartPolicy, ServerEvent, crash_reason, reason_lines
from ray_triton_shm.local._server import LocalTritonServer

SHM_DIR = Path("/dev/shm")
#: The identity model's tensors, at most (its dims are variable).
SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: The most a crash may take to be seen and the server to be ready again, here (a generous
#: bound on a busy 2-core machine: one identity model loads in about a second).
BACK_WITHIN_S = 60.0

# ---- what a crash says, and when to try again (pure) --------------------------------------

ABORT_LOG = """\
I1127 05:26:08.000000 4016 grpc_server.cc:2451] Started GRPCInferenceService at 127.0.0.1:1
terminate called after throwing an instance of 'boost::interprocess::lock_exception'
  what():  boost::interprocess::lock_exception
Signal (6) received.
 0# 0x000055B0 in /opt/tritonserver/bin/tritonserver
"""


def test_an_abort_is_told_by_its_uncaught_exception() -> None:
    assert crash_reason(-6, ABORT_LOG) == (
        "SIGABRT: terminate called after throwing 'boost::interprocess::lock_exception' "
        "(boost::interprocess::lock_exception)"
    )


def test_a_fatal_signal_triton_caught_is_named() -> None:
    log = "I1127 started\nSignal (11) received.\n 0# 0x1 in tritonserver\n"
    assert crash_reason(-11, log) == "SIGSEGV: Triton received SIGSEGV"
    assert crash_reason(-9, "I1127 started\n") == "SIGKILL"


def test_an_exit_code_comes_with_triton_s_last_error_line() -> None:
    log = (
        "E1127 05:26:09.123456 4016 model_lifecycle.cc:654] failed to load 'a'\n"
        "E1127 05:26:09.223456 4016 server.cc:300] unable to find backend library\n"
    )
    assert crash_reason(1, log) == "exit code 1: unable to find backend library"


def test_restarts_back_off_and_give_up_after_max_crashes_within_the_window() -> None:
    now = [100.0]
    policy = RestartPolicy(max_crashes=4, window_s=60.0, clock=lambda: now[0])
    assert [policy.crashed(), policy.crashed(), policy.crashed()] == [0.25, 0.5, 1.0]
    assert policy.crashed() is None  # the 4th within a minute
    now[0] += 61.0  # a quiet minute: the count starts again
    assert policy.recent == 0
    assert policy.crashed() == 0.25
    with pytest.raises(ValueError, match="max_crashes"):
        RestartPolicy(max_crashes=0)


# ---- a real tritonserver, crashed under load ---------------------------------------------


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` still runs (a zombie waiting for init does
    not)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _wait_back(server: LocalTritonServer, crashes: int) -> float:
    """Waits until ``server`` recorded ``crashes`` crashes and is ready again; the seconds
    from the last crash until it was."""

    def back() -> bool:
        assert server.failure is None, server.failure
        return len(server.crashes) >= crashes and not server.is_restarting and server.is_running

    wait_for(back, timeout_s=BACK_WITHIN_S, what=lambda: f"Triton back after {server.crashes}")
    down_s = server.crashes[-1].down_s
    assert down_s is not None
    return down_s


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[LocalTritonServer, list[ServerEvent]]]:
    events: list[ServerEvent] = []
    with local_triton(
        model_repository(tmp_path / "models", "identity"),
        log_path=tmp_path / "tritonserver.log",
        stop_grace_s=5.0,
        on_event=events.append,
    ) as server:
        yield server, events


class _Load:
    """Callers of one ``TritonSHMClient`` sending inputs of their own, every answer checked."""

    def __init__(self, url: str, callers: int) -> None:
        self.client = TritonSHMClient(url)
        self.client.register_shm_model("identity", pool_size=callers, max_shapes=SHAPES)
        self.answers = self.wrong = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._call, args=(i,)) for i in range(callers)]
        for thread in self._threads:
            thread.start()

    def _call(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not self._stop.is_set():
            x = rng.random((int(rng.integers(1, 9)), 16), dtype=np.float32)
            try:
                out = self.client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"]
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.answers += 1
                self.wrong += not np.array_equal(out, x)

    def wait_for(self, answers: int) -> None:
        wait_for(
            lambda: self.answers >= answers,
            timeout_s=BACK_WITHIN_S,
            what=lambda: f"{answers} answers ({self.answers}; errors: {self.errors})",
        )

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.client.close()


@pytest.fixture
def ray_beside(
    supervised: tuple[LocalTritonServer, list[ServerEvent]], ray_local: str
) -> Iterator[None]:
    """The shared local Ray; the node actor the test made on its Triton ends with it."""
    try:
        yield
    finally:
        end_node_actor()


def test_a_crashed_triton_comes_back_under_load_and_every_answer_is_exact(
    supervised: tuple[LocalTritonServer, list[ServerEvent]], ray_beside: None
) -> None:
    import ray

    from ray_triton_shm import NodeBatching
    from ray_triton_shm.ray import ShmModel, get_node_actor

    server, events = supervised
    ports = (server.grpc_port, server.http_port, server.metrics_port)
    # The Ray callers' calls merged on the node (node batching), the load's each its own.
    batching = NodeBatching(force=True, max_delay_s=0.01)
    model = ShmModel(
        "identity", url=server.grpc_url, pool_size=4, max_shapes=SHAPES, node_batching=batching
    )

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Caller:
        def __init__(self, seed: int) -> None:
            self._seed, self._stop = seed, threading.Event()
            self.answered = 0

        def count(self) -> int:
            return self.answered

        def loop(self) -> tuple[int, int, list[str]]:
            rng, answers, wrong, errors = np.random.default_rng(self._seed), 0, 0, []
            while not self._stop.is_set():
                x = rng.random((int(rng.integers(1, 9)), 16), dtype=np.float32)
                try:
                    out = model.infer({"INPUT0": x})["OUTPUT0"]
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                answers += 1
                self.answered = answers
                wrong += not np.array_equal(out, x)
            model.close()
            return answers, wrong, errors

        def stop(self) -> None:
            self._stop.set()

    callers = [Caller.remote(seed) for seed in range(100, 104)]  # type: ignore[attr-defined]
    loops = [caller.loop.remote() for caller in callers]
    load = _Load(server.grpc_url, callers=4)
    downs = []
    try:
        # Every caller under way before the first crash (their processes start one by one).
        wait_for(
            lambda: all(ray.get([c.count.remote() for c in callers])),
            timeout_s=60,
            what="an answer to every Ray caller",
        )
        for number, sig in enumerate((signal.SIGABRT, signal.SIGSEGV), start=1):
            load.wait_for(load.answers + 50)  # answers before the crash
            pid = server.pid
            assert pid is not None
            os.kill(pid, sig)
            downs.append(_wait_back(server, number))
            assert server.pid not in (None, pid)
        load.wait_for(load.answers + 50)  # and after the last restart
    finally:
        for caller in callers:
            caller.stop.remote()
        results = ray.get(loops, timeout=120)
        load.stop()

    print(f"back after {', '.join(f'{d:.2f} s' for d in downs)}")
    assert load.wrong == 0 and load.answers > 100, load.errors[:3]
    assert not load.errors, load.errors[:3]  # each call rode through: it waited and resent
    for answers, wrong, errors in results:
        assert wrong == 0 and answers > 0 and not errors, errors[:3]
    assert (server.grpc_port, server.http_port, server.metrics_port) == ports
    abort, segv = server.crashes
    assert abort.reason.startswith("SIGABRT") and segv.reason.startswith("SIGSEGV")
    assert "Signal (6) received" in abort.log_tail and "Signal (11) received" in segv.log_tail
    assert [e.kind for e in events] == ["crashed", "restarted"] * 2
    assert server.failure is None
    actor = get_node_actor(url=server.grpc_url)
    # The actor sees Triton live again at its next look, which may come after the answers.
    wait_for(lambda: ray.get(actor.stats.remote()).triton_up, what="the node actor seeing Triton")
    ray.get(get_node_actor(url=server.grpc_url).shutdown.remote())
    # Nothing leaks: no region of ours registered; no process of a crashed server left; the
    # Python-backend regions of every server gone with them.
    assert not our_regions() & set(registered_on(server.grpc_url))
    prefix = server._shm_prefix
    server.close()
    for crash in server.crashes:
        assert not _group_alive(crash.pid)
    assert not [p for p in SHM_DIR.iterdir() if p.name.startswith(prefix)]


def test_the_node_actor_counts_restarts_from_the_registrations_triton_lost(
    supervised: tuple[LocalTritonServer, list[ServerEvent]], ray_beside: None
) -> None:
    """A restart as fast as the embedded Triton's (well under the actor's look at its
    liveness, every second) is counted from its proof: Triton lost every registration of the
    node. The actor registers its regions again itself, with no call, and counts each restart
    once, whether it or a caller found the loss first."""
    import ray

    from ray_triton_shm.ray import ShmModel, get_node_actor

    server, _ = supervised
    model = ShmModel("identity", url=server.grpc_url, pool_size=2, max_shapes=SHAPES)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
    actor = get_node_actor(url=server.grpc_url)

    def registered() -> set[str]:
        return our_regions() & set(registered_on(server.grpc_url))

    def restarts() -> int:
        return int(ray.get(actor.stats.remote()).triton_restarts)

    assert registered() and restarts() == 0
    for number in (1, 2):
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGABRT)
        _wait_back(server, number)
        if number == 2:  # a caller finds the loss first, and the actor registers again
            np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
        wait_for(registered, what="the node's regions registered again")
        wait_for(lambda n=number: restarts() == n, what=f"restart {number} counted")
    for _ in range(3):  # later looks of the actor's find nothing lost: no count more
        stats = ray.get(actor.stats.remote())
        np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
    assert stats.triton_up and restarts() == 2
    model.close()


def test_repeated_crashes_past_the_limit_give_up_naming_the_log(tmp_path: Path) -> None:
    events: list[ServerEvent] = []
    with local_triton(
        model_repository(tmp_path / "models", "identity"),
        max_crashes=2,
        on_event=events.append,
    ) as server:
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGABRT)
        _wait_back(server, 1)
        second = server.pid
        assert second is not None
        os.kill(second, signal.SIGABRT)
        wait_for(lambda: server.failure, timeout_s=BACK_WITHIN_S, what="the supervisor to give up")
        assert [e.kind for e in events] == ["crashed", "restarted", "gave_up"]
        log = server.crashes[-1].log_path
        assert "crashed 2 times within 60 s; the supervisor gave up" in server.failure
        assert str(log) in server.failure and str(log) == events[-1].error.split("Log: ")[-1]
        assert not server.is_running and not server.is_restarting
        for pid in (first, second):
            assert not _group_alive(pid)  # no tritonserver, no stub left running
    # The evidence outlives the server (its temporary directory is gone).
    assert log.is_file() and "Signal (6) received" in log.read_text()
    log.unlink()


def test_restarts_off_leave_the_server_down_with_its_reason(tmp_path: Path) -> None:
    with local_triton(
        model_repository(tmp_path / "models", "identity"),
        log_path=tmp_path / "tritonserver.log",
        restart_on_crash=False,
    ) as server:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSEGV)
        wait_for(lambda: server.failure, timeout_s=BACK_WITHIN_S, what="the supervisor to give up")
        assert server.failure.startswith("tritonserver crashed (restarts are off)")
        assert "SIGSEGV" in server.failure and not server.is_running
        server.start()  # a start by hand brings it back
        assert server.is_running and server.failure is None


def test_a_log_that_failed_to_start_is_kept(tmp_path: Path) -> None:
    """A server that exits during its start names a log that still exists."""
    from ray_triton_shm import LocalServerError

    broken = tmp_path / "models" / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    (broken / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('broken on purpose: no weights.bin')\n"
    )
    server = LocalTritonServer(broken.parent, startup_timeout_s=60)
    with pytest.raises(LocalServerError) as error:
        server.start()
    server.close()
    log = server.log_path
    assert f"(log: {log})" in str(error.value) and log.is_file()
    # The lines with the reason, not the tables of options that end the log.
    message = str(error.value)
    assert "its log says:" in message and "| Option" not in message, message
    assert "failed to load 'broken' version 1" in message, message
    assert "RuntimeError: broken on purpose: no weights.bin" in message, message
    assert f"{broken / '1' / 'model.py'}(3): initialize" in message, message
    assert "error: creating server" in message, message
    log.unlink()


def test_the_reason_lines_are_the_errors_the_exception_and_the_traceback() -> None:
    log = (
        'I1127 05:26:09.100000 4016 server.cc:10] "starting"\n'
        'E1127 05:26:09.123456 4016 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        'E1127 05:26:09.1 4016 model.cc:12] "failed: ValueError: x\\n\\nAt:\\n  m.py(7): f\\n"\n'
        'E1127 05:26:09.2 4016 model.cc:13] "again: ValueError: x\\n\\nAt:\\n  m.py(7): f\\n"\n'
        "Traceback (most recent call last):\n"
        '  File "model.py", line 3, in <module>\n'
        "ModuleNotFoundError: No module named 'torch'\n"
        'I1127 05:26:09.300000 4016 server.cc:11] "+--------+ a table"\n'
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  bad\n"
        "| Option | Value |\n"
        "error: creating server: Internal - failed to load all models\n"
    )
    assert reason_lines(log) == [
        "failed: ValueError: x",
        "At:",
        "  m.py(7): f",
        "again: ValueError: x",
        "Traceback (most recent call last):",
        '  File "model.py", line 3, in <module>',
        "ModuleNotFoundError: No module named 'torch'",
        "terminate called after throwing an instance of 'std::runtime_error'",
        "  what():  bad",
        "error: creating server: Internal - failed to load all models",
    ]
    assert reason_lines(log, limit=2) == ["failed: ValueError: x", "At:"]
    assert reason_lines("I1127 05:26:09.1 1 a.cc:1] fine\n| Option |\n") == []


def test_a_kill_ends_the_server_at_once_and_is_no_crash(tmp_path: Path) -> None:
    events: list[ServerEvent] = []
    with local_triton(
        model_repository(tmp_path / "models", "identity"), on_event=events.append
    ) as server:
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not server.is_running and not _group_alive(pid)
        assert server.crashes == () and events == [] and server.failure is None
        assert not [p for p in SHM_DIR.iterdir() if p.name.startswith(server._shm_prefix)]
        server.start()  # and it starts again
        assert server.is_running
