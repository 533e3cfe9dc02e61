"""The chaos soak: many callers on few slots, every answer checked against its own request,
while deadlines, cancellations, killed callers, a Triton restart and a node actor kill happen.

Triton keeps running a request whose client gave up (deadline, cancellation, death) and writes
its outputs into the request's slot when it is done. The library must never hand that slot to
another request before then, or that request may answer with the abandoned one's bytes. Every
request here carries DATA of its own: its caller's tag and its sequence number lead it, then a
pattern of both, in a length of its own. An answer is compared exactly with its own input; one
holding anything else is a wrong answer, and its leading elements say whose bytes it holds.

Callers: threads (``TritonSHMClient.infer_shm``) and coroutines (``infer_shm_async``) of this
process on a client pool of 2 slots, streams of the streaming model ``captioner`` from threads
and coroutines of this process on a pool of 2 slots (a stream's responses, put end to end, echo
its request's DATA; some streams are given up early, a cancellation), and Ray caller
processes (``ShmModel.infer`` in a thread, ``infer_async`` in coroutines) on the node actor's
4 slots. Faults, at random: client deadlines
on about 1 request in 4 (which sleep 0 to 250 ms evenly, so most deadlines expire while
Triton still runs them), coroutine cancellations (``asyncio.wait_for`` and ``Task.cancel``),
SIGKILL of Ray caller processes mid-request (each replaced), and, once each in the middle, a
Triton restart and a node actor kill (Ray restarts it). Errors those faults explain are counted
by kind; any other error fails the test.

Runs 25 s; ``pytest tests/test_soak.py --soak-s=600`` runs it longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import registered_on, wait_for
from ray import cloudpickle
from ray.exceptions import RayActorError

import ray_triton_shm
from ray_triton_shm import (
    ClientClosedError,
    ServerUnreachableError,
    StreamInterruptedError,
    TritonServerError,
    TritonSHMClient,
    TritonSHMError,
)
from ray_triton_shm.local._server import LocalTritonServer
from ray_triton_shm.ray import RegionReplacedError, ShmModel, get_node_actor

# Ship this module's actor class and helpers by value (workers cannot import the test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODEL = "delay_echo"
#: The streaming model, and its client pool's slots: fewer than its callers.
STREAM_MODEL = "captioner"
STREAM_SLOTS = 2
STREAM_THREADS = 2
STREAM_COROUTINES = 2
#: Most responses a stream asks for (4 values of DATA each).
MAX_RESPONSES = 64
#: Share of streams given up after a random number of responses.
GIVE_UP_SHARE = 1 / 6
#: Longest DATA; each request draws its own length in [2, MAX_LEN].
MAX_LEN = 1024
SHAPES = {"DATA": (MAX_LEN,), "ECHO": (MAX_LEN,)}
#: Slots of this process's client pool, and of the node actor: fewer than the callers of each.
CLIENT_SLOTS = 2
NODE_SLOTS = 4
DRIVER_THREADS = 4
DRIVER_COROUTINES = 4
RAY_CALLERS = 3
#: Per Ray caller process: one thread calling ``infer`` and this many coroutines.
RAY_COROUTINES = 2
#: Share of requests with a client deadline, and the range it is drawn from (seconds).
DEADLINE_SHARE = 0.25
DEADLINE_RANGE_S = (0.02, 0.2)
#: The deadlines of the Ray callers' ``ShmModel`` handles (one handle per deadline).
RAY_DEADLINES_S = (0.03, 0.08, 0.15)
#: Share of coroutine requests cancelled, and after how long (seconds).
CANCEL_SHARE = 1 / 6
CANCEL_RANGE_S = (0.005, 0.2)
#: Seconds between kills of a Ray caller (on average; each interval drawn from 0.5x to 1.5x).
CALLER_KILL_EVERY_S = 8.0
#: Right answers the soak must reach per second beyond its first RESTART_ALLOWANCE_S seconds
#: (about what the Triton restart stalls every caller for). Seen on a 2-core machine: ~48/s
#: (2,853 in 60 s; 30,599 in 540 s), most of it spent in the model's chosen delays.
MIN_CHECKED_PER_S = 35
RESTART_ALLOWANCE_S = 15.0

#: Tags: driver threads 1.., driver coroutines 101.., stream threads 201.., stream coroutines
#: 301.., Ray caller k: 1000 + 10 * k + i.
DRIVER_THREAD_TAG = 1
DRIVER_COROUTINE_TAG = 101
STREAM_THREAD_TAG = 201
STREAM_COROUTINE_TAG = 301
RAY_TAG_BASE = 1000
RAY_TAG_STRIDE = 10

#: The library's errors that the faults explain, by the kind they are counted as.
EXPECTED_KINDS = ("deadline", "unreachable", "rebind", "closed", "interrupted")


# --------------------------------------------------------------------------------------
# Requests and their outcomes
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request: DATA unique to it, and how long the model sleeps before echoing it."""

    tag: int
    seq: int
    delay_ms: int
    data: np.ndarray

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The model's inputs."""
        return {"DELAY_MS": np.array([self.delay_ms], np.int32), "DATA": self.data}


def make_request(tag: int, seq: int, rng: np.random.Generator, *, slow: bool = False) -> Request:
    """A request of caller ``tag``: DATA leads with ``(tag, seq)``, then a pattern of both.

    Every value is an integer below 2**24, exact in float32. DELAY_MS is drawn from 0 to
    250 ms: evenly when ``slow`` (a request with a deadline, which then mostly expires while
    Triton still runs it); otherwise 0 for about a third, up to 20 ms for most others, and
    longer for a fifth, so that there are many requests.
    """
    if not (0 <= tag < 2**24 and 0 <= seq < 2**24):
        raise ValueError(f"tag {tag} or seq {seq} does not fit a float32 exactly")
    length = int(rng.integers(2, MAX_LEN + 1))
    values = (tag * 7919 + seq * 104729 + np.arange(length, dtype=np.int64)) % 2**24
    values[0], values[1] = tag, seq
    draw = rng.random()
    if slow:
        delay_ms = int(rng.integers(0, 251))
    elif draw < 0.35:
        delay_ms = 0
    elif draw < 0.8:
        delay_ms = int(rng.integers(1, 21))
    else:
        delay_ms = int(rng.integers(21, 251))
    return Request(tag, seq, delay_ms, values.astype(np.float32))


def draw_deadline(rng: np.random.Generator) -> float | None:
    """A client deadline for about one request in four, else ``None``."""
    if rng.random() >= DEADLINE_SHARE:
        return None
    return float(rng.uniform(*DEADLINE_RANGE_S))


def classify(exc: BaseException, *, deadline: bool) -> str:
    """The kind of an error: one of :data:`EXPECTED_KINDS`, or ``"unexpected"``."""
    if isinstance(exc, ServerUnreachableError):
        return "unreachable"  # Triton restarting took longer than reconnect_timeout_s
    if isinstance(exc, StreamInterruptedError) and exc.status != "StatusCode.DEADLINE_EXCEEDED":
        return "interrupted"  # Triton restarted after a response of the stream
    if (
        deadline
        and isinstance(exc, TritonServerError)
        and exc.status == "StatusCode.DEADLINE_EXCEEDED"
    ):
        return "deadline"
    if isinstance(exc, (RegionReplacedError, RayActorError)):
        return "rebind"  # the node actor restarted, and the retry on its new region failed too
    if isinstance(exc, ClientClosedError):
        return "closed"
    return "unexpected"


class EventLog:
    """One line per request outcome, appended to a file with one ``write`` each.

    Lines survive the SIGKILL of their process, and threads never interleave them.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, kind: str, request: Request, detail: str = "") -> None:
        """Records the outcome ``kind`` of ``request``; ``detail`` is flattened to one line."""
        detail = " ".join(detail.split())[:500]
        line = f"{kind} {request.tag} {request.seq} {time.time():.3f} {detail}\n"
        os.write(self._fd, line.encode())

    def answer(self, request: Request, outputs: dict[str, np.ndarray]) -> None:
        """Checks an answer exactly against the request's own DATA and records the result."""
        echo = outputs.get("ECHO")
        if (
            isinstance(echo, np.ndarray)
            and echo.dtype == np.float32
            and echo.shape == request.data.shape
            and np.array_equal(echo, request.data)
        ):
            self.write("ok", request)
            return
        if isinstance(echo, np.ndarray) and echo.size >= 2:
            head = f"{echo.reshape(-1)[0]:.0f},{echo.reshape(-1)[1]:.0f}"
            first_bad = int(np.argmax(echo.reshape(-1)[: request.data.size] != request.data))
            shape = echo.shape
        else:
            head, first_bad, shape = "-", -1, getattr(echo, "shape", None)
        self.write(
            "wrong",
            request,
            f"found={head} shape={shape} expected_len={request.data.size} "
            f"first_bad={first_bad} delay_ms={request.delay_ms}",
        )

    def error(self, request: Request, exc: BaseException, *, deadline: bool) -> None:
        """Records an error by its kind (with the error itself when unexpected)."""
        kind = classify(exc, deadline=deadline)
        self.write(kind, request, repr(exc) if kind == "unexpected" else type(exc).__name__)

    def close(self) -> None:
        """Closes the file."""
        os.close(self._fd)


# --------------------------------------------------------------------------------------
# Callers
# --------------------------------------------------------------------------------------

#: ``infer(request, client_timeout_s)`` of a coroutine caller.
AsyncInfer = Callable[[Request, float | None], Awaitable[dict[str, np.ndarray]]]


@dataclass
class Stream:
    """The requests of one caller: on a tag of its own, drawn from its ``seed`` (some with a
    deadline where ``deadlines``), each logged in ``log``, until ``stop``."""

    deadlines: bool
    tag: int
    seed: int
    log: EventLog
    stop: threading.Event

    def requests(self, rng: np.random.Generator) -> Iterator[tuple[Request, float | None]]:
        """The next request and its deadline, drawn from ``rng``, until :attr:`stop`."""
        seq = 0
        while not self.stop.is_set():
            deadline = draw_deadline(rng) if self.deadlines else None
            yield make_request(self.tag, seq, rng, slow=deadline is not None), deadline
            seq += 1


def thread_caller(
    infer: Callable[[Request, float | None], dict[str, np.ndarray]], stream: Stream
) -> None:
    """Calls ``infer`` in a loop until the stream stops."""
    log = stream.log
    for request, deadline in stream.requests(np.random.default_rng(stream.seed)):
        try:
            outputs = infer(request, deadline)
        except Exception as exc:
            log.error(request, exc, deadline=deadline is not None)
        else:
            log.answer(request, outputs)


async def coroutine_caller(infer: AsyncInfer, stream: Stream) -> None:
    """:func:`thread_caller` for coroutines, which also cancels some of its requests: half of
    them by ``asyncio.wait_for``, half by ``Task.cancel``."""
    rng = np.random.default_rng(stream.seed)
    loop = asyncio.get_running_loop()
    log = stream.log
    for request, deadline in stream.requests(rng):
        cancel_after = float(rng.uniform(*CANCEL_RANGE_S)) if rng.random() < CANCEL_SHARE else None
        if cancel_after is not None and rng.random() < 0.5:
            try:
                outputs = await asyncio.wait_for(infer(request, deadline), cancel_after)
            except Exception as exc:
                # wait_for cancelled the call; SlotTimeoutError is a TimeoutError too.
                if isinstance(exc, TimeoutError) and not isinstance(exc, TritonSHMError):
                    log.write("cancelled", request)
                else:
                    log.error(request, exc, deadline=deadline is not None)
            else:
                log.answer(request, outputs)
            continue
        task = asyncio.ensure_future(infer(request, deadline))
        timer = None if cancel_after is None else loop.call_later(cancel_after, task.cancel)
        await asyncio.wait({task})  # never cancels the task itself
        if timer is not None:
            timer.cancel()
        if task.cancelled():
            log.write("cancelled", request)
        elif task.exception() is not None:
            log.error(request, task.exception(), deadline=deadline is not None)  # type: ignore[arg-type]
        else:
            log.answer(request, task.result())


class GaveUp(Exception):
    """A stream its caller stopped reading early (its request is cancelled in Triton)."""


def stream_request(request: Request) -> tuple[Request, dict[str, np.ndarray]]:
    """The streaming model's inputs for ``request`` (its DATA cut to whole responses, at the
    head of the image; its delay per response its delay in ms times 10, in µs),
    and the request as the echo of its responses must match."""
    count = min(request.data.size // 4, MAX_RESPONSES)
    data = request.data[: 4 * count]
    image = np.zeros(3 * 224 * 224, np.float32)
    image[: data.size] = data
    inputs = {
        "IMAGE": image.reshape(3, 224, 224),
        "COUNT": np.array([count], np.int32),
        "DELAY_US": np.array([request.delay_ms * 10], np.int32),
    }
    return Request(request.tag, request.seq, request.delay_ms, data), inputs


def echoed(responses: list[Any]) -> dict[str, np.ndarray]:
    """A stream's responses end to end, as an ``ECHO`` (responses out of order: no echo)."""
    if any(int(r["TOKEN"][0]) != k or r.index != k for k, r in enumerate(responses)):
        return {"ECHO": np.array([-1, -1], np.float32)}
    features = [r["FEATURE"] for r in responses]
    return {"ECHO": np.concatenate(features) if features else np.empty(0, np.float32)}


def stream_caller(client: TritonSHMClient, stream: Stream) -> None:
    """Streams requests in a loop until the stream stops; gives some up early."""
    rng, log = np.random.default_rng(stream.seed), stream.log
    for drawn, deadline in stream.requests(rng):
        request, inputs = stream_request(drawn)
        give_up = int(rng.integers(0, 4)) if rng.random() < GIVE_UP_SHARE else None
        responses: list[Any] = []
        try:
            for response in client.stream(STREAM_MODEL, inputs, client_timeout_s=deadline):
                responses.append(response)
                if len(responses) == give_up:
                    raise GaveUp
        except GaveUp:
            log.write("cancelled", request)
        except Exception as exc:
            log.error(request, exc, deadline=deadline is not None)
        else:
            log.answer(request, echoed(responses))


async def stream_coroutine(client: TritonSHMClient, stream: Stream) -> None:
    """:func:`stream_caller` for coroutines: a stream given up is closed (``aclose``)."""
    rng, log = np.random.default_rng(stream.seed), stream.log
    for drawn, deadline in stream.requests(rng):
        request, inputs = stream_request(drawn)
        give_up = int(rng.integers(0, 4)) if rng.random() < GIVE_UP_SHARE else None
        responses: list[Any] = []
        streamed = client.stream_async(STREAM_MODEL, inputs, client_timeout_s=deadline)
        try:
            async for response in streamed:
                responses.append(response)
                if len(responses) == give_up:
                    raise GaveUp
        except GaveUp:
            await streamed.aclose()  # type: ignore[attr-defined]
            log.write("cancelled", request)
        except Exception as exc:
            log.error(request, exc, deadline=deadline is not None)
        else:
            log.answer(request, echoed(responses))


def shm_model(url: str, client_timeout_s: float | None = None) -> ShmModel:
    """A handle to the model on the node's slots, with a client deadline if given."""
    options = {} if client_timeout_s is None else {"client_timeout_s": client_timeout_s}
    return ShmModel(MODEL, url=url, pool_size=NODE_SLOTS, max_shapes=SHAPES, **options)


@ray.remote(num_cpus=0)
class RayCaller:
    """A caller process: one thread calling ``ShmModel.infer`` and :data:`RAY_COROUTINES`
    coroutines calling ``infer_async``, each on a tag of its own, until told to stop.

    About one request in four goes through a handle with a client deadline (when
    ``ShmModel`` takes one).
    """

    def __init__(self, url: str, tag_base: int, log_path: str, seed: int) -> None:
        self._tag_base = tag_base
        self._seed = seed
        self._log = EventLog(Path(log_path))
        self._plain = shm_model(url)
        self._timed = [shm_model(url, timeout_s) for timeout_s in RAY_DEADLINES_S]
        self._rng = np.random.default_rng(seed - 1)
        self._stop = threading.Event()

    def library(self) -> str:
        """Where this process imported ``ray_triton_shm`` from."""
        return ray_triton_shm.__file__  # type: ignore[return-value]

    def pid(self) -> int:
        """The caller's process id."""
        return os.getpid()

    def stop(self) -> None:
        """Makes every loop end after its current request."""
        self._stop.set()

    def _model(self, deadline: float | None) -> ShmModel:
        """The plain handle, or (for a request that drew a deadline) one with a deadline."""
        if deadline is None:
            return self._plain
        return self._timed[int(self._rng.integers(len(self._timed)))]

    async def run(self) -> None:
        """Runs every caller of the process until :meth:`stop`, then closes the handles."""
        deadlines = True

        def infer(request: Request, deadline: float | None) -> dict[str, np.ndarray]:
            return self._model(deadline).infer(request.inputs)

        async def infer_async(request: Request, deadline: float | None) -> dict[str, np.ndarray]:
            return await self._model(deadline).infer_async(request.inputs)

        def stream(i: int) -> Stream:
            return Stream(deadlines, self._tag_base + i, self._seed + i, self._log, self._stop)

        thread = threading.Thread(target=thread_caller, args=(infer, stream(0)), daemon=True)
        thread.start()
        await asyncio.gather(
            *(coroutine_caller(infer_async, stream(i)) for i in range(1, RAY_COROUTINES + 1))
        )
        await asyncio.to_thread(thread.join)
        for model in [self._plain, *self._timed]:
            model.close()
        self._log.close()


# --------------------------------------------------------------------------------------
# The soak
# --------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Every outcome of every log, and the wrong answers and unexpected errors in full."""

    counts: Counter[str] = field(default_factory=Counter)
    #: Outcome of every request that logged one, by ``(tag, seq)``.
    outcomes: dict[tuple[int, int], str] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, paths: list[Path]) -> Tally:
        """Reads the logs; a line cut short by a SIGKILL is left out."""
        tally = cls()
        for path in paths:
            if not path.exists():
                continue  # a caller killed before it opened its log
            for line in path.read_text().splitlines(keepends=True):
                if not line.endswith("\n"):
                    continue
                kind, tag, seq, _, detail = (line.rstrip("\n").split(" ", 4) + [""])[:5]
                tally.counts[kind] += 1
                tally.outcomes[int(tag), int(seq)] = kind
                if kind == "wrong":
                    tally.wrong.append(f"{tag},{seq}: {detail}")
                elif kind not in ("ok", "cancelled", *EXPECTED_KINDS):
                    tally.unexpected.append(f"{kind} {tag},{seq}: {detail}")
        return tally

    def wrong_by_cause(self, killed_tag_bases: set[int]) -> Counter[str]:
        """Wrong answers by what became of the request whose bytes they held."""
        causes: Counter[str] = Counter()
        for entry in self.wrong:
            own, _, detail = entry.partition(": ")
            pool = "client pool" if int(own.split(",")[0]) < RAY_TAG_BASE else "node slots"
            found = detail.split()[0].removeprefix("found=")
            try:
                tag, seq = (int(float(v)) for v in found.split(","))
            except ValueError:  # no data, or not numbers a request could have sent
                causes[f"{pool}: unknown bytes ({found})"] += 1
                continue
            if f"{tag},{seq}" == own:
                cause = "its own bytes, corrupted"
            elif (tag, seq) in self.outcomes:
                cause = f"a request that ended in {self.outcomes[tag, seq]}"
            elif tag - tag % RAY_TAG_STRIDE in killed_tag_bases:
                cause = "a request of a killed caller"
            else:
                cause = "unknown bytes"
            causes[f"{pool}: {cause}"] += 1
        return causes


@dataclass
class Caller:
    """A Ray caller process the soak started."""

    actor: Any
    tag_base: int
    log: Path
    pid: int
    run: Any


class Soak:
    """The soak's callers and faults, on one Triton, one local Ray and its node actor."""

    def __init__(self, triton: LocalTritonServer, logs: Path, seed: int) -> None:
        self.triton = triton
        self.url = triton.grpc_url
        self.logs = logs
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.stop = threading.Event()
        self.faults: Counter[str] = Counter()
        self.callers: list[Caller] = []
        self.killed_tag_bases: set[int] = set()
        #: Every process of the test that may own a region, and what it is.
        self.roles: dict[int, str] = {os.getpid(): "the test process"}
        self.problems: list[str] = []
        self._threads: list[threading.Thread] = []
        self._log: EventLog | None = None
        self._next_caller = 0
        self.node = get_node_actor(url=self.url, slots=NODE_SLOTS)
        first = ray.get(self.node.stats.remote(), timeout=120)
        self.node_pids = [first.pid]
        self.incarnations = [first.incarnation]
        self.roles[first.pid] = "the node actor (incarnation 1, killed)"
        self.client = TritonSHMClient(url=self.url)
        self.client.register_shm_model(MODEL, max_shapes=SHAPES, pool_size=CLIENT_SLOTS)
        self.client.register_shm_model(STREAM_MODEL, pool_size=STREAM_SLOTS)

    # ---------------------------------------------------------------- callers

    def start_ray_caller(self) -> Caller:
        """Starts a Ray caller process with tags of its own."""
        index = self._next_caller
        self._next_caller += 1
        tag_base = RAY_TAG_BASE + RAY_TAG_STRIDE * index
        log = self.logs / f"ray-{index}.log"
        actor = RayCaller.remote(self.url, tag_base, str(log), int(self.rng.integers(2**31)))
        pid = ray.get(actor.pid.remote(), timeout=120)
        library = ray.get(actor.library.remote(), timeout=60)
        assert library == ray_triton_shm.__file__, f"a Ray caller imported {library}"
        caller = Caller(actor, tag_base, log, pid, actor.run.remote())
        self.callers.append(caller)
        self.roles[pid] = f"Ray caller {index}"
        return caller

    def start_driver_callers(self) -> None:
        """Starts this process's threads and its asyncio loop of coroutines."""
        log = self._log = EventLog(self.logs / "driver.log")
        client = self.client

        def infer(request: Request, deadline: float | None) -> dict[str, np.ndarray]:
            return client.infer_shm(MODEL, request.inputs, client_timeout_s=deadline)

        async def infer_async(request: Request, deadline: float | None) -> dict[str, np.ndarray]:
            return await client.infer_shm_async(MODEL, request.inputs, client_timeout_s=deadline)

        def streamer(tag: int) -> Stream:
            return Stream(True, tag, self.seed + tag, log, self.stop)

        async def coroutines() -> None:
            await asyncio.gather(
                *(
                    coroutine_caller(
                        infer_async,
                        Stream(True, DRIVER_COROUTINE_TAG + i, self.seed + 100 + i, log, self.stop),
                    )
                    for i in range(DRIVER_COROUTINES)
                ),
                *(
                    stream_coroutine(client, streamer(STREAM_COROUTINE_TAG + i))
                    for i in range(STREAM_COROUTINES)
                ),
            )

        self._threads = [
            threading.Thread(
                target=thread_caller,
                args=(infer, Stream(True, DRIVER_THREAD_TAG + i, self.seed + i, log, self.stop)),
                daemon=True,
            )
            for i in range(DRIVER_THREADS)
        ]
        self._threads += [
            threading.Thread(
                target=stream_caller, args=(client, streamer(STREAM_THREAD_TAG + i)), daemon=True
            )
            for i in range(STREAM_THREADS)
        ]
        self._threads.append(
            threading.Thread(target=asyncio.run, args=(coroutines(),), daemon=True)
        )
        for thread in self._threads:
            thread.start()

    @staticmethod
    def wait_logging(callers: list[Caller], timeout_s: float = 120) -> None:
        """Waits until each caller answered (or failed) at least one request."""
        wait_for(
            lambda: all(c.log.exists() and c.log.stat().st_size for c in callers),
            timeout_s=timeout_s,
            every_s=0.1,
            what="every Ray caller to get going",
        )

    # ---------------------------------------------------------------- faults

    def kill_a_caller(self) -> None:
        """SIGKILLs a Ray caller that is making requests, and starts another in its place."""
        going = [c for c in self.callers if c.log.exists() and c.log.stat().st_size]
        if not going:
            return
        victim = going[int(self.rng.integers(len(going)))]
        os.kill(victim.pid, signal.SIGKILL)
        self.callers.remove(victim)
        self.killed_tag_bases.add(victim.tag_base)
        self.faults["caller kills"] += 1
        self.start_ray_caller()

    def restart_triton(self) -> None:
        """Stops Triton (its registrations go with it) and starts it on the same ports."""
        self.triton.restart()
        self.faults["Triton restarts"] += 1

    def kill_node_actor(self) -> None:
        """Kills the node actor (Ray restarts it) and waits for its next incarnation."""
        before = ray.get(self.node.stats.remote(), timeout=60)
        if before.incarnation != self.incarnations[-1]:
            self.problems.append(
                f"the node actor restarted before it was killed ({self.incarnations[-1]} -> "
                f"{before.incarnation})"
            )
        ray.kill(self.node, no_restart=False)
        self.faults["node actor kills"] += 1

        def restarted() -> Any:
            """The stats of its next incarnation, once that answers (``None`` before)."""
            try:
                after = ray.get(self.node.stats.remote(), timeout=10)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                return None
            return after if after.pid != before.pid else None

        after = wait_for(
            restarted, timeout_s=120, every_s=0.1, what="the node actor back after its kill"
        )
        self.node_pids.append(after.pid)
        self.incarnations.append(after.incarnation)
        self.roles[after.pid] = f"the node actor (incarnation {len(self.node_pids)})"

    def schedule(self, soak_s: float) -> list[tuple[float, Callable[[], None]]]:
        """The faults and when (seconds into the soak): one Triton restart and one node actor
        kill, always made, and caller kills at random intervals, made while the soak lasts."""
        events: list[tuple[float, Callable[[], None]]] = [
            (0.35 * soak_s, self.restart_triton),
            (0.7 * soak_s, self.kill_node_actor),
        ]
        at = CALLER_KILL_EVERY_S * float(self.rng.uniform(0.5, 1.5))
        while at < soak_s - 2:
            events.append((at, self.kill_a_caller))
            at += CALLER_KILL_EVERY_S * float(self.rng.uniform(0.5, 1.5))
        return sorted(events, key=lambda event: event[0])

    # ---------------------------------------------------------------- the run

    def run(self, soak_s: float) -> None:
        """Starts every caller, makes the faults on schedule, and stops the callers."""
        for _ in range(RAY_CALLERS):
            self.start_ray_caller()
        self.wait_logging(self.callers)
        self.start_driver_callers()
        started = time.monotonic()
        for at, fault in self.schedule(soak_s):
            now = time.monotonic() - started
            if fault == self.kill_a_caller and now > soak_s - 2:
                continue
            time.sleep(max(0.0, at - now))  # the load itself: the fault's time in the schedule
            fault()
        time.sleep(max(0.0, soak_s - (time.monotonic() - started)))  # the load itself: its length
        self.stop_callers()

    def stop_callers(self) -> None:
        """Stops every caller; one that does not stop, or whose run failed, is a problem."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
            if thread.is_alive():
                self.problems.append(f"a caller thread of the test process hung: {thread.name}")
        self._threads = []
        if self._log is not None:
            self._log.close()
            self._log = None
        for caller in self.callers:
            with contextlib.suppress(RayActorError):
                caller.actor.stop.remote()
        for caller in self.callers:
            try:
                ray.get(caller.run, timeout=180)
            except Exception as exc:
                self.problems.append(f"Ray caller {caller.tag_base} ended with {exc!r}"[:2000])
        for caller in self.callers:
            ray.kill(caller.actor)
        self.callers = []

    def settle_and_close(self) -> dict[str, int]:
        """Closes the client, waits for every node slot to be free (a killed caller's after its
        request ends in Triton), checks the incarnation, and shuts the node actor down.

        Returns the model's node stats (``{}`` when its last incarnation never had it).
        """
        self.client.close()
        seen: list[Any] = []  # the node's stats, the last one last

        def settled() -> bool:
            seen.append(ray.get(self.node.stats.remote(), timeout=60))
            model = seen[-1].models.get(MODEL, {})
            return model.get("in_use", 0) == model.get("waiting", 0) == model.get("abandoned", 0)

        try:
            wait_for(settled, timeout_s=60, every_s=0.1, what="every node slot back")
        except AssertionError:
            self.problems.append(f"node slots never all came back: {seen[-1].models.get(MODEL)}")
        stats = seen[-1]
        model = stats.models.get(MODEL, {})
        if stats.incarnation != self.incarnations[-1]:
            self.problems.append(
                f"the node actor crashed: incarnation {stats.incarnation}, expected "
                f"{self.incarnations[-1]} (the one after the deliberate kill)"
            )
        self.roles.setdefault(stats.pid, "the node actor (last incarnation)")
        ray.get(self.node.shutdown.remote(), timeout=120)
        ray.kill(self.node)
        return model

    def leaks(self, timeout_s: float = 20.0) -> tuple[set[str], list[str]]:
        """Regions still registered in Triton, and ``rtshm_*`` files in ``/dev/shm`` of any
        process of the test, once ``timeout_s`` has passed or there are none."""
        prefixes = tuple(f"rtshm_{pid}-" for pid in self.roles)

        def left() -> tuple[set[str], list[str]]:
            shm = sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefixes))
            return registered_on(self.url), shm

        with contextlib.suppress(AssertionError):  # what is left past the wait is the answer
            wait_for(lambda: left() == (set(), []), timeout_s=timeout_s, every_s=0.1)
        return left()

    def owned(self, name: str) -> str:
        """A region's name, and which process of the test made it (from its name)."""
        pid = name.removeprefix("rtshm_").split("-", 1)[0]
        role = self.roles.get(int(pid)) if pid.isdigit() else None
        return f"{name} (made by {role or 'no process of the test'})"

    def abort(self) -> None:
        """Stops whatever still runs after a failure (Ray and Triton go with their fixtures)."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        with contextlib.suppress(Exception):
            self.client.close()


@pytest.mark.soak
def test_chaos_soak_never_answers_with_another_requests_data(
    ray_on_fresh_triton: LocalTritonServer,
    soak_s: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = secrets.randbits(31)
    logs = tmp_path / "logs"
    logs.mkdir()
    soak = Soak(ray_on_fresh_triton, logs, seed)
    try:
        soak.run(soak_s)
        node = soak.settle_and_close()
    except BaseException:
        soak.abort()
        raise
    registered, files = soak.leaks()
    tally = Tally.read(sorted(logs.glob("*.log")))
    counts = tally.counts
    causes = tally.wrong_by_cause(soak.killed_tag_bases)
    summary = (
        f"soak {soak_s:g} s, seed {seed}: {counts['ok'] + counts['wrong']} answers checked, "
        f"{counts['wrong']} wrong; {counts['deadline']} deadlines, {counts['cancelled']} "
        f"cancellations, {counts['unreachable']} unreachable, {counts['rebind']} rebind errors, "
        f"{counts['closed']} closed, {counts['interrupted']} streams interrupted, "
        f"{len(tally.unexpected)} unexpected errors; "
        f"{soak.faults['caller kills']} caller kills, {soak.faults['Triton restarts']} Triton "
        f"restart(s), {soak.faults['node actor kills']} node actor kill(s), "
        f"{node.get('requests', 0)} requests on the node actor's next incarnation"
    )
    with capsys.disabled():
        print(f"\n{summary}")
        if causes:
            print(f"wrong answers, by whose bytes they held: {dict(causes)}")

    floor = int(MIN_CHECKED_PER_S * max(0.0, soak_s - RESTART_ALLOWANCE_S))
    failures = [
        *(
            [f"{counts['wrong']} wrong answers, by cause {dict(causes)}:", *tally.wrong[:20]]
            if counts["wrong"]
            else []
        ),
        *(f"unexpected error: {entry}" for entry in tally.unexpected[:20]),
        *soak.problems,
        *([f"only {counts['ok']} right answers (floor {floor})"] if counts["ok"] < floor else []),
        *(
            ["no Ray caller rebound to the node actor's next incarnation"]
            if not node.get("requests")
            else []
        ),
        *(f"still registered in Triton: {soak.owned(name)}" for name in sorted(registered)),
        *(f"left in /dev/shm: {soak.owned(name)}" for name in files),
    ]
    assert soak.faults["Triton restarts"] == 1 and soak.faults["node actor kills"] == 1
    assert not failures, summary + "\n" + "\n".join(failures)
