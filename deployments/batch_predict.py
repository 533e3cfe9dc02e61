"""Batch inference with Ray Data: synthetic images -> Triton ``classifier`` -> parquet.

::

    python deployments/batch_predict.py --rows 256 --output /tmp/preds

Without ``--url`` it starts the embedded Triton (``LocalTritonServer``, the example models) and
stops it at the end; with ``--url HOST:PORT`` it uses that Triton. Each image is made from its
row id (``default_rng(seed + id)``), so a run is reproducible. The predictions are written as
parquet (``id``, ``top_classes``, ``top_scores`` and, with ``--keep-scores``, the 1000
``scores``), then a summary is printed; ``--verify N`` checks the first ``N`` rows against the
model's formula computed with numpy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from ray_triton_shm.ray import URL_ENV_VAR, ShmPredictor, get_node_actor

IMAGE_SHAPE = (3, 224, 224)


def make_images(batch: dict[str, np.ndarray], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Adds an ``image`` column: one float32 ``(3, 224, 224)`` image per row id."""
    ids = batch["id"]
    images = np.empty((len(ids), *IMAGE_SHAPE), np.float32)
    for row, i in enumerate(ids):
        images[row] = np.random.default_rng(seed + int(i)).random(IMAGE_SHAPE, dtype=np.float32)
    return {"id": ids, "image": images}


def add_top_k(batch: dict[str, np.ndarray], *, k: int, keep_scores: bool) -> dict[str, np.ndarray]:
    """Replaces the 1000 ``scores`` of each row by its ``k`` best classes (best first)."""
    scores = batch["scores"]
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    out = {
        "id": batch["id"],
        "top_classes": top.astype(np.int64),
        "top_scores": np.take_along_axis(scores, top, axis=1),
    }
    if keep_scores:
        out["scores"] = scores
    return out


def reference_scores(images: np.ndarray) -> np.ndarray:
    """What the example ``classifier`` model computes, in numpy."""
    b = images.shape[0]
    return images.reshape(b, -1)[:, :150000].reshape(b, 1000, 150).mean(axis=2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256, help="images to classify (256)")
    parser.add_argument("--output", default="/tmp/preds", help="parquet directory (/tmp/preds)")
    parser.add_argument("--url", help="Triton gRPC HOST:PORT (default: start the embedded one)")
    parser.add_argument("--address", help="Ray cluster to join (default: a new local Ray)")
    parser.add_argument("--model", default="classifier", help="Triton model (classifier)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per Ray Data batch (32)")
    parser.add_argument(
        "--actors", type=int, default=2, help="predictor actors, an ActorPoolStrategy's size (2)"
    )
    parser.add_argument(
        "--actor-cpus",
        type=float,
        default=0.5,
        help="CPUs reserved per predictor actor (0.5: Triton does the work)",
    )
    parser.add_argument("--top-k", type=int, default=5, help="classes kept per image (5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic images (0)")
    parser.add_argument("--keep-scores", action="store_true", help="also write all 1000 scores")
    parser.add_argument(
        "--verify",
        type=int,
        default=8,
        metavar="N",
        help="check the first N rows against numpy (8; 0: skip)",
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Runs the pipeline on the Ray this process is connected to; returns the summary."""
    ds = ray.data.range(args.rows, override_num_blocks=max(1, args.rows // args.batch_size))
    ds = ds.map_batches(make_images, fn_kwargs={"seed": args.seed}, batch_format="numpy")
    ds = ds.map_batches(
        ShmPredictor,
        fn_constructor_kwargs={
            "model_name": args.model,
            "input_columns": {"image": "INPUT0"},
            "output_columns": {"OUTPUT0": "scores"},
            "keep_columns": ["id"],
            "url": url,
        },
        batch_format="numpy",
        batch_size=args.batch_size,
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        num_cpus=args.actor_cpus,
    )
    ds = ds.map_batches(
        add_top_k,
        fn_kwargs={"k": args.top_k, "keep_scores": args.keep_scores},
        batch_format="numpy",
    )
    start = time.perf_counter()
    ds.write_parquet(args.output)
    elapsed_s = time.perf_counter() - start

    written = ray.data.read_parquet(args.output)
    rows = written.count()
    first = written.sort("id").take_batch(max(1, min(args.verify, rows)), batch_format="numpy")
    summary: dict[str, Any] = {"rows": rows, "elapsed_s": elapsed_s, "output": args.output}
    if args.verify:
        images = make_images({"id": first["id"]}, seed=args.seed)["image"]
        expected = reference_scores(images)
        top1 = expected.argmax(axis=1)
        summary["verified"] = bool(np.array_equal(first["top_classes"][:, 0], top1)) and bool(
            np.allclose(first["top_scores"][:, 0], expected.max(axis=1), rtol=1e-5, atol=1e-6)
        )
    summary["top1_of_first_rows"] = [int(c) for c in first["top_classes"][:8, 0]]
    stats = ray.get(get_node_actor(url=url).stats.remote()).models.get(args.model, {})
    summary["node_actor"] = {
        k: stats.get(k) for k in ("requests", "samples", "waits", "errors", "shm_bytes")
    }
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: sets up Triton and Ray as needed, runs, prints the summary, cleans up."""
    args = parse_args(argv)
    server = None
    if args.url is None:
        from ray_triton_shm.local._server import LocalTritonServer

        print("Starting the embedded Triton ...", flush=True)
        server = LocalTritonServer(install=True).start()
    url = args.url or server.grpc_url
    # The node actor reads it on its node; also passed explicitly in case we create the actor.
    os.environ[URL_ENV_VAR] = url
    started_ray = args.address is None and not ray.is_initialized()
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    try:
        summary = run(args, url)
    finally:
        if server is not None or started_ray:
            # The node actor would keep registrations on a Triton that goes away (or leak its
            # regions when Ray is torn down with it): release them first.
            actor = get_node_actor(url=url)
            ray.get(actor.shutdown.remote())
            ray.kill(actor)
        ray.shutdown()
        if server is not None:
            server.stop()
    print(
        f"Classified {summary['rows']} images in {summary['elapsed_s']:.2f} s "
        f"({summary['rows'] / summary['elapsed_s']:.1f} images/s) with {args.actors} "
        f"predictor actors; predictions in {summary['output']}"
    )
    print(f"Top-1 classes of the first rows: {summary['top1_of_first_rows']}")
    print(f"Node actor ({args.model}): {summary['node_actor']}")
    if "verified" in summary:
        print(f"Verified against numpy: {'OK' if summary['verified'] else 'MISMATCH'}")
        if not summary["verified"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
