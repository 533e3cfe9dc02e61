"""A Triton of the bench's own with a ``/dev/shm`` of its own: a mount namespace of its own
(``unshare --mount``, a tmpfs mounted on ``/dev/shm``), as a container without ``--ipc``, a
pod or another host has. It maps none of the bench's regions, so the library's paths reach it
by value; the many-callers case's by-value runs go to it
(:data:`~._config.MANY_CALLERS_BY_VALUE`). Started on first use, on the embedded server's
example models only; stopped with the bench.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ray_triton_shm._bench.paths._base import BenchTarget, SkipPath
from ray_triton_shm.local._server import EXAMPLE_MODEL_REPOSITORY, LocalTritonServer

__all__ = ["OWN_DEV_SHM", "ElsewhereTriton", "unshare_refusal"]

#: The launcher (``LocalTritonServer(launcher=...)``) under which Triton sees a ``/dev/shm``
#: of its own, in a mount namespace of its own.
OWN_DEV_SHM = ("unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"')


@functools.cache
def unshare_refusal(*flags: str) -> str | None:
    """Why ``unshare`` with these ``flags`` (``--mount``: a mount namespace of its own) cannot
    run here (``None``: it can)."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    done = subprocess.run(["unshare", *flags, "true"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`unshare {' '.join(flags)}` cannot run here (it needs root): {done.stderr.strip()}"
    return None


class ElsewhereTriton:
    """The Triton elsewhere: the one at ``given``, or of the bench's own, serving ``models``
    of the example repository, started on first use (:meth:`target`) and stopped by
    :meth:`close`, on the embedded server only (``url`` ``None``: with ``--url``, the
    bench's Triton is the user's)."""

    def __init__(
        self,
        models: Iterable[str],
        *,
        url: str | None,
        startup_timeout_s: float,
        reconnect_timeout_s: float,
        given: str | None = None,
    ) -> None:
        self._models = tuple(dict.fromkeys(models))
        self._given = given
        self._url, self._startup_timeout_s = url, startup_timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._server: LocalTritonServer | None = None
        self._dir: Path | None = None
        self._refusal: str | None = None

    def target(self) -> BenchTarget:
        """The Triton elsewhere, started if it is not yet.

        Raises:
            SkipPath: It cannot run here, saying why.
        """
        if self._given is not None:
            return BenchTarget(self._given, reconnect_timeout_s=self._reconnect_timeout_s)
        if self._server is None and self._refusal is None:
            self._refusal = self._why_not() or self._start()
        if self._refusal is not None:
            raise SkipPath(self._refusal)
        assert self._server is not None
        return BenchTarget(
            self._server.grpc_url,
            self._server.http_url,
            reconnect_timeout_s=self._reconnect_timeout_s,
        )

    def _why_not(self) -> str | None:
        if self._url is not None:
            return (
                "on a Triton of the bench's own in a mount namespace of its own, and the "
                f"bench's Triton is yours (--url {self._url}): give one that cannot map this "
                "machine's /dev/shm as --by-value-url, or run the whole bench against one"
            )
        missing = [m for m in self._models if not (EXAMPLE_MODEL_REPOSITORY / m).is_dir()]
        if missing:
            return f"the Triton elsewhere serves the example models, not {', '.join(missing)}"
        return unshare_refusal("--mount")

    def _start(self) -> str | None:
        """Starts it; why it did not start (``None``: it did)."""
        self._dir = Path(tempfile.mkdtemp(prefix="rtsbench-elsewhere-"))
        models = self._dir / "models"
        models.mkdir()
        for model in self._models:
            (models / model).symlink_to(EXAMPLE_MODEL_REPOSITORY / model, target_is_directory=True)
        server = LocalTritonServer(
            models,
            launcher=OWN_DEV_SHM,
            install=True,
            startup_timeout_s=self._startup_timeout_s,
            log_path=self._dir / "tritonserver.log",
        )
        try:
            server.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                server.close()
            return f"the Triton elsewhere did not start: {exc}"
        self._server = server
        return None

    def close(self) -> None:
        """Stops it, if it runs, and removes its files."""
        if self._server is not None:
            with contextlib.suppress(Exception):  # nobody waits on its graceful end
                self._server.kill()
            with contextlib.suppress(Exception):
                self._server.close()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ElsewhereTriton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
