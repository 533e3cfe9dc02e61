"""ONNX models on the embedded Triton, which has only the Python backend (``onnx_via_python``).

:func:`onnx_via_python_repository` makes a model repository in which each ONNX model of the
original becomes a Python-backend model running onnxruntime (``_onnx_model.py``), with the
original's inputs, outputs, data types and ``max_batch_size`` where its ``config.pbtxt`` says
them and the ONNX graph's otherwise; every other model is linked in unchanged. The graph is
read by the server environment's Python with onnxruntime (:func:`onnx_signature`): the client
side needs neither onnx nor onnxruntime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._exceptions import LocalServerError
from ._repository import model_backends, read_config

__all__ = ["ONNX_DEFAULT_MAX_BATCH_SIZE", "onnx_signature", "onnx_via_python_repository"]

#: The ``max_batch_size`` of an ONNX model without one in a config whose every input and
#: output has a variable first dimension (Triton's ONNX auto-complete gives the same).
ONNX_DEFAULT_MAX_BATCH_SIZE = 4

_ADAPTER = Path(__file__).resolve().parent / "_onnx_model.py"
_INSTALL_HINT = "install it there with `ray-triton-shm setup-server --with onnxruntime`"

#: onnxruntime's element types (``"tensor(float)"``) as Triton's.
_TRITON_TYPES = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
}

#: Run by the server environment's Python: the graph's inputs and outputs as JSON.
_SIGNATURE_SCRIPT = """
import json, sys
try:
    import onnxruntime
except ImportError as exc:
    print(json.dumps({"missing": str(exc)}))
    sys.exit(0)
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
def tensor(arg):
    shape = [d if isinstance(d, int) else None for d in arg.shape]
    return {"name": arg.name, "type": arg.type, "shape": shape}
print(json.dumps({
    "onnxruntime": onnxruntime.__version__,
    "inputs": [tensor(a) for a in session.get_inputs()],
    "outputs": [tensor(a) for a in session.get_outputs()],
}))
"""


def onnx_signature(model_file: Path, *, python: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The inputs and outputs of an ONNX model, read by onnxruntime in the server environment.

    Args:
        model_file: The ``.onnx`` file.
        python: The server environment's Python.
        env: The environment to run it with (the server's).

    Returns:
        ``{"onnxruntime": version, "inputs": [...], "outputs": [...]}``, each tensor
        ``{"name", "type" ("tensor(float)"...), "shape" (ints, ``None`` where variable)}``.

    Raises:
        LocalServerError: onnxruntime is missing there (saying how to install it), or it
            cannot read the model.
    """
    done = subprocess.run(
        [str(python), "-c", _SIGNATURE_SCRIPT, str(model_file)],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
    )
    if done.returncode != 0:
        raise LocalServerError(
            f"onnxruntime in the server environment ({python}) could not read {model_file}:\n"
            f"{done.stderr[-2000:]}"
        )
    signature: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if "missing" in signature:
        raise LocalServerError(
            f"serving ONNX models through the Python backend needs onnxruntime in the server "
            f"environment ({python}), which has none ({signature['missing']}): {_INSTALL_HINT}"
        )
    return signature


def _graph_tensors(
    config: Any, field: str, tensors: list[dict[str, Any]], max_batch_size: int, where: str
) -> None:
    """Adds ``tensors`` of the graph to ``config``'s ``input`` or ``output``."""
    from tritonclient.grpc import model_config_pb2

    for tensor in tensors:
        triton_type = _triton_type(tensor, field, where)
        dims = _graph_dims(tensor, max_batch_size)
        entry = getattr(config, field).add()
        entry.name = tensor["name"]
        entry.data_type = model_config_pb2.DataType.Value(triton_type)
        # Triton wants dims; a tensor of one value per sample (a classifier's label) gets [1],
        # and the adapter reshapes (see _reshapes).
        entry.dims.extend(dims or [1])


def _triton_type(tensor: dict[str, Any], field: str, where: str) -> str:
    triton_type = _TRITON_TYPES.get(tensor["type"])
    if triton_type is None:
        hint = ""
        if tensor["type"].startswith("seq(map("):
            hint = (
                ": a classifier's ZipMap output; convert it without one (skl2onnx: "
                "options={'zipmap': False}), or leave it out of the config's outputs"
            )
        raise LocalServerError(
            f"{where}: {field} {tensor['name']!r} is a {tensor['type']}, which the Python "
            f"backend cannot carry (it carries {', '.join(sorted(_TRITON_TYPES))}){hint}"
        )
    return triton_type


def _graph_dims(tensor: dict[str, Any], max_batch_size: int) -> list[int]:
    """The graph's shape of ``tensor`` per sample (``-1`` where it varies)."""
    dims = [-1 if d is None else d for d in tensor["shape"]]
    return dims[1:] if max_batch_size > 0 else dims


def _count(dims: list[int]) -> int | None:
    """How many values ``dims`` hold, ``None`` if one varies."""
    count = 1
    for d in dims:
        if d < 0:
            return None
        count *= d
    return count


def _reshapes(config: Any, signature: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The shapes the adapter gives tensors whose shape in Triton (the config's ``dims``)
    differs from the graph's (a config's ``reshape``, else the graph's own), per sample:
    inputs to the graph's shape, outputs to the config's. The ``reshape`` fields are removed
    from ``config``: the Python backend does not apply them, the adapter does."""
    from .._slots._specs import reshaped_dims  # here: the bench's reports load no tritonclient

    shapes: dict[str, dict[str, Any]] = {"inputs": {}, "outputs": {}}
    for field, key in (("input", "inputs"), ("output", "outputs")):
        graph = {t["name"]: t for t in signature[key]}
        for entry in getattr(config, field):
            triton_dims = list(entry.dims)
            if entry.HasField("reshape"):
                model_dims = list(entry.reshape.shape)
                entry.ClearField("reshape")
                # Triton's dims have one -1 the reshape fixes (skl2onnx's label, [-1] of a
                # reshape to []): served fixed, as its count is (see reshaped_dims).
                fixed = reshaped_dims({"dims": triton_dims, "reshape": {"shape": model_dims}})
                if fixed is not None:
                    triton_dims = list(fixed)
                    entry.dims[:] = triton_dims
            else:
                model_dims = _graph_dims(graph[entry.name], config.max_batch_size)
                if len(model_dims) == len(triton_dims):
                    continue  # the same shape, or one the config narrows
            if model_dims == triton_dims:
                continue
            counts = _count(triton_dims), _count(model_dims)
            if None not in counts and counts[0] != counts[1]:
                raise LocalServerError(
                    f"{where}: the {field} {entry.name!r} is {triton_dims} per sample in the "
                    f"config and {model_dims} in the model, which do not hold the same number "
                    "of values: give the config the graph's shape, or a reshape to it"
                )
            shapes[key][entry.name] = model_dims if field == "input" else triton_dims
    return shapes


def _batchable(signature: dict[str, Any]) -> bool:
    """Whether every input and output has a variable first dimension (a batch)."""
    tensors = [*signature["inputs"], *signature["outputs"]]
    return bool(tensors) and all(t["shape"] and t["shape"][0] is None for t in tensors)


def _check_names(config: Any, signature: dict[str, Any], where: str) -> None:
    for field, key in (("input", "inputs"), ("output", "outputs")):
        graph = {t["name"]: t for t in signature[key]}
        for entry in getattr(config, field):
            if entry.name not in graph:
                raise LocalServerError(
                    f"{where}: the config's {field} {entry.name!r} is not one of the ONNX "
                    f"graph's {key}: {', '.join(graph) or 'none'}"
                )


def _adapter_config(directory: Path, signature: dict[str, Any], model_file: str) -> str:
    """The ``config.pbtxt`` of the Python-backend model standing for the ONNX model in
    ``directory``."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    where = f"ONNX model {directory.name!r} ({directory})"
    config = model_config_pb2.ModelConfig()
    text = read_config(directory)
    if text is not None:
        try:
            text_format.Parse(text, config)
        except text_format.ParseError as exc:
            raise LocalServerError(f"{where}: its config.pbtxt does not parse: {exc}") from None
    _check_names(config, signature, where)
    if not config.input and not config.output and config.max_batch_size == 0:
        config.max_batch_size = ONNX_DEFAULT_MAX_BATCH_SIZE if _batchable(signature) else 0
    for field, key in (("input", "inputs"), ("output", "outputs")):
        if not getattr(config, field):
            _graph_tensors(config, field, signature[key], config.max_batch_size, where)
    reshapes = _reshapes(config, signature, where)
    config.name = directory.name
    config.ClearField("platform")
    config.backend = "python"
    config.ClearField("default_model_filename")
    config.ClearField("optimization")  # onnxruntime's execution accelerators, not Python's
    for group in config.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.KIND_CPU
        group.ClearField("gpus")
    config.parameters["onnx_model_directory"].string_value = str(directory)
    config.parameters["onnx_model_filename"].string_value = model_file
    if any(reshapes.values()):
        config.parameters["onnx_reshapes"].string_value = json.dumps(reshapes)
    header = f"# Generated by ray-triton-shm (onnx_via_python): {directory} through onnxruntime.\n"
    return header + text_format.MessageToString(config)


def _model_file(directory: Path) -> tuple[str, list[Path]]:
    """The ONNX file's name and the version directories that have it."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    filename = "model.onnx"
    text = read_config(directory)
    if text is not None:
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse(text, config)
            filename = config.default_model_filename or filename
        except text_format.ParseError:
            pass  # said by _adapter_config, naming the model
    versions = sorted(
        (
            p
            for p in directory.iterdir()
            if p.is_dir() and p.name.isdigit() and (p / filename).is_file()
        ),
        key=lambda p: int(p.name),
    )
    return filename, versions


def onnx_via_python_repository(
    repository: Path, dest: Path, *, python: Path, env: Mapping[str, str]
) -> Path:
    """A repository serving the ONNX models of ``repository`` through the Python backend.

    Each ONNX model (its config's platform ``onnxruntime_onnx`` or backend ``onnxruntime``,
    or a ``model.onnx`` and no config saying otherwise) becomes ``dest/<name>/config.pbtxt``
    (backend ``"python"``; inputs, outputs and ``max_batch_size`` from the original config,
    else from the graph; the original's directory and file in ``parameters``) and
    ``dest/<name>/<version>/model.py`` for each version of it; every other model is a link to
    the original directory.

    Args:
        repository: The original model repository.
        dest: A directory to make it in (emptied first).
        python: The server environment's Python, with onnxruntime.
        env: The environment to run it with.

    Returns:
        ``repository`` itself when it has no ONNX model, else ``dest``.

    Raises:
        LocalServerError: onnxruntime is missing in the server environment, a model cannot
            be read, or its config does not match its graph.
    """
    models = model_backends(repository)
    if not any(m.backend == "onnxruntime" for m in models):
        return repository
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for model in models:
        target = dest / model.name
        if model.backend != "onnxruntime":
            os.symlink(model.directory, target, target_is_directory=True)
            continue
        filename, versions = _model_file(model.directory)
        if not versions:
            raise LocalServerError(
                f"ONNX model {model.name!r} ({model.directory}) has no version directory with "
                f"{filename} (e.g. {model.directory / '1' / filename})"
            )
        signature = onnx_signature(versions[-1] / filename, python=python, env=env)
        config = _adapter_config(model.directory, signature, filename)
        target.mkdir()
        (target / "config.pbtxt").write_text(config)
        for version in versions:
            (target / version.name).mkdir()
            shutil.copyfile(_ADAPTER, target / version.name / "model.py")
    return dest
