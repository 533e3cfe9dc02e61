"""A Ray Serve image classifier in front of Triton's ``classifier`` model, through shared memory.

Run from the repository root, with a Triton on ``localhost:8001`` (``ray-triton-shm serve-local
--grpc-port 8001``)::

    serve run deployments.classifier:app           # or: serve run deployments/classifier.yaml

then POST a batch of images to ``http://localhost:8000/`` in any of these forms:

* ``{"seed": 0, "batch": 2}`` (JSON): the replica makes ``batch`` synthetic images from
  ``seed`` (see :func:`synthetic_images`), for demos.
* a ``.npy`` body (``Content-Type: application/x-npy``): ``(N, 3, 224, 224)`` or one image
  ``(3, 224, 224)``.
* raw little-endian bytes (``Content-Type: application/octet-stream``) with the shape in an
  ``X-Shape: N,3,224,224`` header, and ``X-Dtype`` (default ``float32``).
* ``{"inputs": [...]}`` (JSON): nested lists, fine for a one-off test, slow for real images.

Images are float32; float64 and uint8 are converted. Add ``?top_k=3`` (or ``"top_k"`` in the
JSON) for another ``k``. The answer is ``{"top_k": [[{"class": i, "score": s}, ...], ...]}``, one
list per image, best first; bad requests get a 400 with ``{"error": ...}``.

Every image of every request becomes one call of the ``@serve.batch`` method, so images of
concurrent requests share Triton requests of up to ``max_batch_size``; the batch is written
straight into a shared-memory slot of the replica by :class:`ShmModel`.

``backend="grpc"`` runs the same app on plain gRPC (``tritonclient.grpc.aio``), and
``backend="noop"`` answers zeros without Triton: Serve's own ceiling for this app. ``bench
--ray`` compares the three behind Serve's HTTP proxy, with :meth:`stage_times` saying where a
request's time goes in the replica.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from ray_triton_shm import InvalidInputError, OverloadedError, SlotTimeoutError
from ray_triton_shm.ray import URL_ENV_VAR, ShmModel

IMAGE_SHAPE = (3, 224, 224)
NUM_CLASSES = 1000
#: How the replica calls the model: through shared memory, by value over gRPC, or not at all.
BACKENDS = ("shm", "grpc", "noop")
#: Accepted image dtypes; everything is converted to float32 for the model.
_DTYPES = {"float32", "float64", "uint8"}


def synthetic_images(seed: int, batch: int) -> np.ndarray:
    """``batch`` deterministic float32 images in ``[0, 1)``, shape ``(batch, 3, 224, 224)``."""
    return np.random.default_rng(seed).random((batch, *IMAGE_SHAPE), dtype=np.float32)


def top_k_classes(scores: np.ndarray, k: int) -> list[list[dict[str, float | int]]]:
    """The ``k`` best classes of each row of ``scores`` (``(N, classes)``), best first."""
    k = min(k, scores.shape[1])
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [
        [{"class": int(c), "score": float(row[c])} for c in classes]
        for row, classes in zip(scores, best)
    ]


class BadRequest(ValueError):
    """The request cannot be turned into images (answered with HTTP 400)."""


class GrpcModel:
    """The model by value over plain gRPC (``tritonclient.grpc.aio``), with
    :class:`ShmModel`'s ``infer_async``: the app without shared memory, for comparison."""

    def __init__(self, model_name: str, url: str | None = None) -> None:
        self._model_name = model_name
        self._url = url or os.environ.get(URL_ENV_VAR, "localhost:8001")
        self._client: Any = None

    async def infer_async(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        import tritonclient.grpc.aio as grpcclient

        from ray_triton_shm import headers_from_env

        if self._client is None:  # made on the replica's event loop
            self._client = grpcclient.InferenceServerClient(self._url)
        batch = np.stack(inputs["INPUT0"])
        infer_input = grpcclient.InferInput("INPUT0", list(batch.shape), "FP32")
        infer_input.set_data_from_numpy(batch)
        result = await self._client.infer(
            self._model_name,
            [infer_input],
            outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
            headers=headers_from_env(),
        )
        return {"OUTPUT0": result.as_numpy("OUTPUT0")}


class NoopModel:
    """No model: zero scores for every image, at once. The app's own ceiling (Serve, parsing,
    batching, top-k and JSON, without inference)."""

    async def infer_async(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": np.zeros((len(inputs["INPUT0"]), NUM_CLASSES), np.float32)}


class StageTimes:
    """Seconds spent in each stage of a request, summed, with how often it ran: ``with
    times("parse"): ...``. A few hundred ns per stage; :meth:`ClassifierDeployment.stage_times`
    reads them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.images = 0

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
            self.calls[stage] = self.calls.get(stage, 0) + 1


def _batch_options(max_concurrent_batches: int) -> dict[str, Any]:
    # max_concurrent_batches came with Ray 2.4x; older Serve runs one batch at a time.
    if "max_concurrent_batches" in inspect.signature(serve.batch).parameters:
        return {"max_concurrent_batches": max_concurrent_batches}
    return {}


@serve.deployment(max_ongoing_requests=64)
class ClassifierDeployment:
    """Top-k classification of image batches by a Triton model, through shared memory.

    Args:
        model_name: The Triton model (input ``(3, 224, 224)`` float32, output class scores).
        top_k: Classes returned per image unless the request asks otherwise.
        url: Triton's gRPC address on the node; ``None``: the node actor's default
            (``$RAY_TRITON_SHM_URL``, then ``localhost:8001``).
        max_batch_size: Images per Triton request (``@serve.batch``).
        batch_wait_timeout_s: How long a batch waits to fill up.
        max_images_per_request: Larger requests are refused (400).
        backend: ``"shm"`` (:class:`ShmModel`), ``"grpc"`` (:class:`GrpcModel`, for
            comparison) or ``"noop"`` (:class:`NoopModel`: no inference, the app's ceiling).
        memory: Where the ``"shm"`` backend's slots live: ``"system"``, or ``"cuda"`` on the
            replica's GPU (give the replica ``num_gpus``; see :data:`gpu_app`).

    ``user_config`` may set ``top_k``, ``max_batch_size`` and ``batch_wait_timeout_s`` at run
    time (``serve deploy`` with a new config, no restart).
    """

    def __init__(
        self,
        *,
        model_name: str = "classifier",
        top_k: int = 5,
        url: str | None = None,
        max_batch_size: int = 8,
        batch_wait_timeout_s: float = 0.005,
        max_images_per_request: int = 64,
        backend: str = "shm",
        memory: str = "system",
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self._model: Any
        if backend == "shm":
            self._model = ShmModel(model_name, url=url, memory=memory)
        elif backend == "grpc":
            self._model = GrpcModel(model_name, url)
        else:
            self._model = NoopModel()
        self._times = StageTimes()
        self._top_k = top_k
        self._max_images = max_images_per_request
        self._apply_batching(max_batch_size, batch_wait_timeout_s)

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """Applies ``user_config``: ``top_k``, ``max_batch_size``, ``batch_wait_timeout_s``."""
        self._top_k = int(config.get("top_k", self._top_k))
        self._apply_batching(config.get("max_batch_size"), config.get("batch_wait_timeout_s"))

    def _apply_batching(self, max_batch_size: int | None, wait_s: float | None) -> None:
        if max_batch_size is not None:
            self._classify_image.set_max_batch_size(int(max_batch_size))
        if wait_s is not None:
            self._classify_image.set_batch_wait_timeout_s(float(wait_s))

    async def __call__(self, request: Request) -> JSONResponse:
        """Answers one HTTP request: images in, top-k classes out."""
        times = self._times
        try:
            with times("request"):
                with times("body"):
                    body = await request.body()
                with times("parse"):
                    images, top_k = self._parse(request, body)
                with times("batched"):
                    scores = await asyncio.gather(*map(self._classify_image, images))
                with times("top_k"):
                    answer = {"top_k": top_k_classes(np.stack(scores), top_k) if scores else []}
                with times("json"):
                    return JSONResponse(answer)
        except (BadRequest, InvalidInputError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except (OverloadedError, SlotTimeoutError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, **_batch_options(2))
    async def _classify_image(self, images: list[np.ndarray]) -> list[np.ndarray]:
        # Per-sample arrays go straight into the slot: no np.stack copy of the batch first.
        times = self._times
        with times("model"):
            outputs = await self._model.infer_async({"INPUT0": images})
        times.images += len(images)
        return list(outputs["OUTPUT0"])

    async def stage_times(self, reset: bool = False) -> dict[str, Any]:
        """Where this replica's requests spent their time since the last reset.

        Returns:
            ``replica`` (its id), ``pid``, ``images`` (classified), and ``stages``: per
            stage, ``seconds`` in all and ``calls``. The stages: ``request`` (the whole of
            ``__call__``), ``body`` (reading it), ``parse`` (to float32 images), ``batched``
            (from the images' ``@serve.batch`` calls to their scores: waiting for a batch,
            splitting and joining, and the model), ``model`` (a batch's model call), ``top_k``
            and ``json``.
        """
        times = self._times
        if reset:
            self._times = StageTimes()
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "pid": os.getpid(),
            "images": times.images,
            "stages": {
                stage: {"seconds": seconds, "calls": times.calls[stage]}
                for stage, seconds in times.seconds.items()
            },
        }

    def _parse(self, request: Request, body: bytes) -> tuple[np.ndarray, int]:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        top_k = request.query_params.get("top_k")
        if content_type == "application/json" or body[:1] == b"{":
            images, json_top_k = _parse_json(body)
            top_k = top_k or json_top_k
        elif content_type in ("application/x-npy", "application/npy") or body[:6] == b"\x93NUMPY":
            images = _parse_npy(body)
        elif "x-shape" in request.headers:
            images = _parse_raw(body, request.headers["x-shape"], request.headers.get("x-dtype"))
        else:
            raise BadRequest(
                "send JSON ({'seed': 0, 'batch': 2} or {'inputs': [...]}), a .npy body "
                "(Content-Type: application/x-npy), or raw bytes with an X-Shape header"
            )
        images = self._check_images(images)
        try:
            k = int(top_k) if top_k is not None else self._top_k
        except ValueError:
            raise BadRequest(f"top_k must be an integer, got {top_k!r}") from None
        if k < 1:
            raise BadRequest(f"top_k must be at least 1, got {k}")
        return images, k

    def _check_images(self, images: np.ndarray) -> np.ndarray:
        if images.shape == IMAGE_SHAPE:
            images = images[np.newaxis]
        if images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
            raise BadRequest(
                f"images must have shape (N, 3, 224, 224) or (3, 224, 224), got {images.shape}"
            )
        if len(images) > self._max_images:
            raise BadRequest(
                f"at most {self._max_images} images per request, got {len(images)}; split them"
            )
        if images.dtype.name not in _DTYPES:
            raise BadRequest(f"images must be one of {sorted(_DTYPES)}, got {images.dtype}")
        return images.astype(np.float32, copy=False)


def _parse_json(body: bytes) -> tuple[np.ndarray, Any]:
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest("the JSON body must be an object")
    top_k = payload.get("top_k")
    if "inputs" in payload:
        try:
            return np.asarray(payload["inputs"], dtype=np.float32), top_k
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"'inputs' is not a numeric array: {exc}") from None
    seed, batch = payload.get("seed", 0), payload.get("batch", 1)
    if not isinstance(seed, int) or not isinstance(batch, int) or seed < 0 or batch < 0:
        raise BadRequest(f"'seed' and 'batch' must be integers >= 0, got {seed!r}, {batch!r}")
    if batch > 1024:  # checked again against max_images_per_request; avoids a huge allocation
        raise BadRequest(f"'batch' is too large: {batch}")
    return synthetic_images(seed, batch), top_k


def _parse_npy(body: bytes) -> np.ndarray:
    """The array of a ``.npy`` body, read in place (no copy of the data)."""
    if body[:6] != b"\x93NUMPY" or len(body) < 10:
        raise BadRequest("the body is not a valid .npy array: no .npy header")
    major = body[6]
    size_bytes = 2 if major == 1 else 4
    header_len = int.from_bytes(body[8 : 8 + size_bytes], "little")
    start = 8 + size_bytes + header_len
    try:
        header = ast.literal_eval(body[8 + size_bytes : start].decode("latin1"))
        dtype, shape = np.dtype(header["descr"]), tuple(header["shape"])
        fortran = bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise BadRequest(f"the body is not a valid .npy array: {exc}") from None
    if dtype.hasobject:
        raise BadRequest("the body is not a valid .npy array: object arrays are not accepted")
    count = int(np.prod(shape))
    if len(body) - start != count * dtype.itemsize:
        raise BadRequest(
            f"the body is not a valid .npy array: {shape} of {dtype} needs "
            f"{count * dtype.itemsize} bytes of data, it has {len(body) - start}"
        )
    array = np.frombuffer(body, dtype, count=count, offset=start)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _parse_raw(body: bytes, shape_header: str, dtype_header: str | None) -> np.ndarray:
    try:
        shape = tuple(int(d) for d in shape_header.replace("x", ",").split(","))
    except ValueError:
        raise BadRequest(f"X-Shape must look like '2,3,224,224', got {shape_header!r}") from None
    name = (dtype_header or "float32").strip().lower()
    if name not in _DTYPES:
        raise BadRequest(f"X-Dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    dtype = np.dtype(name).newbyteorder("<")
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(body) != expected or any(d < 0 for d in shape):
        raise BadRequest(
            f"X-Shape {shape} of {name} needs {expected} bytes, the body has {len(body)}"
        )
    return np.frombuffer(body, dtype).reshape(shape)


#: ``serve run deployments.classifier:app``
app = ClassifierDeployment.bind()
#: The same app with its slots on each replica's GPU (deployments/kuberay/rayservice-gpu.yaml).
gpu_app = ClassifierDeployment.options(ray_actor_options={"num_gpus": 1}).bind(memory="cuda")
