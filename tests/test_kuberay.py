"""``deployments/kuberay/rayservice.yaml``: valid for KubeRay, right for shared memory, and real.

Three layers, each able to fail on its own:

* **Schema.** The manifest is validated against the ``v1`` schema of the RayService CRD of a
  pinned KubeRay release (vendored under ``tests/schemas/``), closed as the API server's strict
  field validation is: an unknown or misspelt field is an error, as are a wrong type and two
  list entries with the same key (two containers of one name).
* **Invariants.** What shared memory needs and no schema says: Triton beside every Ray container
  that can host a replica, one memory-backed ``emptyDir`` at ``/dev/shm`` in both, the same uid,
  ``RAY_TRITON_SHM_URL`` at that Triton, its readiness probe, the keys from one Secret into
  both, no port taken twice in a pod. Each invariant is shown to catch a broken copy.
* **Triton.** The Triton container's own arguments start a real Triton (2.51, as the image), and
  the Ray container's environment is enough for the library: ``doctor`` passes and the
  classifier answers through shared memory with the keys the Secret would give.
"""

from __future__ import annotations

import copy
import re
import secrets
import shlex
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _crd import crd_schema, schema_problems
from _helpers import CertificateAuthority, local_triton, model_repository, write_secret

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

from ray_triton_shm import TritonSHMClient, check_node  # noqa: E402
from ray_triton_shm._wire._keys import ENV_PREFIX  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deployments" / "kuberay" / "rayservice.yaml"
#: The same RayService with mutual TLS, and cert-manager's resources for it.
MTLS_MANIFEST = ROOT / "deployments" / "kuberay" / "rayservice-mtls.yaml"
SCHEMAS = Path(__file__).parent / "schemas"
CRD = SCHEMAS / "kuberay-v1.7.0" / "ray.io_rayservices.yaml"
CERT_MANAGER_CRDS = {
    "Certificate": SCHEMAS / "cert-manager-v1.21.1" / "cert-manager.io_certificates.yaml",
    "Issuer": SCHEMAS / "cert-manager-v1.21.1" / "cert-manager.io_issuers.yaml",
}

#: Triton's defaults, where its arguments do not say.
TRITON_PORTS = {"grpc": 8001, "http": 8000, "metrics": 8002}
#: Ports a Ray container listens on besides those it declares: Serve's proxy on every node, and
#: the metrics export and dashboard agent ports KubeRay sets.
RAY_PORTS = {8000, 8080, 52365}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)([KMGTPE]i?)?$")
_KEY_ARG = re.compile(r"^(?P<apis>[a-z,-]+):(?P<key>[A-Za-z0-9-]+)=\$\(cat (?P<file>/\S+)\)$")
#: Where a key file's header comes from: its name (see ray_triton_shm._wire._keys).
_HEADER_PREFIX = "triton-grpc-protocol-"

Manifest = dict[str, Any]


# ---- schema ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rayservice_schema() -> dict[str, Any]:
    return crd_schema(CRD, "RayService")


# ---- invariants --------------------------------------------------------------------------


def _bytes(quantity: str | int) -> float:
    """A Kubernetes quantity (``2Gi``, ``512M``, ``1073741824``) in bytes."""
    match = _QUANTITY.match(str(quantity))
    if not match:
        raise ValueError(f"not a quantity: {quantity!r}")
    number, unit = float(match[1]), match[2] or ""
    power = "KMGTPE".index(unit[0]) + 1 if unit else 0
    return number * (1024 if unit.endswith("i") else 1000) ** power


def _triton_args(container: dict[str, Any]) -> list[str]:
    """Triton's command line: ``command`` and ``args``, or, for a shell script
    (``/bin/sh -c``), the words after its ``exec tritonserver``, with the script's variables
    put in."""
    command = [*container.get("command", []), *container.get("args", [])]
    if len(command) < 3 or Path(command[0]).name not in ("sh", "bash") or command[1] != "-c":
        return command
    script = command[2].replace("\\\n", " ")
    variables = dict(re.findall(r"^(\w+)=(\S+)$", script, re.M))
    line = next((ln for ln in script.splitlines() if ln.strip().startswith("exec ")), "")
    words = shlex.split(line.rstrip(" \\"))[1:]
    return [re.sub(r"\$(\w+)", lambda m: variables.get(m[1], m[0]), w) for w in words]


def _flag(args: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def _triton_port(args: list[str], kind: str) -> int:
    given = _flag(args, f"{kind}-port")
    return int(given[-1]) if given else TRITON_PORTS[kind]


def _groups(manifest: Manifest) -> Iterator[tuple[str, dict[str, Any]]]:
    cluster = manifest["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]
    for group in cluster.get("workerGroupSpecs", []):
        yield f"worker group {group['groupName']}", group


def _hosts_replicas(group: dict[str, Any]) -> bool:
    params = group.get("rayStartParams", {})
    return str(params.get("num-cpus", "")) != "0" or str(params.get("num-gpus", "0")) != "0"


def _is_triton(container: dict[str, Any]) -> bool:
    return "tritonserver" in " ".join([container.get("image", ""), *container.get("command", [])])


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_ref(env: dict[str, Any] | None) -> tuple[str, str] | None:
    ref = (env or {}).get("valueFrom", {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


def invariant_problems(manifest: Manifest) -> list[str]:
    """What keeps the library from working in this RayService, one line each."""
    problems: list[str] = []
    serve_config = yaml.safe_load(manifest["spec"].get("serveConfigV2", "")) or {}
    for app in serve_config.get("applications", []):
        module, _, attr = app["import_path"].partition(":")
        source = ROOT / (module.replace(".", "/") + ".py")
        if not source.is_file() or not re.search(rf"^{attr} = ", source.read_text(), re.M):
            problems.append(f"app {app['name']}: {app['import_path']} is not in this repository")
    serving = 0
    for where, group in _groups(manifest):
        pod = group["template"]["spec"]
        containers = pod["containers"]
        for c in containers:
            limits = c.get("resources", {}).get("limits", {})
            if not {"cpu", "memory"} <= set(limits):
                problems.append(f"{where}: container {c['name']} has no cpu and memory limits")
        if _is_triton(containers[0]):
            problems.append(f"{where}: KubeRay takes the first container for Ray's, not Triton")
            continue
        if not _hosts_replicas(group):
            continue
        serving += 1
        ray_c, tritons = containers[0], [c for c in containers if _is_triton(c)]
        if not tritons:
            problems.append(f"{where}: no Triton container beside Ray (it can host replicas)")
            continue
        triton = tritons[0]
        args = _triton_args(triton)
        problems += _shared_dev_shm(where, pod, ray_c, triton, group)
        problems += _same_uid(where, pod, ray_c, triton)
        problems += _url_and_ports(where, ray_c, triton, args)
        problems += _keys(where, pod, ray_c, triton, args)
        repository = _flag(args, "model-repository")
        mounts = {m["mountPath"] for m in triton.get("volumeMounts", [])}
        if not repository or repository[0] not in mounts:
            problems.append(f"{where}: Triton's --model-repository is not a mounted volume")
    if not serving:
        problems.append("no group can host a replica")
    return problems


def _shared_dev_shm(
    where: str, pod: dict[str, Any], ray_c: dict[str, Any], triton: dict[str, Any], group: Any
) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    at_shm = [
        {m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"}
        for c in (ray_c, triton)
    ]
    shared = at_shm[0] & at_shm[1]
    if not shared:
        return [f"{where}: Ray and Triton do not mount one volume at /dev/shm"]
    empty_dir = volumes.get(shared.pop(), {}).get("emptyDir")
    if empty_dir is None or empty_dir.get("medium") != "Memory":
        return [f"{where}: the volume at /dev/shm is not an emptyDir with medium: Memory"]
    if "sizeLimit" not in empty_dir:
        return [f"{where}: the /dev/shm emptyDir has no sizeLimit"]
    store = group.get("rayStartParams", {}).get("object-store-memory")
    if store is None:
        return [f"{where}: no object-store-memory: Ray sizes its store from the pod's memory"]
    if _bytes(store) >= _bytes(empty_dir["sizeLimit"]):
        return [f"{where}: the /dev/shm sizeLimit leaves no room for pools beside the object store"]
    return []


def _same_uid(
    where: str, pod: dict[str, Any], ray_c: dict[str, Any], triton: dict[str, Any]
) -> list[str]:
    default = pod.get("securityContext", {}).get("runAsUser")
    uids = [c.get("securityContext", {}).get("runAsUser", default) for c in (ray_c, triton)]
    if None in uids:
        return [f"{where}: runAsUser is not set for both containers (images differ in users)"]
    if uids[0] != uids[1]:
        return [f"{where}: Ray runs as uid {uids[0]}, Triton as {uids[1]}: not the same"]
    return []


def _url_and_ports(
    where: str, ray_c: dict[str, Any], triton: dict[str, Any], args: list[str]
) -> list[str]:
    problems = []
    grpc = _triton_port(args, "grpc")
    url = _env(ray_c).get("RAY_TRITON_SHM_URL", {}).get("value")
    if url != f"localhost:{grpc}":
        problems.append(f"{where}: RAY_TRITON_SHM_URL is {url!r}, not localhost:{grpc}")
    ready = triton.get("readinessProbe", {}).get("httpGet", {})
    http = _triton_port(args, "http")
    if ready.get("path") != "/v2/health/ready" or ready.get("port") != http:
        problems.append(f"{where}: Triton has no readiness probe on /v2/health/ready:{http}")
    ray_ports = RAY_PORTS | {p["containerPort"] for p in ray_c.get("ports", [])}
    taken = sorted(ray_ports & {_triton_port(args, k) for k in TRITON_PORTS})
    if taken:
        problems.append(f"{where}: Triton and Ray both listen on port(s) {taken}")
    return problems


def _secret_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """``{mount path: Secret name}`` of the Secret volumes ``container`` mounts."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {
        m["mountPath"]: volumes[m["name"]]["secret"]["secretName"]
        for m in container.get("volumeMounts", [])
        if "secret" in volumes.get(m["name"], {})
    }


def _keys(
    where: str, pod: dict[str, Any], ray_c: dict[str, Any], triton: dict[str, Any], args: list[str]
) -> list[str]:
    problems = []
    grpc, http = _flag(args, "grpc-restricted-protocol"), _flag(args, "http-restricted-api")
    if sorted(grpc) != sorted(http):
        problems.append(f"{where}: Triton's HTTP is not restricted as its gRPC is")
    for c in (ray_c, triton):
        if any(_secret_ref(e) for e in c.get("env", [])):
            problems.append(f"{where}: {c['name']} takes a key from an environment variable")
    triton_secrets, ray_secrets = _secret_mounts(pod, triton), _secret_mounts(pod, ray_c)
    keys_dir = _env(ray_c).get("RAY_TRITON_SHM_KEYS_DIR", {}).get("value")
    for restriction in grpc:
        match = _KEY_ARG.match(restriction)
        if match is None:
            problems.append(f"{where}: a restriction's key is not read from a file")
            continue
        folder, name = match["file"].rsplit("/", 1)
        secret = triton_secrets.get(folder)
        if secret is None:
            problems.append(f"{where}: Triton's {match['key']} is not read from a mounted Secret")
        elif name != _HEADER_PREFIX + match["key"]:
            problems.append(f"{where}: the {match['key']} file is not named as its header")
        elif ray_secrets.get(keys_dir or "") != secret:
            problems.append(
                f"{where}: Ray does not read the keys from the Secret's files "
                "(RAY_TRITON_SHM_KEYS_DIR at its mount)"
            )
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for volume in volumes.values():
        mode = volume.get("secret", {}).get("defaultMode", 0o644)
        readable = mode & 0o004 or (mode & 0o040 and "fsGroup" in pod.get("securityContext", {}))
        if "secret" in volume and not readable:
            problems.append(f"{where}: the key files are readable by root only (defaultMode)")
    if grpc:
        probe = " ".join(triton.get("livenessProbe", {}).get("exec", {}).get("command", []))
        script = " ".join(triton.get("args", []))
        digest = re.search(r"sha256sum .*> (\S+)", script)
        if digest is None or "sha256sum -c" not in probe or digest[1] not in probe:
            problems.append(f"{where}: Triton does not restart when the key files change")
    return problems


# ---- the tests -------------------------------------------------------------------------


@pytest.fixture
def manifest() -> Manifest:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_is_a_valid_rayservice(
    manifest: Manifest, rayservice_schema: dict[str, Any]
) -> None:
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    assert schema_problems(manifest, rayservice_schema) == []


def test_the_manifest_keeps_every_invariant(manifest: Manifest) -> None:
    assert invariant_problems(manifest) == []


def _worker(m: Manifest) -> dict[str, Any]:
    return m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]


def _pod(m: Manifest) -> dict[str, Any]:
    return _worker(m)["template"]["spec"]


def _container(m: Manifest, name: str) -> dict[str, Any]:
    return next(c for c in _pod(m)["containers"] if c["name"] == name)


def _drop_env(m: Manifest, container: str, name: str) -> None:
    c = _container(m, container)
    c["env"] = [e for e in c["env"] if e["name"] != name]


def _set_arg(m: Manifest, prefix: str, value: str | None) -> None:
    """Drops Triton's arguments starting with ``prefix`` from its script; adds ``value``."""
    c = _container(m, "triton")
    lines = [ln for ln in c["args"][0].splitlines() if not ln.strip().startswith(prefix)]
    if value is not None:
        at = next(i for i, ln in enumerate(lines) if "exec tritonserver" in ln) + 1
        lines.insert(at, f"  {prefix}{value} \\")
    c["args"][0] = "\n".join(lines)


def _volume(m: Manifest, name: str) -> dict[str, Any]:
    return next(v for v in _pod(m)["volumes"] if v["name"] == name)


def _drop_mount(m: Manifest, container: str, name: str) -> None:
    c = _container(m, container)
    c["volumeMounts"] = [v for v in c["volumeMounts"] if v["name"] != name]


BROKEN: dict[str, tuple[Callable[[Manifest], Any], str]] = {
    "no Triton": (
        lambda m: _pod(m).update(containers=_pod(m)["containers"][:1]),
        "no Triton container beside Ray",
    ),
    "Triton first": (
        lambda m: _pod(m)["containers"].reverse(),
        "first container for Ray's",
    ),
    "disk /dev/shm": (
        lambda m: _pod(m)["volumes"][0]["emptyDir"].pop("medium"),
        "not an emptyDir with medium: Memory",
    ),
    "no sizeLimit": (
        lambda m: _pod(m)["volumes"][0]["emptyDir"].pop("sizeLimit"),
        "no sizeLimit",
    ),
    "store fills /dev/shm": (
        lambda m: _worker(m)["rayStartParams"].update({"object-store-memory": "3221225472"}),
        "no room for pools",
    ),
    "Triton's own /dev/shm": (
        lambda m: _container(m, "triton")["volumeMounts"].pop(0),
        "do not mount one volume at /dev/shm",
    ),
    "Triton as root": (
        lambda m: _container(m, "triton").update(securityContext={"runAsUser": 0}),
        "not the same",
    ),
    "no runAsUser": (
        lambda m: _pod(m).pop("securityContext"),
        "runAsUser is not set",
    ),
    "no URL": (
        lambda m: _drop_env(m, "ray-worker", "RAY_TRITON_SHM_URL"),
        "RAY_TRITON_SHM_URL is None",
    ),
    "URL at another port": (
        lambda m: _set_arg(m, "--grpc-port=", "9001"),
        "not localhost:9001",
    ),
    "no readiness probe": (
        lambda m: _container(m, "triton").pop("readinessProbe"),
        "no readiness probe",
    ),
    "Triton's HTTP on Serve's port": (
        lambda m: (
            _set_arg(m, "--http-port=", None),
            _container(m, "triton").pop("readinessProbe"),
        ),
        "both listen on port(s) [8000]",
    ),
    "Ray without the key files": (
        lambda m: _drop_env(m, "ray-worker", "RAY_TRITON_SHM_KEYS_DIR"),
        "Ray does not read the keys from the Secret's files",
    ),
    "Ray's keys from another Secret": (
        lambda m: (
            _pod(m)["volumes"].append({"name": "other", "secret": {"secretName": "other-keys"}})
            or next(
                v for v in _container(m, "ray-worker")["volumeMounts"] if v["name"] == "triton-keys"
            ).update(name="other")
        ),
        "Ray does not read the keys from the Secret's files",
    ),
    "a key in the manifest": (
        lambda m: _set_arg(m, "--grpc-restricted-protocol=inference:", "infer-key=hunter2"),
        "not read from a file",
    ),
    "Triton's keys not mounted": (
        lambda m: _drop_mount(m, "triton", "triton-keys"),
        "admin-key is not read from a mounted Secret",
    ),
    "a key file named otherwise": (
        lambda m: _set_arg(
            m,
            "--grpc-restricted-protocol=inference:",
            'infer-key="$(cat "$keys"/infer-key)"',
        ),
        "the infer-key file is not named as its header",
    ),
    "a key in an environment variable": (
        lambda m: _container(m, "ray-worker")["env"].append(
            {
                "name": f"{ENV_PREFIX}TRITON_GRPC_PROTOCOL_INFER_KEY",
                "valueFrom": {"secretKeyRef": {"name": "triton-keys", "key": "infer-key"}},
            }
        ),
        "ray-worker takes a key from an environment variable",
    ),
    "key files for root only": (
        lambda m: _volume(m, "triton-keys")["secret"].update(defaultMode=0o400),
        "readable by root only",
    ),
    "Triton never takes new keys": (
        lambda m: _container(m, "triton").pop("livenessProbe"),
        "does not restart when the key files change",
    ),
    "HTTP left open": (
        lambda m: _set_arg(m, "--http-restricted-api=", None),
        "HTTP is not restricted",
    ),
    "models in the image": (
        lambda m: _drop_mount(m, "triton", "models"),
        "--model-repository is not a mounted volume",
    ),
    "no limits": (
        lambda m: _container(m, "triton").pop("resources"),
        "container triton has no cpu and memory limits",
    ),
    "an app from elsewhere": (
        lambda m: m["spec"].update(
            serveConfigV2=m["spec"]["serveConfigV2"].replace("classifier:app", "classify:app")
        ),
        "deployments.classify:app is not in this repository",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_copy_is_caught(manifest: Manifest, broken: str) -> None:
    change, expected = BROKEN[broken]
    copied = copy.deepcopy(manifest)
    change(copied)
    problems = invariant_problems(copied)
    assert any(expected in p for p in problems), problems


SCHEMA_BROKEN: dict[str, tuple[Callable[[Manifest], Any], str]] = {
    "a misspelt field": (
        lambda m: _pod(m)["volumes"][0]["emptyDir"].update(sizeLimt="2Gi"),
        "'sizeLimt' was unexpected",
    ),
    "a wrong type": (lambda m: _worker(m).update(replicas="two"), "'two' is not of type"),
    "a missing field": (lambda m: _worker(m).pop("groupName"), "'groupName' is a required"),
    "a start parameter not a string": (
        lambda m: _worker(m)["rayStartParams"].update({"object-store-memory": 2**30}),
        "is not of type 'string'",
    ),
    "two containers of one name": (
        lambda m: _container(m, "triton").update(name="ray-worker"),
        "two entries with {'name': 'ray-worker'}",
    ),
}


@pytest.mark.parametrize("broken", list(SCHEMA_BROKEN))
def test_the_schema_check_catches_a_broken_copy(
    manifest: Manifest, rayservice_schema: dict[str, Any], broken: str
) -> None:
    change, expected = SCHEMA_BROKEN[broken]
    copied = copy.deepcopy(manifest)
    change(copied)
    problems = schema_problems(copied, rayservice_schema)
    assert any(expected in p for p in problems), problems


def test_the_triton_container_args_run_and_the_ray_env_is_enough(
    manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker pod's Triton, as its script says (keys from the files of a made-up Secret,
    laid out as the kubelet mounts it), and its Ray container's environment: the library
    infers through shared memory, and the probe's path answers without a key."""
    ray_c, triton = _container(manifest, "ray-worker"), _container(manifest, "triton")
    secret = tmp_path / "secret"
    keys = {_HEADER_PREFIX + k: secrets.token_hex(16) for k in ("admin-key", "infer-key")}
    write_secret(secret, keys)
    (mount,) = _secret_mounts(_pod(manifest), triton)
    args = _triton_args(triton)
    restricted = {}
    for restriction in _flag(args, "grpc-restricted-protocol"):
        match = _KEY_ARG.match(restriction)
        assert match is not None, restriction
        value = (secret / match["file"].removeprefix(mount + "/")).read_text().strip()
        restricted[match["apis"]] = (match["key"], value)
    # The embedded server applies each restriction to gRPC and HTTP alike (the invariants check
    # that the manifest does too), and picks its own ports and repository.
    own = ("--grpc-restricted-protocol=", "--http-restricted-api=", "--model-repository=")
    own += tuple(f"--{kind}-{what}=" for kind in TRITON_PORTS for what in ("port", "address"))
    extra = [a for a in args[1:] if not a.startswith(own)]  # after the program
    with local_triton(
        model_repository(tmp_path / "models", "classifier"),  # the one model the test calls
        restricted_protocols=restricted,
        extra_args=extra,
        log_path=tmp_path / "tritonserver.log",
    ) as server:
        (ray_mount,) = _secret_mounts(_pod(manifest), ray_c)
        assert _env(ray_c)["RAY_TRITON_SHM_KEYS_DIR"]["value"] == ray_mount
        monkeypatch.setenv("RAY_TRITON_SHM_KEYS_DIR", str(secret))
        report = check_node(url=server.grpc_url, models={"classifier": 8})
        assert not report.failed, report
        assert {c.name: c.status for c in report.checks}["keys"] == "ok", report

        x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
        with TritonSHMClient(server.grpc_url) as client:  # keys from RAY_TRITON_SHM_KEYS_DIR
            client.register_shm_model("classifier", pool_size=1)
            out = client.infer_shm("classifier", {"INPUT0": x})["OUTPUT0"]
        expected = x.reshape(2, -1)[:, :150000].reshape(2, 1000, 150).mean(axis=2)
        np.testing.assert_allclose(out, expected, rtol=1e-5)

        probe = triton["readinessProbe"]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://{server.http_url}{probe}", timeout=5) as answer:
            assert answer.status == 200


def test_the_liveness_probe_restarts_triton_when_the_keys_rotate(
    manifest: Manifest, tmp_path: Path
) -> None:
    """The script's digest line and the probe's command, run for real on a Secret laid out as
    the kubelet mounts it: the probe passes until the kubelet swaps the files."""
    triton = _container(manifest, "triton")
    (mount,) = _secret_mounts(_pod(manifest), triton)
    secret = tmp_path / "secret"
    write_secret(secret, {_HEADER_PREFIX + "admin-key": "a", _HEADER_PREFIX + "infer-key": "b"})
    script = triton["args"][0]
    digest_line = next(ln for ln in script.splitlines() if ln.startswith("sha256sum"))
    digest_file = re.search(r"> (\S+)", digest_line)[1]  # type: ignore[index]
    here = str(tmp_path / "digest")

    def run(line: str) -> int:
        script = f"keys={secret}\n" + line.replace(digest_file, here)
        return subprocess.run(["/bin/sh", "-c", script], check=False).returncode

    assert run(digest_line) == 0
    probe = shlex.join(triton["livenessProbe"]["exec"]["command"])
    assert run(probe) == 0 and run(probe) == 0
    write_secret(secret, {_HEADER_PREFIX + "admin-key": "a", _HEADER_PREFIX + "infer-key": "c"})
    assert run(probe) != 0
    assert mount in script  # the script reads the keys where the Secret is mounted


# ---- mutual TLS with cert-manager ---------------------------------------------------------


def _mtls_documents() -> list[Manifest]:
    return [d for d in yaml.safe_load_all(MTLS_MANIFEST.read_text()) if d]


def _of_kind(documents: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in documents if d["kind"] == kind]


def tls_problems(documents: list[Manifest]) -> list[str]:
    """What keeps mutual TLS between Ray and Triton from working in the mTLS manifest."""
    problems = []
    (service,) = _of_kind(documents, "RayService")
    certificates = {c["spec"]["secretName"]: c for c in _of_kind(documents, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in _of_kind(documents, "Issuer")}
    for where, group in _groups(service):
        if not _hosts_replicas(group):
            continue
        pod = group["template"]["spec"]
        ray_c = pod["containers"][0]
        triton = next(c for c in pod["containers"] if _is_triton(c))
        args = _triton_args(triton)
        flags = {name: _flag(args, name) for name in ("grpc-use-ssl", "grpc-use-ssl-mutual")}
        if flags != {"grpc-use-ssl": ["true"], "grpc-use-ssl-mutual": ["true"]}:
            problems.append(f"{where}: Triton does not want mutual TLS on gRPC")
        files = {n: _flag(args, f"grpc-{n}") for n in ("server-cert", "server-key", "root-cert")}
        mounts = _secret_mounts(pod, triton)
        folders = {f[0].rsplit("/", 1)[0] for f in files.values() if f}
        server_secret = mounts.get(folders.pop()) if len(folders) == 1 else None
        server = certificates.get(server_secret or "")
        if server is None or any(not f for f in files.values()):
            problems.append(f"{where}: Triton's certificate is not a cert-manager Secret's files")
            continue
        spec = server["spec"]
        if "127.0.0.1" not in spec.get("ipAddresses", []) or "server auth" not in spec["usages"]:
            problems.append(f"{where}: Triton's certificate is not for 127.0.0.1 (server auth)")
        tls_dir = _env(ray_c).get("RAY_TRITON_SHM_TLS_DIR", {}).get("value")
        client = certificates.get(_secret_mounts(pod, ray_c).get(tls_dir or "", ""))
        if client is None:
            problems.append(f"{where}: Ray has no client certificate at RAY_TRITON_SHM_TLS_DIR")
            continue
        if "client auth" not in client["spec"]["usages"]:
            problems.append(f"{where}: Ray's certificate is not for client auth")
        if client["spec"]["issuerRef"] != spec["issuerRef"]:
            problems.append(f"{where}: Ray's and Triton's certificates come from two issuers")
        issuer = issuers.get(spec["issuerRef"]["name"], {}).get("spec", {})
        if "ca" not in issuer:
            problems.append(f"{where}: the issuer is not a CA of the cluster's own")
        digest = re.search(r"sha256sum (.*) >", " ".join(triton.get("args", [])))
        if digest is None or "$tls" not in digest[1]:
            problems.append(f"{where}: Triton does not restart when its certificate is renewed")
    return problems


def test_the_mtls_manifest_is_valid_for_kuberay_and_cert_manager(
    rayservice_schema: dict[str, Any],
) -> None:
    documents = _mtls_documents()
    (service,) = _of_kind(documents, "RayService")
    assert schema_problems(service, rayservice_schema) == []
    assert invariant_problems(service) == []
    for kind, crd in CERT_MANAGER_CRDS.items():
        schema = crd_schema(crd, kind)
        found = _of_kind(documents, kind)
        assert found, kind
        for resource in found:
            assert resource["apiVersion"] == "cert-manager.io/v1"
            assert schema_problems(resource, schema) == [], resource["metadata"]["name"]
    assert {d["kind"] for d in documents} == {"RayService", *CERT_MANAGER_CRDS}
    assert tls_problems(documents) == []


def _mtls_triton(documents: list[Manifest]) -> dict[str, Any]:
    (service,) = _of_kind(documents, "RayService")
    pod = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    return next(c for c in pod["containers"] if _is_triton(c))


MTLS_BROKEN: dict[str, tuple[Callable[[list[Manifest]], Any], str]] = {
    "TLS without mutual": (
        lambda d: _mtls_triton(d).update(
            args=[_mtls_triton(d)["args"][0].replace("--grpc-use-ssl-mutual=true", "")]
        ),
        "does not want mutual TLS",
    ),
    "no client certificate": (
        lambda d: _container({"spec": _of_kind(d, "RayService")[0]["spec"]}, "ray-worker")[
            "env"
        ].pop(),
        "no client certificate",
    ),
    "a server certificate for another name": (
        lambda d: _of_kind(d, "Certificate")[1]["spec"].update(ipAddresses=["10.0.0.1"]),
        "not for 127.0.0.1",
    ),
    "two issuers": (
        lambda d: _of_kind(d, "Certificate")[2]["spec"].update(
            issuerRef={"name": "triton-selfsigned", "kind": "Issuer"}
        ),
        "two issuers",
    ),
    "no restart on renewal": (
        lambda d: _mtls_triton(d).update(
            args=[_mtls_triton(d)["args"][0].replace(' "$tls"/*', "")]
        ),
        "restart when its certificate is renewed",
    ),
}


@pytest.mark.parametrize("broken", list(MTLS_BROKEN))
def test_a_broken_mtls_copy_is_caught(broken: str) -> None:
    change, expected = MTLS_BROKEN[broken]
    documents = _mtls_documents()
    change(documents)
    problems = tls_problems(documents)
    assert any(expected in p for p in problems), problems


def test_the_mtls_triton_args_run_and_the_ray_env_is_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker pod's Triton as its script says, with certificates of a test CA laid out as
    cert-manager's Secrets: the node's clients, with the Ray container's environment, pass
    the doctor (mutual TLS) and infer through shared memory."""
    documents = _mtls_documents()
    (service,) = _of_kind(documents, "RayService")
    pod = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    ray_c, triton = pod["containers"][0], _mtls_triton(documents)
    ca = CertificateAuthority(tmp_path / "ca")
    secrets_dir = {}
    for name in ("server", "client"):
        cert, key = ca.issue(name)
        files = {"ca.crt": ca.cert.read_text(), "tls.crt": cert.read_text()}
        files["tls.key"] = key.read_text()
        secrets_dir[name] = tmp_path / f"{name}-tls"
        write_secret(secrets_dir[name], files)
    keys_dir = tmp_path / "keys"
    keys = {_HEADER_PREFIX + k: secrets.token_hex(16) for k in ("admin-key", "infer-key")}
    write_secret(keys_dir, keys)
    args = _triton_args(triton)
    mounts = _secret_mounts(pod, triton)
    local = {"triton-keys": keys_dir, "triton-server-tls": secrets_dir["server"]}

    def here(path: str) -> Path:
        folder, name = path.rsplit("/", 1)
        return local[mounts[folder]] / name

    restricted = {}
    for restriction in _flag(args, "grpc-restricted-protocol"):
        match = _KEY_ARG.match(restriction)
        assert match is not None, restriction
        restricted[match["apis"]] = (match["key"], here(match["file"]).read_text().strip())
    own = ("--grpc-restricted-protocol=", "--http-restricted-api=", "--model-repository=")
    own += tuple(f"--{kind}-{what}=" for kind in TRITON_PORTS for what in ("port", "address"))
    own += ("--grpc-use-ssl", "--grpc-server-", "--grpc-root-cert=")
    extra = [a for a in args[1:] if not a.startswith(own)]
    with local_triton(
        model_repository(tmp_path / "models", "classifier"),  # the one model the test calls
        restricted_protocols=restricted,
        extra_args=extra,
        tls_cert=here(_flag(args, "grpc-server-cert")[0]),
        tls_key=here(_flag(args, "grpc-server-key")[0]),
        tls_client_ca=here(_flag(args, "grpc-root-cert")[0]),
        log_path=tmp_path / "tritonserver.log",
    ) as server:
        env = _env(ray_c)
        assert set(_secret_mounts(pod, ray_c).values()) == {"triton-keys", "triton-client-tls"}
        monkeypatch.setenv("RAY_TRITON_SHM_KEYS_DIR", str(keys_dir))
        monkeypatch.setenv("RAY_TRITON_SHM_TLS_DIR", str(secrets_dir["client"]))
        assert {"RAY_TRITON_SHM_KEYS_DIR", "RAY_TRITON_SHM_TLS_DIR"} <= set(env)
        report = check_node(url=server.grpc_url, models={"classifier": 8})
        assert not report.failed, report
        checks = {c.name: c for c in report.checks}
        assert checks["tls"].status == "ok" and "mutual" in checks["tls"].summary
        x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
        with TritonSHMClient(server.grpc_url) as client:  # keys and TLS from the environment
            client.register_shm_model("classifier", pool_size=1)
            out = client.infer_shm("classifier", {"INPUT0": x})["OUTPUT0"]
        expected = x.reshape(2, -1)[:, :150000].reshape(2, 1000, 150).mean(axis=2)
        np.testing.assert_allclose(out, expected, rtol=1e-5)


# ---- GPU memory ------------------------------------------------------------------------------

GPU_MANIFEST = ROOT / "deployments" / "kuberay" / "rayservice-gpu.yaml"
#: NVIDIA's DRA driver's device class of whole GPUs.
GPU_DEVICE_CLASS = "gpu.nvidia.com"


def _gpu_documents() -> list[Manifest]:
    return [d for d in yaml.safe_load_all(GPU_MANIFEST.read_text()) if d]


def gpu_problems(documents: list[Manifest]) -> list[str]:
    """What keeps GPU memory (CUDA shared memory) between Ray and Triton from working."""
    problems = []
    (service,) = _of_kind(documents, "RayService")
    templates = {t["metadata"]["name"]: t for t in _of_kind(documents, "ResourceClaimTemplate")}
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    for app in serve_config["applications"]:
        module, _, attr = app["import_path"].partition(":")
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        line = re.search(rf"^{attr} = .*$", source, re.M)
        if line is None or 'memory="cuda"' not in line.group(0):
            problems.append(f'app {app["name"]}: {attr} does not ask for memory="cuda"')
        for deployment in app.get("deployments", []):
            if not deployment.get("ray_actor_options", {}).get("num_gpus"):
                problems.append(f"deployment {deployment['name']}: its replicas hold no GPU")
    for where, group in _groups(service):
        if not _hosts_replicas(group):
            continue
        pod = group["template"]["spec"]
        ray_c = pod["containers"][0]
        triton = next((c for c in pod["containers"] if _is_triton(c)), None)
        if triton is None:
            continue  # invariant_problems says so
        if not pod.get("shareProcessNamespace"):
            problems.append(f"{where}: Ray and Triton have pid namespaces of their own")
        if group.get("rayStartParams", {}).get("num-gpus") is None:
            problems.append(f"{where}: no num-gpus (KubeRay counts nvidia.com/gpu, not claims)")
        claims = {c["name"]: c for c in pod.get("resourceClaims", [])}
        named = [
            {c["name"] for c in x.get("resources", {}).get("claims", [])} for x in (ray_c, triton)
        ]
        shared = named[0] & named[1] & set(claims)
        if not shared:
            problems.append(f"{where}: Ray and Triton do not claim one GPU together")
        for name in shared:
            template = templates.get(claims[name].get("resourceClaimTemplateName", ""), {})
            requests = template.get("spec", {}).get("spec", {}).get("devices", {}).get("requests")
            exactly = [r.get("exactly", {}) for r in requests or []]
            if [(e.get("deviceClassName"), e.get("count", 1)) for e in exactly] != [
                (GPU_DEVICE_CLASS, 1)
            ]:
                problems.append(f"{where}: the claim {name!r} is not one GPU of this file's")
    return problems


def test_the_gpu_manifest_is_valid_and_shares_one_gpu(rayservice_schema: dict[str, Any]) -> None:
    documents = _gpu_documents()
    (service,) = _of_kind(documents, "RayService")
    assert schema_problems(service, rayservice_schema) == []
    assert invariant_problems(service) == []
    assert gpu_problems(documents) == []
    (template,) = _of_kind(documents, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1"


def _gpu_pod(documents: list[Manifest]) -> dict[str, Any]:
    (service,) = _of_kind(documents, "RayService")
    return service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]  # type: ignore[no-any-return]


def _break_gpu(documents: list[Manifest], broken: str) -> None:
    (service,) = _of_kind(documents, "RayService")
    pod = _gpu_pod(documents)
    if broken == "own pid namespaces":
        del pod["shareProcessNamespace"]
    elif broken == "the GPU claimed by Ray only":
        del next(c for c in pod["containers"] if _is_triton(c))["resources"]["claims"]
    elif broken == "two GPUs in the claim":
        (template,) = _of_kind(documents, "ResourceClaimTemplate")
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    elif broken == "replicas without a GPU":
        service["spec"]["serveConfigV2"] = service["spec"]["serveConfigV2"].replace(
            "num_gpus: 1", "num_gpus: 0"
        )
    elif broken == "the app in system memory":
        service["spec"]["serveConfigV2"] = service["spec"]["serveConfigV2"].replace(
            "classifier:gpu_app", "classifier:app"
        )
    elif broken == "no num-gpus":
        del service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"]


@pytest.mark.parametrize(
    "broken",
    [
        "own pid namespaces",
        "the GPU claimed by Ray only",
        "two GPUs in the claim",
        "replicas without a GPU",
        "the app in system memory",
        "no num-gpus",
    ],
)
def test_a_broken_gpu_copy_is_caught(broken: str) -> None:
    documents = copy.deepcopy(_gpu_documents())
    _break_gpu(documents, broken)
    assert len(gpu_problems(documents)) == 1, broken
