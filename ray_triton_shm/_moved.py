"""The package's modules under their names before they moved into layer folders (0.2).

Pickles name a class by its module: a ``ShmModel``, its specs or its options pickled by an
older release (a Ray object, a checkpoint, a rolling upgrade's other half) name
``ray_triton_shm._specs``. :class:`MovedModules` makes each old name import the module that
now holds its code, as the same module object, so those pickles load and ``isinstance``
holds. It loads nothing until an old name is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

__all__ = ["MOVED", "MovedModules", "install"]

#: Each module's old name under the package, and its name now.
MOVED: dict[str, str] = {
    "_channel": "_wire._channel",
    "_http": "_wire._http",
    "_tls": "_wire._tls",
    "_keys": "_wire._keys",
    "_reconnect": "_wire._reconnect",
    "_triton_errors": "_wire._triton_errors",
    "_plain_client": "_wire._plain_client",
    "_shm": "_slots._shm",
    "_header": "_slots._header",
    "_memory": "_slots._memory",
    "_cuda": "_slots._cuda",
    "_gpu_choice": "_slots._gpu_choice",
    "_pool": "_slots._slot_pool",
    "_shared_slots": "_slots._shared_slots",
    "_specs": "_slots._specs",
    "_sizing": "_slots._sizing",
    "_engine": "_inference._engine",
    "_inputs": "_inference._inputs",
    "_outputs": "_inference._outputs",
    "_bytes": "_inference._bytes",
    "_transport": "_inference._requests",
    "_options": "_inference._options",
    "_route": "_inference._transport",
    "_changes": "_inference._model_change",
    "_gpu_tensors": "_inference._gpu_tensors",
    "_registry": "_pools._registry",
    "_follow": "_pools._model_sync",
    "_reroute": "_pools._transport_sync",
    "_scaling": "_pools._scaling",
    "_settle": "_pools._abandoned",
    "_snapshot": "_pools._snapshot",
    "_reaper": "_pools._reaper",
    "_reclaim": "_pools._reclaim",
    "_moves": "_pools._retry",
    "_doctor": "_tools._doctor",
    "_doctor_report": "_tools._doctor_report",
    "_region_status": "_tools._region_status",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``ray_triton_shm.<old name>`` and loads it as the module it moved to."""

    def __init__(self, package: str) -> None:
        self._prefix = package + "."
        self._package = package

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self._prefix) or fullname[len(self._prefix) :] not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        # the module itself, not a copy: the import system sets no attribute it already has
        return importlib.import_module(f"{self._package}.{MOVED[spec.name[len(self._prefix) :]]}")

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module ran under its own name."""


def install(package: str) -> None:
    """Puts one :class:`MovedModules` for ``package`` on the import path (again: no-op)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules(package))
