"""A client's way to Triton: its gRPC channel and stub, its keys and TLS files, the metadata of
each call, and each request's budget for waiting out a Triton that is away.

:class:`~.._client.TritonSHMClient` opens one (tritonclient builds the channel; a channel that
reads its TLS files again replaces it, see :mod:`._tls`); the client's pools
(:mod:`.._pools._registry`) and its calls (:mod:`.._calls`) reach Triton only through it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToJson
from tritonclient.grpc import Request, service_pb2, service_pb2_grpc

from .._exceptions import AccessDeniedError, TritonServerError
from ._http import (
    AUTO_HTTP_URL,
    Counters,
    HttpRoute,
    candidate_http_urls,
    http_headers,
    prove_by_statistics,
    prove_same_triton,
)
from ._keys import Keys, Metadata, RedactedHeaders, normalize
from ._reconnect import Reconnect, channel_options
from ._tls import ReloadingChannel, TlsFiles, diagnose
from ._triton_errors import translate_error

__all__ = ["INFER_METHOD", "Channel", "tritonclient_options"]

#: Triton's gRPC method of an inference request.
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"

T = TypeVar("T")

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
_TLS_OPTIONS = ("ssl", "root_certificates", "private_key", "certificate_chain")


def tritonclient_options(
    args: Sequence[Any], kwargs: Mapping[str, Any], tls_dir: str | Any | None
) -> tuple[dict[str, Any], TlsFiles | None]:
    """tritonclient's options from its positional and keyword arguments, with our channel
    options (keepalive, message sizes), and the TLS files to read again (``None``: no TLS, or
    credentials tritonclient handles); those files' own options are taken out."""
    options = dict(zip(_TRITONCLIENT_OPTIONS, args, strict=False)) | dict(kwargs)
    options["channel_args"] = channel_options(
        options.get("channel_args"), options.pop("keepalive_options", None)
    )
    tls = TlsFiles.from_options(options, tls_dir)
    if tls is not None:  # tritonclient's plain channel never connects: ours replaces it
        for name in _TLS_OPTIONS:
            options.pop(name, None)
    return options, tls


class Channel:
    """The gRPC channel to one Triton, with the keys of every call.

    Args:
        url: Triton's gRPC address.
        channel: The gRPC channel (a :class:`~._tls.ReloadingChannel` for TLS files).
        stub: Triton's gRPC stub over ``channel``.
        keys: The keys sent on every call.
        plain: Whether the channel is plain text (an unreachable Triton may then be one that
            speaks TLS: :func:`._tls.diagnose` says so).
        reconnect_timeout_s: How long a request waits for an unreachable Triton by default.
        http_url: Triton's HTTP endpoint for inference requests (see :meth:`prove_http`):
            :data:`~._http.AUTO_HTTP_URL` for ``$RAY_TRITON_SHM_HTTP_URL``, else a port next to
            gRPC's (the one before, Triton's default, then the one after), ``"host:port"``, or
            ``None`` for gRPC alone.
    """

    def __init__(
        self,
        url: str,
        channel: grpc.Channel,
        stub: service_pb2_grpc.GRPCInferenceServiceStub,
        keys: Keys,
        *,
        plain: bool,
        reconnect_timeout_s: float,
        http_url: str | None = None,
    ) -> None:
        self.url = url
        self.channel = channel
        self.stub = stub
        #: ``ModelInfer`` for a request already serialized (a pool by value's, see
        #: :class:`.._inference._requests.ValueRequests`).
        self.infer_bytes = channel.unary_unary(
            INFER_METHOD,
            request_serializer=None,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        self.keys = keys
        self.plain = plain
        self.reconnect_timeout_s = reconnect_timeout_s
        #: tritonclient's plugin, which sees every call's headers last (``register_plugin``).
        self.plugin: Callable[[Request], None] | None = None
        self._http_url = http_url
        #: Triton's HTTP endpoint, once proven to be this Triton: inference requests go there.
        self.http: HttpRoute | None = None
        #: Which protocol inference requests use, and why (for stats and ``doctor``).
        self.protocol = "grpc"
        self.protocol_reason = "HTTP not tried yet" if http_url else "http_url=None"
        self._http_lock = threading.Lock()
        self._http_closed = False
        #: Whether requests by value tried to prove the HTTP endpoint (once per channel).
        self.by_value_proof_tried = False

    def prove_http(self, region_key: str) -> None:
        """Sends inference requests over Triton's HTTP endpoint from now on if it proves to be
        this Triton: it knows ``region_key``, a system shared-memory region just registered
        over gRPC (no other Triton has a region of that name). Until one such proof, requests
        stay on gRPC; a TLS channel always does (the HTTP route is plain text).

        Raises:
            TritonServerError: an ``http_url`` given explicitly is not this Triton's.
        """
        self._prove(lambda url, headers: prove_same_triton(url, region_key, headers))

    def prove_http_by_value(self, model: str, version: str) -> None:
        """:meth:`prove_http` for requests by value, once per channel, after one of ``model``
        ran: no region of this client's is known to that Triton, so its HTTP endpoint proves
        to be the same by its statistics of the model (see
        :func:`~._http.prove_by_statistics`). One given explicitly that does not prove the
        same leaves requests on gRPC, saying why in :attr:`protocol_reason`."""
        if self.by_value_proof_tried or self.http is not None:
            return
        self.by_value_proof_tried = True

        def read() -> Counters:
            return self._counters(model, version)

        try:
            self._prove(
                lambda url, headers: prove_by_statistics(url, model, version, headers, read)
            )
        except TritonServerError as exc:
            self.protocol_reason = str(exc)
        except grpc.RpcError as exc:  # its statistics could not be read over gRPC
            self.protocol_reason = f"statistics of {model!r} not readable over gRPC: {exc}"

    def _counters(self, model: str, version: str) -> Counters:
        """Triton's counters of ``model`` over gRPC (see :data:`~._http.Counters`)."""
        request = service_pb2.ModelStatisticsRequest(name=model, version=version)
        stats = self.stub.ModelStatistics(request, metadata=self.metadata(), timeout=5.0)
        return {
            entry.version: (entry.last_inference, entry.inference_count, entry.execution_count)
            for entry in stats.model_stats
        }

    def _prove(
        self, prove: Callable[[str, list[tuple[str, str]]], tuple[HttpRoute | None, str]]
    ) -> None:
        """Adopts the first candidate HTTP endpoint that ``prove`` proves to be this Triton's
        (see :meth:`prove_http`); else :attr:`protocol_reason` says why each was not.

        Raises:
            TritonServerError: an ``http_url`` given explicitly is not this Triton's.
        """
        if self.http is not None or self._http_url is None or self._http_closed:
            return
        explicit = self._http_url != AUTO_HTTP_URL
        if not self.plain:
            reason = "TLS: the HTTP route is plain text, requests stay on gRPC"
            if explicit:
                raise TritonServerError(f"http_url={self._http_url!r}: {reason}")
            self.protocol_reason = reason
            return
        reasons = []
        for url in [self._http_url] if explicit else candidate_http_urls(self.url):
            route, reason = prove(url, http_headers(self.metadata()))
            if route is not None:
                self._adopt(route, reason)
                return
            reasons.append(reason)
        if explicit:
            raise TritonServerError(
                f"http_url={self._http_url!r}: {reasons[0]}. Give Triton's --http-port of the "
                f"Triton at {self.url}, or http_url=None for gRPC alone",
                model=None,
            )
        tried = "" if len(reasons) == 1 else " (both ports next to gRPC's tried)"
        self.protocol_reason = "; ".join(reasons) + tried

    def _adopt(self, route: HttpRoute, reason: str) -> None:
        """Sends inference requests over ``route`` from now on (unless closed meanwhile, or
        another proof came first)."""
        with self._http_lock:
            adopted = self.http is None and not self._http_closed
            if adopted:
                self.http, self.protocol, self.protocol_reason = route, "http", reason
        if not adopted:
            route.close()

    def close_http(self) -> None:
        """Closes the HTTP route's connections; idempotent."""
        with self._http_lock:
            self._http_closed = True
            route, self.http = self.http, None
        if route is not None:
            route.close()

    @classmethod
    def replacing(
        cls,
        url: str,
        tls: TlsFiles,
        channel_args: Any,
        keys: Keys,
        *,
        reconnect_timeout_s: float,
        http_url: str | None = None,
    ) -> Channel:
        """A channel that reads ``tls``'s files again when they change (a renewed
        certificate), for the next connections."""
        channel = ReloadingChannel(url, tls, channel_args)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return cls(
            url,
            channel,
            stub,
            keys,
            plain=False,
            reconnect_timeout_s=reconnect_timeout_s,
            http_url=http_url,
        )

    @classmethod
    def open(
        cls, url: str, tls: TlsFiles | None, keys: Keys, *, reconnect_timeout_s: float
    ) -> Channel:
        """A channel of its own, with no tritonclient client around it (a tool's: ``doctor``):
        TLS with ``tls``'s files (read again when they change), else plain text; no HTTP
        route. Close it with :meth:`close`."""
        options = channel_options(None, None)
        if tls is not None:
            return cls.replacing(url, tls, options, keys, reconnect_timeout_s=reconnect_timeout_s)
        channel = grpc.insecure_channel(url, options=options)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return cls(url, channel, stub, keys, plain=True, reconnect_timeout_s=reconnect_timeout_s)

    def close(self) -> None:
        """Closes the gRPC channel and the HTTP route's connections (a channel :meth:`open`
        made; a client closes its own)."""
        self.close_http()
        self.channel.close()

    def metadata(
        self, headers: Mapping[str, str] | None = None, keys: Metadata | None = None
    ) -> Metadata:
        """The metadata of one gRPC call: the keys (``keys``: those in use now) with ``headers``
        merged over them, after the plugin (if any) had its say."""
        metadata = self.keys.metadata() if keys is None else keys
        if not headers and self.plugin is None:
            return metadata
        request = Request({**dict(metadata), **normalize(headers)})
        if self.plugin is not None:
            self.plugin(request)
        return Metadata((request.headers or {}).items())

    def headers_plugin(self, request: Request) -> None:
        """A tritonclient plugin (``client.register_plugin``): the headers of tritonclient's
        own calls become :meth:`metadata`'s, the keys with the call's headers over them."""
        request.headers = RedactedHeaders(self.metadata(request.headers))

    def reconnect(
        self,
        model: str | None,
        timeout_s: float | None = None,
        metadata: Metadata | None = None,
    ) -> Reconnect:
        """A reconnect budget for one request (``timeout_s``: the client's by default), whose
        readiness questions carry ``metadata`` (the keys by default)."""
        return Reconnect(
            self.channel,
            self.url,
            self.reconnect_timeout_s if timeout_s is None else timeout_s,
            model,
            metadata=self.metadata() if metadata is None else metadata,
            tls_problem=self.tls_problem,
        )

    def tls_problem(self) -> tuple[str, str] | None:
        """Whether TLS is why Triton cannot be reached (see :func:`._tls.diagnose`)."""
        if isinstance(self.channel, ReloadingChannel):
            if self.channel.reload():
                return None  # rotated files: the next try uses them
            return diagnose(self.url, self.channel.files)
        return diagnose(self.url, None) if self.plain else None

    def rotating(self, action: Callable[[], T]) -> T:
        """Runs ``action``, and once more if Triton refused the keys and they changed since
        (a rotation: see :meth:`Keys.refused`)."""
        used = self.keys.metadata()
        try:
            return action()
        except AccessDeniedError:
            if not self.keys.refused(used):
                raise
            return action()

    def model_config(self, model: str, version: str) -> Mapping[str, Any]:
        """Triton's configuration of ``model``, as JSON, waiting out a Triton that is away.

        Raises:
            TritonServerError: Triton refused (an unknown model...), translated.
            ServerUnreachableError: Triton stayed unreachable.
        """
        request = service_pb2.ModelConfigRequest(name=model, version=version)

        def read() -> Any:
            return self.stub.ModelConfig(request=request, metadata=self.metadata())

        try:
            response = self.reconnect(model).call(read)
        except grpc.RpcError as exc:
            raise translate_error(
                exc, model=model, action="reading the model configuration"
            ) from exc
        config = json.loads(MessageToJson(response, preserving_proto_field_name=True))
        return config.get("config", config)
