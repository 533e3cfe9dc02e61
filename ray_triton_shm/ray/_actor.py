"""The node actor: one per Ray node, owning the shm pools and the Triton registrations.

:class:`TritonNodeActor` is a plain class; :func:`get_node_actor` makes it a Ray actor pinned
to the caller's node (named after the node, detached, restarted on failure, ``num_cpus=0``).
Only :class:`NodeActorConfig` crosses the pickle boundary: the ``TritonSHMClient`` is built
inside the actor's process.

It is a threaded actor (blocking gRPC calls on threads cost less CPU per request than asyncio
here) whose methods run in two concurrency groups:

* ``"infer"`` (``max_concurrency = slots`` threads): by-value inference and zero-copy inference
  on a claimed slot. No more of them run than there are slots; the rest wait in Ray's queue,
  which is bounded per caller by ``max_pending_calls`` (an :class:`OverloadedError` past it).
  A running call is never interrupted (Ray cancels only queued calls of threaded actors), so a
  slot is never given back while Triton still works on it.
* ``"control"``: registration, claims, stats; never waits behind inference.

Zero-copy callers each hold a few slots of their own (:class:`SlotClaim`, one region each),
so an inference costs them one small Ray call: write the slot, ``infer_claimed``, read the
slot. Claims of processes that exit are taken back by a sweeper.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._client import TritonSHMClient
from .._exceptions import ModelSpecError, TritonSHMError
from .._reclaim import reclaim
from .._shm import pid_alive
from .._specs import ModelSpec, SlotLayout

__all__ = [
    "NAMESPACE",
    "URL_ENV_VAR",
    "ModelRegistration",
    "NodeActorConfig",
    "NodeStats",
    "SlotClaim",
    "StaleClaimError",
    "TritonNodeActor",
    "actor_name",
    "get_node_actor",
]

#: Ray namespace of the node actors.
NAMESPACE = "ray_triton_shm"
#: Environment variable with the Triton gRPC address of a node (read on that node).
URL_ENV_VAR = "RAY_TRITON_SHM_URL"
DEFAULT_URL = "localhost:8001"


def actor_name(node_id: str) -> str:
    """The name of the node actor of ``node_id``."""
    return f"triton-shm-{node_id}"


@dataclass(frozen=True)
class NodeActorConfig:
    """Configuration of a node actor; the only thing shipped to it.

    Attributes:
        url: Triton's gRPC address; ``None`` reads ``$RAY_TRITON_SHM_URL`` on the actor's node,
            then falls back to ``localhost:8001``.
        slots: Inference calls running at once: the ``"infer"`` group's ``max_concurrency``, and
            the default ``pool_size`` of each model.
        max_waiting: Calls a caller may have queued before it gets :class:`OverloadedError`.
        max_claims: Zero-copy slots that callers may hold per model (each is one batch of
            memory); past it, callers pass arrays by value.
        sweep_interval_s: How often claims of processes that are gone are taken back and the
            Ray metrics are updated.
    """

    url: str | None = None
    slots: int = 8
    max_waiting: int = 64
    max_claims: int = 64
    sweep_interval_s: float = 1.0


@dataclass(frozen=True)
class ModelRegistration:
    """What a caller needs to use a model's slots directly.

    Attributes:
        spec: The model's spec.
        layout: Where each tensor lives inside a slot.
        slot_count: Slots of the by-value pool.
        node_id: The node the region lives on.
        incarnation: Changes when the actor restarts (and its regions with it).
    """

    spec: ModelSpec
    layout: SlotLayout
    slot_count: int
    node_id: str
    incarnation: str


@dataclass(frozen=True)
class SlotClaim:
    """A slot of its own handed to a calling process for zero-copy inference.

    The caller attaches ``region_name``, writes its inputs into the slot, calls
    ``infer_claimed`` (one small Ray call), and reads its outputs from the same slot. The claim
    lasts until released, or until the actor sees the owner process gone.

    Attributes:
        claim_id: Identifies the claim in later calls.
        model: The model.
        region_name: The region holding the slot (slot 0).
        layout: Where each tensor lives inside the slot.
        owner_pid: The calling process.
        incarnation: The actor incarnation that granted it.
    """

    claim_id: int
    model: str
    region_name: str
    layout: SlotLayout
    owner_pid: int
    incarnation: str


@dataclass
class _ModelCounters:
    requests: int = 0
    samples: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0

    def add(self, samples: int, bytes_in: int, bytes_out: int) -> None:
        self.requests += 1
        self.samples += samples
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out


@dataclass(frozen=True)
class NodeStats:
    """A snapshot of a node actor.

    Attributes:
        node_id: The actor's node.
        url: The Triton it talks to.
        pid: The actor's process id.
        incarnation: Changes on every restart.
        models: Per model: ``slots`` and ``in_use`` (the by-value pool), ``waiting``,
            ``claimed`` (zero-copy slots held by callers), ``requests``, ``samples``,
            ``bytes_in``, ``bytes_out``, ``errors``.
    """

    node_id: str
    url: str
    pid: int
    incarnation: str
    models: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def slots_total(self) -> int:
        """Slots over every model."""
        return sum(m["slots"] for m in self.models.values())

    @property
    def slots_in_use(self) -> int:
        """Slots in use over every model."""
        return sum(m["in_use"] for m in self.models.values())


class StaleClaimError(TritonSHMError, LookupError):
    """A claim this actor incarnation did not grant (it restarted), or already took back."""


class TritonNodeActor:
    """Owns one ``TritonSHMClient`` to the node's Triton, its models and their slot pools.

    Made a Ray actor by :func:`get_node_actor`; usable as a plain object in tests.

    Args:
        config: The actor's configuration.
    """

    def __init__(self, config: NodeActorConfig) -> None:
        self._config = config
        self._url = config.url or os.environ.get(URL_ENV_VAR) or DEFAULT_URL
        self._node_id = _current_node_id()
        self._incarnation = f"{os.getpid()}-{time.time_ns()}"
        # A restarted actor first takes back what its previous incarnation left behind.
        reclaim(self._url)
        self._client = TritonSHMClient(url=self._url)
        self._claims: dict[int, SlotClaim] = {}
        self._claim_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._counters: dict[str, _ModelCounters] = {}
        self._output_itemsizes: dict[str, list[tuple[str, int]]] = {}
        self._metrics = _Metrics(self._node_id)
        self._stop = threading.Event()
        threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True).start()

    # ---------------------------------------------------------------- control group

    @ray.method(concurrency_group="control")
    def register(
        self,
        model_name: str,
        inputs: Sequence[Any] | None = None,
        outputs: Sequence[Any] | None = None,
        max_batch_size: int | None = None,
        pool_size: int | None = None,
        *,
        model_version: str = "",
        max_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> ModelRegistration:
        """Registers a model (a no-op when already registered with the same specs).

        Raises:
            ModelSpecError: the model is registered with other specs, or bad specs.
        """
        size = pool_size or self._config.slots
        if size > self._config.slots:
            raise ModelSpecError(
                f"model {model_name!r}: pool_size {size} exceeds the node actor's "
                f"{self._config.slots} inference slots; create the node actor with more slots",
                model=model_name,
            )
        self._client.register_shm_model(
            model_name,
            inputs,
            outputs,
            max_batch_size,
            size,
            model_version=model_version,
            max_shapes=max_shapes,
        )
        self._counters.setdefault(model_name, _ModelCounters())
        spec = self._client.registered_models[model_name]
        self._output_itemsizes[model_name] = [(t.name, t.dtype.itemsize) for t in spec.outputs]
        return self._registration(model_name)

    def _registration(self, model_name: str) -> ModelRegistration:
        spec = self._client.registered_models[model_name]
        return ModelRegistration(
            spec=spec,
            layout=SlotLayout.for_model(spec),
            slot_count=self._client.shm_stats(model_name).size,
            node_id=self._node_id,
            incarnation=self._incarnation,
        )

    @ray.method(concurrency_group="control")
    def claim(self, model_name: str, owner_pid: int) -> SlotClaim | None:
        """Hands ``owner_pid`` a slot of its own in a new region; ``None`` past ``max_claims``."""
        with self._lock:
            held = sum(1 for c in self._claims.values() if c.model == model_name)
            if held >= self._config.max_claims:
                return None
            claim_id = next(self._claim_ids)
        region_name, layout = self._client.add_region(model_name, 1)
        claim = SlotClaim(claim_id, model_name, region_name, layout, owner_pid, self._incarnation)
        with self._lock:
            self._claims[claim_id] = claim
        return claim

    @ray.method(concurrency_group="control")
    def release_claim(self, claim_id: int, incarnation: str | None = None) -> None:
        """Takes a claimed slot back and frees its region; idempotent.

        Args:
            claim_id: The claim.
            incarnation: The incarnation that granted it; a claim of an earlier incarnation
                (whose ids may repeat) is ignored.
        """
        if incarnation is not None and incarnation != self._incarnation:
            return
        with self._lock:
            claim = self._claims.pop(claim_id, None)
        if claim is not None:
            self._client.remove_region(claim.region_name)

    @ray.method(concurrency_group="control")
    def stats(self) -> NodeStats:
        """Slots, waiting calls, claims and counters per model."""
        models = {}
        with self._lock:
            claimed = [claim.model for claim in self._claims.values()]
        for name in self._client.registered_models:
            pool = self._client.shm_stats(name)
            counters = self._counters.setdefault(name, _ModelCounters())
            models[name] = {
                "slots": pool.size,
                "in_use": pool.in_use,
                "waiting": pool.waiting,
                "claimed": claimed.count(name),
                **vars(counters),
            }
        return NodeStats(self._node_id, self._url, os.getpid(), self._incarnation, models)

    @ray.method(concurrency_group="control")
    def shutdown(self) -> None:
        """Unregisters every model and frees its memory (the actor can then be killed)."""
        self._stop.set()
        self._client.close()

    # ---------------------------------------------------------------- infer group

    @ray.method(concurrency_group="infer")
    def infer(self, model_name: str, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """By-value inference: arrays in, arrays out (through Ray's object store)."""
        counters = self._counters.setdefault(model_name, _ModelCounters())
        try:
            outputs = self._client.infer_shm(model_name, inputs)
        except BaseException:
            counters.errors += 1
            raise
        counters.add(_rows(inputs), _nbytes(inputs), _nbytes(outputs))
        return outputs

    @ray.method(concurrency_group="infer")
    def infer_claimed(
        self,
        claim_id: int,
        incarnation: str,
        rows: int | None,
        sample_shapes: Mapping[str, tuple[int, ...]],
        bytes_in: int = 0,
    ) -> dict[str, tuple[int, ...]]:
        """Runs inference on a claimed slot the caller has filled; outputs stay in the slot.

        Args:
            claim_id: The claim's id.
            incarnation: The incarnation that granted the claim.
            rows: Samples written (``None`` for a model that does not batch).
            sample_shapes: Per-sample shape of each input written.
            bytes_in: Input bytes written (for the counters).

        Returns:
            The shape of each output.

        Raises:
            StaleClaimError: the claim is unknown (the actor restarted) or was taken back.
        """
        claim = self._claims.get(claim_id)
        if claim is None or incarnation != self._incarnation:
            raise StaleClaimError(
                f"claim {claim_id} is not held (the node actor restarted, or took it back)",
                claim_id=claim_id,
            )
        counters = self._counters[claim.model]
        try:
            shapes = self._client.infer_region(claim.region_name, 0, rows, sample_shapes)
        except BaseException:
            counters.errors += 1
            raise
        itemsizes = self._output_itemsizes[claim.model]
        counters.add(rows or 1, bytes_in, sum(math.prod(shapes[n]) * i for n, i in itemsizes))
        return shapes

    # ---------------------------------------------------------------- internals

    def _housekeeping(self) -> None:
        """Takes back claims of processes that are gone; exports counters as Ray metrics."""
        while not self._stop.wait(self._config.sweep_interval_s):
            with self._lock:
                gone = [c.claim_id for c in self._claims.values() if not pid_alive(c.owner_pid)]
            for claim_id in gone:
                self.release_claim(claim_id)  # type: ignore[operator]  # ray.method-wrapped
            for name in list(self._counters):
                try:
                    pool = self._client.shm_stats(name)
                except TritonSHMError:
                    continue  # unregistered meanwhile
                self._metrics.export(name, self._counters[name], pool)


def _rows(inputs: Mapping[str, Any]) -> int:
    first = next(iter(inputs.values()), None)
    return len(first) if first is not None and hasattr(first, "__len__") else 1


def _nbytes(arrays: Mapping[str, Any]) -> int:
    total = 0
    for value in arrays.values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, (list, tuple)):
            total += sum(v.nbytes for v in value if isinstance(v, np.ndarray))
    return total


def _current_node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # plain object outside Ray (tests)
        return "local"


class _Metrics:
    """The actor's counters and gauges as Ray metrics (Prometheus / dashboard).

    Exported from the housekeeping thread, not per request: the hot path only bumps ints.
    """

    def __init__(self, node_id: str) -> None:
        from ray.util import metrics

        tags = ("model", "node_id")
        self._node_id = node_id
        self._exported: dict[str, _ModelCounters] = {}
        self._requests = metrics.Counter(
            "ray_triton_shm_requests", "Inference requests served", tag_keys=tags
        )
        self._samples = metrics.Counter("ray_triton_shm_samples", "Samples inferred", tag_keys=tags)
        self._bytes_in = metrics.Counter(
            "ray_triton_shm_input_bytes", "Input bytes sent to Triton", tag_keys=tags
        )
        self._bytes_out = metrics.Counter(
            "ray_triton_shm_output_bytes", "Output bytes read from Triton", tag_keys=tags
        )
        self._errors = metrics.Counter(
            "ray_triton_shm_errors", "Inference calls that failed", tag_keys=tags
        )
        self._in_use = metrics.Gauge("ray_triton_shm_slots_in_use", "Slots in use", tag_keys=tags)
        self._total = metrics.Gauge("ray_triton_shm_slots", "Slots in the pool", tag_keys=tags)
        self._waiting = metrics.Gauge(
            "ray_triton_shm_waiting", "Calls waiting for a slot", tag_keys=tags
        )

    def export(self, model: str, counters: _ModelCounters, pool: Any) -> None:
        """Adds what the counters gained since the last export; sets the gauges."""
        tags = {"model": model, "node_id": self._node_id}
        last = self._exported.setdefault(model, _ModelCounters())
        for metric, field_name in (
            (self._requests, "requests"),
            (self._samples, "samples"),
            (self._bytes_in, "bytes_in"),
            (self._bytes_out, "bytes_out"),
            (self._errors, "errors"),
        ):
            value = getattr(counters, field_name)
            delta = value - getattr(last, field_name)
            if delta > 0:
                metric.inc(delta, tags)
                setattr(last, field_name, value)
        self._in_use.set(pool.in_use, tags)
        self._total.set(pool.size, tags)
        self._waiting.set(pool.waiting, tags)


def get_node_actor(
    *,
    url: str | None = None,
    slots: int = 8,
    max_waiting: int = 64,
    max_claims: int = 64,
    node_id: str | None = None,
) -> ray.actor.ActorHandle:
    """Returns the node actor of this node (or of ``node_id``), creating it when missing.

    Safe when many replicas race to create it: one wins, everybody gets its handle. The
    configuration of whoever creates the actor applies.

    Args:
        url: Triton's gRPC address on that node; ``None`` reads ``$RAY_TRITON_SHM_URL`` on
            the node, then uses ``localhost:8001``.
        slots: Inference calls running at once, and the default pool size of each model.
        max_waiting: Calls one caller may have queued before :class:`OverloadedError`.
        max_claims: Zero-copy slots callers may hold per model.
        node_id: The node; default the caller's.
    """
    node = node_id or ray.get_runtime_context().get_node_id()
    name = actor_name(node)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    config = NodeActorConfig(url=url, slots=slots, max_waiting=max_waiting, max_claims=max_claims)
    actor_class = ray.remote(  # type: ignore[call-overload]
        concurrency_groups={"infer": slots, "control": 4},
        # Every method runs in a named group; the default group's max_concurrency > 1 is what
        # makes Ray execute calls out of order. In order, a caller's call that waits for its
        # arguments, or one it cancelled, holds up all its later calls, releases included.
        max_concurrency=2,
    )(TritonNodeActor)
    return actor_class.options(
        name=name,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        max_restarts=-1,
        max_pending_calls=max_waiting,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(config)
