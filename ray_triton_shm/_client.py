"""``TritonSHMClient``: tritonclient's gRPC client plus pooled system-shared-memory inference.

Per registered model the client owns one POSIX region cut into slots, each big enough for every
input and output of one batch of ``max_batch_size`` samples: a fixed ``pool_size`` of them, or
by default as many as its callers need at once, between ``min_slots`` and ``max_slots``
(:mod:`._scaling`). ``infer_shm`` validates the inputs, then for each chunk of at most
``max_batch_size`` samples takes a slot, copies the chunk in, sends Triton a request that only
points at the slot, and copies the outputs out once the response arrives. Up to one chunk per
slot is in flight at once; when every slot is busy, callers wait.

How one call runs over the slots (chunking, slot reuse after errors, deadlines and
cancellation, sending again after Triton restarts) is written once, in :mod:`._engine`;
``infer_shm`` and ``infer_shm_async`` only carry out its steps, by blocking and by awaiting.
Each slot is registered in Triton under a name of its own, so that a slot whose request was
given up is used again exactly when Triton is done with it (:mod:`._settle`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from . import _cuda, _gpu_choice
from ._calls import Calls
from ._changes import Registration, changed_error, differences
from ._defaults import DEFAULT_RECONNECT_TIMEOUT_S, DEFAULT_URL
from ._engine import (
    ModelPool,
    PoolRetired,
    Steps,
    SuspectedChange,
    drive,
    drive_async,
    run,
)
from ._exceptions import (
    AccessDeniedError,
    ClientClosedError,
    InvalidInputError,
    ModelNotRegisteredError,
    ModelSpecError,
    TritonServerError,
    TritonSHMError,
)
from ._gpu_tensors import OUTPUT_KINDS
from ._header import RegionHeader
from ._headers import REDACTED, Keys, Metadata, normalize
from ._inputs import InputValue, prepare_batch
from ._lease import SlotLease
from ._memory import (
    CUDA,
    SYSTEM,
    CudaMemory,
    SlotMemory,
    check_memory_options,
    check_numeric,
    region_bytes,
)
from ._moves import Moves
from ._options import ParameterValue, RequestOptions, request_options, select_outputs
from ._pool import PoolStats, SlotPool, SlotSource
from ._reaper import watch
from ._reclaim import reclaim_dead_registrations
from ._reconnect import Reconnect, channel_options
from ._scaling import Scaler, default_shm_budget
from ._settle import Settler, unregister_slots
from ._shm import SharedMemoryRegion, ensure_room, mib, new_region_name, slot_key
from ._sizing import SlotAutoscaling, pool_sizing
from ._specs import ModelSpec, SlotLayout, SpecLike
from ._tls import ReloadingChannel, TlsFiles, diagnose
from ._triton_errors import status_and_message, translate_error

__all__ = ["TritonSHMClient"]

logger = logging.getLogger(__name__)

#: tritonclient's positional arguments after ``url`` and ``verbose``.
_TRITONCLIENT_OPTIONS = (
    "ssl",
    "root_certificates",
    "private_key",
    "certificate_chain",
    "creds",
    "keepalive_options",
    "channel_args",
)

#: How long ``close()`` waits for in-flight requests before unmapping their memory anyway.
_CLOSE_WAIT_S = 30.0
#: What may send a call to another pool of its model: the model changed on Triton (suspected
#: from a refusal or an answer, or from inputs the pool's spec refuses), or its pool was
#: replaced meanwhile.
_MOVED = (SuspectedChange, PoolRetired, ClientClosedError, InvalidInputError)
#: Inputs the spec refuses make Triton's config be read again at most this often (per pool).
_INPUT_RECHECK_S = 1.0
#: An answer that does not fit its pool (or a fixed-size output refused as too large) proves
#: the model changed, yet while Triton reloads it its config may still read as before: it is
#: read again this often, for this long.
_CONFIG_POLL_S = 0.1
_CONFIG_CATCH_UP_S = 5.0
#: The size of a pool in GPU memory when none is given (GPU pools do not follow their load).
_GPU_POOL_SIZE = 4


@dataclasses.dataclass(frozen=True)
class _Keepers:
    """What looks after a client's pools besides the client: all a finalizer may hold."""

    stub: Any
    keys: Keys
    settler: Settler
    scaler: Scaler
    #: Threads releasing pools replaced by a new layout: closing waits for them.
    retiring: list[threading.Thread] = dataclasses.field(default_factory=list)

    def stop(self) -> None:
        for thread in list(self.retiring):
            thread.join(_CLOSE_WAIT_S)
        self.settler.stop()
        self.scaler.stop()


def _release_pools(pools: dict[str, ModelPool], keepers: _Keepers) -> None:
    """Unregisters and unlinks every pool; the finalizer of a client, so it never sees it."""
    while pools:
        _, pool = pools.popitem()
        _release_pool(pool, keepers, _CLOSE_WAIT_S)
    keepers.stop()


def _release_pool(pool: ModelPool, keepers: _Keepers, wait_s: float) -> None:
    """Waits for the pool's callers (up to ``wait_s``; not for arrays kept from a lease), then
    unregisters and unlinks it, once Triton is done with the requests given up on it (within
    the same wait). Memory a caller still holds stays mapped until the caller lets go."""
    stub, keys = keepers.stub, keepers.keys
    deadline = time.monotonic() + wait_s
    keepers.scaler.forget(pool)
    all_free = pool.slots.close(wait_s=wait_s)
    keepers.settler.forget(pool)
    if not pool.region.owner:  # attached: the owner unregisters and unlinks it
        if all_free:
            pool.memory.release()
            pool.region.close()
        return
    held: list[int] = list(range(pool.memory.slot_count))
    try:
        left_s = max(0.0, deadline - time.monotonic())
        held = unregister_slots(
            stub, pool.memory, pool.slot_keys, keys.metadata(), in_use_wait_s=left_s
        )
    finally:
        pool.region.unlink()
        if all_free:
            pool.memory.release(held)
            pool.region.close()


class TritonSHMClient(grpcclient.InferenceServerClient):
    """A Triton gRPC client that also runs inference through pooled system shared memory.

    A subclass of :class:`tritonclient.grpc.InferenceServerClient`: every plain gRPC method
    still works. It is a drop-in replacement for ``triton_shm_client.TritonSHMClient``.

    Args:
        url: Triton's gRPC address, ``host:port``. The server must run on this machine.
        verbose: Passed to tritonclient.
        *args: Passed to :class:`tritonclient.grpc.InferenceServerClient`: ``ssl``,
            ``root_certificates``, ``private_key``, ``certificate_chain`` and ``creds`` (TLS),
            ``keepalive_options``, ``channel_args``.
        headers: gRPC headers sent on every call the client makes, e.g. the keys of Triton's
            restricted protocols (``{"triton-grpc-protocol-admin-key": ...}``): registration
            and unregistration, status, readiness, model configuration and inference, and the
            plain tritonclient methods (a call's own ``headers=`` are merged over these). Their
            values are never shown: not in the repr, nor in any error. A :class:`Keys` is used
            as it is.
        keys_dir: A directory of key files, one per header, as a mounted Kubernetes Secret
            (see :func:`headers_from_dir`); ``None`` reads ``$RAY_TRITON_SHM_KEYS_DIR`` if
            set. ``headers`` win over it. The files are read again when they change, and when
            Triton refuses a key (the call is then sent once more): keys rotate without
            restarting anyone.
        tls_dir: A directory of TLS files as cert-manager writes them (``ca.crt``; ``tls.crt``
            and ``tls.key`` for mutual TLS), used when ``ssl`` is not given; ``None`` reads
            ``$RAY_TRITON_SHM_TLS_DIR`` if set. TLS files, these or tritonclient's
            ``root_certificates``, ``private_key`` and ``certificate_chain``, are read again
            when they change (a renewed certificate): new connections use them.
        crash_cleanup: If this process dies without closing (SIGKILL, the OOM killer), a
            watchdog process unregisters and unlinks its regions (one per process, started
            with the first registration; see :mod:`ray_triton_shm._reaper`).
        reconnect_timeout_s: How long a request or registration waits for Triton while it is
            unreachable (restarting), before :class:`ServerUnreachableError`; ``0`` fails at
            once. Requests wait on their own, so none fails because Triton was briefly away.
        config_check_interval_s: How often the config of a model whose pool follows it is
            compared with the pool, in the background, to pick up changes no request runs
            into (a larger ``max_batch_size``, an output added); ``None``: only when a
            request runs into one. See :meth:`register_shm_model`.
        shm_budget_bytes: The most bytes of ``/dev/shm`` this client's pools may hold: pools
            that follow their load grow no further (``None``: 90% of ``/dev/shm``).
        **kwargs: Passed to :class:`tritonclient.grpc.InferenceServerClient`.

    Example:
        >>> client = TritonSHMClient(url="localhost:8001")
        >>> client.register_shm_model("classifier", pool_size=4)  # specs from the server
        >>> out = client.infer_shm("classifier", {"INPUT0": images})["OUTPUT0"]
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        verbose: bool = False,
        *args: Any,
        headers: Mapping[str, str] | Keys | None = None,
        keys_dir: str | os.PathLike[str] | None = None,
        tls_dir: str | os.PathLike[str] | None = None,
        crash_cleanup: bool = True,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
        config_check_interval_s: float | None = 10.0,
        shm_budget_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        if reconnect_timeout_s < 0:
            raise ValueError(f"reconnect_timeout_s must be >= 0, got {reconnect_timeout_s}")
        if config_check_interval_s is not None and not config_check_interval_s > 0:
            raise ValueError(
                f"config_check_interval_s must be > 0 or None, got {config_check_interval_s}"
            )
        self._keys = headers if isinstance(headers, Keys) else Keys(headers, keys_dir=keys_dir)
        options = dict(zip(_TRITONCLIENT_OPTIONS, args, strict=False)) | kwargs
        options["channel_args"] = channel_options(
            options.get("channel_args"), options.pop("keepalive_options", None)
        )
        tls = TlsFiles.from_options(options, tls_dir)
        if tls is not None:  # tritonclient's plain channel never connects: ours replaces it
            for name in ("ssl", "root_certificates", "private_key", "certificate_chain"):
                options.pop(name, None)
        super().__init__(url, verbose, **options)
        if tls is not None:
            self._channel.close()  # type: ignore[has-type]
            self._channel = ReloadingChannel(url, tls, options["channel_args"])
            self._client_stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._plain = tls is None and options.get("creds") is None
        self._url = url
        self._crash_cleanup = crash_cleanup
        self._reconnect_timeout_s = reconnect_timeout_s
        self._config_check_interval_s = config_check_interval_s
        #: Called on each new pool before anyone uses it (the Ray node actor shares its slots).
        self._on_new_pool: Callable[[ModelPool], None] | None = None
        self._pools: dict[str, ModelPool] = {}
        self._registry_lock = threading.Lock()
        self._closed = False
        self._swept = False
        self._settler = Settler(self._client_stub, self._keys)
        budget = default_shm_budget() if shm_budget_bytes is None else shm_budget_bytes
        self._scaler = Scaler(budget, self._pools)
        self._keepers = _Keepers(self._client_stub, self._keys, self._settler, self._scaler)
        # Captures the pools and their keepers, never self: the client can still be collected.
        self._finalizer = weakref.finalize(self, _release_pools, self._pools, self._keepers)
        self._close_lock = threading.Lock()  # last: close() tells a whole client by it

    # ------------------------------------------------------------------ registration

    def register_shm_model(
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
        device: int | str | None = None,
        triton_device_id: int | None = None,
    ) -> ModelSpec:
        """Allocates a slot pool for a model and registers it with Triton.

        Specs are ``(name, shape_without_batch, dtype)``; the dtype is a NumPy dtype or a Triton
        datatype name. Whatever is left out is read from the model's configuration on the
        server. Registering the same model again with the same specs is a no-op.

        **When the model changes on Triton** (a new config loaded, Triton restarted on an
        edited repository): a pool whose ``inputs``, ``outputs`` and ``max_batch_size`` all
        came from Triton's config follows the model. The first request that Triton refuses or
        answers in a way the change explains (or inputs the old spec refuses, or the check
        every ``config_check_interval_s``) makes the client read the config again, lay the
        pool out anew in a new region and send the request again there; the old region is
        unregistered and unlinked once Triton is done with every request on it. A pool with
        specs given by hand gets :class:`ModelChangedError` instead, naming what changed:
        register it again with ``replace=True``.

        Args:
            model_name: The model.
            inputs: Input specs, or ``None`` to read them from the server.
            outputs: Output specs, or ``None`` to read them from the server.
            max_batch_size: Samples per slot; ``None`` reads it from the server; ``0`` for a
                model that does not batch.
            pool_size: A fixed number of slots, i.e. requests in flight at once for this model;
                ``None`` (the default): as many as its callers need at once, within
                ``autoscaling``'s bounds.
            autoscaling: How a pool without ``pool_size`` follows its load: a
                :class:`SlotAutoscaling`, or a mapping of its fields (``min_slots``,
                ``max_slots``, ``upscale_delay_s``, ``downscale_delay_s``); ``None``: the
                defaults, 2 to 64 slots. It grows while callers wait for a slot, and shrinks
                after ``downscale_delay_s`` with fewer callers. A pool in GPU memory has a
                fixed size (4 by default).
            model_version: Model version; ``""`` lets the server choose.
            max_shapes: Per-sample maximum for tensors with ``-1`` dims, e.g.
                ``{"INPUT0": (16,)}``: slots are sized for it.
            max_element_bytes: The longest element of each BYTES (string) tensor, e.g.
                ``{"TEXT": 256, "UPPER": 256}``: slots are sized for it.
            replace: If the model is registered with other specs, lay its pool out anew for
                these (calls in flight finish on the old pool) instead of raising.
            memory: Where the slots live: ``"system"`` (POSIX shared memory) or ``"cuda"``
                (GPU memory, through Triton's CUDA shared memory: inputs may then also be GPU
                tensors, and outputs come back as GPU tensors on request, see
                :meth:`infer_shm`). GPU memory needs an NVIDIA GPU and driver here and in
                Triton's reach, and the ``[cuda]`` extra; models with BYTES tensors stay in
                system memory.
            device: For ``memory="cuda"``, the GPU: an index in this process (``0``,
                ``"cuda:1"``), a UUID (``"GPU-..."``), or ``None`` for the current CUDA device.
            triton_device_id: For ``memory="cuda"``, the index Triton knows that GPU by;
                ``None`` guesses it from ``CUDA_VISIBLE_DEVICES`` (right where Triton sees every
                GPU of the machine, as in its container by default).

        Returns:
            The resolved :class:`ModelSpec`.

        Raises:
            ModelSpecError: unusable specs (a BYTES tensor without ``max_element_bytes``...),
                or the model is registered with other specs (and ``replace`` is false).
            SharedMemoryFullError: ``/dev/shm`` has no room for the pool (nothing was created).
            TritonServerError: Triton refused (unknown model, no shared memory, ...).
            AccessDeniedError: Triton restricts shared memory or model configuration, and the
                client's headers lack the key (nothing was left behind).
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``.
            CudaError: ``memory="cuda"`` cannot be used here (no GPU or driver, the bindings
                missing, a GPU not visible, Triton cannot open the GPU memory); nothing was
                left behind.
            GPUMemoryFullError: the GPU has no room for the pool (nothing was left behind).
        """

        def register() -> ModelSpec:
            return self._register_shm_model(
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
            )

        used = self._keys.metadata()
        try:
            return register()
        except AccessDeniedError:
            if not self._keys.refused(used):
                raise
            return register()

    def _register_shm_model(
        self,
        model_name: str,
        inputs: Sequence[SpecLike] | None,
        outputs: Sequence[SpecLike] | None,
        max_batch_size: int | None,
        pool_size: int | None,
        *,
        autoscaling: SlotAutoscaling | Mapping[str, Any] | None,
        model_version: str,
        max_shapes: Mapping[str, Sequence[int]] | None,
        max_element_bytes: Mapping[str, int] | None,
        replace: bool,
        memory: str,
        device: int | str | None,
        triton_device_id: int | None,
    ) -> ModelSpec:
        self._check_open()
        check_memory_options(model_name, memory, device, triton_device_id)
        if memory == CUDA and pool_size is None:
            if autoscaling is not None:
                raise ModelSpecError(
                    f"model {model_name!r}: a pool in GPU memory has a fixed size: pass "
                    "pool_size, not autoscaling",
                    model=model_name,
                )
            pool_size = _GPU_POOL_SIZE
        sizing = pool_sizing(model_name, pool_size, autoscaling)
        gpu = None
        if memory == CUDA:  # the GPU by its UUID: the same in every process, every layout
            gpu = _cuda.find_device(device)
            if triton_device_id is None:
                triton_device_id = _gpu_choice.triton_device_id(gpu)
        registration = Registration.of(
            inputs=inputs,
            outputs=outputs,
            max_batch_size=max_batch_size,
            model_version=model_version,
            max_shapes=max_shapes,
            max_element_bytes=max_element_bytes,
            memory=memory,
            device=None if gpu is None else gpu.uuid,
            triton_device_id=triton_device_id,
        )
        spec = registration.resolve(
            model_name, lambda: self._load_config(model_name, model_version)
        )
        with self._registry_lock:
            existing = self._pools.get(model_name)
            if existing is None:
                self._pools[model_name] = self._create_pool(spec, sizing, registration)
                return spec
            same_memory = existing.registration is None or (
                existing.registration.memory,
                existing.registration.device,
            ) == (memory, registration.device)
            if existing.spec == spec and existing.sizing == sizing and same_memory:
                return spec
            # The same request of a pool that follows the model: the model changed meanwhile.
            follows = existing.registration == registration and registration.follows
            if not (replace or (follows and existing.sizing == sizing)):
                raise ModelSpecError(
                    f"model {model_name!r} is already registered with other specs "
                    f"({_sizing_text(existing.sizing)}, memory {existing.memory.kind!r}, "
                    f"{existing.spec}); pass replace=True, "
                    "or call unregister_shm_model first",
                    model=model_name,
                )
        self._replace(existing, spec, sizing, registration)
        return spec

    def _load_config(self, model_name: str, model_version: str) -> Mapping[str, Any]:
        reconnect = self._reconnect(model_name)
        try:
            config = reconnect.call(
                lambda: self.get_model_config(model_name, model_version, as_json=True)
            )
        except InferenceServerException as exc:
            raise translate_error(
                exc, model=model_name, action="reading the model configuration"
            ) from exc
        return config.get("config", config)

    def _reconnect(
        self,
        model: str | None,
        timeout_s: float | None = None,
        metadata: Metadata | None = None,
    ) -> Reconnect:
        """A reconnect budget for one request (``timeout_s``: the client's by default), whose
        readiness questions carry ``metadata`` (the client's headers by default)."""
        budget = self._reconnect_timeout_s if timeout_s is None else timeout_s
        if metadata is None:
            metadata = self._get_metadata(None)
        return Reconnect(
            self._channel,
            self._url,
            budget,
            model,
            metadata=metadata,
            tls_problem=self._tls_problem,
        )

    def _tls_problem(self) -> tuple[str, str] | None:
        """Whether TLS is why Triton cannot be reached (see :func:`._tls.diagnose`)."""
        if isinstance(self._channel, ReloadingChannel):
            if self._channel.reload():
                return None  # rotated files: the next try uses them
            return diagnose(self._url, self._channel.files)
        return diagnose(self._url, None) if self._plain else None

    def _get_metadata(
        self, headers: Mapping[str, str] | None, keys: Metadata | None = None
    ) -> Metadata:
        """The metadata of one gRPC call: the client's keys (``keys``: those in use now) with
        ``headers`` merged over them, after tritonclient's plugin (if any) had its say.

        tritonclient's own methods call this too, so they send the client's keys.
        """
        metadata = self._keys.metadata() if keys is None else keys
        if not headers and self.plugin() is None:
            return metadata
        merged = {**dict(metadata), **normalize(headers)}
        return Metadata(super()._get_metadata(merged))

    def _create_pool(
        self,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
        generation: int = 0,
        initial: int | None = None,
    ) -> ModelPool:
        """A new pool for ``spec``, registered in Triton; one that follows its load starts
        with ``initial`` slots (default: its ``min_slots``), its region room for the most."""
        reconnect = self._reconnect(spec.name)
        if not self._swept:
            # Registrations left by crashed processes pin memory in Triton: drop them once.
            try:
                reconnect.call(lambda: reclaim_dead_registrations(self))
                self._swept = True
            except InferenceServerException:
                pass  # best effort; the registration below reports what is wrong
        layout = SlotLayout.for_model(spec)
        kind = registration.memory
        if kind == CUDA:
            check_numeric(spec)
        if isinstance(sizing, SlotAutoscaling):
            capacity = sizing.max_slots
            count = min(max(initial or sizing.min_slots, sizing.min_slots), capacity)
        else:
            capacity = count = sizing
        size = region_bytes(kind, layout, capacity)
        backed = region_bytes(kind, layout, count)
        where = "" if kind == SYSTEM else " (their table; the slots are on the GPU)"
        ensure_room(
            backed,
            what=f"model {spec.name!r}: a pool of {count} slot(s) of {mib(layout.slot_bytes)}"
            + where,
            model=spec.name,
            fix="register the model with a smaller pool_size, min_slots or max_batch_size",
        )
        if self._crash_cleanup:
            watch(self._url)
        region = SharedMemoryRegion.create(
            new_region_name(spec.name),
            size,
            slots=capacity if kind == SYSTEM else 0,
            backed=backed,
        )
        try:
            memory = self._slot_memory(region, layout, capacity, registration, spec.name)
        except BaseException:
            region.unlink()
            region.close()
            raise
        keys = [slot_key(region.name, slot) for slot in range(capacity)]
        registered = False
        try:
            self._register_slots(memory, keys, reconnect, model=spec.name)
            registered = True
            header = RegionHeader(region.buffer, capacity)
            header.set_size(count)
            header.set_bounds(count if isinstance(sizing, int) else sizing.min_slots)
            slots = SlotPool(count, name=spec.name, capacity=capacity)
            pool = ModelPool.over(
                spec,
                memory,
                slots,
                header,
                registration=registration,
                generation=generation,
                sizing=sizing,
            )
            pool.next_check = time.monotonic() + (self._config_check_interval_s or 0)
            if self._on_new_pool is not None:
                self._on_new_pool(pool)
        except BaseException as exc:
            # Registered, or interrupted (Ctrl-C) while Triton may have been registering it.
            held: list[int] = []
            if registered or not isinstance(exc, Exception):
                held = unregister_slots(self._client_stub, memory, keys, self._keys.metadata())
            memory.release(held)
            region.unlink()
            region.close()
            raise
        pool.wake_settler = self._settler.notify
        self._settler.watch(pool)
        if isinstance(sizing, SlotAutoscaling):
            self._scaler.watch(pool, sizing)
        return pool

    @staticmethod
    def _slot_memory(
        region: SharedMemoryRegion,
        layout: SlotLayout,
        pool_size: int,
        registration: Registration,
        model: str,
    ) -> SlotMemory:
        """The memory of a new region's slots, as ``registration`` asks (GPU memory is
        allocated here)."""
        if registration.memory == SYSTEM:
            return SlotMemory(region, layout, pool_size)
        assert registration.triton_device_id is not None
        device = _cuda.find_device(registration.device)
        return CudaMemory.create(
            region, layout, pool_size, device, registration.triton_device_id, model=model
        )

    # ------------------------------------------------------------------ model changes

    def _replace(
        self,
        old: ModelPool,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
    ) -> ModelPool:
        """Lays a model's pool out anew; the old one is retired: a caller that takes one of
        its slots moves to the new pool, and once Triton is done with every request on it,
        it is unregistered and unlinked (in the background)."""
        with old.lock:
            if old.successor is not None:
                return old.successor
            # As large as the old one is now: the load that made it so goes on.
            new = self._create_pool(
                spec, sizing, registration, old.generation + 1, initial=old.slots.size
            )
            with self._registry_lock:
                if self._pools.get(spec.name) is old:
                    self._pools[spec.name] = new
            old.successor = new
            old.header.retire()
        logger.info(
            "ray-triton-shm: model %r laid out anew for its config on Triton (generation %d)",
            spec.name,
            new.generation,
        )
        retiring = self._keepers.retiring
        retiring[:] = [thread for thread in retiring if thread.is_alive()]
        thread = threading.Thread(
            target=_release_pool,
            args=(old, self._keepers, _CLOSE_WAIT_S),
            name="ray-triton-shm-retire",
            daemon=True,
        )
        retiring.append(thread)
        thread.start()
        return new

    def _follow(
        self, pool: ModelPool, *, since: float, cause: BaseException | None = None
    ) -> ModelPool | None:
        """Compares Triton's config of the model with the pool's spec (unless that was done
        after ``since``, a ``time.monotonic()``), and lays the pool out anew if it follows the
        model and the model changed.

        Returns:
            The pool to use now, or ``None`` if the model did not change.

        Raises:
            ModelChangedError: specs given by hand that no longer match the model.
            ModelSpecError: the new config cannot be laid out (a ``-1`` dim without a maximum).
            ModelNotLoadedError: the model is not loaded on Triton.
        """
        registration = pool.registration
        if registration is None:
            return None
        name = pool.spec.name
        with pool.lock:
            if pool.successor is not None:
                return pool.successor
            if pool.checked_at >= since:
                if pool.check_error is not None:
                    raise pool.check_error
                return None
            pool.checked_at = time.monotonic()
            config = self._load_config(name, registration.model_version)
            if not registration.follows:
                current = registration.resolve_from_config(name, config)
                found = [] if current is None else differences(pool.spec, current)
                pool.check_error = changed_error(pool.spec, found, cause) if found else None
                if pool.check_error is not None:
                    raise pool.check_error
                return None
            spec = registration.resolve(name, lambda: config)
            if spec == pool.spec:
                return None
        assert pool.sizing is not None  # a pool this client owns
        return self._replace(pool, spec, pool.sizing, registration)

    def _catch_up(self, pool: ModelPool, cause: TritonServerError) -> ModelPool | None:
        """The pool of the model's new config, read again until it differs from ``pool``'s
        (``None``: it did not within :data:`_CONFIG_CATCH_UP_S`)."""
        deadline = time.monotonic() + _CONFIG_CATCH_UP_S
        while time.monotonic() < deadline and not self._closed:
            time.sleep(_CONFIG_POLL_S)
            newer = self._follow(pool, since=time.monotonic(), cause=cause)
            if newer is not None:
                return newer
        return None

    def _call(
        self,
        pool: ModelPool,
        options: RequestOptions | None,
        headers: Mapping[str, str] | None,
        client_timeout_s: float | None,
        reconnect_timeout_s: float | None,
    ) -> tuple[Calls, Moves[ModelPool]]:
        """One call's gRPC side, and where it goes on when its keys are refused (read them
        again, once) or its pool stops it (the model's newer pool)."""
        calls = Calls(
            self,
            pool.spec.name,
            pool,
            headers=headers,
            client_timeout_s=client_timeout_s,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        started = time.monotonic()

        def recover(pool: ModelPool, exc: BaseException) -> ModelPool:
            if isinstance(exc, AccessDeniedError):
                if not calls.rotate():
                    raise exc
                return pool
            calls.pool = self._next_pool(pool, exc, options, started)
            return calls.pool

        return calls, Moves(pool, (AccessDeniedError, *_MOVED), recover)

    def _next_pool(
        self,
        pool: ModelPool,
        exc: BaseException,
        options: RequestOptions | None,
        started: float,
    ) -> ModelPool:
        """The pool a call goes to after ``exc`` (one of :data:`_MOVED`) stopped it on
        ``pool``, or raises what the caller should get."""
        current = self._pools.get(pool.spec.name)
        if isinstance(exc, (PoolRetired, ClientClosedError)):
            if self._closed or current is None or current is pool or pool.registration is None:
                raise exc
            return current
        if pool.registration is None:
            raise exc  # attached: the region's owner follows the model (ShmModel asks it)
        if isinstance(exc, InvalidInputError):
            if not pool.follows or exc.model is None:
                raise exc
            newer = self._follow(pool, since=time.monotonic() - _INPUT_RECHECK_S)
        else:
            assert isinstance(exc, SuspectedChange)
            newer = self._follow(pool, since=started, cause=exc.error)
            if newer is None and exc.proven:
                newer = self._catch_up(pool, exc.error)
            if newer is not None and exc.executed and options is not None and options.is_sequence:
                raise exc.error  # Triton ran this step: sending it again would apply it twice
        if newer is None:
            raise exc.error if isinstance(exc, SuspectedChange) else exc
        return newer

    def _steps(
        self,
        pool: ModelPool,
        inputs: Mapping[str, InputValue],
        options: RequestOptions | None,
        slot_timeout_s: float | None,
        request_id: str,
        outputs_as: str = "numpy",
    ) -> Steps:
        """The steps of one call on ``pool``, its inputs and options checked against it.

        Raises:
            InvalidInputError: naming what does not match (nothing was written).
        """
        device = pool.memory.device
        if outputs_as not in OUTPUT_KINDS or (outputs_as != "numpy" and device is None):
            raise InvalidInputError(
                f"model {pool.spec.name!r}: outputs_as must be one of {OUTPUT_KINDS} ('torch' "
                f"and 'cupy' for a pool in GPU memory, memory='cuda'), got {outputs_as!r} for "
                f"a pool in {pool.memory.kind} memory",
                model=pool.spec.name,
                expected=OUTPUT_KINDS if device is not None else ("numpy",),
                actual=outputs_as,
            )
        batch = prepare_batch(pool.spec, inputs, device)
        chosen = None if options is None else select_outputs(pool.spec, options)
        if chosen is not None and chosen.is_sequence and batch.size > pool.spec.batch_capacity:
            raise InvalidInputError(
                f"model {pool.spec.name!r}: a step of sequence {chosen.sequence_id!r} holds "
                f"{batch.size} samples, more than one request takes (max_batch_size "
                f"{pool.spec.batch_capacity}); the steps of a sequence are never split: send "
                "at most max_batch_size samples per step",
                model=pool.spec.name,
                tensor=None,
                expected=f"<= {pool.spec.batch_capacity} samples",
                actual=batch.size,
            )
        self._maybe_check(pool)
        return run(
            pool,
            batch,
            slot_timeout_s=slot_timeout_s,
            request_id=request_id,
            options=chosen,
            outputs_as=outputs_as,
        )

    def _maybe_check(self, pool: ModelPool) -> None:
        """Every ``config_check_interval_s``, compares the config of a model whose pool
        follows it with the pool, in the background."""
        if self._config_check_interval_s is None or not pool.follows:
            return
        now = time.monotonic()
        if now < pool.next_check:
            return
        pool.next_check = now + self._config_check_interval_s
        threading.Thread(
            target=self._check_quietly, args=(pool,), name="ray-triton-shm-config", daemon=True
        ).start()

    def _check_quietly(self, pool: ModelPool) -> None:
        try:
            self._follow(pool, since=time.monotonic())
        except Exception as exc:  # a request that meets the problem reports it
            logger.debug("ray-triton-shm: checking the config of %r: %s", pool.spec.name, exc)

    def _attach_pool(
        self,
        spec: ModelSpec,
        memory: SlotMemory,
        slots: SlotSource,
        reregister: Callable[[], None],
        generation: int = 0,
    ) -> None:
        """Uses an attached region somebody else owns and registered (the Ray node actor), on
        the slots ``slots`` hands out; replaces an earlier attachment of the model."""
        self._check_open()
        header = RegionHeader(memory.region.buffer, memory.slot_count)
        pool = ModelPool.over(spec, memory, slots, header, reregister, generation=generation)
        with self._registry_lock:
            stale = self._pools.get(spec.name)
            self._pools[spec.name] = pool
        if stale is not None:
            _release_pool(stale, self._keepers, _CLOSE_WAIT_S)

    def unregister_shm_model(self, model_name: str) -> None:
        """Unregisters a model's pool from Triton and frees its memory; idempotent.

        Waits for the model's requests in flight to finish first.
        """
        with self._registry_lock:
            pool = self._pools.pop(model_name, None)
        if pool is not None:
            _release_pool(pool, self._keepers, _CLOSE_WAIT_S)

    @property
    def registered_models(self) -> dict[str, ModelSpec]:
        """The models with a shared-memory pool, and their specs."""
        return {name: pool.spec for name, pool in list(self._pools.items())}

    def shm_stats(self, model_name: str) -> PoolStats:
        """Slots in use and callers waiting for a registered model (this process's share, for
        a region shared with other processes), its size now and its bounds."""
        pool = self._pool(model_name)
        header = pool.header
        return dataclasses.replace(
            pool.slots.stats(),
            min_size=header.min_size,
            max_size=header.slot_count,
            limited_by=header.limited_by,
            shm_bytes=pool.region.allocated if pool.region.owner else 0,
        )

    def _pool(self, model_name: str) -> ModelPool:
        pool = self._pools.get(model_name)
        if pool is None:
            self._check_open()
            raise ModelNotRegisteredError(
                f"model {model_name!r} has no shared-memory pool: call "
                f"register_shm_model({model_name!r}, ...) first (registered: "
                f"{sorted(self._pools)})",
                model=model_name,
            )
        return pool

    def _reregister(self, pool: ModelPool, epoch: int, reconnect: Reconnect) -> None:
        """Registers the pool's region again after Triton forgot it (e.g. it restarted)."""
        with pool.lock:
            if pool.epoch != epoch:
                return  # another request already did it
            if pool.reregister is not None:
                pool.reregister()
                pool.epoch += 1
                return
            self._register_slots(pool.memory, pool.slot_keys, reconnect, model=pool.spec.name)
            pool.epoch += 1

    def _register_slots(
        self,
        memory: SlotMemory,
        keys: Sequence[str],
        reconnect: Reconnect,
        *,
        model: str,
    ) -> None:
        """Registers each slot of a region in Triton under its own name (a name already
        registered, by a concurrent caller that found it missing too, is fine).

        Raises:
            TritonServerError: Triton refused.
            ServerUnreachableError: Triton stayed unreachable.
        """
        used = self._keys.metadata()
        try:
            self._register_each(memory, keys, reconnect, model=model)
        except AccessDeniedError:
            if not self._keys.refused(used):
                raise
            self._register_each(memory, keys, self._reconnect(model), model=model)

    def _register_each(
        self,
        memory: SlotMemory,
        keys: Sequence[str],
        reconnect: Reconnect,
        *,
        model: str,
    ) -> None:
        stub = self._client_stub
        for slot, key in enumerate(keys):
            try:
                reconnect.call(
                    lambda key=key, slot=slot: memory.register(  # type: ignore[misc]
                        stub, key, slot, self._get_metadata(None)
                    )
                )
            except grpc.RpcError as exc:
                if status_and_message(exc)[0] != str(grpc.StatusCode.ALREADY_EXISTS):
                    error = translate_error(exc, model=model, action="registering shared memory")
                    raise memory.explain(error) from exc

    # ------------------------------------------------------------------ inference

    def infer_shm(
        self,
        model_name: str,
        inputs: Mapping[str, InputValue],
        *,
        slot_timeout_s: float | None = None,
        client_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        request_id: str = "",
        reconnect_timeout_s: float | None = None,
        priority: int = 0,
        queue_timeout_s: float | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        parameters: Mapping[str, ParameterValue] | None = None,
        outputs: Sequence[str] | None = None,
        outputs_as: str = "numpy",
    ) -> dict[str, Any]:
        """Runs inference through the model's shared-memory slots.

        Inputs larger than ``max_batch_size`` are split into chunks, up to ``pool_size`` of
        them in flight at once, and the outputs are put back together in order.

        Args:
            model_name: A model registered with :meth:`register_shm_model`.
            inputs: ``{name: array}``; an array holds the whole batch, or is a list of
                per-sample arrays. A pool in GPU memory also takes GPU tensors on its GPU
                (torch, cupy, JAX: anything with ``__cuda_array_interface__`` or
                ``__dlpack__``), copied device to device after the work queued on their
                stream.
            slot_timeout_s: How long to wait for a free slot (``None``: as long as it takes).
            client_timeout_s: How long to wait for Triton's answer to each request (each
                chunk), from when it is sent; past it the call raises
                :class:`TritonServerError` with ``status`` ``"StatusCode.DEADLINE_EXCEEDED"``.
                Triton still runs the request (it cannot be recalled): its slot is used again
                only once Triton has answered it.
            headers: gRPC headers of this call, merged over the client's.
            request_id: Triton request id, sent with every chunk.
            reconnect_timeout_s: How long to wait for Triton while it is unreachable; ``None``
                for the client's ``reconnect_timeout_s``.
            priority: Triton's priority level of the request (``0``: the model's default;
                ``1`` is the highest), for a model whose scheduler has ``priority_levels``.
            queue_timeout_s: Triton's own timeout: past it, a request still waiting in
                Triton's queue is rejected there and its slot is free at once (the model
                needs ``default_queue_policy { timeout_action: REJECT
                allow_timeout_override: true }``). Unlike ``client_timeout_s``, Triton does not
                run such a request at all.
            sequence_id: The sequence of a stateful model (int, or str for a model with
                string ids); its steps are never chunked.
            sequence_start: This request starts the sequence.
            sequence_end: This request ends the sequence.
            parameters: Custom parameters for the model (str, int, float or bool values); names
                the library or Triton use themselves are refused.
            outputs: Ask for these outputs only (``None``: all); only they are returned.
            outputs_as: ``"numpy"`` (the default), or for a pool in GPU memory ``"torch"`` or
                ``"cupy"``: tensors on the pool's GPU, never through the host.

        Returns:
            ``{output name: array}``; the arrays belong to the caller.

        Raises:
            ModelNotRegisteredError: the model has no pool.
            InvalidInputError: the inputs or options do not match the model (nothing was sent).
            SlotTimeoutError: no slot came free within ``slot_timeout_s``.
            TritonServerError: Triton answered with an error, or not within
                ``client_timeout_s``.
            ModelChangedError: the model changed on Triton and its specs were given by hand.
            ModelNotLoadedError: the model is not loaded on Triton.
            AccessDeniedError: Triton restricts inference, and the headers lack the key.
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``.
        """
        pool = self._pool(model_name)
        options = request_options(
            model_name,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            outputs=outputs,
        )
        calls, moves = self._call(pool, options, headers, client_timeout_s, reconnect_timeout_s)
        try:
            return moves.run(
                lambda pool: drive(
                    self._steps(pool, inputs, options, slot_timeout_s, request_id, outputs_as),
                    calls.do,
                )
            )
        except TritonSHMError as exc:
            moves.target.count_failure(exc)
            raise

    def lease(
        self,
        model_name: str,
        *,
        batch: int | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        slot_timeout_s: float | None = None,
        client_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        request_id: str = "",
        reconnect_timeout_s: float | None = None,
        priority: int = 0,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> SlotLease:
        """Leases one slot of the model's pool: write the inputs where Triton reads them, read
        the outputs where Triton wrote them (see :class:`SlotLease`).

        ```python
        with client.lease("classifier", batch=8) as lease:
            np.divide(images, 255, out=lease.inputs["INPUT0"])  # no copy of yours
            probs = lease.infer()["OUTPUT0"]  # read-only, in the slot
        ```

        The slot is taken on entering the block (``with`` or ``async with``), with the rules
        of :meth:`infer_shm` (backpressure, ``slot_timeout_s``, a model that moved), and goes
        back once the block ended and no array of the lease is alive.

        Args:
            model_name: A model registered with :meth:`register_shm_model` (in system memory,
                without BYTES inputs).
            batch: Samples in the request, 1 to ``max_batch_size`` (``None`` for a model that
                does not batch).
            shapes: Per-sample shape of each input with variable dims (``-1``); the others
                take the model's.
            slot_timeout_s: How long to wait for a free slot (``None``: as long as it takes).
            client_timeout_s: How long the request waits for Triton's answer (as for
                :meth:`infer_shm`).
            headers: gRPC headers of this request, merged over the client's.
            request_id: Triton request id.
            reconnect_timeout_s: How long to wait for Triton while it is unreachable.
            priority: Triton's priority level of the request (see :meth:`infer_shm`).
            queue_timeout_s: Triton's own queue timeout (see :meth:`infer_shm`).
            parameters: Custom parameters for the model.
            outputs: Ask for these outputs only (``None``: all).

        Raises:
            ModelNotRegisteredError: the model has no pool.
            InvalidInputError: ``batch``, ``shapes`` or the options do not fit the model (no
                slot was taken).
        """
        pool = self._pool(model_name)
        calls = Calls(
            self,
            model_name,
            pool,
            headers=headers,
            client_timeout_s=client_timeout_s,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        try:
            options = request_options(
                model_name,
                priority=priority,
                queue_timeout_s=queue_timeout_s,
                parameters=parameters,
                outputs=outputs,
            )
            chosen = None if options is None else select_outputs(pool.spec, options)
            return SlotLease(
                calls,
                batch=batch,
                shapes=shapes,
                options=chosen,
                slot_timeout_s=slot_timeout_s,
                request_id=request_id,
            )
        except TritonSHMError as exc:
            pool.count_failure(exc)
            raise

    async def infer_shm_async(
        self,
        model_name: str,
        inputs: Mapping[str, InputValue],
        *,
        slot_timeout_s: float | None = None,
        client_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        request_id: str = "",
        reconnect_timeout_s: float | None = None,
        priority: int = 0,
        queue_timeout_s: float | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        parameters: Mapping[str, ParameterValue] | None = None,
        outputs: Sequence[str] | None = None,
        outputs_as: str = "numpy",
    ) -> dict[str, Any]:
        """:meth:`infer_shm` for coroutines: same semantics, no thread blocked while waiting.

        Waiting for a slot and for Triton's answer both happen on the event loop. Cancelling
        the coroutine is safe: slots come back once Triton has answered.
        """
        pool = self._pool(model_name)
        options = request_options(
            model_name,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            outputs=outputs,
        )
        calls, moves = self._call(pool, options, headers, client_timeout_s, reconnect_timeout_s)
        try:
            return await moves.run_async(
                lambda pool: drive_async(
                    self._steps(pool, inputs, options, slot_timeout_s, request_id, outputs_as),
                    calls.do_async,
                )
            )
        except TritonSHMError as exc:
            moves.target.count_failure(exc)
            raise

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Unregisters and frees every pool, then closes the channel; idempotent.

        Waits for the requests in flight (up to 30 s); a close called meanwhile, from another
        thread, waits for the first one to end. It does not wait for outputs of a lease kept
        past its block (Triton is done with them): their slots are unregistered and unlinked
        too, and their memory stays mapped, and readable, while they live.
        """
        # tritonclient's __del__ calls close() even when __init__ failed half-way.
        if not hasattr(self, "_close_lock"):
            if hasattr(self, "_channel"):
                super().close()
            return
        self._closed = True  # refuses new requests at once
        with self._close_lock:
            if not self._finalizer.alive:
                return
            try:
                self._finalizer()
            finally:
                super().close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the TritonSHMClient is closed")

    def __enter__(self) -> TritonSHMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"models={sorted(self._pools)}"
        names = self._keys.names
        headers = f" headers={dict.fromkeys(names, REDACTED)}" if names else ""
        return f"<TritonSHMClient {self._url}{headers} {state}>"


def _sizing_text(sizing: int | SlotAutoscaling | None) -> str:
    if isinstance(sizing, SlotAutoscaling):
        return f"autoscaling {sizing.min_slots} to {sizing.max_slots} slots"
    return f"pool_size {sizing}"
