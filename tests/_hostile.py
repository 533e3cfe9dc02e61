"""A hostile Triton: real servers on real sockets, HTTP and gRPC, in front of a real Triton.

They pass every call through to it, and answer its inference calls (``ModelInfer``,
``ModelStreamInfer``, HTTP ``.../infer``) as told by :meth:`HostileTriton.cue`: garbage, a
connection closed mid-answer, a stall mid-answer (until :meth:`HostileTriton.release`),
another request's id, or outputs of the wrong shape, datatype or size. What no real Triton
does, on cue: the one mock of these tests that is a server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

#: The cases, each a way to answer an inference call.
CASES = ("garbage", "close", "stall", "other_id", "shape", "datatype", "size")
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _identity(data: bytes) -> bytes:
    return data


class HostileTriton:
    """An HTTP and a gRPC server in front of the Triton at ``grpc_url`` and ``http_url``.

    Attributes:
        grpc_url: Where its gRPC server listens.
        http_url: Where its HTTP server listens.
        answered: Inference answers it corrupted since the last cue.
    """

    def __init__(self, grpc_url: str, http_url: str) -> None:
        self._upstream_http = http_url
        self._case: str | None = None
        self._held = threading.Event()
        self._lock = threading.Lock()
        self.answered = 0
        self._channel = grpc.insecure_channel(grpc_url)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self._grpc.add_generic_rpc_handlers([_Forward(self)])
        port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.grpc_url = f"127.0.0.1:{port}"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.http_url = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: list[socket.socket] = []
        self._closed = False

    def start(self) -> HostileTriton:
        """Starts both servers."""
        self._grpc.start()
        threading.Thread(target=self._accept, daemon=True, name="hostile-http").start()
        return self

    def stop(self) -> None:
        """Stops both servers (releasing any stall first)."""
        self._closed = True
        self.release()
        self._grpc.stop(grace=None)
        self._listener.close()
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.close()
        self._channel.close()

    def cue(self, case: str | None) -> None:
        """Answers every inference call from now on as ``case`` says (``None``: right)."""
        assert case is None or case in CASES, case
        with self._lock:
            self._case, self.answered = case, 0
            self._held.clear()

    def release(self) -> None:
        """Ends the stalls: each answer stalled so far arrives whole."""
        self._held.set()

    def _corrupting(self) -> str | None:
        with self._lock:
            if self._case is not None:
                self.answered += 1
            return self._case

    # --- gRPC ---------------------------------------------------------------------------

    def unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        """A unary call: passed through; an inference answer corrupted on cue."""
        call = self._channel.unary_unary(method, _identity, _identity)
        metadata = context.invocation_metadata()
        try:
            answer: bytes = call(request, metadata=metadata)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        case = self._corrupting() if method == _INFER else None
        if case is None:
            return answer
        return self._grpc_answer(case, answer, context)

    def stream(
        self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """A stream: passed through; each response corrupted on cue."""
        call = self._channel.stream_stream(method, _identity, _identity)
        case = None
        for count, answer in enumerate(call(requests, metadata=context.invocation_metadata())):
            case = self._corrupting() if method == _STREAM else None
            if case == "close" and count == 0:
                yield answer  # the first response, then the connection goes
                continue
            yield answer if case is None else self._grpc_answer(case, answer, context, stream=True)

    def _grpc_answer(
        self, case: str, answer: bytes, context: grpc.ServicerContext, *, stream: bool = False
    ) -> bytes:
        if case == "garbage":
            return b"\xff\xfe garbage \x00" * 3
        if case == "close":
            context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        if case == "stall":
            self._held.wait()
            return answer
        if stream:
            response = service_pb2.ModelStreamInferResponse.FromString(answer)
            _corrupt(case, response.infer_response)
        else:
            response = service_pb2.ModelInferResponse.FromString(answer)
            _corrupt(case, response)
        return response.SerializeToString()

    # --- HTTP ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        host, port = self._upstream_http.rsplit(":", 1)
        upstream = http.client.HTTPConnection(host, int(port))
        reader = connection.makefile("rb")
        with contextlib.suppress(OSError, http.client.HTTPException), connection:
            try:
                self._pass(connection, reader, upstream)
            finally:
                upstream.close()

    def _pass(
        self, connection: socket.socket, reader: Any, upstream: http.client.HTTPConnection
    ) -> None:
        """Passes a connection's requests through, one after another, until it closes."""
        while (request := _read_request(reader)) is not None:
            method, path, headers, body = request
            upstream.request(method, path, body, headers)
            answer = upstream.getresponse()
            status, answer_headers, content = answer.status, answer.getheaders(), answer.read()
            case = self._corrupting() if path.endswith("/infer") else None
            if not self._http_answer(connection, case, status, answer_headers, content):
                return

    def _http_answer(
        self,
        connection: socket.socket,
        case: str | None,
        status: int,
        headers: list[tuple[str, str]],
        content: bytes,
    ) -> bool:
        """Sends an answer as ``case`` says; whether the connection goes on."""
        if case == "garbage":
            connection.sendall(b"\x00\x01garbage, not HTTP\r\n\r\n" * 4)
            return False
        json_bytes = next(
            (int(v) for k, v in headers if k.lower() == "inference-header-content-length"),
            len(content),
        )
        if case in ("other_id", "shape", "datatype", "size") and status == 200:
            document = json.loads(content[:json_bytes])
            for output in document.get("outputs", []):
                _corrupt_json(case, document, output)
            text = json.dumps(document).encode()
            content, json_bytes = text + content[json_bytes:], len(text)
        if case == "size":
            content += b"\x00" * 8  # more binary bytes than the outputs say
        head = f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
        head += f"Inference-Header-Content-Length: {json_bytes}\r\n"
        wire = f"{head}Content-Length: {len(content)}\r\n\r\n".encode() + content
        if case in ("close", "stall"):
            connection.sendall(wire[: len(wire) - len(content) // 2 - 1])
            if case == "close":
                return False
            self._held.wait()
            connection.sendall(wire[len(wire) - len(content) // 2 - 1 :])
            return True
        connection.sendall(wire)
        return True


def _corrupt(case: str, response: service_pb2.ModelInferResponse) -> None:
    """A gRPC answer corrupted as ``case`` says."""
    if case == "other_id":
        response.id = response.id + "-another"
    for output in response.outputs:
        if case == "shape":
            output.shape.append(3)
        elif case == "datatype":
            output.datatype = "INT8" if output.datatype != "INT8" else "FP64"
    if case == "size":
        if response.raw_output_contents:
            response.raw_output_contents[0] += b"\x00" * 8
        for output in response.outputs:
            output.shape[-1] += 1_000_000  # larger than its slot


def _corrupt_json(case: str, document: dict[str, Any], output: dict[str, Any]) -> None:
    if case == "other_id":
        document["id"] = str(document.get("id", "")) + "-another"
    elif case == "shape":
        output["shape"] = [*output["shape"], 3]
    elif case == "datatype":
        output["datatype"] = "INT8" if output["datatype"] != "INT8" else "FP64"
    elif case == "size":
        output["shape"] = [*output["shape"][:-1], output["shape"][-1] + 1_000_000]


def _read_request(reader: Any) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP request off a connection (``None`` once it closes)."""
    line = reader.readline()
    if not line:
        return None
    method, path, _ = line.decode().split(" ", 2)
    headers = {}
    while (header := reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        headers[name.strip()] = value.strip()
    length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
    return method, path, headers, reader.read(length)


class _Forward(grpc.GenericRpcHandler):
    """Every gRPC method, passed through to Triton as bytes."""

    def __init__(self, hostile: HostileTriton) -> None:
        self._hostile = hostile

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = details.method  # type: ignore[attr-defined]
        if method == _STREAM:
            return grpc.stream_stream_rpc_method_handler(_bind(self._hostile.stream, method))
        return grpc.unary_unary_rpc_method_handler(_bind(self._hostile.unary, method))


def _bind(handler: Callable[..., Any], method: str) -> Callable[..., Any]:
    return lambda request, context: handler(method, request, context)


@contextlib.contextmanager
def hostile_triton(grpc_url: str, http_url: str) -> Iterator[HostileTriton]:
    """A :class:`HostileTriton` in front of a Triton, stopped on the way out."""
    hostile = HostileTriton(grpc_url, http_url).start()
    try:
        yield hostile
    finally:
        hostile.stop()
