"""Triton's ``perf_analyzer`` as the bench's ceiling: ``pa-shm`` (``--shared-memory system``,
its inputs written into shared memory once) and ``pa-grpc`` (``none``: by value), by as many
callers as the level (perf_analyzer's concurrency), on the case's batch; on a streaming
(decoupled) model, ``pa-stream-shm`` and ``pa-stream`` alike, with ``--streaming`` and the
first request's inputs as its ``--input-data`` (a raw file per input: a count of responses
must be the case's, not random).

perf_analyzer, in C++, writes its inputs once and never reads its outputs: what it gets from a
Triton over gRPC is the most any client can, and each choice's ratio to the better of the two
says how near it comes (:meth:`~.._results.ModelResult.ceiling`). Its answers are not checked
(:attr:`~._base.BenchPath.unchecked`).

Each slice is a perf_analyzer run of its own, which times its requests itself: three
measurement windows of a third of the slice each (longer where a window would hold fewer than a
few requests), and a stability bound any three windows meet, so that it never loops looking
for stable numbers; its CSV gives the slice's requests per second and latency percentiles
(:class:`~.._load.SliceSummary`). A short run at set-up says whether it can run the model
here (:class:`~._base.SkipPath` saying why if not) and how long a window must be.

With system shared memory, perf_analyzer unregisters every shared-memory region on its Triton,
not only its own, and names its regions after the tensors (two at once on one machine
collide): the ``pa-shm`` runs of this machine take turns (a file lock), and after each the
system regions registered before it are registered again, so that the paths beside it find
theirs.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import itertools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._load import SliceSummary
from ray_triton_shm._bench.paths._base import BenchPath, SkipPath
from ray_triton_shm._exceptions import LocalServerError
from ray_triton_shm._wire._plain_client import tritonclient_for
from ray_triton_shm._wire._tls import TlsFiles
from ray_triton_shm.local._perf_analyzer import PerfAnalyzer, find_perf_analyzer

__all__ = ["PATHS", "STREAM_PATHS", "UNCHECKED", "WINDOWS", "PerfAnalyzerPath"]
__all__ += ["perf_analyzer_args", "write_input_data"]

#: Why the reports say its answers are not checked.
UNCHECKED = "perf_analyzer never reads its outputs"
#: Measurement windows per run: the fewest perf_analyzer judges stability on.
WINDOWS = 3
#: A stability bound (%) any windows with requests in them meet: one run, three windows.
_ANY_STABILITY = 100_000
#: The requests a window should hold at least, at the rate measured at set-up.
_REQUESTS_PER_WINDOW = 3
#: The set-up run's windows (ms), doubled while a window holds no request, up to the most.
_PROBE_WINDOW_MS = 50.0
_MAX_WINDOW_MS = 8_000.0
#: What perf_analyzer says of a window without a request in it.
_EMPTY_WINDOW = "No valid requests recorded"
#: The machine's turns at perf_analyzer with system shared memory.
_LOCK_PATH = Path(tempfile.gettempdir()) / "ray-triton-shm-perf-analyzer.lock"


class _WindowTooShort(Exception):
    """A measurement window held no request."""


def perf_analyzer_args(
    case: ModelCase, url: str, *, shared_memory: str, concurrency: int
) -> list[str]:
    """perf_analyzer's arguments for ``case`` on the Triton at ``url`` (gRPC), by
    ``concurrency`` callers, its inputs in ``shared_memory`` (``"system"`` or ``"none"``); the
    measurement's own come after them.

    Raises:
        SkipPath: The case has BYTES inputs of several lengths (perf_analyzer makes all its
            random strings one length).
    """
    args = ["-m", case.model, "-u", url, "-i", "grpc", "--shared-memory", shared_memory]
    args += ["--concurrency-range", f"{concurrency}:{concurrency}"]
    if case.batched:
        args += ["-b", str(case.batch_size)]
    for t in case.inputs:
        if t.is_variable:
            args += ["--shape", f"{t.name}:{','.join(map(str, t.max_shape))}"]
    lengths = sorted({t.max_element_bytes for t in case.inputs if t.is_bytes})
    if len(lengths) > 1:
        raise SkipPath(
            f"perf_analyzer makes its strings one length, and this case's are {lengths} bytes"
        )
    args += ["--string-length", str(lengths[0])] if lengths else []
    sized = [t for t in case.outputs if t.is_bytes or t.is_variable]
    if shared_memory == "system" and sized:
        # Its regions of outputs of no fixed size: room for a whole request's, at least.
        room = max(t.max_sample_bytes for t in sized) * case.batch_size
        args += ["--output-shared-memory-size", str(room)]
    tls = TlsFiles.from_options({}, None)
    if tls is not None:
        args += ["--ssl-grpc-use-ssl", "true"]
        for flag, path in (
            ("--ssl-grpc-root-certifications-file", tls.root_certificates),
            ("--ssl-grpc-private-key-file", tls.private_key),
            ("--ssl-grpc-certificate-chain-file", tls.certificate_chain),
        ):
            args += [flag, str(path)] if path is not None else []
    return args


def write_input_data(inputs: Mapping[str, Any], directory: Path, *, batched: bool) -> Path:
    """``inputs`` (one request's) as perf_analyzer's ``--input-data`` directory: a file per
    input named after it, the raw bytes of one sample (a BYTES input: a text file, an
    element per line). Returns ``directory``, made."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in inputs.items():
        sample = array[0] if batched else array
        if sample.dtype.kind == "O":
            text = "".join(
                (e.decode() if isinstance(e, bytes) else str(e)) + "\n" for e in sample.flat
            )
            (directory / name).write_text(text)
        else:
            (directory / name).write_bytes(sample.tobytes())
    return directory


def _reason(output: str, returncode: int) -> str:
    """The line of perf_analyzer's output that says why it failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if re.search(r"error|fail|unable|invalid|no valid", line, re.IGNORECASE)
        and not line.startswith("Usage:")
    ]
    said = telling[0] if telling else lines[-1] if lines else ""
    return f"{said[:240]} (exit status {returncode})" if said else f"exit status {returncode}"


def _system_regions(client: Any) -> dict[str, Mapping[str, Any]]:
    """The system shared-memory regions registered on Triton, by name."""
    status = client.get_system_shared_memory_status(as_json=True)
    return dict(status.get("regions", {}))


@contextlib.contextmanager
def _turn_with_regions_kept(url: str, tensors: Sequence[str]) -> Iterator[None]:
    """This machine's turn at perf_analyzer with system shared memory; after it, the system
    regions registered on Triton before are registered again, and the regions perf_analyzer
    left go: those named after the ``tensors`` of its model (``INPUT0_0_0``, ``OUTPUT0``),
    which it leaves now and then even when it ends by itself, and always when killed past its
    time or by Ctrl-C."""

    def left_by_it(name: str) -> bool:
        return any(name == tensor or name.startswith(f"{tensor}_") for tensor in tensors)

    with open(_LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = tritonclient_for(url)
        try:
            try:
                before = _system_regions(client)
            except Exception as exc:
                raise RuntimeError(f"Triton's shared-memory regions unread: {exc}") from None
            try:
                yield
            finally:
                try:
                    after = _system_regions(client)
                except Exception:  # Triton gone (a crash, say): nothing to register again
                    after, before = {}, {}
                for name, region in after.items():
                    if name not in before and left_by_it(name):
                        with contextlib.suppress(Exception):
                            client.unregister_system_shared_memory(name)
                        with contextlib.suppress(OSError):
                            os.unlink(Path("/dev/shm") / str(region["key"]).lstrip("/"))
                for name, region in before.items():
                    if name not in after:
                        with contextlib.suppress(Exception):  # its owner may have gone
                            client.register_system_shared_memory(
                                name,
                                region["key"],
                                int(region["byte_size"]),
                                offset=int(region.get("offset", 0)),
                            )
        finally:
            client.close()
            fcntl.flock(lock, fcntl.LOCK_UN)


class PerfAnalyzerPath(BenchPath):
    """perf_analyzer on the case, its inputs in :attr:`shared_memory` (see the module doc)."""

    #: perf_analyzer's ``--shared-memory``.
    shared_memory: ClassVar[str]
    unchecked = UNCHECKED
    _dir: Path | None = None

    def _streaming_args(self) -> list[str]:
        """perf_analyzer's options for the model's kind: none here (see
        :class:`PerfAnalyzerStreamPath`)."""
        if self.case.streaming:
            raise SkipPath(f"{self.name} runs on a model that answers once: see pa-stream")
        return []

    def setup(self) -> None:
        if self.shared_memory == "system":
            self.target.needs_shm("perf_analyzer --shared-memory system")
        try:
            self._perf_analyzer: PerfAnalyzer = find_perf_analyzer()
        except LocalServerError as exc:
            raise SkipPath(str(exc)) from None
        self._dir = Path(tempfile.mkdtemp(prefix="rtsbench-pa-"))
        self._args = perf_analyzer_args(
            self.case,
            self.target.grpc_url,
            shared_memory=self.shared_memory,
            concurrency=self.concurrency,
        )
        self._args += self._streaming_args()
        if self.shared_memory == "system":
            client = tritonclient_for(self.target.grpc_url)
            try:
                cuda = client.get_cuda_shared_memory_status(as_json=True).get("regions")
            except Exception:  # unreachable, say: the run below says why
                cuda = None
            finally:
                client.close()
            if cuda:
                raise SkipPath(
                    "Triton has CUDA shared-memory regions, which perf_analyzer would "
                    "unregister and the bench could not register again"
                )
        self._runs = itertools.count()
        # A short run: whether it runs here, and the window that holds a few requests.
        window_ms = _PROBE_WINDOW_MS
        while True:
            try:
                probe = self._measure(window_ms)
                break
            except _WindowTooShort:
                if 2 * window_ms > _MAX_WINDOW_MS:
                    raise SkipPath(
                        f"perf_analyzer: no request completed in a window of {window_ms:.0f} ms"
                    ) from None
                window_ms *= 2
            except RuntimeError as exc:
                raise SkipPath(str(exc)) from None
        self._floor_ms = _REQUESTS_PER_WINDOW * 1e3 * probe.wall_s / probe.requests

    def measure_slice(self, slice_s: float) -> SliceSummary:
        """A run of about ``slice_s`` (its windows: longer where a third of it would hold
        fewer than a few requests, see the module doc).

        Raises:
            RuntimeError: perf_analyzer failed, or a window held no request even when twice
                as long.
        """
        window_ms = max(slice_s * 1e3 / WINDOWS, self._floor_ms)
        try:
            return self._measure(window_ms)
        except _WindowTooShort:
            self._floor_ms = 2 * window_ms  # for the slices after it too
            try:
                return self._measure(self._floor_ms)
            except _WindowTooShort:
                raise RuntimeError(
                    f"perf_analyzer: no request completed in a window of {self._floor_ms:.0f} ms"
                ) from None

    def _measure(self, window_ms: float) -> SliceSummary:
        """One perf_analyzer run of :data:`WINDOWS` windows of ``window_ms``.

        Raises:
            _WindowTooShort: A window held no request.
            RuntimeError: perf_analyzer failed, saying why.
        """
        assert self._dir is not None
        report = self._dir / f"run-{next(self._runs)}.csv"
        args = [*self._args, "-p", str(round(window_ms)), "--max-trials", str(WINDOWS)]
        args += ["--stability-percentage", str(_ANY_STABILITY), "-f", str(report)]
        timeout_s = 30.0 + 4 * WINDOWS * window_ms / 1e3
        turn: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self.shared_memory == "system":
            tensors = [t.name for t in (*self.case.inputs, *self.case.outputs)]
            turn = _turn_with_regions_kept(self.target.grpc_url, tensors)
        try:
            with turn:
                done = self._perf_analyzer.run(args, timeout_s=timeout_s, cwd=self._dir)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"perf_analyzer ran past {timeout_s:.0f} s") from None
        if done.returncode != 0 or not report.is_file():
            if _EMPTY_WINDOW in done.stdout:
                raise _WindowTooShort
            raise RuntimeError(f"perf_analyzer: {_reason(done.stdout, done.returncode)}")
        return _summary(done.stdout, report, self.case)

    def teardown(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _summary(output: str, report: Path, case: ModelCase) -> SliceSummary:
    """A run's numbers: its CSV's inferences per second and latency percentiles (us), and the
    requests its output counts (over its windows, as the CSV's rate).

    Raises:
        RuntimeError: They are not there.
    """
    with open(report, newline="") as file:
        rows = list(csv.DictReader(file))
    counted = re.search(r"^\s*Request count: (\d+)\s*$", output, re.MULTILINE)
    if not rows or counted is None:
        raise RuntimeError(f"perf_analyzer's report has no numbers: {report.read_text()[:200]}")
    row, requests = rows[0], int(counted.group(1))
    samples = requests * (case.batch_size if case.batched else 1)
    wall_s = samples / float(row["Inferences/Second"])
    # Of a streaming model, its response throughput (its latency: to the final response).
    responses = row.get("Response Throughput") if case.streaming else None
    return SliceSummary(
        requests=requests,
        wall_s=wall_s,
        latency_ms={p: float(row[f"{p} latency"]) / 1e3 for p in ("p50", "p90", "p99")},
        responses=None if responses is None else round(float(responses) * wall_s),
    )


class PerfAnalyzerShmPath(PerfAnalyzerPath):
    """perf_analyzer with ``--shared-memory system``: its inputs written once."""

    name, label = "pa-shm", "perf_analyzer, shm"
    shared_memory = "system"


class PerfAnalyzerGrpcPath(PerfAnalyzerPath):
    """perf_analyzer with ``--shared-memory none``: its inputs by value."""

    name, label = "pa-grpc", "perf_analyzer, gRPC"
    shared_memory = "none"


class PerfAnalyzerStreamPath(PerfAnalyzerPath):
    """perf_analyzer's ``--streaming``, on a streaming model (its latency: to a request's
    final response; it says nothing of the first)."""

    def _streaming_args(self) -> list[str]:
        if not self.case.streaming:
            raise SkipPath(f"{self.name} runs on a streaming (decoupled) model only")
        assert self._dir is not None
        data = write_input_data(self.inputs, self._dir / "inputs", batched=self.case.batched)
        return ["--streaming", "--input-data", str(data)]


class PerfAnalyzerStreamShmPath(PerfAnalyzerStreamPath):
    """perf_analyzer's ``--streaming`` with ``--shared-memory system``: its inputs written
    once (its outputs too: it never reads them)."""

    name, label = "pa-stream-shm", "perf_analyzer --streaming, shm"
    shared_memory = "system"


class PerfAnalyzerStreamGrpcPath(PerfAnalyzerStreamPath):
    """perf_analyzer's ``--streaming`` with ``--shared-memory none``: its inputs by value."""

    name, label = "pa-stream", "perf_analyzer --streaming, gRPC"
    shared_memory = "none"


#: The perf_analyzer paths, in table order.
PATHS: tuple[type[PerfAnalyzerPath], ...] = (PerfAnalyzerShmPath, PerfAnalyzerGrpcPath)
#: Its paths on a streaming model, in table order (``_config.STREAM_CEILING_PATHS``).
STREAM_PATHS: tuple[type[PerfAnalyzerPath], ...] = (
    PerfAnalyzerStreamShmPath,
    PerfAnalyzerStreamGrpcPath,
)
