"""What a model repository asks of a Triton, read before Triton starts: each model's backend.

Pure functions over directories (no Triton, no subprocess): which backend each model of a
repository needs (its ``config.pbtxt``'s ``backend:`` or ``platform:``, else the model file
Triton's auto-complete would pick), which backends a backend directory has, and the error a
model the embedded Triton cannot serve gets, with the ways forward.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "PLATFORM_BACKENDS",
    "TRITON_CONTAINER_IMAGE",
    "ModelBackend",
    "available_backends",
    "container_command",
    "model_backends",
    "needs_auto_complete",
    "read_config",
    "unsupported_message",
]

#: NVIDIA's Triton container of the release the embedded server runs (Triton 2.51 is NGC's
#: release 24.10: 2.42 was 24.01, one release a month since).
TRITON_CONTAINER_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"

#: The backend each ``platform:`` of a ``config.pbtxt`` runs on.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
#: Platforms Triton's core runs itself (no backend library).
_CORE_PLATFORMS = frozenset({"ensemble"})

#: The file (or folder) in a version directory by which Triton's auto-complete picks a
#: backend when a model has no configuration saying which.
_FILE_BACKENDS: tuple[tuple[str, str], ...] = (
    ("model.onnx", "onnxruntime"),
    ("model.plan", "tensorrt"),
    ("model.pt", "pytorch"),
    ("model.savedmodel", "tensorflow"),
    ("model.graphdef", "tensorflow"),
    ("model.py", "python"),
)

#: ``backend:`` and ``platform:`` at the top level of a config (the first of each).
_FIELD_RE = {
    field: re.compile(rf'^\s*{field}\s*:\s*"([^"]*)"', re.MULTILINE)
    for field in ("backend", "platform")
}


@dataclasses.dataclass(frozen=True)
class ModelBackend:
    """A model of a repository and the backend it needs.

    Attributes:
        name: The model's name (its directory's).
        directory: The model's directory.
        backend: The backend it runs on (``"python"``, ``"onnxruntime"``...); ``None`` when
            neither its config nor its files say (Triton then judges), or for an ensemble.
        platform: Its config's ``platform:``, if any.
        source: What said so: ``"backend"``, ``"platform"`` or the model file's name.
    """

    name: str
    directory: Path
    backend: str | None
    platform: str | None = None
    source: str | None = None

    def describe(self) -> str:
        """The model and what it needs, in words (``model 'digits' (platform
        "onnxruntime_onnx": backend 'onnxruntime')``)."""
        if self.source == "platform":
            why = f'platform "{self.platform}": backend {self.backend!r}'
        elif self.source == "backend":
            why = f'backend "{self.backend}"'
        else:
            why = f"its file {self.source}: backend {self.backend!r}"
        return f"model {self.name!r} ({why}) in {self.directory}"


def read_config(directory: Path) -> str | None:
    """The text of a model directory's ``config.pbtxt``, ``None`` if it has none."""
    try:
        return (directory / "config.pbtxt").read_text(errors="replace")
    except FileNotFoundError:
        return None


def _config_field(text: str, field: str) -> str | None:
    # Comments first, so that a commented-out line never counts.
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    found = _FIELD_RE[field].search(code)
    return found.group(1) if found else None


def _version_dirs(directory: Path) -> list[Path]:
    """A model's version directories, newest first."""
    versions = [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(versions, key=lambda p: int(p.name), reverse=True)


def model_backend(directory: Path) -> ModelBackend:
    """The backend the model in ``directory`` needs, as Triton would decide it.

    The config's ``backend:`` wins, then its ``platform:`` (see :data:`PLATFORM_BACKENDS`);
    without either, the model file of its newest version directory (``model.onnx``:
    onnxruntime, ``model.plan``: tensorrt, ``model.pt``: pytorch, ``model.savedmodel`` or
    ``model.graphdef``: tensorflow, ``model.py``: python).

    Args:
        directory: A model's directory in a repository.

    Returns:
        What the model needs; ``backend`` is ``None`` where nothing says.
    """
    name = directory.name
    text = read_config(directory)
    backend = platform = None
    if text is not None:
        backend = _config_field(text, "backend")
        platform = _config_field(text, "platform")
    if backend:
        return ModelBackend(name, directory, backend, platform, "backend")
    if platform:
        if platform in _CORE_PLATFORMS:
            return ModelBackend(name, directory, None, platform, "platform")
        mapped = PLATFORM_BACKENDS.get(platform, platform)
        return ModelBackend(name, directory, mapped, platform, "platform")
    for version in _version_dirs(directory):
        for filename, file_backend in _FILE_BACKENDS:
            if (version / filename).exists():
                return ModelBackend(name, directory, file_backend, None, filename)
    return ModelBackend(name, directory, None)


def model_backends(repository: Path) -> list[ModelBackend]:
    """Every model of a repository (each directory of it, as Triton takes them, a link
    followed) and its backend, by name.

    Args:
        repository: A model repository.

    Returns:
        One entry per model directory, sorted by name.
    """
    return [
        dataclasses.replace(model_backend(p), name=p.name, directory=p.resolve())
        for p in sorted(repository.iterdir())
        if p.is_dir()
    ]


def needs_auto_complete(repositories: Iterable[Path]) -> bool:
    """Whether a model of ``repositories`` needs Triton's auto-complete: one without a
    ``config.pbtxt``, on a backend other than Python (or none said), or whose Python code
    defines ``auto_complete_config``.

    For the others it changes nothing, yet costs a stub process per Python model at each
    load (about a second each).

    Args:
        repositories: The model repositories Triton is to serve.

    Returns:
        ``False`` when ``--disable-auto-complete-config`` changes nothing of their configs.
    """
    for repository in repositories:
        for model in model_backends(repository):
            if model.backend != "python" or read_config(model.directory) is None:
                return True
            for version in _version_dirs(model.directory):
                for code in version.glob("*.py"):
                    if "auto_complete_config" in code.read_text(errors="replace"):
                        return True
    return False


def available_backends(backend_directory: Path) -> tuple[str, ...]:
    """The backends a backend directory has (a folder each), sorted."""
    if not backend_directory.is_dir():
        return ()
    return tuple(sorted(p.name for p in backend_directory.iterdir() if p.is_dir()))


def container_command(repositories: Sequence[Path], image: str = TRITON_CONTAINER_IMAGE) -> str:
    """The ``docker run`` of NVIDIA's Triton container serving ``repositories`` as the
    embedded server would: on the host's ``/dev/shm`` (``--ipc=host``), as the caller's
    user (regions are ``0600``), on ports 8001 (gRPC), 8000 (HTTP) and 8002 (metrics)."""
    if len(repositories) == 1:
        mounts = [(repositories[0], "/models")]
    else:
        mounts = [(repo, f"/models{i}") for i, repo in enumerate(repositories)]
    words = ["docker", "run", "--rm", "--ipc=host", '--user="$(id -u):$(id -g)"']
    words += ["-p", "8001:8001", "-p", "8000:8000", "-p", "8002:8002"]
    for repo, inside in mounts:
        words += ["-v", shlex.quote(f"{repo}:{inside}:ro")]
    words += [image, "tritonserver"]
    words += [f"--model-repository={inside}" for _, inside in mounts]
    return " ".join(words)


def unsupported_message(
    models: Iterable[ModelBackend], available: Sequence[str], repositories: Sequence[Path]
) -> str:
    """The error for models whose backend the embedded Triton lacks: each model and its
    backend, the backends it has, and the two ways forward.

    Args:
        models: The models it cannot serve.
        available: The backends it has.
        repositories: The repositories asked for (for the container's command line).

    Returns:
        The message, several lines.
    """
    models = list(models)
    has = ", ".join(repr(b) for b in available) or "none"
    lines = [
        f"the embedded Triton cannot serve {len(models)} model(s): it has the backend(s) "
        f"{has} only, and"
    ]
    lines += [f"  {m.describe()}" for m in models]
    onnx = [m.name for m in models if m.backend == "onnxruntime"]
    others = [m.name for m in models if m.backend != "onnxruntime"]
    ways = 1 + bool(onnx) + bool(others)
    lines += [
        f"{('Two', 'Three')[ways - 2]} ways forward:",
        "  1. NVIDIA's Triton container, which has every backend (Triton 2.51, the embedded "
        "server's release), on this host's /dev/shm and as your user:",
        f"       {container_command(repositories)}",
        "     then point the clients at localhost:8001.",
    ]
    if onnx:
        lines += [
            f"  2. Serve the ONNX model(s) ({', '.join(onnx)}) through the Python backend with "
            "onnxruntime, no code to write: `ray-triton-shm setup-server --with onnxruntime`, "
            "then `ray-triton-shm serve-local --onnx-via-python` "
            "(LocalTritonServer(onnx_via_python=True)).",
        ]
    if others:
        lines += [
            f"  {ways}. Serve {', '.join(others)} through the Python backend: a model.py that "
            "loads and runs it, with what it imports installed by `ray-triton-shm setup-server "
            "--with PACKAGE` (docs/guide/own-model.md).",
        ]
    return "\n".join(lines)
