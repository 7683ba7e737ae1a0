"""The Spark adapter: coordinated sources for PySpark Structured Streaming and the job runner.

Outermost layer: it depends on the runtime, the channel and the core, never the reverse.
"""

from sparkcoord.spark.job import CoordinatedJob, JobGaveUp, RunReport
from sparkcoord.spark.operator import SubtaskContext, SubtaskOperator
from sparkcoord.spark.source import OperatorSpec

__all__ = ["CoordinatedJob", "JobGaveUp", "OperatorSpec", "RunReport", "SubtaskContext",
           "SubtaskOperator"]
