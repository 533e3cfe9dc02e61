"""``TritonSHMClient``: tritonclient's gRPC client plus pooled shared-memory inference.

Per registered model the client owns one region cut into slots, each big enough for every
input and output of one batch of ``max_batch_size`` samples: a fixed ``pool_size`` of them, or
by default as many as its callers need at once, between ``min_slots`` and ``max_slots``
(:mod:`._pools._scaling`). The slots are in system shared memory (POSIX), or in GPU memory
through Triton's CUDA shared memory (``memory="cuda"``, :mod:`._slots._memory`); where Triton
cannot map this process's memory (another host, a container with its own ``/dev/shm``), the
tensors go by value, in the requests, and the slots still bound the requests in flight
(``transport``, :mod:`._inference._transport`). ``infer_shm`` validates the inputs, then for
each chunk of at most ``max_batch_size`` samples takes a slot, copies the chunk in, sends Triton
a request that points at the slot (or carries the chunk, by value), and copies the outputs out
once the response arrives. Up to one chunk per slot is in flight at once; when every slot is
busy, callers wait.

How one call runs over the slots (chunking, slot reuse after errors, deadlines and
cancellation, sending again after Triton restarts) is written once, in :mod:`._inference._engine`;
``infer_shm`` and ``infer_shm_async`` only carry out its steps, by blocking and by awaiting.
Each slot is registered in Triton under a name of its own, so that a slot whose request was
given up is used again exactly when Triton is done with it (:mod:`._pools._abandoned`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import raise_error

from ._calls import Call, count_failure
from ._defaults import DEFAULT_RECONNECT_TIMEOUT_S, DEFAULT_URL
from ._exceptions import LeaseByValueError, TritonSHMError
from ._inference._engine import unary_refusal
from ._inference._inputs import InputValue
from ._inference._model_change import plan_registration
from ._inference._node_batching import NodeBatching
from ._inference._options import (
    ParameterValue,
    RequestOptions,
    options_without_sequence,
    renamed_outputs,
    request_options,
    select_outputs,
)
from ._inference._stream import StreamResponse
from ._inference._transport import node_name
from ._lease import SlotLease
from ._pools._reclaim import reclaim_dead_registrations
from ._pools._registry import Registry
from ._slots._memory import SYSTEM
from ._slots._sizing import SlotAutoscaling
from ._slots._slot_pool import PoolStats
from ._slots._specs import ModelSpec, SpecLike
from ._streaming import StreamCall, end_streams
from ._wire._channel import Channel, tritonclient_options
from ._wire._http import AUTO_HTTP_URL
from ._wire._keys import REDACTED, Keys
from ._wire._streams import Streams

__all__ = ["Call", "TritonSHMClient", "call_with", "lease_with", "registry_of", "stream_with"]


class TritonSHMClient(grpcclient.InferenceServerClient):
    """A Triton gRPC client that also runs inference through pooled shared memory: system
    shared memory, GPU memory (``memory="cuda"``), or by value where Triton cannot map it.

    A subclass of :class:`tritonclient.grpc.InferenceServerClient`: every plain gRPC method
    still works. It is a drop-in replacement for ``triton_shm_client.TritonSHMClient``.

    Args:
        url: Triton's gRPC address, ``host:port``. Where Triton cannot map this process's
            shared memory (another host, a container with its own ``/dev/shm``), models send
            their tensors by value (see ``transport`` of :meth:`register_shm_model`).
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
            with the first registration; see :mod:`ray_triton_shm._pools._reaper`).
        reconnect_timeout_s: How long a request or registration waits for Triton while it is
            unreachable (restarting), before :class:`ServerUnreachableError`; ``0`` fails at
            once. Requests wait on their own, so none fails because Triton was briefly away.
        config_check_interval_s: How often the config of a model whose pool follows it is
            compared with the pool, in the background, to pick up changes no request runs
            into (a larger ``max_batch_size``, an output added); ``None``: only when a
            request runs into one. See :meth:`register_shm_model`.
        shm_budget_bytes: The most bytes of ``/dev/shm`` this client's pools may hold: pools
            that follow their load grow no further (``None``: 90% of ``/dev/shm``).
        http_url: Triton's HTTP endpoint, ``host:port``, for the small request that points
            Triton at a slot (half the cost of a gRPC call in Python). ``"auto"`` (the default)
            looks at ``$RAY_TRITON_SHM_HTTP_URL``, else where Triton puts it by default, on the
            port before gRPC's (8000 beside 8001), and uses it once it proves to be the same
            Triton (it knows the region just
            registered over gRPC); otherwise requests go over gRPC. A given address must prove
            it, or registration fails saying why. ``None``: gRPC alone. Everything else
            (registration, readiness, configuration) is gRPC, and a TLS channel stays on
            gRPC. ``shm_stats()`` says which protocol a model's requests use, and why.
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
        http_url: str | None = AUTO_HTTP_URL,
        **kwargs: Any,
    ) -> None:
        if reconnect_timeout_s < 0:
            raise ValueError(f"reconnect_timeout_s must be >= 0, got {reconnect_timeout_s}")
        if config_check_interval_s is not None and not config_check_interval_s > 0:
            raise ValueError(
                f"config_check_interval_s must be > 0 or None, got {config_check_interval_s}"
            )
        keys = headers if isinstance(headers, Keys) else Keys(headers, keys_dir=keys_dir)
        options, tls = tritonclient_options(args, kwargs, tls_dir)
        super().__init__(url, verbose, **options)
        if tls is None:
            channel, stub = self._channel, self._client_stub  # type: ignore[has-type]
            plain = options.get("creds") is None
            self._triton = Channel(
                url,
                channel,
                stub,
                keys,
                plain=plain,
                reconnect_timeout_s=reconnect_timeout_s,
                http_url=http_url,
            )
        else:
            self._channel.close()  # type: ignore[has-type]
            self._triton = Channel.replacing(
                url,
                tls,
                options["channel_args"],
                keys,
                reconnect_timeout_s=reconnect_timeout_s,
                http_url=http_url,
            )
            self._channel, self._client_stub = self._triton.channel, self._triton.stub
        self._streams = Streams(lambda: self._triton.channel)
        self._pools = Registry(
            self._triton,
            crash_cleanup=crash_cleanup,
            config_check_interval_s=config_check_interval_s,
            shm_budget_bytes=shm_budget_bytes,
        )
        # tritonclient's own calls carry the client's keys through its one plugin; the
        # caller's plugin runs inside it (see register_plugin).
        super().register_plugin(self._triton.headers_plugin)

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
        transport: str = "auto",
        node_batching: NodeBatching | bool | None = None,
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
            transport: How the tensors reach Triton. ``"auto"`` (the default): through shared
                memory where Triton proves it maps this process's (it opens the region, and a
                probe request, one per registration, lands in it), else by value, in the
                requests (a Triton on another host, in a container with its own
                ``/dev/shm``); GPU memory Triton cannot open falls back to system memory
                first. Proven again when Triton restarts elsewhere, and every
                ``config_check_interval_s`` while by value. ``"shm"``: shared memory or
                :class:`SharedMemoryUnreachableError`; ``"inline"``: by value. The same API,
                errors, answers and backpressure either way (but :meth:`lease`, which needs
                shared memory). ``shm_stats()`` says which, and why.
            node_batching: Merge calls of a few rows, from every thread and process on this
                machine that uses the model's pool, into one Triton request (see the guide's
                *Node batching*): a :class:`NodeBatching`, ``True`` for its defaults, or
                ``None`` (the default): each call sends its own requests. Only for a model with
                ``max_batch_size > 0``, ``dynamic_batching`` in its config (else
                ``NodeBatching(force=True)``) and no BYTES tensors; in system shared memory (by
                value or in GPU memory, each call goes alone).

        Returns:
            The resolved :class:`ModelSpec`.

        Raises:
            ModelSpecError: unusable specs (a BYTES tensor without ``max_element_bytes``...),
                or the model is registered with other specs (and ``replace`` is false), or
                cannot be batched on the node as ``node_batching`` asks (saying why).
            SharedMemoryFullError: ``/dev/shm`` has no room for the pool (nothing was created).
            TritonServerError: Triton refused (unknown model, no shared memory, ...).
            AccessDeniedError: Triton restricts shared memory or model configuration, and the
                client's headers lack the key (nothing was left behind).
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``.
            CudaError: ``memory="cuda"`` cannot be used here (no GPU or driver, the bindings
                missing, a GPU not visible, Triton cannot open the GPU memory); nothing was
                left behind.
            GPUMemoryFullError: the GPU has no room for the pool (nothing was left behind).
            SharedMemoryUnreachableError: ``transport="shm"``, and Triton cannot map this
                process's shared memory (nothing was left behind).
        """

        self._pools.check_open()
        registration, sizing = plan_registration(
            model_name,
            inputs=inputs,
            outputs=outputs,
            max_batch_size=max_batch_size,
            pool_size=pool_size,
            autoscaling=autoscaling,
            model_version=model_version,
            max_shapes=max_shapes,
            max_element_bytes=max_element_bytes,
            memory=memory,
            device=device,
            triton_device_id=triton_device_id,
            transport=transport,
            node_batching=node_batching,
        )
        self._pools.sweep_once(model_name, lambda: reclaim_dead_registrations(self))
        return self._triton.rotating(
            lambda: self._pools.register(model_name, registration, sizing, replace=replace)
        )

    def register_plugin(self, plugin: Any) -> None:
        """tritonclient's: ``plugin`` sees the headers of every call, the pools' too, after
        the client's keys.

        Raises:
            InferenceServerException: a plugin is registered already.
        """
        if self._triton.plugin is not None:
            raise_error("A plugin is already registered: unregister it first")
        self._triton.plugin = plugin

    def unregister_plugin(self) -> None:
        """tritonclient's: calls go on without the plugin.

        Raises:
            InferenceServerException: no plugin is registered.
        """
        if self._triton.plugin is None:
            raise_error("No plugin has been registered")
        self._triton.plugin = None

    def plugin(self) -> Any:
        """tritonclient's: the plugin registered, or ``None``."""
        return self._triton.plugin

    def unregister_shm_model(self, model_name: str) -> None:
        """Unregisters a model's pool from Triton and frees its memory; idempotent.

        Waits for the model's requests in flight to finish first.
        """
        self._pools.unregister(model_name)

    @property
    def registered_models(self) -> dict[str, ModelSpec]:
        """The models with a shared-memory pool, and their specs."""
        return self._pools.specs

    def shm_stats(self, model_name: str) -> PoolStats:
        """Slots in use and callers waiting for a registered model (this process's share, for
        a region shared with other processes), its size now and its bounds."""
        return self._pools.stats(model_name)

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
        requested_outputs: Sequence[str] | None = None,
        outputs_as: str = "numpy",
        outputs: Sequence[str] | None = None,
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
            requested_outputs: Ask for these outputs only (``None``: all); only they are
                returned.
            outputs_as: ``"numpy"`` (the default), or for a pool in GPU memory ``"torch"`` or
                ``"cupy"``: tensors on the pool's GPU, never through the host.
            outputs: Deprecated: the earlier name of ``requested_outputs``; given, it sets it,
                with a :class:`DeprecationWarning`.

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
        if outputs is not None:
            requested_outputs = renamed_outputs(requested_outputs, outputs, stacklevel=2)
        options = request_options(
            model_name,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        return call_with(
            self,
            model_name,
            options,
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
            outputs_as=outputs_as,
        ).infer(inputs)

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
        requested_outputs: Sequence[str] | None = None,
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
        back once the block ended and no array of the lease is alive. Its one request is a
        request of :meth:`infer_shm`, and takes its options (but a sequence's).

        Args:
            model_name: A model registered with :meth:`register_shm_model` (in system memory,
                without BYTES inputs).
            batch: Samples in the request, 1 to ``max_batch_size`` (``None`` for a model that
                does not batch).
            shapes: Per-sample shape of each input with variable dims (``-1``); the others
                take the model's.
            slot_timeout_s: As for :meth:`infer_shm`.
            client_timeout_s: As for :meth:`infer_shm`.
            headers: As for :meth:`infer_shm`.
            request_id: As for :meth:`infer_shm`.
            reconnect_timeout_s: As for :meth:`infer_shm`.
            priority: As for :meth:`infer_shm`.
            queue_timeout_s: As for :meth:`infer_shm`.
            parameters: As for :meth:`infer_shm`.
            requested_outputs: As for :meth:`infer_shm`.
            outputs: As for :meth:`infer_shm` (deprecated).

        Raises:
            ModelNotRegisteredError: the model has no pool.
            LeaseByValueError: the model sends its tensors by value (Triton cannot map this
                process's shared memory, or ``transport="inline"``): call :meth:`infer_shm`.
            InvalidInputError: ``batch``, ``shapes`` or the options do not fit the model (no
                slot was taken).
        """
        if outputs is not None:
            requested_outputs = renamed_outputs(requested_outputs, outputs, stacklevel=2)
        call = call_with(
            self,
            model_name,
            None,
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        try:
            call.options = options_without_sequence(
                model_name,
                priority=priority,
                queue_timeout_s=queue_timeout_s,
                parameters=parameters,
                requested_outputs=requested_outputs,
            )
        except TritonSHMError as exc:
            count_failure(call.pool, exc)
            raise
        return lease_with(call, batch, shapes)

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
        requested_outputs: Sequence[str] | None = None,
        outputs_as: str = "numpy",
        outputs: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """:meth:`infer_shm` for coroutines: same arguments, same semantics, no thread blocked
        while waiting.

        Waiting for a slot and for Triton's answer both happen on the event loop. Cancelling
        the coroutine is safe: slots come back once Triton has answered.
        """
        if outputs is not None:
            requested_outputs = renamed_outputs(requested_outputs, outputs, stacklevel=2)
        options = request_options(
            model_name,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        call = call_with(
            self,
            model_name,
            options,
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
            outputs_as=outputs_as,
        )
        return await call.infer_async(inputs)

    def stream(
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
        requested_outputs: Sequence[str] | None = None,
    ) -> Generator[StreamResponse, None, None]:
        """Runs one request of a streaming (decoupled) model, and yields its responses as
        they come.

        ```python
        for response in client.stream("captioner", {"IMAGE": image, ...}):
            print(response.index, response["TOKEN"])
        ```

        The inputs go into one slot of the model's pool, as for :meth:`infer_shm` (a stream
        is one request: at most ``max_batch_size`` samples), held until Triton's final
        response. The outputs come back by value, in the responses (Triton writes every
        response of a request into the same place, so shared memory cannot hold them).
        Concurrent streams, from threads or tasks, each go on a gRPC stream of the client's,
        used again one request after the other. Stopping early (``break``, ``close()``)
        cancels the request in Triton; its slot is used again once Triton is done with it.

        Args:
            model_name: A streaming model registered with :meth:`register_shm_model`.
            inputs: As for :meth:`infer_shm`.
            slot_timeout_s: As for :meth:`infer_shm`.
            client_timeout_s: How long to wait for each response, after the request or the
                response before it; past it the stream is cancelled in Triton and raises
                :class:`StreamInterruptedError` (``status`` ``"StatusCode.DEADLINE_EXCEEDED"``).
            headers: As for :meth:`infer_shm`.
            request_id: As for :meth:`infer_shm`.
            reconnect_timeout_s: As for :meth:`infer_shm`.
            priority: As for :meth:`infer_shm`.
            queue_timeout_s: As for :meth:`infer_shm`.
            sequence_id: As for :meth:`infer_shm`.
            sequence_start: As for :meth:`infer_shm`.
            sequence_end: As for :meth:`infer_shm`.
            parameters: As for :meth:`infer_shm`.
            requested_outputs: As for :meth:`infer_shm`.

        Yields:
            Each response with outputs, a :class:`StreamResponse`: ``{output name: array}``
            with its ``index`` and whether it is ``final``. The iteration ends after
            Triton's final response (an empty one is not yielded).

        Raises:
            StreamingModelError: the model is not a streaming one (call :meth:`infer_shm`).
            StreamInterruptedError: the stream ended before Triton's final response (Triton
                went away after a response, or ``client_timeout_s``); says how many
                responses came. Before the first response, a Triton that went away is
                waited for and the request sent again, as for :meth:`infer_shm`.
            TritonServerError: the model answered with an error (Triton's message).
            ModelNotRegisteredError: as for :meth:`infer_shm`.
            InvalidInputError: as for :meth:`infer_shm`.
            SlotTimeoutError: as for :meth:`infer_shm`.
            AccessDeniedError: as for :meth:`infer_shm`.
            ServerUnreachableError: as for :meth:`infer_shm`.
        """
        call = self._stream_call(
            model_name,
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        return call.stream(inputs)

    def stream_async(
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
        requested_outputs: Sequence[str] | None = None,
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` for coroutines: an async iterator, same arguments and semantics, no
        thread blocked while waiting (``async for response in client.stream_async(...)``).
        ``aclose()`` or a cancelled task cancels the request in Triton."""
        call = self._stream_call(
            model_name,
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        return call.stream_async(inputs)

    def _stream_call(
        self,
        model_name: str,
        *,
        slot_timeout_s: float | None,
        client_timeout_s: float | None,
        headers: Mapping[str, str] | None,
        request_id: str,
        reconnect_timeout_s: float | None,
        **options: Any,
    ) -> StreamCall:
        return stream_with(
            self,
            model_name,
            request_options(model_name, **options),
            slot_timeout_s=slot_timeout_s,
            client_timeout_s=client_timeout_s,
            headers=headers,
            request_id=request_id,
            reconnect_timeout_s=reconnect_timeout_s,
        )

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Unregisters and frees every pool, then closes the channel; idempotent.

        Waits for the requests in flight (up to 30 s); a close called meanwhile, from another
        thread, waits for the first one to end. A stream not finished is cancelled in Triton
        first, its slot given up: its caller gets ``ClientClosedError`` next. It does not wait
        for outputs of a lease kept past its block (Triton is done with them): their slots are
        unregistered and unlinked too, and their memory stays mapped, and readable, while they
        live.
        """
        # tritonclient's __del__ calls close() even when __init__ failed half-way.
        if hasattr(self, "_streams"):
            end_streams(self, self._streams)  # first: the pools wait for the slots streams hold
        if hasattr(self, "_pools"):
            self._pools.close()
        if hasattr(self, "_triton"):
            self._triton.close_http()
        if hasattr(self, "_channel"):
            super().close()

    def __enter__(self) -> TritonSHMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._pools.closed else f"models={sorted(self.registered_models)}"
        names = self._triton.keys.names
        headers = f" headers={dict.fromkeys(names, REDACTED)}" if names else ""
        return f"<TritonSHMClient {self._triton.url}{headers} {state}>"


def registry_of(client: TritonSHMClient) -> Registry:
    """Internal API for the Ray layer (and the bench): the client's pools."""
    return client._pools


def call_with(
    client: TritonSHMClient,
    model_name: str,
    options: RequestOptions | None,
    *,
    slot_timeout_s: float | None,
    client_timeout_s: float | None,
    outputs_as: str = "numpy",
    headers: Mapping[str, str] | None = None,
    reconnect_timeout_s: float | None = None,
    request_id: str = "",
) -> Call:
    """One call of :meth:`TritonSHMClient.infer_shm` on ``client``, its request options
    checked (``options``); ``.infer(inputs)``, or ``await .infer_async(inputs)``, runs it,
    and :func:`lease_with` leases a slot for it. Internal API for the Ray layer too, whose
    handles check their options once, where they make them.

    Raises:
        ModelNotRegisteredError: the model has no pool.
    """
    pools = client._pools
    return Call(
        client._triton,
        pools,
        pools.get(model_name),
        options,
        slot_timeout_s,
        client_timeout_s,
        headers,
        request_id,
        reconnect_timeout_s,
        outputs_as,
        client,
    )


def stream_with(
    client: TritonSHMClient,
    model_name: str,
    options: RequestOptions | None,
    *,
    slot_timeout_s: float | None,
    client_timeout_s: float | None,
    headers: Mapping[str, str] | None = None,
    reconnect_timeout_s: float | None = None,
    request_id: str = "",
) -> StreamCall:
    """One call of :meth:`TritonSHMClient.stream` on ``client`` (see :func:`call_with`):
    ``.stream(inputs)`` or ``.stream_async(inputs)`` runs it. Internal API for the Ray layer
    too.

    Raises:
        ModelNotRegisteredError: the model has no pool.
    """
    pools = client._pools
    return StreamCall(
        client._triton,
        pools,
        pools.get(model_name),
        options,
        slot_timeout_s,
        client_timeout_s,
        headers,
        request_id,
        reconnect_timeout_s,
        "numpy",
        client,
        streams=client._streams,
    )


def lease_with(
    call: Call, batch: int | None, shapes: Mapping[str, Sequence[int]] | None
) -> SlotLease:
    """A lease of one slot for ``call`` (:meth:`TritonSHMClient.lease`); internal API for the
    Ray layer too, with a call of :func:`call_with`.

    Raises:
        LeaseByValueError: the model sends its tensors by value (counted as the call's
            failure).
        InvalidInputError: its outputs, ``batch`` or ``shapes`` do not fit the model (counted
            as the call's failure).
    """
    try:
        pool = call.pool
        refusal = unary_refusal(pool, streaming=False)
        if refusal is not None:
            raise refusal
        if pool.by_value:
            raise LeaseByValueError(
                f"model {pool.spec.name!r}: a lease writes into shared memory Triton maps "
                f"(transport 'shm'), but the model sends its tensors by value (transport "
                f"'inline': {pool.transport.reason}); call infer_shm() there",
                node=node_name(),
                reason=pool.transport.reason,
                model=pool.spec.name,
                expected="transport 'shm'",
                actual="inline",
            )
        return SlotLease(
            call,
            batch=batch,
            shapes=shapes,
            options=select_outputs(pool.spec, call.options),
            slot_timeout_s=call.slot_timeout_s,
            request_id=call.request_id,
        )
    except TritonSHMError as exc:
        count_failure(call.pool, exc)
        raise
