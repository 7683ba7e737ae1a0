"""Small helpers for error and log texts. Thread model: none (pure functions)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``"1 checkpoint"``, ``"3 checkpoints"``: a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def parse_bytes(name: str, value: str) -> int:
    """Option ``name``'s size (``1048576``, ``64m``, ``1g``) in bytes; ValueError naming it."""
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"option {name!r}: expected a size like 1048576, 64m or 1g, got {value!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match[2].lower()]
    number = int(float(match[1]) * scale)
    if number < 1:
        raise ValueError(f"option {name!r}: must be at least 1 byte, got {value!r}")
    return number
