"""What every path is: a :class:`BenchPath` (one way of getting a request to Triton), the
:class:`BenchTarget` it sends to, how it says it cannot run here (:class:`SkipPath`), and
the check of its answers against the reference; for a streaming model, its requests with the
responses each must get (:class:`StreamRequest`), and a stream timed with every response
checked (:func:`time_stream`)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import BY_VALUE, STREAM_VARIANTS
from ray_triton_shm._bench._load import (
    OpenLoop,
    StreamSlice,
    StreamTimes,
    run_closed_loop,
    run_open_loop,
)
from ray_triton_shm._defaults import DEFAULT_RECONNECT_TIMEOUT_S

__all__ = ["BenchPath", "BenchTarget", "SkipPath", "StreamRequest", "check_outputs"]
__all__ += ["time_stream", "time_stream_async"]


class SkipPath(Exception):
    """Raised by ``BenchPath.setup`` when the path cannot run here (e.g. no HTTP endpoint):
    like ``unittest.SkipTest``, the runner records why, and it never leaves the bench."""


def check_outputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> None:
    """Raises ``AssertionError``, saying how, if the outputs are not the reference's."""
    for name, expected in reference.items():
        got = _on_host(outputs.get(name))  # a missing output: shape (), dtype object
        if got.shape != expected.shape or got.dtype != expected.dtype:
            wanted = f"{expected.shape} {expected.dtype}"
            raise AssertionError(f"output {name}: got {got.shape} {got.dtype}, not {wanted}")
        if not np.array_equal(got, expected, equal_nan=np.issubdtype(expected.dtype, np.floating)):
            raise AssertionError(f"output {name}: values differ from the gRPC reference")


@dataclasses.dataclass(frozen=True)
class StreamRequest:
    """One request of a streaming model: its ``inputs``, and the ``responses`` it must get,
    in order (each its outputs by name: tritonclient's answer to it, and for the example
    model its rule's too)."""

    inputs: Mapping[str, np.ndarray]
    responses: tuple[Mapping[str, np.ndarray], ...]

    def check(self, index: int, response: Mapping[str, Any]) -> None:
        """Raises ``AssertionError``, saying how, unless ``response`` is this request's
        response ``index``."""
        if index >= len(self.responses):
            raise AssertionError(f"response {index} of a request that gets {len(self.responses)}")
        try:
            check_outputs(response, self.responses[index])
        except AssertionError as exc:
            raise AssertionError(f"response {index}: {exc}") from None

    def check_end(self, count: int) -> None:
        """Raises ``AssertionError`` unless the stream ended after all its responses."""
        if count != len(self.responses):
            raise AssertionError(f"{count} responses, not {len(self.responses)}")


def time_stream(responses: Iterable[Mapping[str, Any]], request: StreamRequest) -> StreamTimes:
    """Iterates ``responses``, one stream of ``request`` (its request sent by the first
    ``next``), checking each (``AssertionError`` at the first wrong one): the seconds to its
    first response and to its end, and its responses."""
    clock = time.perf_counter
    sent, first, count = clock(), None, 0
    for response in responses:
        first = clock() - sent if first is None else first
        request.check(count, response)
        count += 1
    end = clock() - sent
    request.check_end(count)
    return (end if first is None else first), end, count


async def time_stream_async(
    responses: AsyncIterable[Mapping[str, Any]], request: StreamRequest
) -> StreamTimes:
    """:func:`time_stream` of an async iterator."""
    clock = time.perf_counter
    sent, first, count = clock(), None, 0
    async for response in responses:
        first = clock() - sent if first is None else first
        request.check(count, response)
        count += 1
    end = clock() - sent
    request.check_end(count)
    return (end if first is None else first), end, count


def _on_host(value: Any) -> np.ndarray:
    """An output as a NumPy array: a GPU tensor (torch, cupy) is copied to the host."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "cpu"):  # torch
        return np.asarray(value.cpu().numpy())
    if hasattr(value, "get"):  # cupy
        return np.asarray(value.get())
    return np.asarray(value)


@dataclasses.dataclass(frozen=True)
class BenchTarget:
    """The server being benchmarked: its gRPC and HTTP (``None``: unknown, the HTTP path is
    then skipped) endpoints, ``"host:port"``, its process (group) when it runs here, how
    long the paths' requests wait for it while it is unreachable, and how the library's pools
    of the model reach it (``transport``: ``"shm"``, ``"inline"`` by value, ``None`` not
    known) and why (``transport_reason``)."""

    grpc_url: str
    http_url: str | None = None
    server_pid: int | None = None
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S
    transport: str | None = None
    transport_reason: str = ""

    def needs_shm(self, what: str) -> None:
        """Raises :class:`SkipPath` if ``what`` cannot run here: it needs shared memory
        Triton maps, and the library sends the model's tensors by value to this one."""
        if self.transport == BY_VALUE:
            raise SkipPath(
                f"{what} cannot run by value: Triton at {self.grpc_url} cannot map the "
                "bench's /dev/shm (the library's paths run by value there)"
            )


class BenchPath:
    """One way of sending the ``inputs`` of ``case`` to the ``target``, by ``concurrency``
    callers at once (on ``slots`` slots, for the shm paths: default one per caller,
    :data:`~.._config.ELASTIC` a pool that follows its load); its outputs must be the
    ``reference`` (a plain gRPC request's). The Ray paths get the run's Ray ``session``."""

    #: The path's name (``--paths``, tables, the JSON output).
    name: ClassVar[str]
    #: What it is, in a few words.
    label: ClassVar[str]
    #: Whether the path uses the Ray node actor (which then starts afresh for its runs).
    uses_node_actor: ClassVar[bool] = False
    #: Its slices last this many ``--slice-s`` (for requests of hundreds of ms under load).
    slice_factor: ClassVar[float] = 1.0
    #: Its runs take part in at most this many rounds (``None``: all of them).
    max_rounds: ClassVar[int | None] = None
    #: Why its answers are not checked against the reference (``None``: its first one is,
    #: before its numbers count), as the reports say it.
    unchecked: ClassVar[str | None] = None
    #: A streaming model's path: its slices are streams (:meth:`run_stream_slice`), every
    #: response checked against its own request's (:attr:`streams`), :meth:`run_once` too.
    streaming: ClassVar[bool] = False
    #: Whether it runs on a Triton of the bench's own with a ``/dev/shm`` of its own, where
    #: the library sends by value (the runner gives it that Triton as its :attr:`target`).
    elsewhere: ClassVar[bool] = False
    #: Whether each caller sends inputs of its own, every answer checked against the answer
    #: to them (the many-callers case's runs, whose requests are merged: a row of another
    #: caller's would show); else the callers send the same, and the first answers are.
    own_inputs: bool = False
    _client: Any = None

    def __init__(
        self,
        *,
        target: BenchTarget,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray],
        concurrency: int = 1,
        slots: int | None = None,
        session: Any = None,
        streams: Sequence[StreamRequest] = (),
    ) -> None:
        self.target, self.case, self.session = target, case, session
        self.inputs, self.reference = dict(inputs), dict(reference)
        self.concurrency = concurrency
        self.slots = concurrency if slots is None else slots
        self.streams = tuple(streams)

    def setup(self) -> None:
        """Connects, creates and registers regions...; raises ``SkipPath`` if it cannot here."""
        raise NotImplementedError

    def run_once(self) -> Mapping[str, np.ndarray]:
        """Sends one request; returns its outputs by name (arrays the caller may keep)."""
        raise NotImplementedError

    def warm_up(self, seconds: float) -> None:
        """Load for ``seconds`` (a slice, untimed; ``0``: none) once the runs of its group are
        set up, before the rounds."""
        if seconds > 0:
            self.run_slice(seconds)

    def teardown(self) -> None:
        """Releases what ``setup`` acquired, even in part (here: ``_client``); never raises."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        """Every caller sends requests back to back for about ``slice_s`` (at least one);
        returns each caller's request latencies in seconds, and the slice's wall time."""
        return run_closed_loop(self.run_once, self.concurrency, slice_s)

    def run_rate(self, due: np.ndarray, threads: int, give_up_s: float) -> OpenLoop:
        """An open loop (:func:`~.._load.run_open_loop`) of :meth:`run_once`, from now on."""
        return run_open_loop(self.run_once, due, time.perf_counter(), threads, give_up_s)

    def run_stream_slice(self, slice_s: float) -> StreamSlice:
        """A streaming path's slice: every caller runs streams back to back for about
        ``slice_s`` (at least one), each timed, every response checked."""
        raise NotImplementedError

    def stream_requests(self, caller: int) -> tuple[StreamRequest, ...]:
        """The requests of caller ``caller`` (its own :data:`~.._config.STREAM_VARIANTS`,
        in turn, of :attr:`streams`): one crossing to another caller's stream shows."""
        count = len(self.streams)
        return tuple(
            self.streams[(caller * STREAM_VARIANTS + i) % count] for i in range(STREAM_VARIANTS)
        )

    @property
    def counted(self) -> tuple[str, str]:
        """Where Triton counts this path's requests (its statistics): the gRPC URL of its
        Triton, and the model its requests go to."""
        return self.target.grpc_url, self.case.model

    def cpu_time(self) -> float:
        """CPU seconds used so far by the processes doing this path's client work."""
        return time.process_time()

    def side_cpu_time(self) -> float | None:
        """CPU seconds used so far by the Ray node actor, for paths that use one."""
        return None

    def stats(self) -> dict[str, Any]:
        """Numbers of the path's own for its run, read after the rounds."""
        return {}

    def answers_checked(self) -> int | None:
        """The answers checked so far, each against its own request's (``None``: not each
        one, see :attr:`own_inputs`)."""
        return None
