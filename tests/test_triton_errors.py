"""Each of Triton's answers that ``_triton_errors`` reads, provoked from a real Triton.

One test (or one parametrized case) per message, named for it: a Triton whose wording
changed fails the test of that message. Each provokes the answer with plain gRPC calls (the
raw stub: its errors are ``grpc.RpcError``, as the engine's are), then checks that the
module's predicate recognizes it and that :func:`translate_error` gives the right exception
of ours, Triton's message kept.

Most messages come from the session's Triton. One Triton of the module's own serves the
rest: ``--model-control-mode=explicit`` (a model unloaded), a model whose queue holds one
request, and the ``shared-memory`` protocol restricted to a key.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.utils.shared_memory as shm
from _helpers import SHM_DIR, free_ports, local_triton, wait_for

from ray_triton_shm import (
    AccessDeniedError,
    ModelNotLoadedError,
    SharedMemoryNotAllowedError,
    TritonServerError,
)
from ray_triton_shm._wire import _triton_errors as words
from ray_triton_shm._wire._triton_errors import (
    answered_or_never_sent,
    expected_header,
    is_change_symptom,
    is_in_use,
    is_missing_region,
    is_queue_refusal,
    is_restart_symptom,
    is_unknown_model,
    is_unreachable,
    never_reached,
    output_overflow,
    status_and_message,
    translate_error,
)
from ray_triton_shm.local import LocalTritonServer, find_tritonserver
from ray_triton_shm.local._server import EXAMPLE_MODEL_REPOSITORY

#: The names (and /dev/shm keys) of this module's regions: a leak is found by its prefix.
PREFIX = f"rts_words_{os.getpid()}_"
#: Seconds a provocation that races Triton's scheduling may keep trying.
PROVOKE_WITHIN_S = 20.0
#: The key of the ``shared-memory`` protocol on the module's own Triton, and its header.
KEY_NAME = "words-key"
HEADER = f"triton-grpc-protocol-{KEY_NAME}"
#: The module's own Triton's model whose queue holds a single request.
QUEUE_OF_ONE = """
name: "queue_of_one"
backend: "python"
max_batch_size: 1
dynamic_batching { default_queue_policy { max_queue_size: 1 } }
input [
  { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DATA" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "ECHO" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""
#: A model the module's own Triton loads and unloads (an identity under another name).
UNLOADED = """
name: "unloaded"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

Tensor = tuple[pb.ModelInferRequest.InferInputTensor, bytes | None]


# --- requests, regions, servers ---------------------------------------------------------


def raw(name: str, array: np.ndarray, datatype: str | None = None) -> Tensor:
    """An input sent in the request, with ``datatype`` (numpy's own by default)."""
    datatype = datatype or {"float32": "FP32", "int32": "INT32"}[array.dtype.name]
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=list(array.shape)
    )
    return tensor, array.tobytes()


def in_region(name: str, array: np.ndarray, region: str) -> Tensor:
    """An FP32 input read from the start of the registered region ``region``."""
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=name, datatype="FP32", shape=list(array.shape)
    )
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = array.nbytes
    return tensor, None


def inference(
    model: str,
    *inputs: Tensor,
    outputs: tuple[pb.ModelInferRequest.InferRequestedOutputTensor, ...] = (),
    timeout_us: int | None = None,
) -> pb.ModelInferRequest:
    """A ``ModelInfer`` request; ``timeout_us``: how long it may wait in Triton's queue."""
    message = pb.ModelInferRequest(model_name=model, outputs=outputs)
    for tensor, contents in inputs:
        message.inputs.append(tensor)
        if contents is not None:
            message.raw_input_contents.append(contents)
    if timeout_us is not None:
        message.parameters["timeout"].int64_param = timeout_us
    return message


def output_in_region(
    name: str, region: str, byte_size: int
) -> pb.ModelInferRequest.InferRequestedOutputTensor:
    """An output to be written into the registered region ``region``."""
    output = pb.ModelInferRequest.InferRequestedOutputTensor(name=name)
    output.parameters["shared_memory_region"].string_param = region
    output.parameters["shared_memory_byte_size"].int64_param = byte_size
    return output


def refused(call: Callable[[], object]) -> grpc.RpcError:
    """The gRPC error ``call()`` raised (the test fails if it did not)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def unregister(stub: pb_grpc.GRPCInferenceServiceStub, name: str) -> None:
    """Unregisters the region ``name`` (nothing happens if Triton has none so named)."""
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name))


def register(stub: pb_grpc.GRPCInferenceServiceStub, name: str, byte_size: int) -> None:
    """Registers the system shared memory ``/name`` as the region ``name``."""
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name=name, key=f"/{name}", byte_size=byte_size)
    )


def ours_registered(stub: pb_grpc.GRPCInferenceServiceStub) -> set[str]:
    """This module's regions registered in the session's Triton."""
    status = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
    return {name for name in status.regions if name.startswith(PREFIX)}


def ours_in_dev_shm() -> set[str]:
    """This module's regions in /dev/shm."""
    return {path.name for path in SHM_DIR.iterdir() if path.name.startswith(PREFIX)}


def translated(
    exc: grpc.RpcError, kind: type[TritonServerError], model: str | None = None
) -> TritonServerError:
    """``translate_error(exc)``, checked: exactly a ``kind``, with Triton's status and
    message kept."""
    error = translate_error(exc, model=model, action="inference")
    assert type(error) is kind, f"{type(error).__name__}: {error}"
    assert error.status == str(exc.code())
    assert error.server_message == exc.details()
    assert status_and_message(exc) == (str(exc.code()), exc.details())
    return error


@pytest.fixture(scope="module")
def stub(triton: LocalTritonServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The raw gRPC stub of the session's Triton."""
    with grpc.insecure_channel(triton.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def _no_region_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, none of this module's regions is in /dev/shm or registered."""
    yield
    assert ours_in_dev_shm() == set(), "a region of the test is left in /dev/shm"
    if "stub" in request.fixturenames:
        assert ours_registered(request.getfixturevalue("stub")) == set()


@pytest.fixture
def regions(stub: pb_grpc.GRPCInferenceServiceStub) -> Iterator[Callable[[int], str]]:
    """``make(byte_size)``: a new region (zeros), registered in the session's Triton; its
    name. Each is unregistered and removed after the test."""
    made: list[tuple[str, object]] = []

    def make(byte_size: int) -> str:
        name = f"{PREFIX}{secrets.token_hex(4)}"
        made.append((name, shm.create_shared_memory_region(name, f"/{name}", byte_size)))
        register(stub, name, byte_size)
        return name

    yield make
    for name, handle in made:
        unregister(stub, name)
        shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def own_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A Triton of the module's own: explicit model control (``queue_of_one`` loaded,
    ``unloaded`` not), and the ``shared-memory`` protocol restricted to a key."""
    work = tmp_path_factory.mktemp("words")
    models = work / "models"

    def write(name: str, config: str, source: Path) -> None:
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
        (models / name / "1" / "model.py").symlink_to(source / "1" / "model.py")

    write("queue_of_one", QUEUE_OF_ONE, Path(__file__).parent / "models" / "delay_echo")
    with local_triton(
        models,
        log_path=work / "tritonserver.log",
        extra_args=["--model-control-mode=explicit", "--load-model=queue_of_one"],
        restricted_protocols={"shared-memory": (KEY_NAME, secrets.token_hex(8))},
    ) as server:
        # Only now: a model of the repository that is not loaded would keep start() waiting.
        write("unloaded", UNLOADED, EXAMPLE_MODEL_REPOSITORY / "identity")
        yield server


@pytest.fixture
def own_stub(own_triton: LocalTritonServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The raw gRPC stub of the module's own Triton."""
    with grpc.insecure_channel(own_triton.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


# --- restricted protocols ---------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "not-the-key"], ids=["without a key", "a wrong key"])
def test_this_protocol_is_restricted_expecting_header(
    own_stub: pb_grpc.GRPCInferenceServiceStub, key: str | None
) -> None:
    """Triton's "This protocol is restricted, expecting header '...'" (``_RESTRICTED``): answered
    ``UNAVAILABLE``, yet an answer, not Triton away."""
    metadata = None if key is None else ((HEADER, key),)
    exc = refused(
        lambda: own_stub.SystemSharedMemoryStatus(
            pb.SystemSharedMemoryStatusRequest(), metadata=metadata
        )
    )
    assert exc.code() == grpc.StatusCode.UNAVAILABLE
    assert expected_header(exc) == HEADER
    assert not is_unreachable(exc) and not never_reached(exc) and not is_restart_symptom(exc)
    assert answered_or_never_sent(exc)
    error = translated(exc, AccessDeniedError, model="identity")
    assert isinstance(error, AccessDeniedError) and error.header == HEADER


# --- shared memory regions --------------------------------------------------------------


def test_unable_to_open_shared_memory_region(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Triton's "Unable to open shared memory region: '...'" (``_UNOPENABLE``): a key that is in
    no /dev/shm Triton sees."""
    name = f"{PREFIX}nowhere"
    exc = refused(lambda: register(stub, name, 64))
    assert words._UNOPENABLE in exc.details()
    error = translated(exc, TritonServerError)
    assert "could not open the shared memory region" in str(error)
    assert exc.details() in str(error)


def test_unable_to_find_shared_memory_region(
    stub: pb_grpc.GRPCInferenceServiceStub, regions: Callable[[int], str]
) -> None:
    """Triton's "Unable to find shared memory region: '...'" (``is_missing_region``): a request
    names a region Triton no longer has (unregistered, or Triton restarted)."""
    x = np.ones((1, 4), np.float32)
    gone = regions(x.nbytes)
    unregister(stub, gone)
    exc = refused(lambda: stub.ModelInfer(inference("identity", in_region("INPUT0", x, gone))))
    assert is_missing_region(exc)
    assert not is_change_symptom(exc) and not is_unknown_model(exc)
    assert exc.details() in str(translated(exc, TritonServerError, model="identity"))


def test_cannot_unregister_currently_in_use(
    stub: pb_grpc.GRPCInferenceServiceStub, regions: Callable[[int], str]
) -> None:
    """Triton's "Cannot unregister shared memory region '...', it is currently in use."
    (``is_in_use``): a request still reads the region."""
    data = np.arange(4, dtype=np.float32)
    busy = regions(data.nbytes)
    busy_exc: grpc.RpcError | None = None

    def unregister_while_used() -> bool:
        nonlocal busy_exc
        call = stub.ModelInfer.future(
            inference(
                "delay_echo",
                raw("DELAY_MS", np.array([400], np.int32)),
                in_region("DATA", data, busy),
            )
        )
        try:
            unregister(stub, busy)
        except grpc.RpcError as exc:
            busy_exc = exc
        try:
            call.result()
        except grpc.RpcError:
            if busy_exc is not None:
                raise
        if busy_exc is None:  # unregistered before Triton had the request: again
            register(stub, busy, data.nbytes)
        return busy_exc is not None

    wait_for(unregister_while_used, timeout_s=PROVOKE_WITHIN_S, what="an unregister refused")
    assert busy_exc is not None
    assert is_in_use(busy_exc)
    assert not is_missing_region(busy_exc)
    assert busy_exc.details() in str(translated(busy_exc, TritonServerError))


def test_should_be_at_least_bytes_to_hold_the_results(
    stub: pb_grpc.GRPCInferenceServiceStub, regions: Callable[[int], str]
) -> None:
    """Triton's "shared memory size specified with the request for output '...' (N bytes) should be
    at least M bytes to hold the results" (``_OVERFLOW``, ``output_overflow``)."""
    x = np.ones((1, 8), np.float32)
    small = regions(16)
    exc = refused(
        lambda: stub.ModelInfer(
            inference(
                "identity", raw("INPUT0", x), outputs=(output_in_region("OUTPUT0", small, 16),)
            )
        )
    )
    match = output_overflow(exc.details())
    assert match is not None and match.groups() == ("OUTPUT0", "16", str(x.nbytes))
    assert is_change_symptom(exc)
    assert exc.details() in str(translated(exc, TritonServerError))


def _allows_client_shm_flag() -> bool:
    """Whether this tritonserver has an ``--allow-client-shm`` option (its ``--help``)."""
    install = find_tritonserver()
    done = subprocess.run(
        [str(install.executable), "--help"],
        env=install.environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "allow-client-shm" in done.stdout + done.stderr


def test_shared_memory_not_allowed(tmp_path: Path) -> None:
    """A refusal of client shared memory (``_REFUSAL_WORDS``, SharedMemoryNotAllowedError),
    from a Triton started with ``--allow-client-shm=false``.

    Triton 2.51 has no such option and no such refusal (none of its libraries holds a
    shared-memory message with any of those words): skipped there, run on a Triton that
    has the option.
    """
    if not _allows_client_shm_flag():
        pytest.skip("this tritonserver has no --allow-client-shm: it never refuses client shm")
    (tmp_path / "models").mkdir()
    with (
        local_triton(
            tmp_path / "models",
            log_path=tmp_path / "tritonserver.log",
            extra_args=["--allow-client-shm=false"],
        ) as server,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        name = f"{PREFIX}refused"
        handle = shm.create_shared_memory_region(name, f"/{name}", 64)
        try:
            exc = refused(lambda: register(pb_grpc.GRPCInferenceServiceStub(channel), name, 64))
        finally:
            shm.destroy_shared_memory_region(handle)
    lower = exc.details().lower()
    assert any(w in lower for w in words._REFUSAL_WORDS)
    translated(exc, SharedMemoryNotAllowedError)


# --- models -----------------------------------------------------------------------------


def test_request_for_unknown_model_is_not_found(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Triton's "Request for unknown model: '...' is not found" (``_UNKNOWN_MODEL``): a model that
    Triton never served. Not a restart symptom: only "no available versions" is."""
    x = np.ones((1, 4), np.float32)
    exc = refused(lambda: stub.ModelInfer(inference("no_such_model", raw("INPUT0", x))))
    assert exc.code() == grpc.StatusCode.NOT_FOUND
    assert is_unknown_model(exc)
    assert not is_restart_symptom(exc) and answered_or_never_sent(exc)
    translated(exc, ModelNotLoadedError, model="no_such_model")
    translated(exc, TritonServerError)  # with no model named: nothing to say is unloaded


def test_request_for_unknown_model_has_no_available_versions(
    own_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    """Triton's "Request for unknown model: '...' has no available versions"
    (``is_restart_symptom``, ``_UNKNOWN_MODEL``): the model was unloaded, as Triton shutting
    down answers."""
    own_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="unloaded"))
    own_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="unloaded"))
    x = np.ones((1, 4), np.float32)
    exc = refused(lambda: own_stub.ModelInfer(inference("unloaded", raw("INPUT0", x))))
    assert exc.code() == grpc.StatusCode.NOT_FOUND
    assert "no available versions" in exc.details()
    assert is_restart_symptom(exc) and is_unknown_model(exc)
    assert not is_unreachable(exc) and answered_or_never_sent(exc)
    translated(exc, ModelNotLoadedError, model="unloaded")


#: The alternatives of ``_REFUSALS``, in its order, each with the case(s) provoking it.
REFUSAL_ALTERNATIVES = (
    r"unexpected shape for input",
    r"batch-size must be <=",
    r"data-type is '[^']*', but model '[^']*' expects",
    r"unexpected datatype",
    r"unexpected inference (input|output)",
    r"missing required input",
    r"expected \d+ inputs but got",
    r"should be at least \d+ bytes to hold the results",
)


def test_every_refusal_alternative_has_a_case() -> None:
    """The cases below cover ``_REFUSALS``: an alternative added there needs one here."""
    assert "|".join(REFUSAL_ALTERNATIVES) == words._REFUSALS.pattern


F32 = np.ones((1, 4), np.float32)
VECTOR = np.ones(4, np.float32)
#: A request Triton refuses, by the alternative of ``_REFUSALS`` its answer matches (or
#: ``None`` where no request of Triton 2.51 gets such an answer).
REFUSALS: dict[str, tuple[str, Callable[[Callable[[int], str]], pb.ModelInferRequest] | None]] = {
    "unexpected shape for input": (
        REFUSAL_ALTERNATIVES[0],
        lambda _: inference(
            "add_nobatch",
            raw("INPUT0", np.ones(5, np.float32)),
            raw("INPUT1", VECTOR),
        ),
    ),
    "batch-size must be <=": (
        REFUSAL_ALTERNATIVES[1],
        lambda _: inference("identity", raw("INPUT0", np.ones((9, 4), np.float32))),
    ),
    "data-type is, but model expects": (
        REFUSAL_ALTERNATIVES[2],
        lambda _: inference("identity", raw("INPUT0", np.ones((1, 4), np.int32))),
    ),
    "unexpected datatype": (REFUSAL_ALTERNATIVES[3], None),
    "unexpected inference input": (
        REFUSAL_ALTERNATIVES[4],
        lambda _: inference("identity", raw("NOT_AN_INPUT", F32)),
    ),
    "unexpected inference output": (
        REFUSAL_ALTERNATIVES[4],
        lambda _: inference(
            "identity",
            raw("INPUT0", F32),
            outputs=(pb.ModelInferRequest.InferRequestedOutputTensor(name="NOT_AN_OUTPUT"),),
        ),
    ),
    "missing required input": (
        REFUSAL_ALTERNATIVES[5],
        lambda _: inference("add_nobatch", raw("INPUT0", VECTOR)),
    ),
    "expected N inputs but got": (
        REFUSAL_ALTERNATIVES[6],
        lambda _: inference(
            "add_nobatch",
            raw("INPUT0", VECTOR),
            raw("INPUT1", VECTOR),
            raw("INPUT2", VECTOR),
        ),
    ),
    "should be at least N bytes to hold the results": (
        REFUSAL_ALTERNATIVES[7],
        lambda regions: inference(
            "identity",
            raw("INPUT0", np.ones((1, 8), np.float32)),
            outputs=(output_in_region("OUTPUT0", regions(16), 16),),
        ),
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_as_for_another_config(
    stub: pb_grpc.GRPCInferenceServiceStub, regions: Callable[[int], str], case: str
) -> None:
    """Each alternative of ``_REFUSALS`` (``is_change_symptom``): Triton's refusal of a
    request laid out for another config of the model.

    "unexpected datatype" is in no answer of Triton 2.51 (it says "data-type is '...', but
    model '...' expects '...'", the case before): skipped.
    """
    alternative, make = REFUSALS[case]
    if make is None:
        pytest.skip(f"no request gets Triton 2.51 to answer {alternative!r}")
    exc = refused(lambda: stub.ModelInfer(make(regions)))
    assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL)
    assert re.search(alternative, exc.details()), exc.details()
    assert is_change_symptom(exc)
    assert not is_restart_symptom(exc) and answered_or_never_sent(exc)
    assert exc.details() in str(translated(exc, TritonServerError, model="identity"))


# --- Triton's queue ---------------------------------------------------------------------


def _refused_from_the_queue(
    stub: pb_grpc.GRPCInferenceServiceStub, make: Callable[[], pb.ModelInferRequest], n: int
) -> grpc.RpcError:
    """Sends ``n`` requests at once, again until Triton refuses one from its queue (whether
    one waits in the queue is Triton's scheduling); that refusal."""
    found: list[grpc.RpcError] = []

    def one_refused() -> bool:
        calls = [stub.ModelInfer.future(make()) for _ in range(n)]
        for call in calls:
            try:
                call.result()
            except grpc.RpcError as exc:
                found.append(exc)
        return bool(found)

    wait_for(one_refused, timeout_s=PROVOKE_WITHIN_S, what="a request refused by the queue")
    return found[0]


#: Triton's refusals from its queue, each provoked by a test below.
QUEUE_REFUSALS = ("Request timeout expired", "Exceeds maximum queue size")


def test_every_queue_refusal_has_a_test() -> None:
    """The tests below cover ``_QUEUE_REFUSALS``: a wording added there needs one here."""
    assert QUEUE_REFUSALS == words._QUEUE_REFUSALS


def check_queue_refusal(exc: grpc.RpcError, wording: str) -> None:
    """``exc`` is Triton's refusal ``wording`` from its queue (``is_queue_refusal``):
    answered ``UNAVAILABLE``, yet an answer (Triton never ran the request), not Triton
    away."""
    assert exc.code() == grpc.StatusCode.UNAVAILABLE
    assert wording in exc.details()
    assert is_queue_refusal(exc)
    assert not is_unreachable(exc) and not is_restart_symptom(exc)
    assert answered_or_never_sent(exc)
    assert exc.details() in str(translated(exc, TritonServerError, model="queued"))


def test_request_timeout_expired(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Triton's "Request timeout expired" (``_QUEUE_REFUSALS``): the request's own timeout ran out
    in the queue (the ``queued`` model rejects such requests)."""
    # One runs 300 ms while the other waits: its 100 ms in the queue expire.
    exc = _refused_from_the_queue(
        stub,
        lambda: inference(
            "queued",
            raw("DELAY_MS", np.array([[300]], np.int32)),
            raw("DATA", F32),
            timeout_us=100_000,
        ),
        2,
    )
    check_queue_refusal(exc, QUEUE_REFUSALS[0])


def test_exceeds_maximum_queue_size(own_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Triton's "Exceeds maximum queue size" (``_QUEUE_REFUSALS``): the model's queue was full."""
    # One runs, one waits in the queue of one: the others find it full.
    exc = _refused_from_the_queue(
        own_stub,
        lambda: inference(
            "queue_of_one", raw("DELAY_MS", np.array([[300]], np.int32)), raw("DATA", F32)
        ),
        4,
    )
    check_queue_refusal(exc, QUEUE_REFUSALS[1])


# --- no Triton --------------------------------------------------------------------------


def test_failed_to_connect() -> None:
    """gRPC's "failed to connect to all addresses; ..." (``never_reached``): nothing listens
    at Triton's address. The request never left: Triton away, and nothing runs it."""
    (port,) = free_ports(1)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        nobody = pb_grpc.GRPCInferenceServiceStub(channel)
        exc = refused(lambda: nobody.ServerReady(pb.ServerReadyRequest(), timeout=10))
    assert exc.code() == grpc.StatusCode.UNAVAILABLE
    assert never_reached(exc)
    assert is_unreachable(exc) and is_restart_symptom(exc) and answered_or_never_sent(exc)
    assert expected_header(exc) is None and not is_queue_refusal(exc)
    assert exc.details() in str(translated(exc, TritonServerError))
