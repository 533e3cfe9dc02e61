"""How big a model's pool is: a fixed number of slots, or bounds and delays for a pool that
follows its load (:class:`SlotAutoscaling`; the policy that follows it is
:mod:`.._pools._scaling`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .._exceptions import ModelSpecError
from ._header import MAX_SLOTS

__all__ = ["SlotAutoscaling", "default_autoscaling", "pool_sizing"]


@dataclass(frozen=True)
class SlotAutoscaling:
    """How a model's pool follows its load (a pool of fixed size is ``pool_size=``).

    The counterpart for slots of Ray Serve's ``autoscaling_config`` for replicas, with a target
    of no caller waiting for a slot.

    Attributes:
        min_slots: Slots the pool keeps when idle (it starts with as many).
        max_slots: Slots it may grow to: the most requests in flight for the model at once
            (on the node, in the Ray layer); past it callers wait in turn, and past
            ``max_waiting`` of them get :class:`OverloadedError`. At most 116 (a region's
            header has room for no more).
        upscale_delay_s: How long callers must have been waiting for a slot before the pool
            grows.
        downscale_delay_s: How long the pool must have had more slots than its callers used
            at once before it shrinks (to the most they used at once over that time).
    """

    min_slots: int = 2
    max_slots: int = 64
    upscale_delay_s: float = 0.2
    downscale_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_slots <= self.max_slots <= MAX_SLOTS:
            raise ModelSpecError(
                f"autoscaling needs 1 <= min_slots <= max_slots <= {MAX_SLOTS}, got "
                f"min_slots={self.min_slots}, max_slots={self.max_slots}"
            )
        for name in ("upscale_delay_s", "downscale_delay_s"):
            if not getattr(self, name) >= 0:
                raise ModelSpecError(f"autoscaling {name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def of(
        cls, value: SlotAutoscaling | Mapping[str, Any] | None, **defaults: Any
    ) -> SlotAutoscaling:
        """``value`` as a :class:`SlotAutoscaling` (a mapping of its fields, as Ray Serve's
        ``autoscaling_config``); fields left out take ``defaults``, then the class's own.

        Raises:
            ModelSpecError: an unknown field, or bounds that do not hold.
        """
        if isinstance(value, SlotAutoscaling):
            return value
        given = dict(value or {})
        unknown = sorted(set(given) - {f.name for f in fields(cls)})
        if unknown:
            raise ModelSpecError(
                f"autoscaling: unknown field(s) {unknown}; expected some of "
                f"{[f.name for f in fields(cls)]}"
            )
        return cls(**{**defaults, **given})


def default_autoscaling(limit: int = MAX_SLOTS) -> SlotAutoscaling:
    """How a pool given neither ``pool_size`` nor ``autoscaling`` follows its load: between
    :class:`SlotAutoscaling`'s default bounds, each at most ``limit`` slots (a node actor's
    ``slots``)."""
    bounds = SlotAutoscaling()
    return SlotAutoscaling(
        min_slots=min(bounds.min_slots, limit), max_slots=min(bounds.max_slots, limit)
    )


def pool_sizing(
    model: str,
    pool_size: int | None,
    autoscaling: SlotAutoscaling | Mapping[str, Any] | None,
    *,
    limit: int = MAX_SLOTS,
    **defaults: Any,
) -> int | SlotAutoscaling:
    """What a model's pool should be: a fixed ``pool_size``, or a pool that follows its load
    (``autoscaling``, whose fields left out take ``defaults``). ``limit`` bounds both.

    Raises:
        ModelSpecError: both given, or sizes out of bounds (naming the model).
    """
    if pool_size is not None:
        if autoscaling is not None:
            raise ModelSpecError(
                f"model {model!r}: pass pool_size (a fixed pool) or autoscaling (a pool that "
                "follows its load), not both",
                model=model,
            )
        if not 1 <= pool_size <= limit:
            raise ModelSpecError(
                f"model {model!r}: pool_size must be >= 1 and <= {limit}, got {pool_size}",
                model=model,
            )
        return pool_size
    try:
        sizing = SlotAutoscaling.of(autoscaling, **defaults)
    except ModelSpecError as exc:
        raise ModelSpecError(f"model {model!r}: {exc}", model=model) from None
    if sizing.max_slots > limit:
        raise ModelSpecError(
            f"model {model!r}: autoscaling max_slots {sizing.max_slots} exceeds the "
            f"{limit} slots allowed here",
            model=model,
        )
    return sizing
