"""Finding Triton's ``perf_analyzer`` (its C++ load generator) and running it.

The binary comes from one of three places (see :func:`find_perf_analyzer`):

1. ``$PERF_ANALYZER``: an explicit path to a ``perf_analyzer`` binary;
2. a ``perf_analyzer`` on ``PATH`` (e.g. in Triton's SDK container);
3. the server environment (:func:`~._install.server_env_dir`), where ``setup-server`` installs
   the ``tritonclient`` wheel of the server's own release
   (:data:`~._install.PERF_ANALYZER_REQUIREMENT`), which ships it in its ``bin``.

That wheel's binary is linked against ``libb64.so.0d`` and ``libcudart.so.12`` (even to run
without a GPU), which a plain machine lacks. The ``nvidia-pytriton`` wheel of the server
environment carries both, under hashed names: links with the plain names, in a directory of
the environment's own, go first on the binary's ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._exceptions import LocalServerError
from ._install import PERF_ANALYZER_REQUIREMENT, server_env_dir

__all__ = ["PERF_ANALYZER_ENV_VAR", "PerfAnalyzer", "find_perf_analyzer"]

#: The environment variable naming a ``perf_analyzer`` binary to use.
PERF_ANALYZER_ENV_VAR = "PERF_ANALYZER"
#: The libraries the wheel's binary needs that a plain machine lacks, by soname, and the
#: names ``nvidia-pytriton``'s wheel gives its copies (in ``nvidia_pytriton.libs``).
_LIBRARIES = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
#: The server environment's directory of links to them, by soname.
_LINKS_DIR = "perf-analyzer-libs"
#: How long ``perf_analyzer --version`` may take to say it runs.
_VERSION_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class PerfAnalyzer:
    """A ``perf_analyzer`` binary and what it needs to run.

    Attributes:
        executable: The binary.
        source: Where it was found: ``"PERF_ANALYZER"`` (the environment variable),
            ``"PATH"`` or ``"server-env"``.
        library_dirs: Directories to put in front of its ``LD_LIBRARY_PATH``.
        version: What ``perf_analyzer --version`` says, e.g. ``"Perf Analyzer Version
            2.51.0 (commit unknown)"``.
    """

    executable: Path
    source: str
    library_dirs: tuple[Path, ...] = ()
    version: str = ""

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment to run it with: ``base`` (``os.environ``) with
        :attr:`library_dirs` in front of ``LD_LIBRARY_PATH``."""
        env = dict(os.environ if base is None else base)
        if self.library_dirs:
            parts = [str(d) for d in self.library_dirs]
            if env.get("LD_LIBRARY_PATH"):
                parts.append(env["LD_LIBRARY_PATH"])
            env["LD_LIBRARY_PATH"] = os.pathsep.join(parts)
        return env

    def run(
        self, args: Sequence[str], *, timeout_s: float, cwd: str | os.PathLike[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs it with ``args`` and waits; its stdout and stderr together in ``stdout``.

        Raises:
            subprocess.TimeoutExpired: It ran past ``timeout_s`` (it was killed).
        """
        return subprocess.run(
            [str(self.executable), *args],
            env=self.environ(),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def _how_to_install() -> str:
    return (
        f"`ray-triton-shm setup-server` (or `make`) installs it into the server environment "
        f"({PERF_ANALYZER_REQUIREMENT}'s), or name one in ${PERF_ANALYZER_ENV_VAR}"
    )


def _library_links(env_dir: Path) -> Path | None:
    """The server environment's directory of links to the libraries the binary needs, made
    if missing; ``None`` where the environment has no copy of them."""
    found: dict[str, Path] = {}
    for libs in sorted(env_dir.glob("lib/python3.*/site-packages/nvidia_pytriton.libs")):
        for soname, pattern in _LIBRARIES.items():
            copies = sorted(libs.glob(pattern))
            if copies and soname not in found:
                found[soname] = copies[0]
    if not found:
        return None
    links = env_dir / _LINKS_DIR
    links.mkdir(exist_ok=True)
    for soname, target in found.items():
        link = links / soname
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        staging = links / f".{soname}.{os.getpid()}"  # atomic: another process may run it
        staging.unlink(missing_ok=True)
        staging.symlink_to(target)
        staging.replace(link)
    return links


def _candidate() -> tuple[Path, str]:
    """The binary to try, and where it came from; raises where there is none."""
    explicit = os.environ.get(PERF_ANALYZER_ENV_VAR)
    if explicit:
        binary = Path(explicit).expanduser()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise LocalServerError(
                f"${PERF_ANALYZER_ENV_VAR}={explicit} is not an executable; {_how_to_install()}"
            )
        return binary, PERF_ANALYZER_ENV_VAR
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return Path(on_path), "PATH"
    binary = server_env_dir() / "bin" / "perf_analyzer"
    if binary.is_file():
        return binary, "server-env"
    raise LocalServerError(
        f"no perf_analyzer found (${PERF_ANALYZER_ENV_VAR}, PATH, {binary.parent}); "
        + _how_to_install()
    )


def find_perf_analyzer() -> PerfAnalyzer:
    """Locate a ``perf_analyzer`` that runs here.

    Resolution order: ``$PERF_ANALYZER`` (a path to the binary), a ``perf_analyzer`` on
    ``PATH``, then the server environment's. Where the server environment has
    ``nvidia-pytriton``'s copies of the libraries the binary needs, links to them go on its
    ``LD_LIBRARY_PATH``, wherever the binary came from.

    Returns:
        The binary, checked to run (``perf_analyzer --version``).

    Raises:
        LocalServerError: No binary was found, or it does not run here; the message says
            why and how to install one.
    """
    binary, source = _candidate()
    env_dir = server_env_dir()
    links = _library_links(env_dir) if env_dir.is_dir() else None
    found = PerfAnalyzer(binary, source, (links,) if links is not None else ())
    try:
        done = found.run(["--version"], timeout_s=_VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalServerError(f"perf_analyzer at {binary} does not run here: {exc}") from None
    said = done.stdout.strip()
    if done.returncode != 0:
        last = said.splitlines()[-1] if said else f"exit status {done.returncode}"
        last = last.removeprefix(f"{binary}: ")
        if "error while loading shared libraries" in last and links is None:
            last += f" (nvidia-pytriton's copy is not in {env_dir})"
        raise LocalServerError(
            f"perf_analyzer at {binary} does not run here: {last}; {_how_to_install()}"
        )
    return dataclasses.replace(found, version=said.splitlines()[-1] if said else "")
