"""The Spark adapter: coordinated sources for PySpark Structured Streaming and the job runner.

Outermost layer: it depends on the runtime, the channel and the core, never the reverse.

The names below are loaded on first use: Spark's Python workers import this package (to
unpickle a coordinated source's reader and partitions) and need none of the job runner
(docs/decisions/032-worker-imports.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkcoord.core.lazy import names_on_first_use

if TYPE_CHECKING:
    from sparkcoord.operator import SubtaskContext, SubtaskOperator
    from sparkcoord.spark.job import CoordinatedJob, JobGaveUp, JobHandle, RunReport
    from sparkcoord.spark.spec import OperatorSpec

#: name -> the module that holds it
_HOMES = {"CoordinatedJob": "sparkcoord.spark.job", "JobGaveUp": "sparkcoord.spark.job",
          "JobHandle": "sparkcoord.spark.job", "RunReport": "sparkcoord.spark.job",
          "SubtaskContext": "sparkcoord.operator", "SubtaskOperator": "sparkcoord.operator",
          "OperatorSpec": "sparkcoord.spark.spec"}

__all__ = ["CoordinatedJob", "JobGaveUp", "JobHandle", "OperatorSpec", "RunReport", "SubtaskContext",
           "SubtaskOperator"]

__getattr__ = names_on_first_use(__name__, _HOMES)
