"""What the node actor is told and what it tells: its configuration (the only thing shipped
to it), a model's registration as a process binds to it, and the node's stats.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._defaults import DEFAULT_RECONNECT_TIMEOUT_S
from .._inference._node_batching import NodeBatching
from .._slots._sizing import SlotAutoscaling
from .._slots._specs import ModelSpec

__all__ = ["ModelRegistration", "NodeActorConfig", "NodeStats"]


@dataclass(frozen=True)
class NodeActorConfig:
    """Configuration of a node actor; the only thing shipped to it.

    Attributes:
        url: Triton's gRPC address; ``None`` reads ``$RAY_TRITON_SHM_URL`` on the actor's node,
            then falls back to ``localhost:8001``.
        slots: The most slots one model may have on the node: its most requests in flight
            there, calls by value included (a fixed ``pool_size`` and a pool's ``max_slots``
            are at most this).
        max_waiting: Callers that may wait for a slot of one model on the node; past it,
            :class:`OverloadedError`.
        metrics_interval_s: How often the actor updates the Ray metrics. (Callers that died
            holding a slot or waiting for one are looked for every 0.25 s, and their slots
            come back within 50 ms of Triton being done with their requests.)
        reconnect_timeout_s: How long the actor's registrations wait for Triton while it is
            unreachable (restarting); calls wait as long as their caller says.
        headers: gRPC headers of every call the actor makes: Triton's access keys for the
            control plane (shared memory, and model configuration if restricted), over those
            of the node: its key files (``RAY_TRITON_SHM_KEYS_DIR``, a mounted Secret, read
            again when they change) and its ``RAY_TRITON_SHM_HEADER_*`` variables. Never
            shown; but these travel with the config, so prefer the node's key files.
        client_options: Keyword arguments of the actor's :class:`TritonSHMClient` (TLS:
            ``ssl=True``, ``root_certificates=``, ``private_key=``, ``certificate_chain=``).
        config_check_interval_s: How often the actor compares the config of each model whose
            pool follows it with the pool, to pick up changes no request runs into (a larger
            ``max_batch_size``, an output added); ``None``: only when a request runs into
            one.
        autoscaling: How the pools of models registered without ``pool_size`` or
            ``autoscaling`` of their own follow their load (``None``: 2 slots up to
            ``slots``).
        shm_budget_bytes: The most bytes of the node's ``/dev/shm`` the actor's pools may hold
            (``None``: 90% of it, less Ray's object store where it lives there).
        transport: How the node's models reach Triton: ``"auto"`` (shared memory where
            Triton proves it maps the node's, else by value), ``"shm"`` or ``"inline"`` (see
            :meth:`TritonSHMClient.register_shm_model`), for the models whose registration
            leaves it at ``"auto"`` (:meth:`TritonNodeActor.register`). A Triton on another
            node (``url``) gets the tensors by value, and nothing is registered in it.
        sweep_interval_s: Deprecated: the earlier name of ``metrics_interval_s``; given, it
            sets it, with a :class:`DeprecationWarning`.
    """

    url: str | None = None
    slots: int = 64
    max_waiting: int = 64
    metrics_interval_s: float = 1.0
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    client_options: Mapping[str, Any] | None = field(default=None, repr=False)
    config_check_interval_s: float | None = 5.0
    autoscaling: SlotAutoscaling | None = None
    shm_budget_bytes: int | None = None
    transport: str = "auto"
    sweep_interval_s: float | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.sweep_interval_s is not None:
            warnings.warn(
                "NodeActorConfig(sweep_interval_s=) is deprecated: it is metrics_interval_s "
                "(how often the actor updates the Ray metrics)",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "metrics_interval_s", self.sweep_interval_s)


@dataclass(frozen=True)
class ModelRegistration:
    """What a process needs to use a model's slots directly.

    Attributes:
        spec: The model's spec.
        region_name: The region holding the slots.
        slot_count: Slots the region has room for (the pool's size now is in its header).
        node_id: The node the region lives on.
        url: The Triton the region is registered with.
        incarnation: Changes when the actor restarts (and its regions with it).
        generation: Grows each time the model's pool is laid out anew (the model changed on
            Triton, or it was registered again with other specs, or Triton moved).
        transport: How the node's pool reaches Triton: ``"shm"`` or ``"inline"`` (by value).
        transport_reason: Why.
        batching: The pool's node batching (``None``: none).
    """

    spec: ModelSpec
    region_name: str
    slot_count: int
    node_id: str
    url: str
    incarnation: str
    generation: int = 0
    transport: str = "shm"
    transport_reason: str = ""
    batching: NodeBatching | None = None


@dataclass(frozen=True)
class NodeStats:
    """A snapshot of a node actor.

    Attributes:
        node_id: The actor's node.
        url: The Triton it talks to.
        pid: The actor's process id.
        incarnation: Changes on every restart.
        shm_free: Bytes free in the node's ``/dev/shm`` (Ray's object store lives there too).
        shm_capacity: Size of the node's ``/dev/shm``.
        shm_budget: Bytes of ``/dev/shm`` the actor's pools may hold (``0``: no budget).
        triton_up: Whether Triton answered the actor's last liveness check (every
            ``metrics_interval_s``).
        triton_restarts: How often Triton restarted: the actor saw it answer again after it
            was down, or found that it had lost every registration of the node's regions
            (which it then registers again), however short the restart.
        models: Per model, over every process of the node: ``slots`` (the pool's size now),
            ``min_slots`` and ``max_slots`` (its bounds: both its size if fixed),
            ``limited_by`` (why it did not grow although callers waited lately, ``""`` for
            nothing: ``"upscale_delay_s"`` (their waits ended before that delay did),
            ``"max_slots"``, ``"shm_budget"`` or ``"shm_full"``), ``grows`` and ``shrinks``
            (how often it resized), ``in_use`` (slots held
            now), ``waiting`` (callers queued for a slot), ``abandoned`` (slots out of use
            now until Triton is done with a request whose caller gave up or died),
            ``overloads`` (callers refused past ``max_waiting``), ``shm_bytes`` (what its
            region holds of ``/dev/shm`` now), ``shm_max_bytes`` (what it would hold at
            ``max_slots``),
            ``wait_p99_us`` (the 99th percentile of every request's wait for a slot, zero for
            those that found one free), ``settle_p99_us`` (the 99th percentile of how long
            abandoned slots waited for Triton), ``latency_p99_us`` (the 99th percentile of the
            requests' latency, from the caller's first wait to its answer), ``failures``
            (failed calls by kind: ``overloaded``, ``deadline``, ``access_denied``, ``tls``,
            ``unavailable``, ``model_changed``, ``bad_input``, ``other``), ``generation``
            (new layouts since the model was registered: it changed on Triton, or Triton
            moved), ``transport`` (``"shm"``, or ``"inline"``: by value) and
            ``transport_reason`` (why), and the
            counters ``requests``, ``samples``, ``bytes_in``, ``bytes_out``, ``errors``
            (failed requests to Triton), ``waits`` (requests that queued for a slot),
            ``wait_ns`` (their total wait), ``abandoned_requests`` (requests given up while
            Triton ran them), ``settle_ns`` (how long their slots waited for Triton, in all)
            and ``latency_ns`` (the answered requests' latency, in all), and
            ``by_value_requests`` (those of ``requests`` whose tensors went by value: all of
            them while ``transport`` is ``"inline"``); and node batching's:
            ``node_batching`` (whether calls of a few rows join the node's batches),
            ``rows_per_request`` (the mean rows per request Triton answered),
            ``rows_histogram`` (the answered requests by their rows: each bucket's upper
            bound, ``1, 2, 4, ..., 1024`` then ``math.inf``, -> its count),
            ``company_waits`` (batches whose sender waited for company while the model's
            earlier batches were in Triton), ``company_wait_ns`` (their wait, in all) and
            ``company_wait_mean_us`` (its mean).
    """

    node_id: str
    url: str
    pid: int
    incarnation: str
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    shm_free: int = 0
    shm_capacity: int = 0
    shm_budget: int = 0
    triton_up: bool = True
    triton_restarts: int = 0

    @property
    def slots_total(self) -> int:
        """Slots over every model."""
        return sum(m["slots"] for m in self.models.values())

    @property
    def slots_in_use(self) -> int:
        """Slots in use over every model."""
        return sum(m["in_use"] for m in self.models.values())

    @property
    def shm_bytes(self) -> int:
        """Shared memory held over every model."""
        return sum(m["shm_bytes"] for m in self.models.values())
