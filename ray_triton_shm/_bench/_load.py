"""The load generators: a closed loop (callers sending back to back for a while) and an open
loop (requests sent at a rate, whatever the answers), and the records of what a slice of load
measured. They time any call: the paths (:mod:`.paths`) give theirs."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["OpenLoop", "SliceSummary", "arrival_times", "run_closed_loop", "run_open_loop"]
__all__ += ["merge_open_loops", "run_until"]
__all__ += ["StreamSlice", "StreamTimes", "merge_stream_slices", "run_stream_loop"]
__all__ += ["run_stream_loop_async", "run_streams_until", "run_streams_until_async"]


def run_until(call: Callable[[], Any], deadline: float) -> np.ndarray:
    """Calls ``call`` back to back until ``deadline`` (``time.perf_counter()``; at least
    once); returns the latency of each call in seconds."""
    clock = time.perf_counter
    latencies = []
    while True:
        sent = clock()
        call()
        done = clock()
        latencies.append(done - sent)
        if done >= deadline:
            return np.array(latencies)


def run_closed_loop(
    call: Callable[[], Any], callers: int, duration_s: float
) -> tuple[list[np.ndarray], float]:
    """``callers`` threads (none of its own for one) each calling ``call`` back to back for
    about ``duration_s`` (at least once); returns each caller's latencies in seconds, and the
    seconds it took."""
    start = time.perf_counter()
    if callers == 1:
        return [run_until(call, start + duration_s)], time.perf_counter() - start
    with ThreadPoolExecutor(callers) as threads:
        deadlines = [time.perf_counter() + duration_s] * callers
        latencies = list(threads.map(run_until, [call] * callers, deadlines))
    return latencies, time.perf_counter() - start


def arrival_times(rate: float, duration_s: float, arrivals: str, seed: int) -> np.ndarray:
    """When each request of an open loop at ``rate`` requests per second is due, in seconds
    from its start, over ``duration_s``: evenly spaced (``"constant"``) or with exponential
    gaps (``"poisson"``, from ``seed``); at least one."""
    count = max(1, round(rate * duration_s))
    if arrivals == "constant":
        return np.arange(count) / rate
    gaps = np.random.default_rng(seed).exponential(1 / rate, size=2 * count + 16)
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    return times[times < duration_s] if count > 1 else times[:1]


@dataclasses.dataclass
class OpenLoop:
    """One slice of an open loop: each request's latency in seconds, from when it was due
    (not when it went out: a request waiting for a free thread counts its wait, so a server
    that falls behind cannot hide its queue), in the order they were due; the requests
    ``dropped`` (still unsent when the slice gave up on them); the seconds from the start to
    the last answer; and the median latency of the first quarter of the requests, before any
    queue could build up (``first_s``)."""

    latencies: np.ndarray
    dropped: int
    wall_s: float
    first_s: float


def run_open_loop(
    call: Callable[[], Any], due: np.ndarray, start: float, threads: int, give_up_s: float
) -> OpenLoop:
    """Sends ``call`` at ``start + due[i]`` (``time.perf_counter()``) each, up to ``threads``
    at once; a request still unsent ``give_up_s`` after the last is due is dropped."""
    clock, order, lock = time.perf_counter, iter(range(len(due))), threading.Lock()
    give_up_at = start + float(due[-1]) + give_up_s
    latencies = np.full(len(due), np.nan)

    def worker() -> float:
        last = start
        while True:
            with lock:
                index = next(order, None)
            if index is None:
                return last
            when = start + float(due[index])
            now = clock()
            if now < when:
                time.sleep(when - now)
            elif now > give_up_at:
                continue  # dropped: its latency stays NaN
            call()
            last = clock()
            latencies[index] = last - when

    count = min(threads, len(due))
    with ThreadPoolExecutor(count) as pool:
        lasts = [future.result() for future in [pool.submit(worker) for _ in range(count)]]
    answered = latencies[~np.isnan(latencies)]
    first = answered[: max(1, len(answered) // 4)]
    return OpenLoop(
        answered,
        len(due) - len(answered),
        max(lasts) - start,
        float(np.median(first)) if len(first) else 0.0,
    )


def merge_open_loops(loops: list[OpenLoop]) -> OpenLoop:
    """The open loops of several callers, run side by side, as one."""
    return OpenLoop(
        np.concatenate([loop.latencies for loop in loops]),
        sum(loop.dropped for loop in loops),
        max(loop.wall_s for loop in loops),
        float(np.median([loop.first_s for loop in loops])),
    )


@dataclasses.dataclass(frozen=True)
class SliceSummary:
    """A slice that a load generator of its own timed (perf_analyzer), not request by request
    here: the requests it completed in its measurement windows, their seconds, and the
    percentiles of their latency (``"p50"``, ``"p90"``, ``"p99"``, in ms)."""

    requests: int
    wall_s: float
    latency_ms: Mapping[str, float]
    #: Of a streaming model: the responses of those requests (``None``: not one).
    responses: int | None = None


#: One stream, timed (see :func:`run_streams_until`): the seconds from its request to its
#: first response (to its end, if it had none) and to its end (Triton's final response), and
#: its responses.
StreamTimes = tuple[float, float, int]


@dataclasses.dataclass
class StreamSlice:
    """One slice of streams, back to back by each caller: per caller, each stream's seconds to
    its first response and to its end, in order; the responses of them all, and the seconds
    the slice took."""

    first_s: list[np.ndarray]
    last_s: list[np.ndarray]
    responses: int
    wall_s: float


def run_streams_until(stream: Callable[[int], StreamTimes], deadline: float) -> StreamSlice:
    """Runs ``stream(0)``, ``stream(1)``... (each a stream, timed by itself) back to back until
    ``deadline`` (``time.perf_counter()``; at least one): one caller's slice."""
    start, first, last, responses = time.perf_counter(), [], [], 0
    for index in itertools.count():
        to_first, to_end, count = stream(index)
        first.append(to_first)
        last.append(to_end)
        responses += count
        if time.perf_counter() >= deadline:
            break
    wall_s = time.perf_counter() - start
    return StreamSlice([np.array(first)], [np.array(last)], responses, wall_s)


def merge_stream_slices(slices: list[StreamSlice]) -> StreamSlice:
    """The slices of callers run side by side, as one (the longest one's seconds)."""
    return StreamSlice(
        [times for s in slices for times in s.first_s],
        [times for s in slices for times in s.last_s],
        sum(s.responses for s in slices),
        max(s.wall_s for s in slices),
    )


def run_stream_loop(
    stream: Callable[[int, int], StreamTimes], callers: int, duration_s: float
) -> StreamSlice:
    """``callers`` threads (none of its own for one), caller ``c`` running ``stream(c, i)``
    for ``i = 0, 1...`` back to back for about ``duration_s`` (at least once each)."""
    start = time.perf_counter()
    if callers == 1:
        return run_streams_until(functools.partial(stream, 0), start + duration_s)
    with ThreadPoolExecutor(callers) as threads:
        slices = list(
            threads.map(
                run_streams_until,
                [functools.partial(stream, c) for c in range(callers)],
                [start + duration_s] * callers,
            )
        )
    return dataclasses.replace(merge_stream_slices(slices), wall_s=time.perf_counter() - start)


async def run_streams_until_async(
    stream: Callable[[int], Awaitable[StreamTimes]], deadline: float
) -> StreamSlice:
    """:func:`run_streams_until` of a coroutine function."""
    start, first, last, responses = time.perf_counter(), [], [], 0
    for index in itertools.count():
        to_first, to_end, count = await stream(index)
        first.append(to_first)
        last.append(to_end)
        responses += count
        if time.perf_counter() >= deadline:
            break
    wall_s = time.perf_counter() - start
    return StreamSlice([np.array(first)], [np.array(last)], responses, wall_s)


async def run_stream_loop_async(
    stream: Callable[[int, int], Awaitable[StreamTimes]], callers: int, duration_s: float
) -> StreamSlice:
    """:func:`run_stream_loop` of tasks on the running event loop, a task per caller."""
    start = time.perf_counter()
    slices = await asyncio.gather(
        *(
            run_streams_until_async(functools.partial(stream, c), start + duration_s)
            for c in range(callers)
        )
    )
    return dataclasses.replace(merge_stream_slices(slices), wall_s=time.perf_counter() - start)
