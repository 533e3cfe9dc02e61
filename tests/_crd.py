"""Validating manifests against a vendored CRD's schema as the API server's strict field
validation does: closed objects (an unknown or misspelt field is an error), types, and no two
entries of a list-as-map with the same key. Shared by the KubeRay manifest tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml


def crd_schema(path: Path, kind: str) -> dict[str, Any]:
    """The closed ``v1`` schema of the CRD of ``kind`` in ``path``."""
    # libyaml's loader where PyYAML has it: the CRDs are megabytes, seconds in pure Python.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(), Loader=loader)
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return _closed(v1["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]


def schema_problems(manifest: Any, schema: dict[str, Any]) -> list[str]:
    """Where ``manifest`` breaks ``schema``: types, unknown fields, duplicate list keys."""
    validator = jsonschema.Draft7Validator(schema)
    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]
    return problems + _duplicate_keys(schema, manifest, "")


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others, as the API
    server's strict field validation treats them (unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


def _duplicate_keys(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """Lists the CRD types as maps (``x-kubernetes-list-type: map``) must not repeat a key."""
    problems = []
    if isinstance(value, dict):
        for name, item in value.items():
            sub = schema.get("properties", {}).get(name)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                problems += _duplicate_keys(sub, item, f"{path}.{name}")
    elif isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "map":
            fields = schema.get("x-kubernetes-list-map-keys", [])
            seen = [tuple(i.get(f) for f in fields) for i in value if isinstance(i, dict)]
            problems += [
                f"{path}: two entries with {dict(zip(fields, k, strict=True))}"
                for k in sorted({k for k in seen if seen.count(k) > 1}, key=str)
            ]
        for i, item in enumerate(value):
            problems += _duplicate_keys(schema.get("items", {}), item, f"{path}[{i}]")
    return problems
