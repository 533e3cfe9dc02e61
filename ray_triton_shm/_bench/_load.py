"""The load generators: a closed loop (callers sending back to back for a while) and an open
loop (requests sent at a rate, whatever the answers), and the records of what a slice of load
measured. They time any call: the paths (:mod:`.paths`) give theirs."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["OpenLoop", "SliceSummary", "arrival_times", "run_closed_loop", "run_open_loop"]
__all__ += ["merge_open_loops", "run_until"]


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
