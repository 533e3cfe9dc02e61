"""The bench's eye on its Triton: crashes, outages, and a Triton that will not come back.

The embedded server's supervisor tells :class:`TritonWatch` of each crash and restart
(:meth:`TritonWatch.on_event`); the watch prints one line at once (when, during which run,
why) and keeps an outage per crash, from the crash until Triton was ready again. A remote
Triton (``--url``) has no supervisor here: when a slice fails, :meth:`TritonWatch.wait_back`
asks it whether it is live, and an outage is what it saw. The runner marks a run whose
slice overlapped an outage as disturbed (its numbers kept, not used for verdicts), waits
for Triton, and goes on; a Triton that is gone for good (the supervisor gave up, restarts are
off, or a remote one stayed unreachable) ends the bench with what ran (:class:`TritonGone`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable

from ray_triton_shm.local._crashes import ServerCrash, ServerEvent

__all__ = ["SETTLE_S", "Outage", "TritonGone", "TritonWatch"]

#: How often an unreachable Triton is asked whether it is live again.
_PROBE_S = 0.25
#: How long a failure waits for the embedded server's supervisor to see a crash.
_CRASH_SEEN_S = 2.0
#: How long a restart of the embedded server may take (its models loaded again) under load.
_RESTART_WAIT_S = 180.0
#: A failure this soon after Triton came back is still the outage's doing (gRPC channels
#: reconnecting, pools registering again).
SETTLE_S = 5.0


class TritonGone(ConnectionError):
    """Triton will not come back: the bench stops, and reports what ran before."""


@dataclasses.dataclass
class Outage:
    """Triton was gone from ``start`` until ``end`` (``time.time()``; ``None``: not back),
    during ``run`` (the run in progress), for ``reason``; ``crash``: the embedded server's
    record, ``None`` for a remote Triton."""

    start: float
    end: float | None
    run: str
    reason: str
    crash: ServerCrash | None = None

    def overlaps(self, start: float, end: float, settle_s: float = 0.0) -> bool:
        """Whether the outage, and ``settle_s`` after it, touched ``[start, end]``."""
        return self.start <= end and (self.end is None or self.end + settle_s >= start)

    def describe(self) -> str:
        """One line: when, during which run, why, and how it ended."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.start))
        back = "" if self.end is None else f"; back after {self.end - self.start:.1f} s"
        what = "crashed" if self.crash is not None else "was unreachable"
        return f"Triton {what} at {clock} during {self.run or 'set-up'}: {self.reason}{back}"

    def to_dict(self) -> dict[str, object]:
        """As JSON values (with the crash's record and log tail, for the embedded server)."""
        return {
            "start": self.start,
            "end": self.end,
            "down_s": None if self.end is None else self.end - self.start,
            "run": self.run,
            "reason": self.reason,
            "crash": None if self.crash is None else self.crash.to_dict(),
        }


class TritonWatch:
    """Outages of the bench's Triton, and whether it is gone for good.

    Args:
        live: Whether Triton is up (``False`` or an exception: it is not): for the embedded
            server its process, for a remote one its answer to ``ServerLive``.
        supervised: Whether Triton is the embedded server, whose supervisor reports its
            crashes to :meth:`on_event`.
        give_up_s: How long a remote Triton may stay unreachable before the bench stops.
        say: Prints one line (a crash, a restart) as it happens.
    """

    def __init__(
        self,
        live: Callable[[], bool],
        *,
        supervised: bool,
        give_up_s: float,
        say: Callable[[str], None] = print,
    ) -> None:
        self._live = live
        self._supervised = supervised
        self._give_up_s = give_up_s
        self._say = say
        self._lock = threading.Lock()
        self._back = threading.Condition(self._lock)
        self.outages: list[Outage] = []
        self.gone: str | None = None
        #: The run in progress, as the report names it.
        self.run = ""
        #: Whether Triton was ever seen up (the embedded one is, once started).
        self.reached = supervised

    def probe(self) -> bool:
        """Asks whether Triton is up now; once it was, a later failure to reach it is an
        outage (:attr:`reached`)."""
        self.reached = self.reached or self._is_live()
        return self.reached

    def follow(self, live: Callable[[], bool]) -> None:
        """From now on, ``live`` says whether Triton is up (the embedded server's process,
        once it runs)."""
        self._live = live

    # ---- the embedded server's supervisor ----------------------------------------------

    def on_event(self, event: ServerEvent) -> None:
        """Takes the embedded server's :class:`ServerEvent` (from its supervisor's thread)."""
        crash = event.crash
        with self._lock:
            outage = next(
                (o for o in self.outages if o.crash and o.crash.number == crash.number), None
            )
            if outage is None:
                outage = Outage(crash.at, None, self.run, crash.reason, crash)
                self.outages.append(outage)
            outage.crash = crash
            if event.kind == "restarted":
                for o in self.outages:
                    if o.end is None:
                        o.end = crash.restarted_at
            elif event.kind == "gave_up":
                self.gone = event.error or crash.reason
            self._back.notify_all()
        if event.kind == "crashed":
            self._say(f"{outage.describe()}; the embedded Triton is being restarted")
        elif event.kind == "restarted":
            self._say(f"Triton is back (pid {event.pid}) after {crash.down_s or 0.0:.1f} s")
        else:
            self._say(f"{outage.describe()}; Triton is not restarted: {self.gone}")

    # ---- the runner ------------------------------------------------------------------------

    def disturbance(self, start: float, end: float, *, failed: bool = False) -> str | None:
        """The outages that touched ``[start, end]`` (or just before it, for a step that
        ``failed``: :data:`SETTLE_S`), in words; ``None`` if none did."""
        settle_s = SETTLE_S if failed else 0.0
        with self._lock:
            hit = [o.describe() for o in self.outages if o.overlaps(start, end, settle_s)]
        return "; ".join(hit) if hit else None

    def raise_if_gone(self) -> None:
        """Raises :class:`TritonGone` if Triton will not come back."""
        if self.gone is not None:
            raise TritonGone(self.gone)

    def wait_back(self) -> None:
        """After a failure: waits until Triton is back (an outage recorded for a remote one);
        returns at once if it never left.

        Raises:
            TritonGone: the embedded server's supervisor gave up, or a remote Triton stayed
                unreachable for ``give_up_s``.
        """
        if self._supervised:
            # The failure may be the first sign of a crash its supervisor is about to record.
            # Triton is asked outside the lock: the supervisor's events need it meanwhile.
            deadline = time.monotonic() + _CRASH_SEEN_S
            while not self._outage_seen() and not self._is_live():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            with self._lock:
                if not self._back.wait_for(self._settled, timeout=_RESTART_WAIT_S):
                    self.gone = f"Triton was not back within {_RESTART_WAIT_S:g} s of a crash"
            self.raise_if_gone()
            return
        if not self.reached or self._is_live():
            return  # never reached: the failure is the answer, not an outage
        outage = Outage(time.time(), None, self.run, "it did not answer ServerLive")
        with self._lock:
            self.outages.append(outage)
        self._say(outage.describe())
        deadline = time.monotonic() + self._give_up_s
        while time.monotonic() < deadline:
            time.sleep(_PROBE_S)
            if self._is_live():
                outage.end = time.time()
                self._say(f"Triton is reachable again after {outage.end - outage.start:.1f} s")
                return
        self.gone = f"Triton stayed unreachable for {self._give_up_s:g} s"
        raise TritonGone(self.gone)

    def _outage_seen(self) -> bool:
        """Whether an outage is under way, or Triton is gone for good."""
        with self._lock:
            return self.gone is not None or any(o.end is None for o in self.outages)

    def _settled(self) -> bool:
        """Whether Triton is back or gone for good (under the lock)."""
        return self.gone is not None or all(o.end is not None for o in self.outages)

    def _is_live(self) -> bool:
        with contextlib.suppress(Exception):
            return bool(self._live())
        return False
