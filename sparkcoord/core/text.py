"""Small helpers for error and log texts. Thread model: none (pure functions)."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``"1 checkpoint"``, ``"3 checkpoints"``: a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
