"""A Ray Serve app that streams: Triton's streaming ``captioner`` model behind HTTP, each of
its responses sent on as it comes, through shared memory.

Run from the repository root, with a Triton on ``localhost:8001`` (``ray-triton-shm serve-local
--grpc-port 8001``)::

    serve run deployments.captioner:app           # or: serve run deployments/captioner.yaml

then POST an image and how many responses to stream, and read the answer as it comes
(``curl -N``)::

    curl -sN -d '{"seed": 0, "count": 8, "delay_us": 100000}' localhost:8000/caption

* ``{"seed": 0, "count": 8, "delay_us": 0}`` (JSON): the replica makes a synthetic image from
  ``seed`` (:func:`synthetic_image`); ``count`` responses, ``delay_us`` apart (the example
  model's error case, a ``count`` below 0, sends ``-count`` responses, then an error).
* a ``.npy`` body (``Content-Type: application/x-npy``), one image ``(3, 224, 224)``, with
  ``?count=8&delay_us=0`` in the query.

The answer is newline-delimited JSON (``application/x-ndjson``), one line per response as
Triton sends it: ``{"index": 0, "token": 0, "feature": [...]}``. Errors before the first
response get a status (400 for bad inputs, 503 when the node is overloaded, 502 for Triton's
own); an error after it ends the stream with an ``{"error": ..., "delivered": n}`` line. A client
that goes away cancels the request in Triton, and its slot comes back once Triton is done.

Other deployments stream too, through a ``DeploymentHandle``:
``handle.options(stream=True).captions.remote(image, count)`` yields the same lines as dicts.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ray_triton_shm import (
    InvalidInputError,
    OverloadedError,
    SlotTimeoutError,
    StreamResponse,
    TritonServerError,
)
from ray_triton_shm.ray import ShmModel

IMAGE_SHAPE = (3, 224, 224)
#: The most responses one request may ask for, and the longest pause between two.
MAX_COUNT = 10_000
MAX_DELAY_US = 1_000_000
NDJSON = "application/x-ndjson"


class BadRequest(ValueError):
    """The request cannot be turned into the model's inputs (answered with HTTP 400)."""


def synthetic_image(seed: int) -> np.ndarray:
    """A deterministic float32 image in ``[0, 1)``, shape ``(3, 224, 224)``."""
    return np.random.default_rng(seed).random(IMAGE_SHAPE, dtype=np.float32)


def model_inputs(image: np.ndarray, count: int, delay_us: int = 0) -> dict[str, np.ndarray]:
    """The ``captioner`` model's inputs: ``count`` responses, ``delay_us`` apart."""
    return {
        "IMAGE": image,
        "COUNT": np.array([count], np.int32),
        "DELAY_US": np.array([delay_us], np.int32),
    }


def response_line(response: StreamResponse) -> dict[str, Any]:
    """One response as the app sends it: its index, its token and its 4 features."""
    return {
        "index": response.index,
        "token": int(response["TOKEN"][0]),
        "feature": response["FEATURE"].tolist(),
    }


def _line(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload).encode() + b"\n"


@serve.deployment(max_ongoing_requests=64)
class CaptionerDeployment:
    """Streams the responses of a streaming (decoupled) Triton model, through shared memory.

    Args:
        model_name: The Triton model (the example ``captioner``'s inputs and outputs).
        url: Triton's gRPC address on the node; ``None``: the node actor's default
            (``$RAY_TRITON_SHM_URL``, then ``localhost:8001``).
        pool_size: A fixed number of the node's slots for the model, so of streams in
            flight on the node (``None``: as many as its callers need, see :class:`ShmModel`).
    """

    def __init__(
        self, *, model_name: str = "captioner", url: str | None = None, pool_size: int | None = None
    ) -> None:
        self._model = ShmModel(model_name, url=url, pool_size=pool_size)

    async def __call__(self, request: Request) -> Response:
        """Answers one HTTP request: an image in, its responses out as NDJSON lines."""
        try:
            image, count, delay_us = _parse(request, await request.body())
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        responses = self._model.stream_async(model_inputs(image, count, delay_us))
        # The first response before the status: an error before it still gets one.
        try:
            first = await anext(responses, None)
        except InvalidInputError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except (OverloadedError, SlotTimeoutError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        except TritonServerError as exc:
            return JSONResponse({"error": str(exc)}, status_code=502)
        return StreamingResponse(_ndjson(first, responses), media_type=NDJSON)

    async def captions(
        self, image: np.ndarray, count: int, delay_us: int = 0
    ) -> AsyncIterator[dict[str, Any]]:
        """The lines of :meth:`__call__` as dicts, for ``handle.options(stream=True)``: one
        per response, as it comes. Errors are raised to the caller."""
        responses = self._model.stream_async(model_inputs(image, count, delay_us))
        async for response in responses:
            yield response_line(response)


async def _ndjson(
    first: StreamResponse | None, responses: AsyncGenerator[StreamResponse, None]
) -> AsyncIterator[bytes]:
    """The body: a line per response; a model's error after the first ends it with an error
    line. A client that goes away cancels this, and with it the request in Triton."""
    delivered = 0
    try:
        if first is None:
            return
        yield _line(response_line(first))
        delivered = 1
        async for response in responses:
            yield _line(response_line(response))
            delivered += 1
    except TritonServerError as exc:
        yield _line({"error": str(exc), "delivered": delivered})
    finally:
        await responses.aclose()


def _parse(request: Request, body: bytes) -> tuple[np.ndarray, int, int]:
    """The image, the count and the delay of a request (JSON, or a ``.npy`` body)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("application/x-npy", "application/npy") or body[:6] == b"\x93NUMPY":
        try:
            image = np.load(io.BytesIO(body), allow_pickle=False)
        except ValueError as exc:
            raise BadRequest(f"the body is not a valid .npy array: {exc}") from None
        options: Mapping[str, Any] = request.query_params
    else:
        try:
            options = json.loads(body or b"{}")
        except ValueError as exc:
            raise BadRequest(f"invalid JSON: {exc}") from None
        if not isinstance(options, dict):
            raise BadRequest("the JSON body must be an object")
        image = synthetic_image(_number(options, "seed", 0, 0, 2**32 - 1))
    if image.shape != IMAGE_SHAPE:
        raise BadRequest(f"the image must have shape {IMAGE_SHAPE}, got {image.shape}")
    count = _number(options, "count", 8, -MAX_COUNT, MAX_COUNT)
    delay_us = _number(options, "delay_us", 0, 0, MAX_DELAY_US)
    return image.astype(np.float32, copy=False), count, delay_us


def _number(options: Mapping[str, Any], name: str, default: int, least: int, most: int) -> int:
    value = options.get(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name!r} must be an integer, got {value!r}") from None
    if not least <= number <= most:
        raise BadRequest(f"{name!r} must be between {least} and {most}, got {number}")
    return number


#: ``serve run deployments.captioner:app``
app = CaptionerDeployment.bind()
