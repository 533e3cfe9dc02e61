"""Finding a ``tritonserver`` binary, and setting up the environment it runs in.

The binary comes from one of three places (see :func:`find_tritonserver`):

1. ``$TRITONSERVER``: an explicit path to a ``tritonserver`` binary;
2. a ``tritonserver`` already on ``PATH`` (e.g. inside an NGC Triton container);
3. a private virtual environment with ``nvidia-pytriton`` and ``numpy<2`` installed in it
   (created on demand by :func:`ensure_server_env`). The wheel ships a complete
   ``tritonserver`` with the Python backend; the server side needs ``numpy<2`` because the
   Python backend of that release silently returns empty outputs with numpy 2. The
   environment also gets the ``tritonclient`` wheel of the server's own release, for the
   ``perf_analyzer`` it ships (the bench's ceiling, :mod:`._perf_analyzer`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._exceptions import LocalServerError

__all__ = [
    "PERF_ANALYZER_REQUIREMENT",
    "SERVER_ENV_REQUIREMENTS",
    "TritonServerInstall",
    "add_server_packages",
    "ensure_server_env",
    "find_tritonserver",
    "server_env_dir",
]

#: The ``tritonclient`` of the server's release (Triton 2.51, in ``nvidia-pytriton`` 0.7):
#: its manylinux wheel ships ``perf_analyzer`` (the newest, 2.73, does not), and it fits
#: ``nvidia-pytriton``'s ``tritonclient~=2.50``.
PERF_ANALYZER_REQUIREMENT = "tritonclient==2.51.0"
#: Packages installed into the server environment.
SERVER_ENV_REQUIREMENTS: tuple[str, ...] = ("nvidia-pytriton", "numpy<2", PERF_ANALYZER_REQUIREMENT)

_ENV_VAR_SERVER_ENV = "RAY_TRITON_SHM_SERVER_ENV"
_ENV_VAR_TRITONSERVER = "TRITONSERVER"
_MARKER_NAME = ".ray-triton-shm-server-env"


def server_env_dir() -> Path:
    """Return the directory of the server virtual environment.

    Returns:
        ``$RAY_TRITON_SHM_SERVER_ENV`` if set, else
        ``~/.cache/ray-triton-shm/server-env-py{X}{Y}`` for the running Python ``X.Y``.
    """
    override = os.environ.get(_ENV_VAR_SERVER_ENV)
    if override:
        return Path(override).expanduser().absolute()
    major, minor = sys.version_info[:2]
    return Path.home() / ".cache" / "ray-triton-shm" / f"server-env-py{major}{minor}"


def _env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _env_site_packages(env_dir: Path) -> Path | None:
    candidates = sorted((env_dir / "lib").glob("python3.*/site-packages"))
    for candidate in candidates:
        if (candidate / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
            return candidate
    return candidates[0] if candidates else None


def _env_tritonserver(env_dir: Path) -> Path | None:
    site = _env_site_packages(env_dir)
    if site is None:
        return None
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    return binary if binary.is_file() else None


def _env_is_ready(env_dir: Path, *, up_to_date: bool = True) -> bool:
    """Whether the environment was set up, with a ``tritonserver``; ``up_to_date``: and for
    today's :data:`SERVER_ENV_REQUIREMENTS` (one set up for others still serves)."""
    marker = env_dir / _MARKER_NAME
    if not marker.is_file() or _env_tritonserver(env_dir) is None:
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return not up_to_date or recorded.get("requirements") == list(SERVER_ENV_REQUIREMENTS)


def _run_setup_command(cmd: Sequence[str], *, quiet: bool) -> None:
    if not quiet:
        print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    result = subprocess.run(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        output = (result.stdout or "")[-4000:] if quiet else "(see output above)"
        raise LocalServerError(
            f"command failed with exit code {result.returncode}: {' '.join(map(str, cmd))}\n"
            f"{output}"
        )


def ensure_server_env(*, quiet: bool = False) -> Path:
    """Create the server virtual environment if it does not exist yet.

    The environment is created with the running interpreter's ``python -m venv`` and gets
    :data:`SERVER_ENV_REQUIREMENTS` installed into it. A marker file records success (and
    the requirements), so later calls return immediately; an environment set up for other
    requirements gets today's installed into it. Concurrent callers are serialised with a
    file lock.

    Args:
        quiet: Suppress pip's output (it is still shown if installation fails).

    Returns:
        The environment's directory (see :func:`server_env_dir`).

    Raises:
        LocalServerError: If creating the environment or installing into it fails.
    """
    env_dir = server_env_dir()
    if _env_is_ready(env_dir):
        return env_dir
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = env_dir.parent / f".{env_dir.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if _env_is_ready(env_dir):
                return env_dir
            if not quiet:
                print(f"Creating the Triton server environment in {env_dir}", file=sys.stderr)
            if not _env_python(env_dir).exists():
                _run_setup_command([sys.executable, "-m", "venv", str(env_dir)], quiet=quiet)
            pip = [str(_env_python(env_dir)), "-m", "pip", "--disable-pip-version-check"]
            if quiet:
                pip.append("--quiet")
            _run_setup_command([*pip, "install", *SERVER_ENV_REQUIREMENTS], quiet=quiet)
            if _env_tritonserver(env_dir) is None:
                raise LocalServerError(
                    f"installed {', '.join(SERVER_ENV_REQUIREMENTS)} into {env_dir}, but no "
                    "tritonserver binary was found in it"
                )
            (env_dir / _MARKER_NAME).write_text(
                json.dumps({"requirements": list(SERVER_ENV_REQUIREMENTS)}) + "\n"
            )
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return env_dir


def add_server_packages(
    packages: Sequence[str] = (),
    *,
    requirements: str | os.PathLike[str] | None = None,
    quiet: bool = False,
) -> dict[str, str]:
    """Installs what a model imports (Python backend) into the server environment, keeping
    its ``numpy<2``; creates the environment first if needed. Idempotent: what is installed
    already is left as it is.

    Args:
        packages: pip requirements (``"scikit-learn"``, ``"torch==2.5.1"``).
        requirements: A pip requirements file, besides ``packages``.
        quiet: Suppress pip's output (it is still shown if installation fails).

    Returns:
        The version now installed of each package named, and of numpy.

    Raises:
        LocalServerError: pip failed; where a package needs numpy 2, the message says so.
    """
    env_dir = ensure_server_env(quiet=quiet)
    if not packages and requirements is None:
        return _versions(env_dir, ["numpy"])
    constraints = env_dir / "constraints.txt"
    constraints.write_text("numpy<2\n")  # Triton 2.51's Python backend: empty outputs with 2
    pip = [str(_env_python(env_dir)), "-m", "pip", "--disable-pip-version-check"]
    if quiet:
        pip.append("--quiet")
    files = ["-r", str(Path(requirements).absolute())] if requirements is not None else []
    command = [*pip, "install", "-c", str(constraints), *packages, *files]
    lock_path = env_dir.parent / f".{env_dir.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if not quiet:
                print("+ " + " ".join(command), file=sys.stderr, flush=True)
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        hint = ""
        if "numpy" in output and ("conflict" in output.lower() or "ResolutionImpossible" in output):
            hint = (
                "\nA package asked for needs numpy 2, which Triton's Python backend of this "
                "release cannot run (its outputs come back empty): ask for an older release of "
                "it, one that works with numpy<2."
            )
        raise LocalServerError(
            f"installing into the server environment failed (exit code {done.returncode}): "
            f"{' '.join(command)}\n{output[-4000:]}{hint}"
        )
    if not quiet:
        print(output, end="", file=sys.stderr)
    return _versions(env_dir, [*(_project(p) for p in packages), "numpy"])


def _project(requirement: str) -> str:
    """The project a pip requirement names (``"torch>=2; python_version>'3'"``: ``"torch"``)."""
    return re.split(r"[\s<>=!~\[;@(]", requirement.strip(), maxsplit=1)[0]


def _versions(env_dir: Path, projects: Sequence[str]) -> dict[str, str]:
    """The versions of ``projects`` installed in the environment (``"-"``: none)."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "def v(p):\n"
        "    try:\n"
        "        return m.version(p)\n"
        "    except m.PackageNotFoundError:\n"
        "        return '-'\n"
        "print(json.dumps({p: v(p) for p in sys.argv[1:]}))\n"
    )
    done = subprocess.run(
        [str(_env_python(env_dir)), "-c", script, *projects],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LocalServerError(f"could not read versions in {env_dir}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------
# Locating the binary
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TritonServerInstall:
    """A ``tritonserver`` binary and what it needs to run.

    Attributes:
        executable: The ``tritonserver`` binary.
        source: Where it was found: ``"TRITONSERVER"`` (the environment variable),
            ``"PATH"`` or ``"server-env"``.
        path_prepend: Directories to put in front of ``PATH`` (the server environment's
            ``bin``, so the Python backend stub finds that environment's numpy).
        ld_library_path_prepend: Directories to put in front of ``LD_LIBRARY_PATH``.
        python_backend_dir: For a ``nvidia-pytriton`` layout, the Python backend directory
            to copy into a private backend directory; ``None`` for a standard install,
            which uses the server's default backend directory.
        python_stub: The ``triton_python_backend_stub`` matching the server environment's
            Python version (copied next to the Python backend); ``None`` if not needed.
    """

    executable: Path
    source: str
    path_prepend: tuple[Path, ...] = ()
    ld_library_path_prepend: tuple[Path, ...] = ()
    python_backend_dir: Path | None = None
    python_stub: Path | None = None

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return the environment to run the server with.

        Args:
            base: The environment to extend; defaults to ``os.environ``.

        Returns:
            A new environment mapping.
        """
        env = dict(os.environ if base is None else base)
        for var, dirs in (
            ("PATH", self.path_prepend),
            ("LD_LIBRARY_PATH", self.ld_library_path_prepend),
        ):
            if dirs:
                parts = [str(d) for d in dirs]
                if env.get(var):
                    parts.append(env[var])
                env[var] = os.pathsep.join(parts)
        if self.path_prepend:
            # The stub must use the server environment's Python, not the caller's venv.
            for var in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV"):
                env.pop(var, None)
        return env

    def python(self) -> Path | None:
        """The Python the Python backend's stub runs with: the server environment's, else
        the first ``python3`` on the server's ``PATH``; ``None`` if there is none."""
        for directory in self.path_prepend:
            if (directory / "python").is_file():
                return directory / "python"
        found = shutil.which("python3", path=self.environ().get("PATH"))
        return Path(found) if found else None

    def default_backend_directory(self) -> Path:
        """Where a standard install keeps its backends (``/opt/tritonserver/backends``)."""
        return self.executable.parent.parent / "backends"

    def prepare_backend_directory(self, dest: Path) -> Path | None:
        """Build a private backend directory with the Python backend and its stub.

        Args:
            dest: An empty or non-existent directory to fill.

        Returns:
            The backend directory to pass as ``--backend-directory``, or ``None`` if the
            server's default backend directory should be used.
        """
        if self.python_backend_dir is None:
            return None
        python_dir = dest / "python"
        shutil.copytree(
            self.python_backend_dir,
            python_dir,
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )
        if self.python_stub is not None:
            shutil.copy2(self.python_stub, python_dir / "triton_python_backend_stub")
        return dest


def _venv_from_site_packages(site: Path) -> Path | None:
    # <venv>/lib/pythonX.Y/site-packages
    venv = site.parent.parent.parent
    return venv if (venv / "bin" / "python").exists() else None


def _python_shared_libdir(venv: Path, version: str) -> Path | None:
    """The base interpreter's libdir if it holds a matching shared libpython."""
    cfg = venv / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    home = None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
    if home is None:
        return None
    libdir = home.parent / "lib"
    return libdir if (libdir / f"libpython{version}.so.1.0").exists() else None


def _install_for_binary(binary: Path, source: str) -> TritonServerInstall:
    binary = binary.resolve()
    root = binary.parent.parent  # .../tritonserver
    stubs = root / "python_backend_stubs"
    if not stubs.is_dir():
        # A standard install (e.g. /opt/tritonserver): nothing to adapt.
        return TritonServerInstall(executable=binary, source=source)
    # The nvidia-pytriton layout: <site>/pytriton/tritonserver/{bin,backends,python_backend_stubs}
    site = root.parent.parent
    libs = site / "nvidia_pytriton.libs"
    venv = _venv_from_site_packages(site)
    version = site.parent.name.removeprefix("python")  # "3.11"
    stub = stubs / version / "triton_python_backend_stub"
    if not stub.is_file():
        available = sorted(p.name for p in stubs.iterdir())
        raise LocalServerError(
            f"no Python backend stub for Python {version} in {stubs} (available: {available})"
        )
    ld_dirs: list[Path] = [libs] if libs.is_dir() else []
    if venv is not None:
        libdir = _python_shared_libdir(venv, version)
        if libdir is not None:
            ld_dirs.append(libdir)
    return TritonServerInstall(
        executable=binary,
        source=source,
        path_prepend=(venv / "bin",) if venv is not None else (),
        ld_library_path_prepend=tuple(ld_dirs),
        python_backend_dir=root / "backends" / "python",
        python_stub=stub,
    )


def find_tritonserver(*, install: bool = False, quiet: bool = True) -> TritonServerInstall:
    """Locate a ``tritonserver`` binary.

    Resolution order: ``$TRITONSERVER`` (a path to the binary), a ``tritonserver`` on
    ``PATH``, then the server environment (see :func:`ensure_server_env`).

    Args:
        install: Create the server environment (pip) if nothing else is found, or bring it
            up to date; without it, a missing server is an error that says how to install
            one (an environment set up for other requirements still serves).
        quiet: Passed to :func:`ensure_server_env`.

    Returns:
        A description of the binary and what it needs to run.

    Raises:
        LocalServerError: If no binary can be found or installed.
    """
    explicit = os.environ.get(_ENV_VAR_TRITONSERVER)
    if explicit:
        explicit_binary = Path(explicit).expanduser()
        if not (explicit_binary.is_file() and os.access(explicit_binary, os.X_OK)):
            raise LocalServerError(f"${_ENV_VAR_TRITONSERVER}={explicit} is not an executable")
        return _install_for_binary(explicit_binary, "TRITONSERVER")
    on_path = shutil.which("tritonserver")
    if on_path:
        return _install_for_binary(Path(on_path), "PATH")
    env_dir = server_env_dir()
    if install and not _env_is_ready(env_dir):
        env_dir = ensure_server_env(quiet=quiet)
    binary = _env_tritonserver(env_dir) if _env_is_ready(env_dir, up_to_date=False) else None
    if binary is None:
        raise LocalServerError(
            f"no tritonserver found (${_ENV_VAR_TRITONSERVER}, PATH, {env_dir}); install "
            "the server side with `ray-triton-shm setup-server` (or `make`), or pass "
            "install=True to set it up on first use"
        )
    return _install_for_binary(binary, "server-env")
