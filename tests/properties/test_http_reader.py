"""The library's HTTP/1.1 reader of Triton's answers (``_wire/_http.py``), against llhttp
(``httptools``, uvicorn's parser) as its oracle: on any bytes it returns the response llhttp
reads, waits for more, or raises :class:`HttpError`; never another exception, never a loop.
Bytes that arrive in pieces, split anywhere, read as they do whole."""

from __future__ import annotations

import json
from typing import Any

import httptools
from _counts import examples, tried
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm._wire._http import (
    HttpError,
    HttpResponse,
    _parse,
    _received,
    http_answer,
)

#: A response, as read: status, body, JSON length and whether the connection closes.
Read = tuple[int, bytes, int | None, bool]
#: What reading some bytes came to: a response, ``None`` (not all there) or an error.
Outcome = Read | None | type[HttpError]

_TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_DATATYPES = ("FP32", "INT64", "UINT8", "BOOL", "BYTES")


class _Oracle:
    """llhttp's reading of the first response in some bytes."""

    def __init__(self) -> None:
        self.body = b""
        self.first: tuple[int, bytes, bool] | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = True

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        if self.first is None:
            self.first = (self.parser.get_status_code(), self.body, self.keep_alive)


def llhttp(data: bytes) -> tuple[int, bytes, bool] | None | type[Exception]:
    """llhttp's first response in ``data`` (status, body, keep-alive), ``None`` if it is not
    all there, or ``Exception`` if ``data`` breaks HTTP before its end."""
    oracle = _Oracle()
    try:
        oracle.parser.feed_data(data)
    except httptools.HttpParserError:
        if oracle.first is None:
            return Exception
    return oracle.first


def ours(data: bytes) -> Outcome:
    """The library's reading of ``data``, whole."""
    try:
        response = _parse(data)
    except HttpError as exc:
        assert exc.code() is not None and not exc.answered  # a malformed head is no answer
        return HttpError
    return None if response is None else _read(response)


def in_pieces(data: bytes, cuts: list[int]) -> Outcome:
    """The library's reading of ``data`` as a socket hands it over, cut at ``cuts``."""
    so_far, response = b"", None
    bounds = [0, *sorted({min(cut, len(data)) for cut in cuts}), len(data)]
    try:
        for start, stop in zip(bounds, bounds[1:]):
            if start == stop:
                continue
            so_far, response = _received(so_far, data[start:stop])
            if response is not None:
                return _read(response)
    except HttpError:
        return HttpError
    return None


def _read(response: HttpResponse) -> Read:
    return response.status, response.body, response.json_bytes, response.close


# --- Well-formed answers, as Triton writes them -------------------------------------------

outputs = st.lists(
    st.tuples(
        st.text(_TOKEN, min_size=1, max_size=12),
        st.sampled_from(_DATATYPES),
        st.lists(st.integers(0, 64), max_size=3),
        st.one_of(st.none(), st.binary(max_size=96)),
    ),
    max_size=4,
)


@st.composite
def triton_answers(draw: st.DrawFn) -> tuple[bytes, bytes, int | None, list[Any]]:
    """A body as Triton writes it: its JSON (an ``id`` maybe), each binary output after it.
    Returns the body, the request id, the JSON's length (if binary), and the answer."""
    request_id = draw(st.text(max_size=8))
    answer = draw(outputs)
    document: dict[str, Any] = {"model_name": "m", "model_version": "1"}
    if request_id:
        document["id"] = request_id
    document["outputs"] = [
        {"name": name, "datatype": datatype, "shape": shape}
        | ({} if data is None else {"parameters": {"binary_data_size": len(data)}})
        for name, datatype, shape, data in answer
    ]
    text = json.dumps(document, separators=(",", ":")).encode()
    binary = b"".join(data for *_, data in answer if data is not None)
    expected = [(name, dt, tuple(shape), data or b"") for name, dt, shape, data in answer]
    return text + binary, request_id.encode(), len(text) if binary else None, expected


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, Read]:
    """A well-formed response (Content-Length or chunked, HTTP/1.1 or 1.0, headers of any
    case, an error's JSON), and how it reads."""
    status = draw(st.sampled_from([200, 200, 200, 400, 404, 409, 499, 500, 503]))
    if status == 200:
        body, _, json_bytes, _ = draw(triton_answers())
    else:
        body = json.dumps({"error": draw(st.text(max_size=40))}).encode()
        json_bytes = None
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    connection = draw(st.sampled_from([None, b"keep-alive", b"close", b"Keep-Alive, x"]))
    headers = [(b"Content-Type", b"application/json")]
    if json_bytes is not None:
        headers.append((b"inference-header-content-length", b"%d" % json_bytes))
    if connection is not None:
        headers.append((b"Connection", connection))
    extra = st.tuples(st.text(_TOKEN, min_size=1, max_size=10), st.text("ab c=;,/", max_size=10))
    for name, value in draw(st.lists(extra, max_size=3)):
        if name.lower() not in ("content-length", "transfer-encoding", "connection"):
            headers.append((name.encode(), value.strip().encode()))
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if b > a]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
        payload += b"0\r\n\r\n"
        headers.append((b"Transfer-Encoding", b"chunked"))
    else:
        payload = body
        headers.append((b"Content-Length", b"%d" % len(body)))
    headers = draw(st.permutations(headers))
    case = draw(st.sampled_from([bytes.lower, bytes.upper, bytes.title]))
    head = b"HTTP/%s %d %s\r\n" % (version, status, draw(st.sampled_from([b"OK", b"", b"Bad"])))
    head += b"".join(case(name) + b": " + value + b"\r\n" for name, value in headers)
    close = (connection or b"").lower().startswith(b"close") or (
        version == b"1.0" and connection is None
    )
    return head + b"\r\n" + payload, (status, body, json_bytes, close)


@given(responses(), st.data())
@examples(180, soak=3_600)
def test_a_well_formed_response_reads_as_llhttp_reads_it_in_any_pieces(
    response: tuple[bytes, Read], data: st.DataObject
) -> None:
    wire, expected = response
    tried("http reader: responses")
    assert ours(wire) == expected
    status, body, _, close = expected
    assert llhttp(wire) == (status, body, not close)
    for cut in range(len(wire)):  # every prefix: not all there yet, never an error
        assert _parse(wire[:cut]) is None
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=8))
    assert in_pieces(wire, cuts) == expected
    # Bytes past the response: the connection is never used again.
    assert ours(wire + b"HTTP/1.1 200 OK\r\n") == (*expected[:3], True)


@given(triton_answers())
@examples(180, soak=3_600)
def test_a_triton_answer_reads_back_as_written(answer: tuple[bytes, bytes, Any, Any]) -> None:
    body, request_id, json_bytes, expected = answer
    tried("http reader: answers")
    assert http_answer(body, json_bytes) == expected
    assert http_answer(body, json_bytes, request_id.decode()) == expected
    try:
        http_answer(body, json_bytes, request_id.decode() + "x")
    except HttpError as exc:  # another request's answer: this one may still run
        assert not exc.answered and "request id" in exc.details()
    else:
        raise AssertionError("an answer with another request's id was read as this one's")


# --- Anything else -------------------------------------------------------------------------


def _mutate(wire: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    for position, deleted, inserted in edits:
        at = position % (len(wire) + 1)
        wire = wire[:at] + inserted + wire[at + deleted :]
    return wire


edits = st.lists(
    st.tuples(
        st.integers(0, 4096),
        st.integers(0, 3),
        st.one_of(
            st.binary(max_size=4),
            st.sampled_from(
                [b"\r\n", b"\n", b" ", b"-", b"0", b"f", b";", b":", b"\x00", b"\r\n\r\n"]
            ),
        ),
    ),
    min_size=1,
    max_size=4,
)

_HEAD = b"HTTP/1.1 200 OK\r\n"
#: Header lines, right and wrong, that a reader must judge.
_HEADER_LINES = [
    b"Content-Length: 5",
    b"Content-Length: -5",
    b"Content-Length: 1_0",
    b"Content-Length: +5",
    b"Content-Length: 5 ",
    b"Content-Length: 99999999999999999999",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip",
    b"Connection: close",
    b"Inference-Header-Content-Length: 3",
    b" folded",
    b"X : y",
    b"X:\x00",
]


@st.composite
def odd_heads(draw: st.DrawFn) -> bytes:
    """A status line, header lines right and wrong, and some bytes."""
    lines = draw(st.lists(st.sampled_from(_HEADER_LINES), max_size=4))
    return (
        _HEAD + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + draw(st.binary(max_size=40))
    )


anything = st.one_of(
    responses().flatmap(lambda r: edits.map(lambda e: _mutate(r[0], e))),
    st.binary(max_size=300),
    st.binary(max_size=300).map(lambda tail: _HEAD + tail),
    odd_heads(),
)


@given(anything, st.lists(st.integers(0, 4400), max_size=8))
@example(_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-6\r\nabcdef", [])  # looped forever
@example(_HEAD + b'Connection: close\r\n\r\n{"outp', [])  # a truncated body, read as whole
@example(b"garbage\r\n\r\n", [])  # IndexError
@example(_HEAD + b"Content-Length: -5\r\n\r\nabcdefgh", [])  # read as 3 bytes
@example(_HEAD + b"Content-Length: 1_0\r\n\r\nabcdefghij", [])  # Python's int(), not HTTP
@example(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", [])
@example(_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n", [])  # no CRLF after
@examples(900, soak=18_000)
def test_any_bytes_read_as_llhttp_reads_them_or_fail_by_name(wire: bytes, cuts: list[int]) -> None:
    tried("http reader: any bytes")
    outcome = ours(wire)
    oracle = llhttp(wire)
    if isinstance(outcome, tuple):  # read as a response: llhttp reads the same one
        assert isinstance(oracle, tuple), (outcome, oracle)
        assert outcome[:2] == oracle[:2]
        assert outcome[3] or oracle[2]  # kept alive only where llhttp would
    elif oracle is Exception:  # what breaks HTTP is never read as a response
        assert outcome in (None, HttpError)
    assert in_pieces(wire, cuts) == outcome


bodies = st.one_of(
    st.binary(max_size=200),
    triton_answers().flatmap(lambda a: edits.map(lambda e: _mutate(a[0], e))),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    ).map(lambda doc: json.dumps({"outputs": doc}).encode()),
)


@given(bodies, st.one_of(st.none(), st.integers(-5, 300)))
@example(b"[" * 100_000, None)  # RecursionError
@example(b'{"outputs":[{"name":"o","datatype":"FP32","shape":[2]}]}xyz', 56)  # bytes left
@example(b'{"outputs":[{"name":"o","datatype":"FP32","shape":[-1],'
         b'"parameters":{"binary_data_size":-4}}]}', None)  # fmt: skip
@examples(900, soak=18_000)
def test_any_body_reads_as_an_answer_or_fails_by_name(body: bytes, json_bytes: int | None) -> None:
    tried("http reader: answer bodies")
    try:
        answer = http_answer(body, json_bytes if json_bytes is None or json_bytes >= 0 else 0)
    except HttpError as exc:
        assert exc.answered  # a whole response: Triton is done with the request
        return
    offset = len(body) if json_bytes is None else json_bytes
    for name, datatype, shape, data in answer:
        assert isinstance(name, str) and isinstance(datatype, str)
        assert all(isinstance(dim, int) and dim >= 0 for dim in shape)
        assert body[offset : offset + len(data)] == data
        offset += len(data)
    assert offset == len(body)
