"""What ``ray-triton-shm doctor`` found: each check's result, a machine's report, the
transport the ``region`` check finds, and the reports as text. Plain data, with nothing of
Triton's: :mod:`._doctor` runs the checks, :mod:`..ray._doctor` gathers them from every node of a
cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._inference._transport import AUTO_TRANSPORT, INLINE, SHM

__all__ = [
    "FAIL",
    "OK",
    "SKIP",
    "WARN",
    "CheckResult",
    "NodeReport",
    "format_reports",
    "transport_result",
]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class CheckResult:
    """The result of one check.

    Attributes:
        name: ``tls``, ``triton``, ``region``, ``http``, ``keys``, ``models``, ``dev_shm``,
            ``leftovers`` or ``versions``.
        status: ``ok``, ``warn``, ``fail``, or ``skip`` (not tried: another check failed).
        summary: What was found, in one line.
        fix: What to do about it, in one line (empty when nothing is to be done).
        details: What was measured, for ``--json``.
    """

    name: str
    status: str
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeReport:
    """Every check of one machine.

    Attributes:
        node: The Ray node id, or ``""`` outside Ray.
        hostname: The machine's hostname.
        url: The Triton address checked.
        url_source: Where that address came from (``--url``, ``$RAY_TRITON_SHM_URL``, the node
            actor, or the default).
        checks: The checks, in order.
        elapsed_s: How long the checks took.
    """

    node: str
    hostname: str
    url: str
    url_source: str
    checks: list[CheckResult]
    elapsed_s: float

    @property
    def failed(self) -> bool:
        """Whether a check failed."""
        return any(c.status == FAIL for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, for JSON."""
        return {**asdict(self), "failed": self.failed}


def transport_result(
    asked: str, found: str, fix: str = "", details: dict[str, Any] | None = None
) -> CheckResult:
    """The ``region`` check's result: the transport the models registered here with
    ``transport=asked`` get, and why.

    Args:
        asked: ``"auto"``, ``"shm"`` or ``"inline"`` (``doctor --transport``).
        found: What the check found: that Triton opened a region made here, or why it cannot
            (then ``fix`` says how to give it this machine's shared memory).
        fix: How Triton would map this machine's shared memory; empty where it does.
        details: What was measured; ``asked`` is added, and ``transport``: ``"shm"``,
            ``"inline"``, or ``None`` where the models cannot be registered.

    Returns:
        ``ok`` where the models get what was asked for (shared memory where Triton maps it,
        by value where that was asked), ``warn`` where ``auto`` falls back to by value, and
        ``fail`` where ``shm`` was asked and Triton cannot map the memory.
    """
    mapped = not fix
    kind = SHM if mapped and asked != INLINE else (None if asked == SHM else INLINE)
    details = {**(details or {}), "transport": kind, "asked": asked}
    if asked == INLINE:
        aside = "auto would use shared memory" if mapped else "auto would go by value too"
        summary = f"transport inline: by value, as asked ({found}: {aside})"
        return CheckResult("region", OK, summary, "", details)
    if mapped:
        return CheckResult("region", OK, f"transport {asked}: shm, because {found}", "", details)
    if asked == AUTO_TRANSPORT:
        summary = (
            f"transport auto: inline, because {found}: models send their tensors by value, in "
            "each request (as plain gRPC does)"
        )
        return CheckResult("region", WARN, summary, f"for shared memory: {fix}", details)
    summary = f"transport shm: {found}: registering a model fails (SharedMemoryUnreachableError)"
    fix = f"{fix}; or transport='auto' to send the tensors by value"
    return CheckResult("region", FAIL, summary, fix, details)


def format_reports(reports: Sequence[NodeReport]) -> str:
    """The reports as text, one block per node."""
    lines: list[str] = []
    for report in reports:
        node = f"node {report.node[:12]} ({report.hostname})" if report.node else report.hostname
        if report.url:
            lines.append(
                f"{node}: Triton at {report.url} (from {report.url_source}), "
                f"checked in {report.elapsed_s:.2f} s"
            )
        else:
            lines.append(f"{node}: not checked")
        for check in report.checks:
            lines.append(f"  {check.status:<5} {check.name:<10} {check.summary}")
            if check.fix and check.status in (FAIL, WARN):
                lines.append(f"  {'':<5} {'':<10} fix: {check.fix}")
    failed = sum(r.failed for r in reports)
    lines.append(
        f"{len(reports)} node(s): "
        + (f"{failed} with a failed check" if failed else "no check failed")
    )
    return "\n".join(lines)
