"""``ray-triton-shm status --ray``: every node actor of a Ray cluster, asked for its
``stats()``, and what they say as text: per node a table of its models (each one's transport,
its pool, its counters), and under it why each model goes the way it does (and, for a model
batched on the node, its rows per Triton request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._pools._scaling import limit_text
from .._slots._shm import mib

__all__ = ["COLUMNS", "format_node_actors", "node_actor_reports"]

#: The columns of a node's table after ``model``, each a key of the model's stats.
COLUMNS = (
    "transport",
    "slots",
    "max_slots",
    "limited_by",
    "in_use",
    "waiting",
    "abandoned",
    "overloads",
    "wait_p99_us",
    "settle_p99_us",
    "shm_bytes",
    "requests",
    "samples",
    "bytes_in",
    "bytes_out",
    "errors",
)
#: The columns read as words, aligned left (the numbers are aligned right).
_WORDS = ("model", "transport")
#: How each transport reads under the table.
_BY = {"shm": "through shared memory", "inline": "by value, in the requests"}


def node_actor_reports(address: str | None, *, timeout_s: float) -> list[dict[str, Any]]:
    """Connects to a Ray cluster and asks every node actor for its ``stats()``.

    Args:
        address: The Ray cluster (``None``: ``$RAY_ADDRESS``, else the local one).
        timeout_s: How long to wait for each node actor's stats.

    Returns:
        One entry per node actor: ``name``, and ``stats`` (a ``NodeStats``) or ``error``.

    Raises:
        ConnectionError: No Ray cluster at ``address``.
    """
    import ray

    from ._actor import NAMESPACE, joined_cluster, node_actor_names

    with joined_cluster(address):
        reports: list[dict[str, Any]] = []
        for name in node_actor_names():
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                reports.append(
                    {"name": name, "stats": ray.get(actor.stats.remote(), timeout=timeout_s)}
                )
            except Exception as exc:
                reports.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
        return reports


def format_node_actors(reports: Sequence[dict[str, Any]], namespace: str) -> tuple[str, bool]:
    """The node actors' reports as text.

    Args:
        reports: :func:`node_actor_reports`' answer.
        namespace: The Ray namespace of the node actors, for the heading.

    Returns:
        The text, and whether a node actor could not be asked.
    """
    lines = [f"Ray node actors (namespace {namespace}): {len(reports)}"]
    unasked = False
    for report in reports:
        stats = report.get("stats")
        if stats is None:
            lines.append(f"  {report['name']}: could not be asked: {report.get('error')}")
            unasked = True
            continue
        lines.append(
            f"  node {stats.node_id}  url {stats.url}  pid {stats.pid}  "
            f"incarnation {stats.incarnation}"
        )
        if not stats.models:
            lines.append("    no models registered")
            continue
        lines.append(
            f"    shared memory: {mib(stats.shm_bytes)} held in /dev/shm by the node's "
            f"regions ({mib(stats.shm_free)} free of {mib(stats.shm_capacity)})"
        )
        lines += _table(stats.models)
        for name, model in sorted(stats.models.items()):
            lines.append(f"    {name}: {_transport_text(model)}")
            if model.get("limited_by"):
                lines.append(f"    {name} did not grow: {limit_text(model['limited_by'])}")
            if model.get("node_batching"):
                lines.append(f"    {name}: {_batching_text(model)}")
    return "\n".join(lines), unasked


def _table(models: dict[str, dict[str, Any]]) -> list[str]:
    header = ("model", *COLUMNS)
    rows = [
        (name, *(str(model.get(c, "-")) or "-" for c in COLUMNS))
        for name, model in sorted(models.items())
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return [
        "    "
        + "  ".join(
            c.ljust(w) if h in _WORDS else c.rjust(w)
            for c, w, h in zip(row, widths, header, strict=True)
        ).rstrip()
        for row in (header, *rows)
    ]


def _batching_text(model: dict[str, Any]) -> str:
    """How node batching does: rows per Triton request, and the batches that waited."""
    return (
        f"node batching: {model.get('rows_per_request', 0.0):.2f} rows per Triton request; "
        f"{model.get('company_waits', 0)} batches waited for company, "
        f"{model.get('company_wait_mean_us', 0.0) / 1e3:.2f} ms on average"
    )


def _transport_text(model: dict[str, Any]) -> str:
    """Which way the model's tensors go, and why (the node actor's reason, whole)."""
    kind = model.get("transport", "-")
    reason = model.get("transport_reason") or "no reason told"
    return f"{kind} ({_BY.get(kind, 'unknown')}), because {reason}"
