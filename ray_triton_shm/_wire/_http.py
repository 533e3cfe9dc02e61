"""Triton's HTTP endpoint, for the one request of a call: pointing Triton at a slot, or by
value, carrying the tensors.

Python's gRPC stack costs more per call than Triton spends on a small request (about 470 µs
against 220 µs over HTTP/1.1 on this library's 16-float request, measured on one machine):
for a request that carries no tensor, only the names of a slot's tensors, a keep-alive HTTP
connection and a few hundred bytes of JSON are the cheaper way; by value, the tensors follow
the JSON as binary data (Triton's binary tensor extension), as they are. Everything else
(registration, readiness, configuration, plain tritonclient calls) stays on gRPC.

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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import grpc
import httptools
from tritonclient.grpc import service_pb2

from .._defaults import HTTP_URL_ENV_VAR
from ._keys import GRPC_KEY_PREFIX
from ._triton_errors import header_named_as_grpc

__all__ = [
    "AUTO_HTTP_URL",
    "Answer",
    "BinaryBody",
    "HttpError",
    "HttpResponse",
    "HttpRoute",
    "candidate_http_urls",
    "default_http_url",
    "grpc_answer",
    "http_answer",
    "http_body",
    "http_headers",
    "http_path",
    "http_url_for",
    "not_this_answer",
    "prove_by_statistics",
    "prove_same_triton",
    "region_status_path",
]

#: ``http_url="auto"``: Triton's HTTP endpoint at ``$RAY_TRITON_SHM_HTTP_URL``, else on a port
#: next to its gRPC port, the one before it first (Triton's default: 8000 and 8001), then the
#: one after it; used once proven to be the same Triton (:func:`candidate_http_urls`,
#: :func:`prove_same_triton`).
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
#: The most bytes a response's head may take (Triton's take a few hundred).
_MAX_HEAD_BYTES = 1 << 16
#: The most digits of a length.
_MAX_DIGITS = 15
#: What a name in a request's path may not hold, as Triton reads paths.
_UNSAFE = frozenset(' /?#%"<>\\^`{|}')


class BinaryBody(NamedTuple):
    """A request by value over HTTP: its JSON, then each input's bytes (Triton's binary tensor
    extension), sent as they are, never joined."""

    #: The JSON, each input's ``binary_data_size`` in its parameters.
    json: bytes
    #: Each input's bytes, in the JSON's order.
    tensors: Sequence[bytes | memoryview]


#: A body of this many bytes or fewer is sent in one piece (headers, JSON and tensors joined).
_JOIN_BYTES = 1 << 16


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
    """Where ``http_url="auto"`` looks first: ``$RAY_TRITON_SHM_HTTP_URL``, else next below
    the gRPC port (:func:`http_url_for`)."""
    return candidate_http_urls(grpc_url)[0]


def candidate_http_urls(grpc_url: str) -> list[str]:
    """Where ``http_url="auto"`` looks, in turn: ``$RAY_TRITON_SHM_HTTP_URL`` alone, else the
    ports next below and next above the gRPC port (``--http-port`` at gRPC's minus one,
    Triton's default, or plus one, as many set it)."""
    given = os.environ.get(HTTP_URL_ENV_VAR)
    if given:
        return [given]
    below = http_url_for(grpc_url)
    host, _, port = below.rpartition(":")
    return [below, f"{host}:{int(port) + 2}"]


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


#: A model's statistics, per version: its last inference (ms since the epoch), its inferences
#: and its executions, as Triton counts them.
Counters = dict[str, tuple[int, int, int]]


def prove_by_statistics(
    url: str,
    model: str,
    version: str,
    headers: Sequence[tuple[str, str]],
    read_grpc: Callable[[], Counters],
) -> tuple[HttpRoute | None, str]:
    """Asks the HTTP endpoint at ``url`` for the statistics of ``model`` between two readings
    of them over gRPC (``read_grpc``), for a client whose tensors go by value: no region of
    its own is known to Triton, but a Triton's counters of a model that ran are its own. Each
    counter over HTTP must lie between its two readings over gRPC (equal, where nothing ran in
    between): another Triton would have to have run the model exactly as often, and last in
    the same milliseconds.

    Returns:
        A route to the endpoint if it proved to be that Triton (``None`` if not), and the
        reason, in words.
    """
    path = http_stats_path(model, version)
    if path is None:
        return None, f"model name {model!r} cannot be in an HTTP path"
    before = read_grpc()
    if not any(counts[1] for counts in before.values()):
        return None, f"not proven yet: model {model!r} has not run on Triton"
    route = HttpRoute(url)
    try:
        response = route.exchange(path, b"", headers, method=b"GET")
    except HttpError as exc:
        route.close()
        return None, f"no Triton HTTP endpoint at {url} ({exc.details()})"
    after = read_grpc()
    seen = _counters(response.body) if response.status == 200 else None
    if seen is not None and _between(before, seen, after):
        return route, (
            f"Triton's HTTP endpoint {url}, proven the same (its statistics of model "
            f"{model!r} are the gRPC endpoint's)"
        )
    route.close()
    detail = response.body.decode(errors="replace").strip()[:200]
    return None, (
        f"{url} is not this Triton's HTTP endpoint: its statistics of model {model!r} are "
        f"not the gRPC endpoint's (HTTP {response.status}: {detail})"
    )


def _counters(body: bytes) -> Counters | None:
    """The counters of Triton's JSON statistics of a model (see :data:`Counters`)."""
    try:
        return {
            str(entry["version"]): (
                int(entry.get("last_inference", 0)),
                int(entry.get("inference_count", 0)),
                int(entry.get("execution_count", 0)),
            )
            for entry in json.loads(body)["model_stats"]
        }
    except (ValueError, KeyError, TypeError):
        return None


def _between(before: Counters, seen: Counters, after: Counters) -> bool:
    """Whether every counter of ``seen`` lies between its readings ``before`` and ``after``."""
    if not before.keys() == seen.keys() == after.keys():
        return False
    return all(
        low <= middle <= high
        for version in seen
        for low, middle, high in zip(before[version], seen[version], after[version])
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


def http_stats_path(model: str, version: str) -> bytes | None:
    """The path of a model's statistics; ``None`` as for :func:`http_path`."""
    infer = http_path(model, version)
    return None if infer is None else infer[: -len(b"infer")] + b"stats"


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


def http_body(
    request: service_pb2.ModelInferRequest, input_sizes: Sequence[int] | None = None
) -> bytes | None:
    """A prepared request as Triton's JSON (outputs not in the slot answered as binary data);
    ``None`` for a request JSON cannot carry (tensors sent inline). ``input_sizes``: by value,
    the bytes of each input, which follow the JSON as binary data."""
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
    if input_sizes is not None:
        for entry, size in zip(document["inputs"], input_sizes, strict=True):
            entry["parameters"]["binary_data_size"] = size
    outputs = []
    for entry in request.outputs:
        parameters = _parameters(entry.parameters)
        if "shared_memory_region" not in parameters:
            parameters["binary_data"] = True
        outputs.append({"name": entry.name, "parameters": parameters})
    document["outputs"] = outputs
    return json.dumps(document, separators=(",", ":")).encode()


def grpc_answer(response: service_pb2.ModelInferResponse, request_id: str | None = None) -> Answer:
    """A gRPC answer's outputs.

    Raises:
        HttpError: the answer carries another id than ``request_id`` (``None``: not checked).
    """
    if request_id is not None and response.id != request_id:
        raise not_this_answer(request_id, response.id)
    raw = response.raw_output_contents
    return [
        (output.name, output.datatype, tuple(output.shape), raw[index] if index < len(raw) else b"")
        for index, output in enumerate(response.outputs)
    ]


def http_answer(body: bytes, json_bytes: int | None, request_id: str | None = None) -> Answer:
    """An HTTP answer's outputs: its JSON (the first ``json_bytes`` of ``body``, or all of
    it), then each binary output's bytes in order.

    Args:
        body: The response's body.
        json_bytes: Its ``Inference-Header-Content-Length``, if it has one.
        request_id: The request's id, which the answer must carry (``None``: not checked).

    Raises:
        HttpError: the body is not Triton's answer, or the answer is another request's.
    """
    end = len(body) if json_bytes is None else json_bytes
    if end > len(body):
        raise _unreadable(f"its JSON of {end} bytes is longer than its body of {len(body)}")
    try:
        document = json.loads(body[:end])
        answer: Answer = []
        offset = end
        for output in document.get("outputs", ()):
            size = output.get("parameters", {}).get("binary_data_size")
            data = b""
            if size is not None:
                if type(size) is not int or not 0 <= size <= len(body) - offset:
                    raise _unreadable(f"output {output['name']!r}'s binary_data_size {size!r}")
                data = body[offset : offset + size]
                offset += size
            shape = tuple(output["shape"])
            if not (isinstance(output["name"], str) and isinstance(output["datatype"], str)):
                raise _unreadable("an output's name or datatype is not a string")
            if not all(type(dim) is int and dim >= 0 for dim in shape):
                raise _unreadable(f"output {output['name']!r}'s shape {shape!r}")
            answer.append((output["name"], output["datatype"], shape, data))
        answered_id = document.get("id", "")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise _unreadable(f"{type(exc).__name__}: {exc}") from None
    if offset != len(body):
        raise _unreadable(f"{len(body) - offset} bytes past its outputs")
    if request_id is not None and answered_id != request_id:
        raise not_this_answer(request_id, answered_id)
    return answer


def not_this_answer(request_id: str, answered_id: object) -> HttpError:
    """An answer that carries another request's id: this request may still run in Triton."""
    return HttpError(
        grpc.StatusCode.INTERNAL,
        f"Triton answered request id {answered_id!r} to request id {request_id!r}",
        answered=False,
    )


class HttpResponse:
    """An HTTP response read off a connection."""

    __slots__ = ("body", "close", "json_bytes", "status")

    def __init__(self, status: int, body: bytes, json_bytes: int | None, close: bool) -> None:
        self.status, self.body, self.json_bytes, self.close = status, body, json_bytes, close

    def answer(self, request_id: str | None = None) -> Answer:
        """The outputs (of the request ``request_id``, if given), or the :class:`HttpError` of
        Triton's refusal."""
        if self.status == 200:
            return http_answer(self.body, self.json_bytes, request_id)
        raise self.error()

    def error(self) -> HttpError:
        """Triton's refusal as an :class:`HttpError`."""
        try:
            message = str(json.loads(self.body)["error"])
        except (ValueError, KeyError, TypeError):
            message = self.body.decode(errors="replace").strip() or f"HTTP {self.status}"
        code = _STATUS.get(self.status, grpc.StatusCode.UNKNOWN)
        return HttpError(code, header_named_as_grpc(message), answered=True)


def _malformed(why: str) -> HttpError:
    """A response that breaks HTTP/1.1 (the connection is closed): whether Triton is done with
    the request is not known, so its slot waits until Triton is proven done with it."""
    return HttpError(
        grpc.StatusCode.INTERNAL,
        f"Triton's HTTP endpoint answered a malformed HTTP/1.1 response: {why}",
        answered=False,
    )


def _unreadable(why: str) -> HttpError:
    """A whole HTTP response whose JSON or binary outputs do not read as Triton's answer."""
    return HttpError(
        grpc.StatusCode.INTERNAL,
        f"Triton's HTTP endpoint answered an inference response that does not read: {why}",
        answered=True,
    )


def _length(value: bytes, what: str) -> int:
    """A header's decimal length."""
    if not value.isdigit() or len(value) > _MAX_DIGITS:
        raise _malformed(f"its {what} is not a length")
    return int(value)


def _received(data: bytes, received: bytes) -> tuple[bytes, HttpResponse | None]:
    """What a connection sent so far, ``received`` last, and the response if it is all there.

    Raises:
        ConnectionResetError: Triton closed the connection (``received`` is empty).
    """
    if not received:
        raise ConnectionResetError("Triton closed the connection")
    data += received
    return data, _parse(data)


class _Reading:
    """llhttp's reading of one response (``httptools``' callbacks)."""

    __slots__ = ("body", "done", "extra", "framed", "json_bytes", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.json_bytes: int | None = None
        self.done = self.extra = self.framed = False
        #: Whether the connection may be used again (``None`` until the head is read).
        self.keep_alive: bool | None = None
        self.status = 0

    def on_message_begin(self) -> None:
        self.extra = self.done  # a second response, never asked for

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"inference-header-content-length":
            self.json_bytes = _length(value.strip(), "Inference-Header-Content-Length")
        elif name in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = status = self.parser.get_status_code()
        if status < 200:  # never asked for (no Expect:): the final response would follow it
            raise _malformed(f"an interim status {status}")
        if not self.framed and status not in (204, 304):  # its end would be the connection's
            raise _malformed("no Content-Length and not chunked")
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


def _parse(data: bytes) -> HttpResponse | None:
    """The response in ``data`` (read by llhttp), or ``None`` if it is not all there yet.

    Raises:
        HttpError: ``data`` breaks HTTP/1.1, or is a response this library never asks for
            (see :func:`_malformed`).
    """
    reading = _Reading()
    parser = reading.parser
    try:
        parser.feed_data(data)
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, HttpError):
            raise exc.__context__ from None
        raise _malformed(str(exc)) from None
    except httptools.HttpParserError as exc:
        if not reading.done:
            raise _malformed(str(exc)) from None
        reading.extra = True  # bytes past the response that are no response
    if not reading.done:
        if reading.keep_alive is None and len(data) > _MAX_HEAD_BYTES:
            raise _malformed(f"its head is over {_MAX_HEAD_BYTES} bytes")
        return None
    # Bytes past the response were not asked for: the connection is not used again.
    close = reading.extra or not reading.keep_alive
    return HttpResponse(reading.status, b"".join(reading.body), reading.json_bytes, close)


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
        self,
        method: bytes,
        path: bytes,
        body: bytes | BinaryBody,
        headers: Sequence[tuple[str, str]],
    ) -> list[bytes | memoryview]:
        """The request's bytes, in pieces to send one after another (one for a small one)."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers).encode()
        if isinstance(body, BinaryBody):
            length = len(body.json) + sum(len(tensor) for tensor in body.tensors)
            content = b"Content-Type: application/octet-stream\r\n"
            content += b"Inference-Header-Content-Length: %d\r\n" % len(body.json)
            pieces: list[bytes | memoryview] = [body.json, *body.tensors]
        else:
            length = len(body)
            content = b"Content-Type: application/json\r\n" if body else b""
            pieces = [body]
        head = b"%s %s HTTP/1.1\r\n%s%s%sContent-Length: %d\r\n\r\n" % (
            method,
            path,
            self._host,
            content,
            extra,
            length,
        )
        if length <= _JOIN_BYTES:
            return [b"".join([head, *pieces])]
        return [head, *pieces]

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
        body: bytes | BinaryBody,
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
            for piece in message:
                sock.sendall(piece)
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
        self, path: bytes, body: bytes | BinaryBody, headers: Sequence[tuple[str, str]] = ()
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
            writer.writelines(message)
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
