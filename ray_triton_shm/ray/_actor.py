"""The node actor: the control plane of one Ray node's shared-memory inference.

:class:`TritonNodeActor` is a plain class; :func:`get_node_actor` makes it a Ray actor pinned
to the caller's node (named after the node, detached, restarted on failure, ``num_cpus=0``).
Only :class:`NodeActorConfig` crosses the pickle boundary: the ``TritonSHMClient`` is built
inside the actor's process.

For every model it owns one region of slots, registered in the node's Triton. The slots are the
node's budget for that model: no more requests are in flight on the node than there are slots,
over every process. By default the pool follows the model's load on the node, between
``min_slots`` and ``max_slots`` (at most the actor's ``slots``), within the node's share of
``/dev/shm`` (:mod:`ray_triton_shm._pools._scaling`); ``pool_size`` fixes it. Processes on the node
attach the region once and then take and give back its slots **through the region itself**
(:mod:`ray_triton_shm._slots._shared_slots`: file locks, sleeping in the kernel while they wait),
and send their requests straight to Triton: a request makes no Ray call, at any load. The actor's
part is the control plane: create and register the regions (again, after Triton restarts), set
their limits, resize them, sweep up after callers that died and put their slots back in use as
soon as Triton is done with their requests (:mod:`ray_triton_shm._pools._abandoned`), sum the
counters from the regions' headers. Where its Triton cannot map the node's shared memory (another
node, a container with its own ``/dev/shm``) the regions hold the slots' locks alone and
callers send their tensors by value, straight to Triton too
(:mod:`ray_triton_shm._inference._transport`).

It is a threaded actor whose methods run in the concurrency group ``"control"``
(registration, stats), but the deprecated by-value :meth:`TritonNodeActor.infer`, which may wait
for a slot, in ``"infer"``. The actor executes calls in order: Ray's out-of-order execution (the
default for threaded actors) can crash the actor inside Ray core when callers die with calls in
flight, which is what Ray Data does at the end of every job. In-order execution stalls a
caller's later calls behind a cancelled one; callers therefore make their control calls from a
thread of their own, outside any Ray task, so a Ray cancellation never reaches them (see
:mod:`._control`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tritonclient.utils import InferenceServerException

from .._client import TritonSHMClient, call_with, registry_of
from .._defaults import DEFAULT_RECONNECT_TIMEOUT_S, DEFAULT_URL, URL_ENV_VAR
from .._exceptions import ModelSpecError, RegionReplacedError, TritonServerError, TritonSHMError
from .._inference._model_pool import ModelPool
from .._inference._node_batching import NodeBatching
from .._inference._options import RequestOptions
from .._inference._transport import AUTO_TRANSPORT, check_transport
from .._pools._reclaim import reclaim_regions, registrations
from .._pools._scaling import default_shm_budget
from .._pools._snapshot import PoolSnapshot
from .._slots._memory import SYSTEM
from .._slots._shm import DEAD, list_local_regions, object_store_in_dev_shm, shm_space
from .._slots._sizing import SlotAutoscaling, default_autoscaling
from .._slots._specs import SpecLike
from .._wire._keys import Keys
from ._config import ModelRegistration, NodeActorConfig, NodeStats
from ._metrics import NodeMetrics

__all__ = [
    "NAMESPACE",
    "NODE_ACTOR_ENV_VARS",
    "NOSET_VISIBLE_DEVICES_ENV_VAR",
    "URL_ENV_VAR",
    "ModelRegistration",
    "NodeActorConfig",
    "NodeStats",
    "TritonNodeActor",
    "actor_name",
    "find_node_actor",
    "get_node_actor",
    "node_actor_names",
]

logger = logging.getLogger(__name__)
#: How long the node's Triton has to answer the actor's liveness check.
_LIVENESS_TIMEOUT_S = 2.0
_UNREACHABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")

#: Ray namespace of the node actors.
NAMESPACE = "ray_triton_shm"
#: Ray leaves CUDA_VISIBLE_DEVICES alone in a worker with this variable set.
NOSET_VISIBLE_DEVICES_ENV_VAR = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
#: The node actor's environment variables. It holds no GPU, yet allocates GPU pools on whichever
#: GPU of the node a caller names (by UUID): Ray must not hide the node's GPUs from it (it sets
#: CUDA_VISIBLE_DEVICES="" in a worker without GPUs), so the actor sees what its node sees.
NODE_ACTOR_ENV_VARS: Mapping[str, str] = {NOSET_VISIBLE_DEVICES_ENV_VAR: "1"}


def actor_name(node_id: str) -> str:
    """The name of the node actor of ``node_id``."""
    return f"triton-shm-{node_id}"


#: Threads of the deprecated :meth:`TritonNodeActor.infer` (its calls at once).
DEPRECATED_INFER_THREADS = 4


class TritonNodeActor:
    """Owns one ``TritonSHMClient`` to the node's Triton and its regions.

    Made a Ray actor by :func:`get_node_actor`; usable as a plain object in tests.

    Args:
        config: The actor's configuration.
    """

    def __init__(self, config: NodeActorConfig) -> None:
        self._config = config
        self._url = config.url or os.environ.get(URL_ENV_VAR) or DEFAULT_URL
        self._node_id = _current_node_id()
        self._incarnation = f"{os.getpid()}-{time.time_ns()}"
        self._started_s = time.time()
        #: Triton's liveness as last seen, and how often it restarted (see _note_triton).
        self._triton_seen_up = True
        self._triton_restarts = 0
        self._triton_lock = threading.Lock()
        keys = Keys(config.headers, environ=True)
        # A restarted actor first takes back what its previous incarnation left behind.
        reclaim_regions(self._url, headers=keys)
        self._budget = config.shm_budget_bytes
        if self._budget is None:
            self._budget = default_shm_budget(reserved=_object_store_in_shm(self._node_id))
        self._client = TritonSHMClient(
            url=self._url,
            reconnect_timeout_s=config.reconnect_timeout_s,
            headers=keys,
            config_check_interval_s=None,  # the housekeeping thread checks, not requests
            shm_budget_bytes=self._budget,
            **(config.client_options or {}),
        )
        self._pools = registry_of(self._client)
        self._pools.share_slots(max_waiting=config.max_waiting)
        self._lock = threading.Lock()
        self._infer_warned = False
        self._metrics = NodeMetrics(self._node_id)
        self._stop = threading.Event()
        threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True).start()

    # ---------------------------------------------------------------- control group

    @ray.method(concurrency_group="control")
    def register(
        self,
        model_name: str,
        inputs: Sequence[SpecLike] | None = None,
        outputs: Sequence[SpecLike] | None = None,
        max_batch_size: int | None = None,
        pool_size: int | None = None,
        *,
        autoscaling: SlotAutoscaling | Mapping[str, Any] | None = None,
        model_version: str = "",
        max_shapes: Mapping[str, Sequence[int]] | None = None,
        max_element_bytes: Mapping[str, int] | None = None,
        replace: bool = False,
        memory: str = SYSTEM,
        device: str | None = None,
        triton_device_id: int | None = None,
        transport: str = AUTO_TRANSPORT,
        node_batching: NodeBatching | bool | None = None,
    ) -> ModelRegistration:
        """Registers a model (a no-op when already registered with the same specs): the
        arguments of :meth:`TritonSHMClient.register_shm_model`, with the node's limits.

        Without ``pool_size`` its pool follows its load: ``autoscaling``'s fields left out
        take the actor's (see :class:`NodeActorConfig`).

        ``memory="cuda"`` puts its slots on the GPU ``device`` (a UUID: the actor sees every
        GPU of the node, whatever its callers see).

        ``transport="auto"`` (the default) takes the actor's ``transport``; ``"shm"`` or
        ``"inline"`` is the model's own.

        With ``replace``, a model registered with other specs is laid out anew for these:
        every process on the node moves to the new region at its next call.

        Raises:
            ModelSpecError: the model is registered with other specs, or bad specs.
        """
        limit = self._config.slots
        if pool_size is not None and pool_size > limit:
            raise ModelSpecError(
                f"model {model_name!r}: pool_size {pool_size} exceeds the node actor's "
                f"{limit} slots; create the node actor with more slots",
                model=model_name,
            )
        if pool_size is None and memory == SYSTEM:
            base = self._config.autoscaling or default_autoscaling(limit)
            autoscaling = SlotAutoscaling.of(autoscaling, **asdict(base))
            if autoscaling.max_slots > limit:
                raise ModelSpecError(
                    f"model {model_name!r}: autoscaling max_slots {autoscaling.max_slots} "
                    f"exceeds the node actor's {limit} slots; create the node actor with more "
                    "slots",
                    model=model_name,
                )
        spec = self._client.register_shm_model(
            model_name,
            inputs,
            outputs,
            max_batch_size,
            pool_size,
            autoscaling=autoscaling,
            model_version=model_version,
            max_shapes=max_shapes,
            max_element_bytes=max_element_bytes,
            replace=replace,
            memory=memory,
            device=device,
            triton_device_id=triton_device_id,
            transport=self._config.transport if transport == AUTO_TRANSPORT else transport,
            node_batching=node_batching,
        )
        del spec  # the pool's own spec: another caller may have laid it out anew meanwhile
        return self._registration(self._pools.get(model_name))

    @ray.method(concurrency_group="control")
    def follow(
        self,
        model_name: str,
        incarnation: str,
        generation: int,
        cause: TritonServerError | None = None,
        catch_up_s: float | None = None,
    ) -> ModelRegistration:
        """The model's current registration, after a process found its layout of generation
        ``generation`` refused or answered in a way a change of the model explains.

        Reads Triton's config of the model unless the pool already moved past ``generation``
        (so a change costs one read per node, however many processes run into it) and lays
        the pool out anew if the model changed; the registration returned is then of a newer
        generation. ``cause``, what the process ran into, given where it proves the change
        (an answer that fits no spec): the config is read until it shows the change, as a
        client does for its own pools, for at most ``catch_up_s`` (the caller's
        ``client_timeout_s``; ``None``: the client's own limit).

        Raises:
            RegionReplacedError: ``incarnation`` is not this actor's (it restarted).
            ModelChangedError: the model was registered with specs given by hand that no
                longer match.
        """
        self._check_incarnation(incarnation)
        pool = self._pools.get(model_name)
        if pool.generation == generation:
            # Read now, whenever the last check was: the caller's refusal may be newer.
            now = time.monotonic()
            if cause is None:
                pool = self._pools.follow(pool, since=now) or pool
            else:
                deadline = None if catch_up_s is None else now + catch_up_s
                newer = self._pools.follow_change(
                    pool, since=now, cause=cause, proven=True, deadline=deadline
                )
                pool = newer or pool
        return self._registration(pool)

    @ray.method(concurrency_group="control")
    def ensure_registered(
        self, model_name: str, incarnation: str, generation: int | None = None
    ) -> None:
        """Registers the model's region in Triton again if Triton lost it (it restarted).

        Raises:
            RegionReplacedError: ``incarnation`` is not this actor's (it restarted), or the
                model's pool was laid out anew since ``generation`` (or now: Triton moved
                where it cannot map the region): bind again.
            TritonServerError: Triton refused.
        """
        self._check_incarnation(incarnation)
        pool = self._pools.get(model_name)
        if generation is not None and generation != pool.generation:
            raise RegionReplacedError(
                f"model {model_name!r} was laid out anew (generation {pool.generation}, the "
                f"caller's {generation}); bind again",
                model=model_name,
                incarnation=incarnation,
            )
        self._note_triton(up=True)  # the node's other regions too, if Triton restarted
        if self._pools.register_again(pool) is not pool:
            raise RegionReplacedError(
                f"model {model_name!r} was laid out anew: Triton can no longer map the node's "
                "region (it restarted elsewhere); bind again",
                model=model_name,
                incarnation=incarnation,
            )

    @ray.method(concurrency_group="control")
    def stats(self) -> NodeStats:
        """Slots in use, waiting callers, abandoned slots, shared memory and counters per
        model, over every process of the node."""
        models = {}
        for name, pool in self._registered_pools():
            now = PoolSnapshot.of(pool, node_wide=True)
            models[name] = {
                "slots": now.size,
                "min_slots": now.min_size,
                "max_slots": now.max_size,
                "limited_by": now.limited_by,
                "grows": now.grows,
                "shrinks": now.shrinks,
                "in_use": now.in_use,
                "waiting": now.waiting,
                "abandoned": now.abandoned,
                "overloads": now.overloads,
                "shm_bytes": now.shm_bytes,
                "shm_max_bytes": now.shm_max_bytes,
                "wait_p99_us": now.wait_p99_us,
                "settle_p99_us": now.settle_p99_us,
                "latency_p99_us": now.latency_p99_us,
                "failures": now.failures,
                "generation": now.generation,
                "transport": pool.transport.kind,
                "transport_reason": pool.transport.reason,
                **now.counters,
                "by_value_requests": now.counters["requests"] if pool.by_value else 0,
                "node_batching": now.node_batching,
                "rows_per_request": now.rows_per_request,
                "rows_histogram": now.rows_by_bound,
                "company_waits": now.company_waits,
                "company_wait_ns": now.company_wait_ns,
                "company_wait_mean_us": now.company_wait_mean_us,
            }
        free, capacity = shm_space() or (0, 0)
        return NodeStats(
            self._node_id,
            self._url,
            os.getpid(),
            self._incarnation,
            models,
            free,
            capacity,
            self._budget or 0,
            self._triton_seen_up,
            self._triton_restarts,
        )

    @ray.method(concurrency_group="control")
    def shutdown(self) -> None:
        """Unregisters every model and frees its memory (the actor can then be killed)."""
        self._stop.set()
        self._client.close()

    # ---------------------------------------------------------------- deprecated

    @ray.method(concurrency_group="infer")
    def infer(
        self,
        model_name: str,
        incarnation: str,
        inputs: Mapping[str, Any],
        reconnect_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        client_timeout_s: float | None = None,
        options: RequestOptions | Mapping[str, Any] | None = None,
        outputs_as: str = "numpy",
    ) -> dict[str, Any]:
        """Deprecated: a :class:`ShmModel` sends its requests straight to Triton, by value too
        where Triton cannot map the node's memory, with no Ray call per request. This serves
        one by value through the actor's client (arrays in and out through Ray's object
        store), on the slots of the node, and warns once per actor.

        ``incarnation`` is the one of a registration (see :meth:`register`);
        ``reconnect_timeout_s``, ``headers``, ``client_timeout_s`` and ``outputs_as`` are those
        of :meth:`TritonSHMClient.infer_shm`, and ``options`` its request options: its
        keywords (``priority``, ``sequence_id``...), or checked, as handles once sent them.

        Raises:
            RegionReplacedError: ``incarnation`` is not this actor's (it restarted).
            OverloadedError: ``max_waiting`` callers already wait for a slot of this model.
        """
        self._warn_infer_deprecated()
        self._check_incarnation(incarnation)
        if isinstance(options, Mapping):
            return self._client.infer_shm(
                model_name,
                inputs,
                client_timeout_s=client_timeout_s,
                headers=headers,
                reconnect_timeout_s=reconnect_timeout_s,
                outputs_as=outputs_as,
                **options,
            )
        call = call_with(
            self._client,
            model_name,
            options,
            slot_timeout_s=None,
            client_timeout_s=client_timeout_s,
            outputs_as=outputs_as,
            headers=headers,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        return call.infer(inputs)

    def _warn_infer_deprecated(self) -> None:
        with self._lock:
            warned, self._infer_warned = self._infer_warned, True
        if warned:
            return
        message = (
            "TritonNodeActor.infer is deprecated: use ShmModel, whose calls go straight to "
            "Triton (by value too, transport='inline'), with no Ray call per request"
        )
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        logger.warning("ray-triton-shm: %s", message)

    # ---------------------------------------------------------------- internals

    def _registration(self, pool: ModelPool) -> ModelRegistration:
        return ModelRegistration(
            spec=pool.spec,
            region_name=pool.region.name,
            slot_count=pool.memory.slot_count,
            node_id=self._node_id,
            url=self._url,
            incarnation=self._incarnation,
            generation=pool.generation,
            transport=pool.transport.kind,
            transport_reason=pool.transport.reason,
            batching=pool.batching,
        )

    def _check_incarnation(self, incarnation: str) -> None:
        if incarnation != self._incarnation:
            raise RegionReplacedError(
                "the node actor restarted since this process bound to it (incarnation "
                f"{incarnation}, now {self._incarnation}); bind again",
                incarnation=incarnation,
            )

    def _housekeeping(self) -> None:
        """Sweeps up after callers that died; exports the Ray metrics; compares the configs
        of the models whose pools follow them with their pools."""
        interval = self._config.config_check_interval_s
        while not self._stop.wait(self._config.metrics_interval_s):
            for name in self._client.registered_models:
                try:
                    pool = self._pools.get(name)
                    now = PoolSnapshot.of(pool, node_wide=True)
                    self._metrics.export(name, now, transport=pool.transport.kind)
                    if interval is not None and pool.follows:
                        self._pools.follow(pool, since=time.monotonic() - interval)
                    if interval is not None:
                        self._pools.reprobe(pool, since=time.monotonic() - interval)
                except TritonSHMError:
                    continue  # unregistered meanwhile
                except Exception:  # the next round tries again; never end the thread
                    logger.exception("ray-triton-shm: housekeeping of model %r failed", name)
            try:
                up = self._triton_up()
                self._note_triton(up=up)
                self._metrics.export_node(
                    triton_up=up,
                    triton_restarts=self._triton_restarts,
                    started_s=self._started_s,
                    dead_regions=sum(r.owner_state == DEAD for r in list_local_regions()),
                )
            except Exception:
                logger.exception("ray-triton-shm: exporting the node's metrics failed")

    def _note_triton(self, *, up: bool) -> None:
        """Registers again the regions Triton lost, and counts its restarts.

        A restart is counted once, on whichever proof comes first: Triton answers again after
        it was seen down, or it has lost every registration of the node (only a restart, or
        somebody unregistering every region, does that), which a restart faster than the
        liveness check also leaves.
        """
        with self._triton_lock:
            if not up:
                self._triton_seen_up = False
                return
            came_back, self._triton_seen_up = not self._triton_seen_up, True
            try:
                lost_all = self._register_lost()
            except (InferenceServerException, TritonSHMError):
                self._triton_seen_up = not came_back  # gone again: the next look tells
                return
            self._triton_restarts += came_back or lost_all

    def _register_lost(self) -> bool:
        """Registers the pools Triton has no registration of again; whether it had none of
        any pool (the proof of a restart)."""
        pools = [pool for _, pool in self._registered_pools() if not pool.by_value]
        if not pools:
            return False
        registered = registrations(self._client).keys()
        lost = [pool for pool in pools if registered.isdisjoint(pool.slot_keys)]
        for pool in lost:
            if self._pools.register_again(pool) is pool:  # else laid out anew, and logged
                logger.info(
                    "ray-triton-shm: Triton lost model %r's region; registered it again",
                    pool.spec.name,
                )
        return len(lost) == len(pools)

    def _registered_pools(self) -> list[tuple[str, ModelPool]]:
        """The registered models and their pools (but one unregistered meanwhile)."""
        pools = []
        for name in self._client.registered_models:
            try:
                pools.append((name, self._pools.get(name)))
            except TritonSHMError:
                continue  # unregistered meanwhile
        return pools

    def _triton_up(self) -> bool:
        """Whether the node's Triton answers a liveness check (refusing the keys is an
        answer: the errors by kind tell that)."""
        try:
            return bool(self._client.is_server_live(client_timeout=_LIVENESS_TIMEOUT_S))
        except InferenceServerException as exc:
            return exc.status() not in _UNREACHABLE


def _object_store_in_shm(node_id: str) -> int:
    """The bytes Ray's object store on ``node_id`` may take of ``/dev/shm``: all of its
    ``object_store_memory`` where it lives there (see :func:`object_store_in_dev_shm`), else
    none."""
    if not ray.is_initialized():  # a plain object outside Ray (tests): asking would start one
        return 0
    resources = _node_resources(node_id)
    if resources is None:  # no reservation
        return 0
    store = int(resources.get("object_store_memory", 0))
    return store if object_store_in_dev_shm(store, node_id) else 0


def _has_gpus(node_id: str) -> bool:
    """Whether Ray counts GPUs on ``node_id`` (``True`` when it cannot tell)."""
    resources = _node_resources(node_id)
    return resources is None or float(resources.get("GPU", 0)) > 0


def _node_resources(node_id: str) -> Mapping[str, Any] | None:
    """Ray's resources of ``node_id``; ``None`` when the GCS did not answer, or the node is
    gone."""
    try:
        node = next(n for n in ray.nodes() if n.get("NodeID") == node_id)
    except Exception:
        return None
    return dict(node.get("Resources", {}))


def _current_node_id() -> str:
    if not ray.is_initialized():  # a plain object outside Ray (tests)
        return "local"
    return ray.get_runtime_context().get_node_id()


def find_node_actor(node_id: str | None = None) -> Any | None:
    """The actor of node ``node_id`` (this process's node by default), or ``None`` if it has
    none (the one way the library finds a node's actor)."""
    node = node_id or ray.get_runtime_context().get_node_id()
    try:
        return ray.get_actor(actor_name(node), namespace=NAMESPACE)
    except ValueError:
        return None


@contextlib.contextmanager
def joined_cluster(address: str | None) -> Iterator[None]:
    """Joins the Ray cluster at ``address`` (``None``: the one running here) quietly, in the
    node actors' namespace, for a tool; leaves it after. (``ConnectionError``: no cluster.)"""
    ray.init(
        address or "auto", namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False
    )
    try:
        yield
    finally:
        ray.shutdown()


def node_actor_names() -> list[str]:
    """The names of the node actors of the connected cluster, sorted."""
    prefix = actor_name("")
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)
    )


def get_node_actor(
    *,
    url: str | None = None,
    slots: int = 64,
    max_waiting: int = 64,
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
    client_options: Mapping[str, Any] | None = None,
    node_id: str | None = None,
    autoscaling: SlotAutoscaling | Mapping[str, Any] | None = None,
    shm_budget_bytes: int | None = None,
    transport: str = "auto",
) -> ray.actor.ActorHandle:
    """Returns the node actor of this node (or of ``node_id``), creating it when missing.

    Safe when many replicas race to create it: one wins, everybody gets its handle. The
    configuration of whoever creates the actor applies.

    Args:
        url: Triton's gRPC address on that node; ``None`` reads ``$RAY_TRITON_SHM_URL`` on
            the node, then uses ``localhost:8001``.
        slots: The most slots one model may have on the node (its most requests in flight
            there); pools grow up to it.
        max_waiting: Callers that may wait for a slot of one model before
            :class:`OverloadedError`.
        reconnect_timeout_s: How long the actor's registrations wait for an unreachable
            Triton.
        headers: The control plane's keys (see :class:`NodeActorConfig`); prefer key files
            on the node (``RAY_TRITON_SHM_KEYS_DIR``), which travel in no argument and rotate.
        client_options: TLS and other options of the actor's client (see
            :class:`NodeActorConfig`).
        node_id: The node; default the caller's.
        autoscaling: How the pools of models that give no ``pool_size`` or ``autoscaling`` of
            their own follow their load (a :class:`SlotAutoscaling` or a mapping of its
            fields; ``None``: 2 slots up to ``slots``).
        shm_budget_bytes: The most bytes of the node's ``/dev/shm`` its pools may hold
            (``None``: 90% of it, less Ray's object store where it lives there).
        transport: How the node's models reach its Triton (see :class:`NodeActorConfig`):
            ``"auto"``, ``"shm"`` or ``"inline"``.

    Raises:
        ModelSpecError: an unknown ``transport``.
    """
    check_transport("the node actor's models", transport)
    node = node_id or ray.get_runtime_context().get_node_id()
    actor = find_node_actor(node)
    if actor is not None:
        return actor
    config = NodeActorConfig(
        url=url,
        slots=slots,
        max_waiting=max_waiting,
        reconnect_timeout_s=reconnect_timeout_s,
        headers=dict(headers) if headers else None,
        client_options=dict(client_options) if client_options else None,
        autoscaling=None if autoscaling is None else SlotAutoscaling.of(autoscaling),
        shm_budget_bytes=shm_budget_bytes,
        transport=transport,
    )
    actor_class = ray.remote(  # type: ignore[call-overload]
        # A few threads for the deprecated infer: one per waiting caller (slots + max_waiting,
        # as before its removal) would be ~130 idle threads in every node actor; its callers
        # past these wait in Ray's queue instead.
        concurrency_groups={"infer": DEPRECATED_INFER_THREADS, "control": 4},
        allow_out_of_order_execution=False,  # see the module docstring
    )(TritonNodeActor)
    # A runtime environment of its own costs a worker process started for it (a second); only
    # a node whose GPUs Ray could hide from the actor needs one.
    environment = {"runtime_env": {"env_vars": dict(NODE_ACTOR_ENV_VARS)}}
    return actor_class.options(
        name=actor_name(node),
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        **(environment if _has_gpus(node) else {}),
        max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(config)
