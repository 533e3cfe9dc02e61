"""Numbers as the bench writes them, in the terminal, the figures and the report alike."""

from __future__ import annotations

__all__ = ["num", "per_s"]


def num(value: float | None, suffix: str = "") -> str:
    """``value`` with about three significant digits, then ``suffix``; ``"-"`` for ``None``:
    from 100 on, whole numbers grouped by thousands (``"1,758"``), from 1e5 on, ``"1.23e+05"``."""
    if value is None:
        return "-"
    # The bounds are where rounding moves a value up a band (9.996 is "10.0", not "10.00").
    magnitude = abs(value)
    if value == 0:
        text = "0"
    elif magnitude >= 99_999.5:
        text = f"{value:.3g}"
    elif magnitude >= 99.95:
        text = f"{value:,.0f}"
    elif magnitude >= 9.995:
        text = f"{value:.1f}"
    elif magnitude >= 0.9995:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return text + suffix


def per_s(value: float | None) -> str:
    """A rate in requests per second, as a whole number from 10 on (``"50"`` beside
    ``"200"``, never ``"50.0"``); ``"-"`` for ``None``."""
    if value is None or abs(value) < 9.995:
        return num(value)
    return num(round(value)) if abs(value) < 99_999.5 else num(value)
