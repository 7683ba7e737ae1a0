"""Settings of the coordination service (see docs/configuration.md).

A module of its own because the settings travel inside every coordinated source's spec to
Spark's Python workers, which must not import the service (threads, storage) to read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcoord.core.codec import DEFAULT_MAX_EVENT_BYTES


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of the coordination service (see docs/configuration.md)."""

    checkpoint_timeout_s: float = 60.0
    tolerable_checkpoint_failures: int = 0
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
