"""What ``ray-triton-shm doctor`` found: each check's result, a machine's report, and the
reports as text. Plain data, with nothing of Triton's: :mod:`._doctor` runs the checks,
:mod:`.ray._doctor` gathers them from every node of a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FAIL", "OK", "SKIP", "WARN", "CheckResult", "NodeReport", "format_reports"]

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
