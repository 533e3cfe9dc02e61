"""Every public signature that takes the library's shared options holds them as
``ray_triton_shm._inference._options`` writes them once (``REQUEST_OPTIONS``,
``CALL_OPTIONS``, ``REGISTRATION_OPTIONS``): the same names, the same defaults, and the same
meanings. Each signature spells its options out (for IDEs and the API reference); the one
that defines an option's meaning (``infer_shm``, ``register_shm_model``) says it in the
table's words, and the others refer to it."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from ray_triton_shm import TritonSHMClient
from ray_triton_shm._inference._options import (
    CALL_OPTIONS,
    NOT_GIVEN,
    REGISTRATION_OPTIONS,
    RENAMED_REQUEST_OPTIONS,
    REQUEST_OPTIONS,
    Option,
    options_without_sequence,
    request_options,
)
from ray_triton_shm.ray import ShmModel, ShmPredictor, TritonNodeActor

SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
#: The options a ``ShmModel`` holds defaults of for its calls.
HANDLE_DEFAULTS = (
    "priority",
    "queue_timeout_s",
    "parameters",
    "requested_outputs",
    "outputs_as",
    "slot_timeout_s",
    "client_timeout_s",
)
REQUEST_AND_CALL = REQUEST_OPTIONS + RENAMED_REQUEST_OPTIONS + CALL_OPTIONS


def _some(
    options: tuple[Option, ...], *names: str, but: tuple[str, ...] = ()
) -> tuple[Option, ...]:
    """The options named (all of them when none is), but those in ``but``."""
    return tuple(o for o in options if (not names or o.name in names) and o.name not in but)


@dataclass(frozen=True)
class Copy:
    """A signature that spells out shared options.

    Attributes:
        name: How a failure names it.
        function: Whose signature it is.
        options: The shared options it takes.
        doc: Whose docstring documents them (a class documents its ``__init__``).
        refers_to: Where its options' meanings are written, named in its docstring (an entry
            of its own that names it, or its summary); empty for the signature that writes
            them, in the table's words.
        defaults: Defaults that differ by design (a handle's calls: ``None``, the handle's).
    """

    name: str
    function: Callable[..., Any]
    options: tuple[Option, ...]
    doc: Any = None
    refers_to: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)


def _words(text: str) -> str:
    return " ".join(text.split())


def documented(owner: Any) -> dict[str, str]:
    """Each argument its Google-style docstring's ``Args:`` section gives, with its text."""
    entries: dict[str, list[str]] = {}
    inside, current = False, None
    for line in (inspect.getdoc(owner) or "").splitlines():
        if line.strip() == "Args:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break  # the next section
        entry = re.match(r" {4}\**(\w+): ?(.*)", line)
        if entry:
            current = entry.group(1)
            entries[current] = [entry.group(2)]
        elif current is not None and line.startswith(" " * 8):
            entries[current].append(line)
    return {name: _words(" ".join(lines)) for name, lines in entries.items()}


def drift(copy: Copy) -> list[str]:
    """What ``copy`` says otherwise than the tables: a name missing or positional only, a
    default, a meaning; empty when it holds them."""
    found = []
    parameters = inspect.signature(copy.function).parameters
    owner = copy.doc or copy.function
    entries, whole = documented(owner), _words(inspect.getdoc(owner) or "")
    for option in copy.options:
        parameter = parameters.get(option.name)
        if parameter is None or parameter.kind not in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            found.append(f"{copy.name}: no keyword {option.name}")
            continue
        default = copy.defaults.get(option.name, option.default)
        if parameter.default != default or type(parameter.default) is not type(default):
            found.append(f"{copy.name}: {option.name}={parameter.default!r}, not {default!r}")
        entry = entries.get(option.name)
        if not copy.refers_to:
            if entry != _words(option.meaning):
                found.append(
                    f"{copy.name}: {option.name} means {entry!r}; the table says "
                    f"{_words(option.meaning)!r}"
                )
        elif not any(where in (whole if entry is None else entry) for where in copy.refers_to):
            found.append(
                f"{copy.name}: {option.name} means {entry!r}, which neither is the table's "
                f"meaning nor refers to {' or '.join(copy.refers_to)}"
            )
    return found


COPIES = (
    Copy("TritonSHMClient.infer_shm", TritonSHMClient.infer_shm, REQUEST_AND_CALL),
    Copy(
        "TritonSHMClient.infer_shm_async",
        TritonSHMClient.infer_shm_async,
        REQUEST_AND_CALL,
        refers_to=(":meth:`infer_shm`",),
    ),
    Copy(
        "TritonSHMClient.lease",
        TritonSHMClient.lease,
        _some(REQUEST_AND_CALL, but=(*SEQUENCE, "outputs_as")),
        refers_to=(":meth:`infer_shm`",),
    ),
    Copy(
        "TritonSHMClient.register_shm_model",
        TritonSHMClient.register_shm_model,
        REGISTRATION_OPTIONS,
    ),
    Copy(
        "TritonNodeActor.register",
        TritonNodeActor.register,
        REGISTRATION_OPTIONS,
        refers_to=("TritonSHMClient.register_shm_model",),
    ),
    Copy(
        "ShmModel",
        ShmModel.__init__,
        _some(REGISTRATION_OPTIONS, but=("replace",))
        + _some(REQUEST_AND_CALL, *HANDLE_DEFAULTS, "headers"),
        doc=ShmModel,
        refers_to=("TritonSHMClient.register_shm_model", "TritonSHMClient.infer_shm"),
    ),
    Copy(
        "ShmModel.options",
        ShmModel.options,
        _some(REQUEST_AND_CALL, *HANDLE_DEFAULTS),
        refers_to=(":meth:`infer`",),
        defaults=dict.fromkeys(HANDLE_DEFAULTS, NOT_GIVEN),
    ),
    *(
        Copy(
            f"ShmModel.{call.__name__}",
            call,
            REQUEST_OPTIONS + RENAMED_REQUEST_OPTIONS + _some(CALL_OPTIONS, "outputs_as")
            if call is not ShmModel.lease
            else _some(REQUEST_OPTIONS + RENAMED_REQUEST_OPTIONS, but=SEQUENCE),
            refers_to=("TritonSHMClient.infer_shm", ":meth:`infer`"),
            defaults={"priority": None, "outputs_as": None},
        )
        for call in (ShmModel.infer, ShmModel.infer_async, ShmModel.lease)
    ),
)


@pytest.mark.parametrize("copy", COPIES, ids=[copy.name for copy in COPIES])
def test_every_copy_holds_the_options_as_the_tables_write_them(copy: Copy) -> None:
    assert drift(copy) == []


def test_the_tables_name_each_option_once() -> None:
    for table in (REQUEST_OPTIONS + RENAMED_REQUEST_OPTIONS + CALL_OPTIONS, REGISTRATION_OPTIONS):
        names = [option.name for option in table]
        assert len(names) == len(set(names))


def test_the_checks_take_every_request_option_and_no_default() -> None:
    """The checker takes what every signature gives it, by the same names: the defaults are
    the signatures'."""
    for checker, names in (
        (request_options, [o.name for o in REQUEST_OPTIONS]),
        (options_without_sequence, [o.name for o in REQUEST_OPTIONS if o.name not in SEQUENCE]),
    ):
        parameters = list(inspect.signature(checker).parameters.values())[1:]
        assert [p.name for p in parameters] == names
        assert {p.default for p in parameters} == {inspect.Parameter.empty}


def test_shm_predictor_passes_shm_models_options_through() -> None:
    """``ShmPredictor`` takes ``ShmModel``'s options as ``**model_options``: none of its own
    hides one of them, and each option its docstring names there is one."""
    own = inspect.signature(ShmPredictor).parameters
    handle = inspect.signature(ShmModel).parameters
    assert own["model_options"].kind is inspect.Parameter.VAR_KEYWORD
    assert set(own) & set(handle) == {"model_name"}
    cited = set(re.findall(r"``(\w+)(?:=[^`]*)?``", documented(ShmPredictor)["model_options"]))
    assert cited and cited <= set(handle) | set(own)


def test_a_copy_that_drifts_is_found() -> None:
    """A name left out, a default changed, a meaning of its own: each is found."""

    def core(*, priority: int = 0, requested_outputs: Any = None) -> None:
        """Doc.

        Args:
            priority: Triton's priority level of the request (``0``: the model's default;
                ``1`` is the highest), for a model whose scheduler has ``priority_levels``.
            requested_outputs: Ask for these outputs only (``None``: all); only they are
                returned.
        """

    def other_default(*, priority: int = 1, requested_outputs: Any = None) -> None:
        """As for :meth:`core`."""

    def other_meaning(*, priority: int = 0, requested_outputs: Any = None) -> None:
        """Doc.

        Args:
            priority: The request's urgency.
        """

    def missing(*, priority: int = 0) -> None:
        """As for :meth:`core`."""

    options = _some(REQUEST_OPTIONS, "priority", "requested_outputs")
    assert drift(Copy("core", core, options)) == []
    assert (
        drift(Copy("refers", other_default, options, refers_to=("core",), defaults={"priority": 1}))
        == []
    )
    assert drift(Copy("default", other_default, options, refers_to=("core",))) == [
        "default: priority=1, not 0"
    ]
    meanings = drift(Copy("meaning", other_meaning, options))
    assert [found.partition(" means ")[0] for found in meanings] == [
        "meaning: priority",
        "meaning: requested_outputs",
    ]
    assert drift(Copy("meaning", other_meaning, options, refers_to=("core",))) != []
    assert drift(Copy("missing", missing, options, refers_to=("core",))) == [
        "missing: no keyword requested_outputs"
    ]
