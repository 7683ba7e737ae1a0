"""sparkcoord's own exception raised in a Spark task leads the job's failure text (issue 24
item 6; docs/decisions/052-own-error-leads.md): found in Spark's error text, without Spark."""

from __future__ import annotations

from sparkcoord.spark.job import failure_text, sparkcoord_error_in

MESSAGE = ("/ckpt/coordination/numbers/state/numbers/0/1.state is missing: numbers[0] ran the "
           "batch of epoch 1 with state (its newest state file left is from epoch 0)")
TRACEBACK = f"""Traceback (most recent call last):
  File "/work/main/sparkcoord/spark/subtask.py", line 192, in _subtask_rows
    restored = store.read_before(sid, p.epoch, p.previous_epoch)
  File "/work/main/sparkcoord/runtime/subtask_state.py", line 122, in read_before
    raise StateMissing(
sparkcoord.runtime.subtask_state.StateMissing: {MESSAGE}
"""
# the two shapes Spark 4 gave for a deleted state file (cut short): a foreachBatch sink, whose
# function's own traceback comes first, and a parquet sink
FOREACH_BATCH = f"""[STREAM_FAILED] Query [id = e2, runId = df] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach \
batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback \
(most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/venv/lib/python3.11/site-packages/pyspark/errors/exceptions/captured.py", line 262, in deco
    raise converted from None
pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:
{TRACEBACK}

 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = e2, runId = df]
"""
PARQUET = f"""[STREAM_FAILED] Query [id = bb, runId = e0] terminated with exception: \
[PYTHON_EXCEPTION] An exception was thrown from the Python worker: {TRACEBACK}

 SQLSTATE: 38000 SQLSTATE: XXKST
=== Streaming Query ===
"""
STAGE = f"""Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times, most recent \
failure: Lost task 0.3 in stage 3.0 (TID 9): org.apache.spark.api.python.PythonException: \
{TRACEBACK}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
"""


def test_a_sparkcoord_error_raised_in_a_task_is_found_in_each_shape_of_sparks_text() -> None:
    for text in (FOREACH_BATCH, PARQUET, STAGE):
        assert sparkcoord_error_in(text) == f"StateMissing: {MESSAGE}", text


def test_the_failure_text_leads_with_sparkcoords_error_and_keeps_sparks_text_after_it() -> None:
    text = failure_text(FOREACH_BATCH)
    assert text.splitlines()[0] == f"StateMissing: {MESSAGE}"
    assert text.endswith(FOREACH_BATCH)


def test_a_message_of_several_lines_is_kept_whole_up_to_where_spark_resumes() -> None:
    text = ("Lost task: org.apache.spark.api.python.PythonException: Traceback:\n"
            "sparkcoord.core.errors.RequestFailed: no answer:\n  the job failed: boom\n"
            "\tat org.apache.spark.Foo(Foo.scala:1)\n")
    assert sparkcoord_error_in(text) == "RequestFailed: no answer:\n  the job failed: boom"


def test_other_errors_keep_sparks_text_alone() -> None:
    users = FOREACH_BATCH.replace("sparkcoord.runtime.subtask_state.StateMissing",
                                  "ValueError")
    unknown = FOREACH_BATCH.replace("StateMissing", "NoSuchClass")
    not_an_error = FOREACH_BATCH.replace("runtime.subtask_state.StateMissing",
                                         "runtime.subtask_state.SubtaskStateStore")
    for text in (users, unknown, not_an_error, "Job aborted: disk full"):
        assert sparkcoord_error_in(text) is None
        assert failure_text(text) == text


def test_an_error_of_ours_that_the_users_code_turned_into_its_own_is_not_the_cause() -> None:
    chained = (f"PythonException: {TRACEBACK}\nThe above exception was the direct cause of the "
               f"following exception:\n\nTraceback (most recent call last):\n"
               f"  File \"job.py\", line 3, in process\nValueError: no state\n")
    assert sparkcoord_error_in(chained) is None
