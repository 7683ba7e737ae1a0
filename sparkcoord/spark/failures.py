"""A query's failure, as the job runner reads it: the coordination service's report of a run's
global failure, sparkcoord's own exception in Spark's error text, and which failures no
restart changes.

Rules:
  1. The service's failure report counts only for the run that wrote it: its ``run`` is the
     one ``channel.json`` names (a report of an earlier run is removed before the next query
     starts, and its run id guards it until then).
  2. In Spark's error text, only a :class:`~sparkcoord.core.errors.SparkCoordError` counts as
     ours (its module is imported to check), and only the exception a traceback ends with,
     not one another exception chained (docs/decisions/052-own-error-leads.md).
  3. A failure whose cause ends with a permanent sparkcoord error
     (``SparkCoordError.permanent``) ends the job at once: job.py rule 6.

Thread model: the job handle's thread (sparkcoord-job), after a query failed and at each
poll; the text functions are pure and may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.runtime import layout

if TYPE_CHECKING:
    from sparkcoord.spark.spec import SourceSpec

#: the job runner's logger (sparkcoord.spark.job): one name for the runner's modules
log = logging.getLogger("sparkcoord.spark.job")


class JobGaveUp(SparkCoordError):
    """The query failed and the restart strategy allows no further restart."""


#: a Python traceback's last line naming one of sparkcoord's exceptions, as Spark's error text
#: carries it for an exception raised in a task: ``sparkcoord.<module>.<Class>: <message>``
_OUR_EXCEPTION = re.compile(r"(sparkcoord(?:\.\w+)*)\.([A-Za-z_]\w*): (.*)")
#: where Spark's (or the JVM's) text resumes after that message
_SPARK_RESUMES = ("SQLSTATE: ", "=== ", "JVM stacktrace", "Driver stacktrace", "Caused by: ")
#: the line after a traceback's exception when that exception is not the final one
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def sparkcoord_error_in(spark_text: str) -> str | None:
    """sparkcoord's own exception (``Class: message``) raised in a Spark task, found in the
    text of the Spark error that reports it; None when there is none
    (docs/decisions/052-own-error-leads.md).

    Spark leads with its wrappers (``[STREAM_FAILED] ... [FOREACH_BATCH_USER_FUNCTION_ERROR]
    ... Python Proxy``, ``[PYTHON_EXCEPTION] ...``, ``Job aborted due to stage failure``);
    the task's Python traceback inside ends with the exception's qualified name and message.
    Only a :class:`SparkCoordError` counts (the module is imported to check: it is ours), and
    only the exception a traceback ends with (not one that another exception chained)."""
    found = _sparkcoord_exception_in(spark_text)
    return None if found is None else found[1]


def permanent_error_in(text: str) -> str | None:
    """The name of the permanent sparkcoord error (``SparkCoordError.permanent``: a refusal a
    restart cannot change) that ``text`` (a failure's cause, or Spark's error text) ends
    with; None if it ends with another (rule 3). Handle thread, after a query failed."""
    found = _sparkcoord_exception_in(text)
    if found is None or not getattr(found[0], "permanent", False):
        return None
    return found[0].__name__


def _sparkcoord_exception_in(spark_text: str) -> tuple[type, str] | None:
    lines = spark_text.split("\n")
    found = None
    for i, line in enumerate(lines):
        m = _OUR_EXCEPTION.fullmatch(line.rstrip("\r"))
        cls = None if m is None else _our_class(m.group(1), m.group(2))
        if m is None or cls is None:
            continue
        message = [m.group(3)]
        j = i + 1
        while (j < len(lines) and lines[j].strip() and not lines[j].startswith("\tat ")
               and not lines[j].lstrip().startswith(_SPARK_RESUMES)):
            message.append(lines[j])
            j += 1
        following = next((ln for ln in lines[j:] if ln.strip()), "")
        if following.startswith(_CHAINED):
            continue  # another exception followed from this one: that one is the error
        found = (cls, f"{m.group(2)}: " + "\n".join(message).rstrip())
    return found


def _our_class(module: str, name: str) -> type | None:
    import importlib

    try:
        cls = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - a module of another version, or none: not ours to tell
        return None
    return cls if isinstance(cls, type) and issubclass(cls, SparkCoordError) else None


def failure_text(spark_text: str) -> str:
    """The cause of a query failure that the coordination service did not record: sparkcoord's
    own exception from a task first, then Spark's text; Spark's text alone if none."""
    ours = sparkcoord_error_in(spark_text)
    if ours is None:
        return spark_text
    return f"{ours}\n\n(raised in a Spark task; Spark reported:)\n{spark_text}"



def failure_cause_of(specs: Iterable[SourceSpec]) -> str | None:
    """The cause of the global failure of the latest run of the sources ``specs``, as the
    coordination service recorded it (rule 1): :meth:`CoordinatedJob.failure_cause
    <sparkcoord.spark.job.CoordinatedJob.failure_cause>`. Handle thread."""
    from sparkcoord.runtime.files import files_for

    for spec in specs:
        try:
            files, root = files_for(spec.checkpoint_url, spec.storage_options)
            # the failure report first: usually there is none, one read (polled)
            failure = json.loads(files.read(f"{root}/{layout.FAILURE_REPORT}"))
            run = json.loads(files.read(f"{root}/{layout.CHANNEL_INFO}"))["run"]
        except Exception:  # noqa: BLE001 - no report (or an unreadable one): Spark's text
            continue
        if isinstance(failure, dict) and failure.get("run") == run:
            return str(failure.get("cause"))
    return None


def forget_failures(specs: Iterable[SourceSpec]) -> None:
    """Remove the failure reports of the sources ``specs`` (rule 1). Handle thread, before a
    query starts."""
    # A failure recorded by an earlier run must not be taken for the next run's cause (that
    # run may fail before it writes its own channel.json).
    from sparkcoord.runtime.files import files_for

    for spec in specs:
        try:
            files, root = files_for(spec.checkpoint_url, spec.storage_options)
            files.remove(f"{root}/{layout.FAILURE_REPORT}")
        except Exception:  # noqa: BLE001 - best effort: the run ids still guard the report
            log.debug("cannot remove the failure report of %s", spec.name, exc_info=True)
