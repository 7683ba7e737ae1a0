"""Option values every source reads the same way, as strings from PySpark's ``.option()``.

Thread model: none (pure functions).
"""

from __future__ import annotations

import re

_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|minutes?|h|hours?|d|days?|w|weeks?)?\s*$",
    re.IGNORECASE)


def parse_seconds(name: str, value: str) -> float:
    """Seconds in a duration such as ``500ms``, ``10s``, ``5 minutes`` or ``7d`` (a bare number
    is seconds); an error naming option ``name`` otherwise. Any thread."""
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"option {name!r}: expected a duration like 500ms, 10s, 5 minutes or 7d, "
                         f"got {value!r}")
    unit = (match[2] or "s").lower()
    scale = 0.001 if unit == "ms" else 60.0 if unit.startswith("m") else (
        3600.0 if unit.startswith("h") else 86400.0 if unit.startswith("d") else (
            604800.0 if unit.startswith("w") else 1.0))
    return float(match[1]) * scale


def parse_int(name: str, value: str) -> int:
    """A whole number >= 1; an error naming option ``name`` otherwise. Any thread."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"option {name!r}: expected an integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"option {name!r}: must be >= 1, got {value!r}")
    return number
