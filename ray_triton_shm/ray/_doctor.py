"""``ray-triton-shm doctor --ray``: the doctor's checks on every alive node of a Ray cluster.

The driver asks each node's node actor, if it has one, for the address it uses and the pools it
holds, and reads each node's object store size; then one task pinned to each node runs
:func:`.._tools._doctor.check_node` there, with that node's environment (``$RAY_TRITON_SHM_URL`` and
the ``RAY_TRITON_SHM_HEADER_*`` keys are read on the node, as the node actor reads them).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._tools._doctor import check_node
from .._tools._doctor_report import FAIL, SKIP, CheckResult, NodeReport
from ._actor import find_node_actor, joined_cluster

__all__ = ["check_cluster"]


def check_cluster(
    *,
    address: str | None = None,
    url: str | None = None,
    models: Mapping[str, int | None] | None = None,
    timeout_s: float = 5.0,
    wait_s: float = 60.0,
    tls: Mapping[str, Any] | None = None,
    all_nodes: bool = False,
    transport: str = "auto",
) -> list[NodeReport]:
    """Runs the doctor's checks on every alive node of the cluster at ``address``.

    Args:
        address: The Ray cluster (``None``: ``$RAY_ADDRESS``, else the local one).
        url: Triton's address on every node; ``None``: the node actor's, else the node's
            ``$RAY_TRITON_SHM_URL``, else the default.
        models: Pools each node would hold besides its node actor's: ``{model: pool_size}``.
        timeout_s: The longest wait for one answer from Triton.
        wait_s: How long to wait for the nodes' tasks (a node whose task did not run in time
            is reported failed).
        tls: The TLS options of :func:`check_node` (``ssl``, ``root_certificates``,
            ``private_key``, ``certificate_chain``, ``tls_dir``): paths on the nodes.
        all_nodes: Check nodes without CPUs or GPUs too. By default they are reported
            skipped: no replica or predictor is placed there (a KubeRay head with
            ``num-cpus: "0"`` is one), so no Triton needs to run beside them.
        transport: The ``transport=`` the models will be registered with on every node
            (see :func:`check_node`).

    Raises:
        ConnectionError: No Ray cluster at ``address``.
    """
    with joined_cluster(address):
        check = ray.remote(num_cpus=0, max_retries=0)(_check_here)
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
        pending = {}
        reports = []
        for node in nodes:
            node_id = node["NodeID"]
            resources = node.get("Resources", {})
            if not all_nodes and not resources.get("CPU") and not resources.get("GPU"):
                reports.append(
                    _unchecked(
                        node,
                        "no CPU or GPU here (num-cpus: 0): no replica or predictor runs on this "
                        "node, so it needs no Triton (--all-nodes checks it anyway)",
                        status=SKIP,
                    )
                )
                continue
            actor_url, held = _node_actor(node_id, timeout_s)
            ref = check.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(
                dict(
                    url=url or actor_url,
                    url_source="--url" if url else ("the node actor" if actor_url else None),
                    models=dict(models or {}),
                    held=held,
                    object_store_bytes=int(resources.get("object_store_memory", 0)),
                    node=node_id,
                    timeout_s=timeout_s,
                    transport=transport,
                    **dict(tls or {}),
                )
            )
            pending[ref] = node
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
        for ref, node in pending.items():
            if ref in ready:
                try:
                    reports.append(ray.get(ref))
                    continue
                except Exception as exc:
                    why = f"the check task failed: {exc}"
            else:
                why = f"the check task did not run within {wait_s:g} s"
            reports.append(_unchecked(node, why))
        return sorted(reports, key=lambda r: r.node)


def _check_here(options: dict[str, Any]) -> NodeReport:
    return check_node(**options)


def _node_actor(node_id: str, timeout_s: float) -> tuple[str | None, dict[str, int]]:
    """The address the node's actor uses and the bytes of its pools at their largest; nothing
    if it has none (none is created)."""
    actor = find_node_actor(node_id)
    try:
        stats = ray.get(actor.stats.remote(), timeout=timeout_s) if actor is not None else None
    except Exception:
        stats = None
    if stats is None:
        return None, {}
    return stats.url, {name: int(m["shm_max_bytes"]) for name, m in stats.models.items()}


def _unchecked(node: Mapping[str, Any], why: str, *, status: str = FAIL) -> NodeReport:
    return NodeReport(
        node=node["NodeID"],
        hostname=str(node.get("NodeManagerHostname") or socket.gethostname()),
        url="",
        url_source="",
        checks=[
            CheckResult(
                "node",
                status,
                why,
                "is the node healthy? `ray status` shows it" if status == FAIL else "",
            )
        ],
        elapsed_s=0.0,
    )
