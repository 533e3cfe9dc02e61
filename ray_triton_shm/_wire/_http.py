"""Triton's HTTP endpoint, for the one small request of a call that points Triton at a slot.

Python's gRPC stack costs more per call than Triton spends on a small request (about 470 µs
against 220 µs over HTTP/1.1 on this library's 16-float request, measured on one machine):
for a request that carries no tensor, only the names of a slot's tensors, a keep-alive HTTP
connection and a few hundred bytes of JSON are the cheaper way. Everything else (registration,
readiness, configuration, plain tritonclient calls) stays on gRPC.

:class:`HttpRoute` holds the idle connections (blocking sockets, and per event loop asyncio
streams) and exchanges one request on one of them. Its failures are :class:`HttpError`, a
``grpc.RpcError`` with gRPC's status code, so the one module that reads Triton's errors
(:mod:`._triton_errors`) reads them too, and the engine's rules (wait for a restarting Triton,
register a forgotten region again, follow a changed model) apply unchanged.

:func:`http_body` writes a prepared ``ModelInferRequest`` as Triton's JSON, and
:func:`http_answer` reads Triton's JSON answer as the engine's :data:`Answer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from .._defaults import HTTP_URL_ENV_VAR
from ._keys import GRPC_KEY_PREFIX
from ._triton_errors import header_named_as_grpc

__all__ = [
    "AUTO_HTTP_URL",
    "Answer",
    "HttpError",
    "HttpResponse",
    "HttpRoute",
    "default_http_url",
    "grpc_answer",
    "http_answer",
    "http_body",
    "http_headers",
    "http_path",
    "http_url_for",
    "prove_same_triton",
    "region_status_path",
]

#: ``http_url="auto"``: Triton's HTTP endpoint at ``$RAY_TRITON_SHM_HTTP_URL``, else where
#: Triton puts it by default, on the port before its gRPC port (8000 and 8001), used once
#: proven to be the same Triton (:func:`default_http_url`, :func:`prove_same_triton`).
AUTO_HTTP_URL = "auto"

#: The outputs of one answer: name, datatype, shape and inline contents (empty for an output
#: Triton wrote into the slot), in the request's order.
Answer = list[tuple[str, str, tuple[int, ...], bytes]]

#: Triton's HTTP status codes (``HttpCodeFromError``) as gRPC's.
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAVAILABLE,  # a restricted API, as gRPC answers it
    403: grpc.StatusCode.UNAVAILABLE,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    429: grpc.StatusCode.UNAVAILABLE,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
_RECEIVE_BYTES = 1 << 16
#: What a name in a request's path may not hold, as Triton reads paths.
_UNSAFE = frozenset(' /?#%"<>\\^`{|}')


class HttpError(grpc.RpcError):
    """A request to Triton's HTTP endpoint that failed, in gRPC's terms.

    Attributes:
        answered: Whether Triton answered (an HTTP status), or the request never left (no
            connection): either way Triton does not run it. ``False`` for a connection lost
            after the request was sent: Triton may still run it.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        self.answered = answered

    def code(self) -> grpc.StatusCode:
        """gRPC's status code for the failure."""
        return self._code

    def details(self) -> str:
        """Triton's message, or what happened to the connection."""
        return self._message

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_error, (self._code.name, self._message, self.answered)


def _rebuild_error(code: str, message: str, answered: bool) -> HttpError:
    return HttpError(grpc.StatusCode[code], message, answered=answered)


def http_headers(metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A gRPC call's metadata as the headers of the same call over HTTP: a key of Triton's
    restricted protocols, ``triton-grpc-protocol-<key>`` over gRPC, is ``<key>`` over HTTP
    (``--grpc-restricted-protocol`` and ``--http-restricted-api`` name the same ``<key>``)."""
    return [(name.removeprefix(GRPC_KEY_PREFIX), value) for name, value in metadata]


def default_http_url(grpc_url: str) -> str:
    """Where ``http_url="auto"`` looks: ``$RAY_TRITON_SHM_HTTP_URL``, else next below the
    gRPC port (:func:`http_url_for`)."""
    return os.environ.get(HTTP_URL_ENV_VAR) or http_url_for(grpc_url)


def prove_same_triton(
    url: str, region: str, headers: Sequence[tuple[str, str]]
) -> tuple[HttpRoute | None, str]:
    """Asks the HTTP endpoint at ``url`` for the status of ``region``, a system shared-memory
    region just registered over gRPC: only the Triton that registered it knows its name.

    Returns:
        A route to the endpoint if it proved to be that Triton (``None`` if not), and the
        reason, in words.
    """
    path = region_status_path(region)
    if path is None:
        return None, f"region name {region!r} does not fit a URL"
    route = HttpRoute(url)
    try:
        response = route.exchange(path, b"", headers, method=b"GET")
    except HttpError as exc:
        route.close()
        return None, f"no Triton HTTP endpoint at {url} ({exc.details()})"
    if response.status == 200 and region.encode() in response.body:
        return route, f"Triton's HTTP endpoint {url}, proven the same"
    route.close()
    detail = response.body.decode(errors="replace").strip()[:200]
    return None, (
        f"{url} is not this Triton's HTTP endpoint: it does not know region {region!r} "
        f"(HTTP {response.status}: {detail})"
    )


def http_url_for(grpc_url: str) -> str:
    """Where Triton's HTTP endpoint is by default: the gRPC endpoint's host, one port lower
    (Triton's 8000 beside 8001)."""
    host, _, port = grpc_url.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"cannot derive an HTTP address from gRPC address {grpc_url!r}")
    return f"{host}:{int(port) - 1}"


def http_path(model: str, version: str) -> bytes | None:
    """The path of a model's inference requests; ``None`` for a name the path cannot carry as
    it is (Triton does not decode escaped paths)."""
    if not all(_fits_path(part) for part in (model, version)):
        return None
    if version:
        return f"/v2/models/{model}/versions/{version}/infer".encode()
    return f"/v2/models/{model}/infer".encode()


def region_status_path(region: str) -> bytes | None:
    """The path of a system shared-memory region's status; ``None`` as for :func:`http_path`."""
    return f"/v2/systemsharedmemory/region/{region}/status".encode() if _fits_path(region) else None


def _fits_path(name: str) -> bool:
    return name.isascii() and not _UNSAFE.intersection(name) and name.isprintable()


def _parameters(parameters: Any) -> dict[str, Any]:
    return {
        name: getattr(value, value.WhichOneof("parameter_choice"))
        for name, value in parameters.items()
    }


def http_body(request: service_pb2.ModelInferRequest) -> bytes | None:
    """A prepared request as Triton's JSON (outputs not in the slot answered as binary data);
    ``None`` for a request JSON cannot carry (tensors sent inline)."""
    if request.raw_input_contents:
        return None
    document: dict[str, Any] = {}
    if request.id:
        document["id"] = request.id
    if request.parameters:
        document["parameters"] = _parameters(request.parameters)
    document["inputs"] = [
        {
            "name": entry.name,
            "datatype": entry.datatype,
            "shape": list(entry.shape),
            "parameters": _parameters(entry.parameters),
        }
        for entry in request.inputs
    ]
    outputs = []
    for entry in request.outputs:
        parameters = _parameters(entry.parameters)
        if "shared_memory_region" not in parameters:
            parameters["binary_data"] = True
        outputs.append({"name": entry.name, "parameters": parameters})
    document["outputs"] = outputs
    return json.dumps(document, separators=(",", ":")).encode()


def grpc_answer(response: service_pb2.ModelInferResponse) -> Answer:
    """A gRPC answer's outputs."""
    raw = response.raw_output_contents
    return [
        (output.name, output.datatype, tuple(output.shape), raw[index] if index < len(raw) else b"")
        for index, output in enumerate(response.outputs)
    ]


def http_answer(body: bytes, json_bytes: int | None) -> Answer:
    """An HTTP answer's outputs: its JSON (the first ``json_bytes`` of ``body``, or all of
    it), then each binary output's bytes in order."""
    end = len(body) if json_bytes is None else json_bytes
    document = json.loads(body[:end])
    answer: Answer = []
    offset = end
    for output in document.get("outputs", ()):
        size = output.get("parameters", {}).get("binary_data_size")
        data = b""
        if size is not None:
            data = body[offset : offset + size]
            offset += size
        answer.append((output["name"], output["datatype"], tuple(output["shape"]), data))
    return answer


class HttpResponse:
    """An HTTP response read off a connection."""

    __slots__ = ("body", "close", "json_bytes", "status")

    def __init__(self, status: int, body: bytes, json_bytes: int | None, close: bool) -> None:
        self.status, self.body, self.json_bytes, self.close = status, body, json_bytes, close

    def answer(self) -> Answer:
        """The outputs, or the :class:`HttpError` of Triton's refusal."""
        if self.status == 200:
            return http_answer(self.body, self.json_bytes)
        raise self.error()

    def error(self) -> HttpError:
        """Triton's refusal as an :class:`HttpError`."""
        try:
            message = str(json.loads(self.body)["error"])
        except (ValueError, KeyError, TypeError):
            message = self.body.decode(errors="replace").strip() or f"HTTP {self.status}"
        code = _STATUS.get(self.status, grpc.StatusCode.UNKNOWN)
        return HttpError(code, header_named_as_grpc(message), answered=True)


def _head(head: bytes) -> tuple[int, int | None, int | None, bool, bool]:
    """Status, content length, JSON length, whether the connection closes, and whether the
    body is chunked, of a response's head."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = json_bytes = None
    close = chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"inference-header-content-length":
            json_bytes = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return status, length, json_bytes, close, chunked


def _dechunk(data: bytes) -> tuple[bytes, int] | None:
    """A chunked body and the bytes it took, or ``None`` if ``data`` does not hold all of it."""
    body, offset = bytearray(), 0
    while True:
        end = data.find(b"\r\n", offset)
        if end < 0:
            return None
        size = int(data[offset:end].split(b";")[0], 16)
        start = end + 2
        if size == 0:
            trailer = data.find(b"\r\n", start)
            return None if trailer < 0 else (bytes(body), trailer + 2)
        if len(data) < start + size + 2:
            return None
        body += data[start : start + size]
        offset = start + size + 2


def _received(data: bytes, received: bytes) -> tuple[bytes, HttpResponse | None]:
    """What a connection sent so far, ``received`` last, and the response if it is all there.

    Raises:
        ConnectionResetError: Triton closed the connection (``received`` is empty).
    """
    if not received:
        raise ConnectionResetError("Triton closed the connection")
    data += received
    return data, _parse(data)


def _parse(data: bytes) -> HttpResponse | None:
    """The response in ``data``, or ``None`` if it is not all there yet."""
    split = data.find(b"\r\n\r\n")
    if split < 0:
        return None
    status, length, json_bytes, close, chunked = _head(data[:split])
    rest = data[split + 4 :]
    if chunked:
        done = _dechunk(rest)
        if done is None:
            return None
        return HttpResponse(status, done[0], json_bytes, close)
    if length is None:
        return None if not close else HttpResponse(status, rest, json_bytes, True)
    if len(rest) < length:
        return None
    return HttpResponse(status, rest[:length], json_bytes, close)


class HttpRoute:
    """Keep-alive connections to Triton's HTTP endpoint, one per request in flight.

    Args:
        url: ``host:port`` of Triton's HTTP endpoint.
    """

    def __init__(self, url: str) -> None:
        host, _, port = url.rpartition(":")
        self.url = url
        self._address = (host.strip("[]"), int(port))
        self._host = f"Host: {url}\r\n".encode()
        self._idle: deque[socket.socket] = deque()
        self._streams: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.closed = False

    def _request(
        self, method: bytes, path: bytes, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers).encode()
        content = b"Content-Type: application/json\r\n" if body else b""
        return b"%s %s HTTP/1.1\r\n%s%s%sContent-Length: %d\r\n\r\n%s" % (
            method,
            path,
            self._host,
            content,
            extra,
            len(body),
            body,
        )

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self._address)
        except OSError as exc:
            raise self._unreachable(exc) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def exchange(
        self,
        path: bytes,
        body: bytes,
        headers: Sequence[tuple[str, str]] = (),
        *,
        method: bytes = b"POST",
    ) -> HttpResponse:
        """Sends one request and reads its response, blocking, on an idle connection (a new
        one if none is idle).

        Raises:
            HttpError: no connection could be made, or it was lost before the response.
        """
        message = self._request(method, path, body, headers)
        try:
            sock = self._idle.pop()
        except IndexError:
            sock = self._connect()
        data, response = b"", None
        try:
            sock.sendall(message)
            while response is None:
                data, response = _received(data, sock.recv(_RECEIVE_BYTES))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, OSError):
                raise self._lost(exc) from exc
            raise
        if response.close or self.closed:
            sock.close()
        else:
            self._idle.append(sock)
        return response

    async def exchange_async(
        self, path: bytes, body: bytes, headers: Sequence[tuple[str, str]] = ()
    ) -> HttpResponse:
        """:meth:`exchange` on the running event loop's connections."""
        loop = asyncio.get_running_loop()
        idle = self._streams.get(loop)
        if idle is None:
            with self._lock:
                idle = self._streams.setdefault(loop, deque())
        message = self._request(b"POST", path, body, headers)
        try:
            reader, writer = idle.pop()
        except IndexError:
            try:
                reader, writer = await asyncio.open_connection(*self._address)
            except OSError as exc:
                raise self._unreachable(exc) from exc
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data, response = b"", None
        try:
            writer.write(message)
            while response is None:
                data, response = _received(data, await reader.read(_RECEIVE_BYTES))
        except BaseException as exc:
            writer.close()
            if isinstance(exc, OSError):
                raise self._lost(exc) from exc
            raise
        if response.close or self.closed:
            writer.close()
        else:
            idle.append((reader, writer))
        return response

    def _unreachable(self, exc: OSError) -> HttpError:
        """No connection could be made: the request never left (read as Triton away)."""
        return HttpError(
            grpc.StatusCode.UNAVAILABLE,
            f"failed to connect to Triton's HTTP endpoint {self.url}: {exc}",
            answered=False,
        )

    def _lost(self, exc: OSError) -> HttpError:
        return HttpError(
            grpc.StatusCode.UNAVAILABLE,
            f"lost the connection to Triton's HTTP endpoint {self.url}: {exc}",
            answered=False,
        )

    def close(self) -> None:
        """Closes the idle connections; those in use close when their request ends.
        Idempotent."""
        self.closed = True
        while self._idle:
            self._idle.pop().close()
        for loop, idle in list(self._streams.items()):
            writers = [writer for _, writer in idle]
            idle.clear()
            if loop.is_closed():
                continue  # its transports cannot close any more: their sockets close with them
            for writer in writers:
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(writer.close)
