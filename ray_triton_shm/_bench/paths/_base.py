"""What every path is: a :class:`BenchPath` (one way of getting a request to Triton), the
:class:`BenchTarget` it sends to, how it says it cannot run here (:class:`SkipPath`), and
the check of its answers against the reference."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import BY_VALUE
from ray_triton_shm._bench._load import OpenLoop, run_closed_loop, run_open_loop
from ray_triton_shm._defaults import DEFAULT_RECONNECT_TIMEOUT_S

__all__ = ["BenchPath", "BenchTarget", "SkipPath", "check_outputs"]


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
    ) -> None:
        self.target, self.case, self.session = target, case, session
        self.inputs, self.reference = dict(inputs), dict(reference)
        self.concurrency = concurrency
        self.slots = concurrency if slots is None else slots

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

    def cpu_time(self) -> float:
        """CPU seconds used so far by the processes doing this path's client work."""
        return time.process_time()

    def side_cpu_time(self) -> float | None:
        """CPU seconds used so far by the Ray node actor, for paths that use one."""
        return None

    def stats(self) -> dict[str, Any]:
        """Numbers of the path's own for its run, read after the rounds."""
        return {}
