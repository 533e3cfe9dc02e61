"""``ray-triton-shm doctor``: is this machine set up for Triton's shared memory?

Shared memory fails most often at deployment: Triton in another container with another
``/dev/shm``, Triton running as another uid, Docker's 64 MB ``/dev/shm``, a missing access key,
Triton not where ``$RAY_TRITON_SHM_URL`` says. The library reports each of these on the first
request that meets it; :func:`check_node` finds them all before any traffic, each with its fix:

* ``triton``: reachable, live and ready, its version, the system shared memory extension;
* ``region``: the transport the models will get (``--transport``, default ``auto``): a tiny
  region made here, registered in Triton and removed again; when Triton cannot open it, a
  second region readable by everyone tells another uid (it opens that one) from another
  ``/dev/shm`` (it opens neither). Then ``auto`` sends the tensors by value (a warning), and
  ``shm`` fails;
* ``keys``: each protocol the library calls is allowed with this machine's
  ``RAY_TRITON_SHM_HEADER_*`` keys (a refusal names the header, never a value);
* ``models``: Triton serves each model named (``--model``); one it does not is named with the
  models it does serve, and the nearest name;
* ``dev_shm``: room in ``/dev/shm`` for the pools and for Ray's object store;
* ``leftovers``: regions whose owner is gone;
* ``versions``: Python, numpy, tritonclient, Ray, this library and Triton.

It leaves nothing behind, and an unreachable Triton fails within ``timeout_s``. It talks to
Triton as the library's clients do, over a :class:`~.._wire._channel.Channel`; what it found, and
that as text, is :mod:`._doctor_report`.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import platform
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from tritonclient.grpc import service_pb2

from .._defaults import DEFAULT_URL, HTTP_URL_ENV_VAR, URL_ENV_VAR
from .._inference._transport import AUTO_TRANSPORT, INLINE, TRANSPORTS, region_refusal
from .._slots._memory import BY_VALUE, SYSTEM, region_bytes
from .._slots._shm import DEAD, SHM_DIR, mib, object_store_in_dev_shm, own_raylet, shm_space
from .._slots._sizing import default_autoscaling
from .._slots._specs import SlotLayout, resolve_model_spec
from .._wire._channel import Channel
from .._wire._http import HttpRoute, candidate_http_urls, http_headers, prove_same_triton
from .._wire._keys import KEYS_DIR_ENV_VAR, Keys, env_var_for
from .._wire._tls import TLS_DIR_ENV_VAR, TlsFiles, diagnose
from .._wire._triton_errors import (
    expected_header,
    is_unopenable,
    never_reached,
    status_and_message,
    translate_error,
)
from ._doctor_report import FAIL, OK, SKIP, WARN, CheckResult, NodeReport, transport_result
from ._region_status import region_status

__all__ = ["check_node", "url_for_node"]

#: Below this much ``/dev/shm`` with nothing else known, it is most likely Docker's default.
_DOCKER_DEFAULT_SHM = 64 * 2**20
#: A model no Triton serves: a call about it that Triton answers "unknown" was allowed.
_NO_MODEL = "__ray_triton_shm_doctor__"


def url_for_node(url: str | None) -> tuple[str, str]:
    """The Triton address the node actor of this machine would use, and where it comes from."""
    if url:
        return url, "--url"
    if os.environ.get(URL_ENV_VAR):
        return os.environ[URL_ENV_VAR], f"${URL_ENV_VAR}"
    return DEFAULT_URL, "the default"


def check_node(
    *,
    url: str | None = None,
    url_source: str | None = None,
    models: Mapping[str, int | None] | None = None,
    held: Mapping[str, int] | None = None,
    object_store_bytes: int = 0,
    node: str = "",
    timeout_s: float = 5.0,
    root_certificates: str | None = None,
    ssl: bool = False,
    private_key: str | None = None,
    certificate_chain: str | None = None,
    tls_dir: str | None = None,
    transport: str = AUTO_TRANSPORT,
) -> NodeReport:
    """Runs every check on this machine.

    Args:
        url: Triton's gRPC address; ``None``: ``$RAY_TRITON_SHM_URL``, else the default.
        url_source: Where ``url`` came from, for the report (when the caller chose it).
        models: Pools this machine would hold: ``{model: pool_size}`` (``None``: a pool that
            follows its load, counted at its default ``max_slots``; its ``min_slots`` must
            fit), sized from the model's configuration on Triton.
        held: Pools the node actor holds already: ``{model: bytes}``, at their largest.
        object_store_bytes: Ray's object store on this node (counted if it lives in
            ``/dev/shm``); ``0``: no Ray, or unknown.
        node: The Ray node id, for the report.
        timeout_s: The longest wait for one answer from Triton.
        root_certificates: PEM file of the CA that signed Triton's certificate (TLS).
        ssl: Talk TLS to Triton (with the system's CAs unless ``root_certificates``).
        private_key: PEM file of the client's key (mutual TLS).
        certificate_chain: PEM file of the client's certificate (mutual TLS).
        tls_dir: A directory of TLS files as cert-manager writes them, used when ``ssl`` is
            false and no file is given; ``None``: ``$RAY_TRITON_SHM_TLS_DIR`` if set (as the
            library's clients on this node).
        transport: The ``transport=`` the models will be registered with: ``"auto"`` (the
            ``region`` check warns where they would go by value), ``"shm"`` (it fails there)
            or ``"inline"``.

    Raises:
        ValueError: an unknown ``transport``.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    started = time.monotonic()
    chosen, source = url_for_node(url)
    keys, keys_error = _node_keys()
    given = {
        "ssl": ssl or any(f is not None for f in (root_certificates, private_key)),
        "root_certificates": root_certificates,
        "private_key": private_key,
        "certificate_chain": certificate_chain,
    }
    tls = _node_tls(given, tls_dir)
    # The doctor waits out no restart: an unreachable Triton fails within timeout_s.
    with contextlib.closing(Channel.open(chosen, tls[0], keys, reconnect_timeout_s=0.0)) as channel:
        triton = _Triton(channel, timeout_s, keys_error, node)
        pools = _Pools(models or {}, held or {}, object_store_bytes)
        checks = _run_checks(triton, tls, transport, pools)
    return NodeReport(
        node=node,
        hostname=socket.gethostname(),
        url=chosen,
        url_source=url_source or source,
        checks=checks,
        elapsed_s=round(time.monotonic() - started, 3),
    )


def _node_keys() -> tuple[Keys, str | None]:
    """The keys this node's clients send, and why its key files cannot be read, if not."""
    try:
        return Keys(environ=True), None
    except ValueError as exc:  # names the directory, never a value
        return Keys(environ=True, files=False), str(exc)


def _node_tls(given: dict[str, Any], tls_dir: str | None) -> tuple[TlsFiles | None, str | None]:
    """The TLS files this node's clients use (``None``: plain gRPC), and why they cannot be
    read, if not."""
    try:
        return TlsFiles.from_options(given, tls_dir), None
    except ValueError as exc:
        return None, str(exc)


class _Pools(NamedTuple):
    """What the node holds and would hold in ``/dev/shm`` (see :func:`check_node`)."""

    models: Mapping[str, int | None]
    held: Mapping[str, int]
    object_store_bytes: int


def _run_checks(
    triton: _Triton, tls: tuple[TlsFiles | None, str | None], transport: str, pools: _Pools
) -> list[CheckResult]:
    """Every check, in order: a check that raises fails, saying so, and the next runs."""
    checks: list[CheckResult] = []
    for name, run in (
        ("tls", lambda: _check_tls(triton, *tls)),
        ("triton", triton.check),
        ("region", lambda: _check_region(triton, transport)),
        ("http", lambda: _check_http(triton, tls[0])),
        ("keys", lambda: _check_keys(triton)),
        ("models", lambda: _check_models(triton, list(pools.models))),
        ("dev_shm", lambda: _check_dev_shm(triton, pools)),
        ("leftovers", lambda: _check_leftovers(triton)),
        ("versions", lambda: _check_versions(triton)),
    ):
        try:
            checks.append(run())
        except Exception as exc:
            checks.append(CheckResult(name, FAIL, f"the check itself failed: {exc!r}"))
    return checks


def _check_tls(triton: _Triton, tls: TlsFiles | None, error: str | None) -> CheckResult:
    if error is not None:
        return CheckResult(
            "tls", FAIL, error, f"mount the TLS files there, or fix ${TLS_DIR_ENV_VAR}"
        )
    details = {"tls": tls is not None, "mutual": tls is not None and tls.mutual}
    if not _listens(triton.url, triton.timeout_s):
        return CheckResult("tls", SKIP, "not tried: nothing listens there (see triton)")
    problem = diagnose(triton.url, tls, timeout_s=triton.timeout_s)
    if problem is not None:
        reason, fix = problem
        triton.tls_problem = reason
        what = {
            "tls_required": "Triton speaks TLS and this node's clients do not",
            "plain_server": "this node's clients speak TLS and Triton does not",
            "client_certificate_required": "Triton wants a client certificate (mutual TLS); "
            "this node's clients have none",
            "client_certificate_refused": "Triton refuses this node's client certificate",
            "server_certificate_untrusted": "this node's clients do not trust Triton's certificate",
        }.get(reason, "the TLS handshake with Triton fails")
        return CheckResult("tls", FAIL, what, fix, {**details, "reason": reason})
    if tls is None:
        return CheckResult("tls", OK, "plain gRPC (Triton asks for no TLS)", "", details)
    ca = tls.root_certificates or "the system's CAs"
    summary = f"TLS, Triton's certificate verified with {ca}"
    if tls.mutual:
        summary = f"mutual {summary}; Triton took the client certificate {tls.certificate_chain}"
    return CheckResult("tls", OK, summary, "", details)


def _listens(url: str, timeout_s: float) -> bool:
    host, _, port = url.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout_s):
            return True
    except (OSError, ValueError):
        return False


class _Triton:
    """The doctor's calls to Triton over ``channel``, each waiting ``timeout_s`` at most, and
    what the first of them found out."""

    def __init__(
        self, channel: Channel, timeout_s: float, keys_error: str | None, node: str
    ) -> None:
        self.channel = channel
        self.url = channel.url
        self.headers = channel.keys.headers
        self.timeout_s = timeout_s
        self.reachable = False
        self.version = ""
        self.refused: dict[str, str] = {}  # protocol -> the header Triton wants
        self.keys_dir: Path | None = channel.keys.keys_dir
        self.keys_error = keys_error
        self.tls_problem: str | None = None
        self.node = node  # the Ray node id, if the check runs for one
        self.by_value = False  # the models send their tensors by value (see region)

    def call(self, method: str, request: Any) -> Any:
        rpc: Callable[..., Any] = getattr(self.channel.stub, method)
        return rpc(request, metadata=self.channel.metadata(), timeout=self.timeout_s)

    def check(self) -> CheckResult:
        try:
            live = self.call("ServerLive", service_pb2.ServerLiveRequest()).live
        except grpc.RpcError as exc:
            header = expected_header(exc)
            if header is None:
                return self._unreachable(exc)
            self.reachable = True
            self.refused["health"] = header
            return CheckResult(
                "triton",
                FAIL,
                f"Triton answers at {self.url}, but refused to say whether it is live: its "
                "health protocol is restricted (see keys)",
                _key_fix(header, self.headers, self.keys_dir),
            )
        self.reachable = True
        ready = self.call("ServerReady", service_pb2.ServerReadyRequest()).ready
        extensions: list[str] | None = None
        try:
            meta = self.call("ServerMetadata", service_pb2.ServerMetadataRequest())
        except grpc.RpcError as exc:
            header = expected_header(exc)
            if header is None:
                raise
            self.refused["metadata"] = header
        else:
            self.version = meta.version
            extensions = list(meta.extensions)
        details = {"live": live, "ready": ready, "version": self.version, "extensions": extensions}
        about = f"Triton {self.version or '(version not told)'} at {self.url}"
        if not (live and ready):
            return CheckResult(
                "triton",
                FAIL,
                f"{about} is {'live' if live else 'not live'} but not ready (a model failed to "
                "load, or it is starting or stopping)",
                "look at Triton's log; with --strict-readiness every model must load",
                details,
            )
        if extensions is not None and "system_shared_memory" not in extensions:
            return CheckResult(
                "triton",
                FAIL,
                f"{about} is ready but has no system shared memory extension",
                "use a Triton build with system shared memory (any official release has it)",
                details,
            )
        known = "" if extensions is not None else " (extensions not told: see keys)"
        return CheckResult(
            "triton",
            OK,
            f"{about} is live and ready, with system shared memory{known}",
            "",
            details,
        )

    def _unreachable(self, exc: grpc.RpcError) -> CheckResult:
        status, message = status_and_message(exc)
        lower = message.lower()
        if self.tls_problem is not None:
            return CheckResult(
                "triton",
                FAIL,
                f"Triton at {self.url} cannot be talked to: TLS stands in between (see tls)",
                "see tls",
                {"status": status, "message": message},
            )
        if any(w in lower for w in ("dns resolution failed", "errors resolving", "not known")):
            what = f"the host of {self.url} does not resolve"
        elif status == str(grpc.StatusCode.DEADLINE_EXCEEDED):
            what = f"nothing answered at {self.url} within {self.timeout_s:g} s"
        elif never_reached(exc):
            what = f"nothing listens at {self.url} (connection refused)"
        else:
            what = f"Triton could not be asked at {self.url}: {status}: {message}"
        return CheckResult(
            "triton",
            FAIL,
            what,
            f"start Triton on this node, or give its gRPC address with --url or "
            f"${URL_ENV_VAR} on the node",
            {"status": status, "message": message},
        )


def _key_fix(header: str, headers: Mapping[str, str], keys_dir: Path | None) -> str:
    variable = env_var_for(header)
    if header in headers:
        return (
            f"the {header!r} key is set (in ${variable} or a key file), but not to the key "
            "Triton expects: set it to that key"
        )
    where = f"in {keys_dir}" if keys_dir is not None else f"in ${KEYS_DIR_ENV_VAR}"
    return (
        f"put Triton's key in a file named {header!r} {where} (a mounted Secret), or set "
        f"${variable} on this node"
    )


def _skipped(name: str, triton: _Triton, needs: str | None = None) -> CheckResult | None:
    if not triton.reachable:
        return CheckResult(name, SKIP, "not tried: Triton cannot be reached (see triton)")
    if needs is not None and needs in triton.refused:
        return CheckResult(name, SKIP, f"not tried: Triton refused the {needs} protocol (see keys)")
    return None


# ---- region ---------------------------------------------------------------------------


def _check_region(triton: _Triton, asked: str) -> CheckResult:
    skipped = _skipped("region", triton)
    if skipped:
        return skipped
    error = _register_probe(triton, mode=0o600)
    if error is None:
        found = f"Triton opened a region made here in {SHM_DIR} (mode 0600), and it is gone again"
        return _transport(triton, transport_result(asked, found))
    header = expected_header(error)
    if header is not None:
        triton.refused["shared-memory"] = header
        return CheckResult(
            "region", SKIP, "not tried: Triton refused the shared-memory protocol (see keys)"
        )
    if not is_unopenable(error):
        translated = translate_error(error, action="registering a region")
        return CheckResult("region", FAIL, str(translated), "", {"server_message": error.details()})
    # Triton cannot open our region: a region anyone may open tells a uid from a /dev/shm.
    if _register_probe(triton, mode=0o666) is None:
        found = (
            f"Triton runs as another user than this process (uid {os.getuid()}): it opened a "
            "region readable by everyone, not the library's, which are its owner's only (0600)"
        )
        fix = (
            "run Triton and Ray as the same uid: `docker run --user` on both, or the same "
            "securityContext.runAsUser on both containers in Kubernetes"
        )
        details: dict[str, Any] = {"cause": "uid", "uid": os.getuid()}
    else:
        found = (
            f"Triton cannot see regions made here: it has another {SHM_DIR} than this process "
            "(another container, pod or machine)"
        )
        fix = (
            "share /dev/shm: `docker run --ipc=container:<triton>` (or --ipc=host) for Ray, or "
            "in Kubernetes Triton as a sidecar with one `medium: Memory` emptyDir at /dev/shm "
            "in both containers, and Triton's address on this node (localhost)"
        )
        details = {"cause": "dev_shm"}
    return _transport(triton, transport_result(asked, found, fix, details))


def _transport(triton: _Triton, result: CheckResult) -> CheckResult:
    """Notes whether the models go by value (the checks after ``region`` look at it)."""
    triton.by_value = result.details["transport"] == INLINE
    return result


def _register_probe(
    triton: _Triton, *, mode: int, then: Callable[[str], object] | None = None
) -> grpc.RpcError | None:
    """Triton's refusal of a region of ``mode`` made here, or ``None`` (see
    :func:`region_refusal`)."""
    metadata = triton.channel.metadata()
    stub = triton.channel.stub
    return region_refusal(stub, metadata, triton.timeout_s, label="doctor", mode=mode, then=then)


def _check_http(triton: _Triton, tls: TlsFiles | None) -> CheckResult:
    """Where the requests that point Triton at a slot go: its HTTP endpoint, proven the same
    Triton as the client's does (see ``TritonSHMClient(http_url=...)``), or gRPC."""
    skipped = _skipped("http", triton, "shared-memory")
    if skipped:
        return skipped
    if triton.by_value:
        return CheckResult(
            "http",
            SKIP,
            "not tried: the tensors go by value (see region); a client's requests go over "
            "Triton's HTTP endpoint once its statistics of a model that ran prove it the same "
            "Triton, else over gRPC (shm_stats().protocol says which)",
        )
    if tls is not None:
        return CheckResult("http", OK, "TLS: every request goes over gRPC (HTTP is plain text)")
    urls = candidate_http_urls(triton.url)
    found: list[tuple[HttpRoute | None, str]] = []

    def prove(region: str) -> None:
        for url in urls:  # as the client's http_url="auto" does
            route, reason = prove_same_triton(url, region, http_headers(triton.channel.metadata()))
            found.append((route, reason))
            if route is not None:
                return

    error = _register_probe(triton, mode=0o600, then=prove)
    if error is not None or not found:
        return CheckResult("http", SKIP, "not tried: no region could be registered (see region)")
    route, reason = found[-1]
    url = urls[len(found) - 1]
    if route is not None:
        route.close()
        return CheckResult(
            "http",
            OK,
            f"the requests that point Triton at a slot go over {reason}",
            details={"protocol": "http", "http_url": url},
        )
    reason = "; ".join(r for _, r in found)
    return CheckResult(
        "http",
        WARN,
        f"the requests that point Triton at a slot go over gRPC, about twice the cost of "
        f"HTTP on small requests: {reason}",
        f"give Triton's HTTP address in ${HTTP_URL_ENV_VAR} on this node (or http_url=... "
        "in the client's options), or serve HTTP on a port next to gRPC's",
        {"protocol": "grpc", "http_url": urls[0], "reason": reason},
    )


# ---- keys -----------------------------------------------------------------------------

#: The protocols the library calls, each with a request Triton answers when it is allowed.
_PROTOCOLS: tuple[tuple[str, str, Callable[[], Any]], ...] = (
    ("health", "ServerReady", service_pb2.ServerReadyRequest),
    ("metadata", "ServerMetadata", service_pb2.ServerMetadataRequest),
    ("model-config", "ModelConfig", lambda: service_pb2.ModelConfigRequest(name=_NO_MODEL)),
    ("shared-memory", "SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest),
    ("inference", "ModelInfer", lambda: service_pb2.ModelInferRequest(model_name=_NO_MODEL)),
)


def _check_keys(triton: _Triton) -> CheckResult:
    skipped = _skipped("keys", triton)
    if skipped:
        return skipped
    names = sorted(triton.headers)
    source = f" (key files: {triton.keys_dir})" if triton.keys_dir is not None else ""
    keys_set = f"keys set: {', '.join(names)}{source}" if names else "no keys set"
    if triton.keys_error is not None:
        return CheckResult(
            "keys",
            FAIL,
            triton.keys_error,
            f"mount the Secret's files there, or fix ${KEYS_DIR_ENV_VAR}",
            {"headers": names},
        )
    refused: dict[str, str] = {}
    for protocol, method, request in _PROTOCOLS:
        try:
            triton.call(method, request())
        except grpc.RpcError as exc:
            header = expected_header(exc)
            if header is not None:
                refused[protocol] = header
    triton.refused.update(refused)
    details = {"headers": names, "refused": refused}
    if not refused:
        return CheckResult(
            "keys",
            OK,
            f"every protocol the library calls is allowed ({', '.join(p[0] for p in _PROTOCOLS)}"
            f"; {keys_set}, values not shown)",
            "",
            details,
        )
    by_header: dict[str, list[str]] = {}
    for protocol, header in refused.items():
        by_header.setdefault(header, []).append(protocol)
    what = "; ".join(
        f"{', '.join(protocols)} refused without {header!r}"
        + (" (set, but not to Triton's key)" if header in triton.headers else "")
        for header, protocols in by_header.items()
    )
    fix = "; ".join(_key_fix(header, triton.headers, triton.keys_dir) for header in by_header)
    return CheckResult("keys", FAIL, f"{what} ({keys_set})", fix, details)


# ---- models ---------------------------------------------------------------------------


def _check_models(triton: _Triton, models: Sequence[str]) -> CheckResult:
    if not models:
        return CheckResult(
            "models", OK, "no model named (doctor --model NAME checks that Triton serves it)"
        )
    skipped = _skipped("models", triton, "health")
    if skipped:
        return skipped
    missing = [model for model in models if not _model_ready(triton, model)]
    served = _served_models(triton)
    details: dict[str, Any] = {"asked": list(models), "missing": missing, "served": served}
    if not missing:
        return CheckResult("models", OK, f"Triton serves {', '.join(models)}", "", details)
    if served is None:
        serves = (
            "which models it serves it did not say (its model-repository protocol is restricted)"
        )
    else:
        serves = f"it serves {', '.join(served) if served else 'no model'}"
    nearest = {
        model: close[0]
        for model in missing
        if (close := difflib.get_close_matches(model, served or [], n=1))
    }
    guesses = "".join(f"; {model!r}: did you mean {near!r}?" for model, near in nearest.items())
    names = ", ".join(repr(model) for model in missing)
    return CheckResult(
        "models",
        FAIL,
        f"Triton at {triton.url} does not serve {names}: {serves}{guesses}",
        "name a model Triton serves, or have it load the model (in its model repository; "
        "with --model-control-mode=explicit, load it)",
        {**details, "nearest": nearest},
    )


def _model_ready(triton: _Triton, model: str) -> bool:
    try:
        return bool(triton.call("ModelReady", service_pb2.ModelReadyRequest(name=model)).ready)
    except grpc.RpcError:
        return False


def _served_models(triton: _Triton) -> list[str] | None:
    """The models Triton serves (ready), sorted; ``None`` where it would not say."""
    try:
        index = triton.call("RepositoryIndex", service_pb2.RepositoryIndexRequest(ready=True))
    except grpc.RpcError:
        return None
    return sorted({model.name for model in index.models})


# ---- /dev/shm -------------------------------------------------------------------------


def _check_dev_shm(triton: _Triton, pools: _Pools) -> CheckResult:
    models, held, object_store_bytes = pools
    space = shm_space()
    if space is None:
        return CheckResult("dev_shm", WARN, f"{SHM_DIR} cannot be read: is it mounted?")
    free, total = space
    least, new, unsized = _pool_sizes(triton, models)
    in_dev_shm = object_store_in_dev_shm(object_store_bytes, triton.node, total)
    store = object_store_bytes if in_dev_shm else 0
    # Pools that follow their load are counted at their largest: what they may come to hold.
    demand = sum(held.values()) + sum(new.values()) + store
    details: dict[str, Any] = {
        "free": free,
        "total": total,
        "held": dict(held),
        "new": new,
        "new_least": least,
        "unsized": unsized,
        "object_store": store,
        "raylet": own_raylet(triton.node) if object_store_bytes else None,
        "demand": demand,
    }
    parts = [f"pools held {mib(sum(held.values()))}"] if held else []
    parts += [f"{m} {mib(b)}" for m, b in new.items()]
    if store:
        parts.append(f"Ray's object store {mib(store)}")
    needs = f"needs {mib(demand)} ({', '.join(parts)})" if parts else "no pools known"
    summary = f"{mib(total)} in all, {mib(free)} free; {needs}"
    if unsized:
        summary += f"; not sized: {'; '.join(f'{m}: {why}' for m, why in unsized.items())}"
    suggested = 2 ** max(6, (2 * max(demand, 1) - 1).bit_length() - 20)  # MiB, a power of 2
    fix = (
        f"give /dev/shm at least {suggested} MiB: `docker run --shm-size={suggested}m`, or in "
        f"Kubernetes an emptyDir with `medium: Memory` and `sizeLimit: {suggested}Mi` at "
        "/dev/shm; or smaller pools (pool_size, max_batch_size)"
    )
    fits_least = (
        sum(least.values()) <= free and demand - sum(new.values()) + sum(least.values()) <= total
    )
    if not fits_least:
        return CheckResult("dev_shm", FAIL, summary + ": it does not fit", fix, details)
    if sum(new.values()) > free or demand > total:
        return CheckResult(
            "dev_shm",
            WARN,
            summary + ": pools that follow their load stop growing short of their max_slots "
            "(their smallest sizes fit)",
            fix,
            details,
        )
    if demand and total < 2 * demand:
        return CheckResult("dev_shm", WARN, summary + ": less than twice that", fix, details)
    if not demand and total <= _DOCKER_DEFAULT_SHM:
        return CheckResult(
            "dev_shm",
            WARN,
            summary + f": {mib(total)} is Docker's default, too small for most pools",
            fix.replace(f"at least {suggested} MiB", "room for the pools (say 1024 MiB)")
            .replace(f"{suggested}m", "1g")
            .replace(f"{suggested}Mi", "1Gi"),
            details,
        )
    return CheckResult("dev_shm", OK, summary, "", details)


def _pool_sizes(
    triton: _Triton, models: Mapping[str, int | None]
) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
    """Bytes of each model's pool at its smallest and at its largest size (the same for a
    fixed ``pool_size``), from its configuration on Triton; and why others could not be
    sized."""
    least: dict[str, int] = {}
    sizes: dict[str, int] = {}
    unsized: dict[str, str] = {}
    for model, pool_size in models.items():
        if not triton.reachable:
            unsized[model] = "Triton cannot be reached"
            continue
        try:
            spec = resolve_model_spec(
                model,
                inputs=None,
                outputs=None,
                max_batch_size=None,
                model_version="",
                max_shapes=None,
                load_config=functools.partial(triton.channel.model_config, model, ""),
            )
        except Exception as exc:
            unsized[model] = str(exc)
            continue
        layout, elastic = SlotLayout.for_model(spec), default_autoscaling()
        kind = BY_VALUE if triton.by_value else SYSTEM  # by value: a region of the header alone
        least[model] = region_bytes(kind, layout, pool_size or elastic.min_slots)
        sizes[model] = region_bytes(kind, layout, pool_size or elastic.max_slots)
    return least, sizes, unsized


# ---- leftovers, versions --------------------------------------------------------------


def _check_leftovers(triton: _Triton) -> CheckResult:
    asked = triton.reachable and "shared-memory" not in triton.refused
    report = region_status(triton.url if asked else None, headers=triton.headers)
    dead = [r for r in report.regions if r.owner == DEAD]
    held = sum(r.size for r in dead)
    details = {"regions": [r.name for r in dead], "bytes": held}
    where = "" if asked and not report.server_error else " (in /dev/shm only: Triton not asked)"
    if not dead:
        return CheckResult("leftovers", OK, f"no region whose owner is gone{where}", "", details)
    return CheckResult(
        "leftovers",
        WARN,
        f"{len(dead)} region(s) whose owner is gone hold {mib(held)}{where}",
        "`ray-triton-shm reclaim` removes them (a restarted node actor does too)",
        details,
    )


def _check_versions(triton: _Triton) -> CheckResult:
    versions = {"python": platform.python_version()}
    for package in ("numpy", "tritonclient", "grpcio", "ray", "ray-triton-shm"):
        try:
            versions[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["triton"] = triton.version or "unknown"
    summary = ", ".join(f"{name} {version}" for name, version in versions.items())
    return CheckResult("versions", OK, summary, "", versions)
