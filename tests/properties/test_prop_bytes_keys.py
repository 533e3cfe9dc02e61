"""BYTES decoding (Triton's length-prefixed elements, read from a slot), and key and
certificate files: the right value or a named error."""

from __future__ import annotations

import ssl
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _counts import examples, tried
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm._inference._bytes import decode
from ray_triton_shm._wire._keys import headers_from_dir, normalize
from ray_triton_shm._wire._tls import TlsFiles, _context


def _serialized(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@given(
    elements=st.lists(st.binary(max_size=40), max_size=12),
    tail=st.binary(max_size=16),
    cut=st.integers(0, 64),
    extra=st.integers(0, 3),
)
@example(elements=[], tail=b"\xff\xff\xff\xff", cut=0, extra=1)  # a length past everything
@examples(1500, soak=50_000)
def test_decode_reads_what_was_written_or_says_it_runs_past(
    elements: list[bytes], tail: bytes, cut: int, extra: int
) -> None:
    """Serialized elements (then anything) decode to themselves; asked for more than there
    are, or cut short, ``None`` (which the caller turns into a named error), never an
    element past the space."""
    tried("BYTES decode")
    data = _serialized(elements) + tail
    space = np.frombuffer(data, np.uint8)
    decoded = decode(space, len(elements))
    assert decoded is not None
    values, used = decoded
    assert list(values) == elements and used == len(_serialized(elements))
    short = np.frombuffer(data[: max(0, used - cut)], np.uint8)
    again = decode(short, len(elements) + extra)
    if again is not None:
        assert again[1] <= len(short)
        assert list(again[0][: len(elements)]) == elements[: len(again[0])] or extra


@given(space=st.binary(max_size=200), count=st.integers(0, 50))
@examples(1500, soak=50_000)
def test_decode_of_random_bytes_stays_inside(space: bytes, count: int) -> None:
    tried("BYTES decode")
    decoded = decode(np.frombuffer(space, np.uint8), count)
    if decoded is not None:
        values, used = decoded
        assert len(values) == count and used <= len(space)
        assert sum(4 + len(v) for v in values) == used


names = st.from_regex(r"[a-zA-Z0-9_.\-]{1,20}", fullmatch=True).filter(
    lambda n: n not in (".", "..")
)


@given(files=st.dictionaries(names, st.binary(max_size=64), max_size=4))
@example(files={"triton-grpc-protocol-infer-key": b"\xff\xfe"})  # not UTF-8
@example(files={"key": b""})  # empty
@example(files={"-": b"\x00 \n"})  # a NUL, whitespace
@examples(360, soak=7_200)
def test_key_files_give_their_text_or_a_named_error(files: dict[str, bytes]) -> None:
    """A directory of key files: each file's text (stripped), or ``ValueError`` naming a
    file that is not UTF-8 (never its value)."""
    tried("key files")
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in files.items():
            (Path(tmp) / name).write_bytes(content)
        try:
            headers = headers_from_dir(tmp)
        except ValueError as exc:
            assert "is not UTF-8 text" in str(exc)
            assert not any(c and c in str(exc).encode() for c in files.values() if len(c) > 3)
            return
    visible = {n: c for n, c in files.items() if not n.startswith(".")}
    assert len(headers) <= len(visible)
    assert all(v == v.strip() for v in headers.values())
    assert normalize(headers) == headers


PEM = b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0xZ\n-----END CERTIFICATE-----\n"


@given(
    content=st.one_of(
        st.binary(max_size=300),
        st.integers(0, len(PEM)).map(lambda n: PEM[:n]),  # truncated PEM
        st.just(b""),
    ),
    which=st.sampled_from(["ca", "pair"]),
)
@examples(120, soak=2400)
def test_tls_files_give_a_context_or_a_named_error(content: bytes, which: str) -> None:
    """Garbage, empty or truncated PEM: the files are read, and the context made from them
    fails with what the handshake's diagnosis names (``ssl.SSLError``, ``OSError``,
    ``ValueError``: see ``diagnose``), never another error."""
    tried("TLS files")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.pem"
        path.write_bytes(content)
        files = TlsFiles(path) if which == "ca" else TlsFiles(None, path, path)
        assert files.read()[0 if which == "ca" else 1] == content
        with pytest.raises((ssl.SSLError, OSError, ValueError)):
            _context(files)
