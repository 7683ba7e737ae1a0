"""The Spark adapter: coordinated sources for PySpark Structured Streaming and the job runner.

Outermost layer: it depends on the runtime, the channel and the core, never the reverse.

The names below are loaded on first use: Spark's Python workers import this package (to
unpickle a coordinated source's reader and partitions) and need none of the job runner
(docs/decisions.md 32).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkcoord.spark.job import CoordinatedJob, JobGaveUp, JobHandle, RunReport
    from sparkcoord.spark.operator import SubtaskContext, SubtaskOperator
    from sparkcoord.spark.spec import OperatorSpec

_HOMES = {"CoordinatedJob": "job", "JobGaveUp": "job", "JobHandle": "job", "RunReport": "job",
          "SubtaskContext": "operator", "SubtaskOperator": "operator", "OperatorSpec": "spec"}

__all__ = ["CoordinatedJob", "JobGaveUp", "JobHandle", "OperatorSpec", "RunReport", "SubtaskContext",
           "SubtaskOperator"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sparkcoord.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sparkcoord.spark.{home}"), name)
    globals()[name] = value
    return value
