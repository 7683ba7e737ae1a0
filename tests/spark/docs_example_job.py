"""Run python examples of docs/ as written, in this process's working directory (the examples
use relative paths, which Spark's JVM resolves against its own working directory, so the test
starts this script with ``cwd`` set), for tests/spark/test_docs_on_spark.py.

    python tests/spark/docs_example_job.py <doc.md> <block,block,...> [--session]

Blocks run in order in one namespace named ``__main__`` (as a script's: classes defined there
are pickled by value). ``--session`` first puts a local[2,4] session in it as ``spark``.
Prints what the examples printed, then one JSON line about the ``handle`` they left.
"""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def main() -> None:
    from tests.test_docs_examples import python_blocks

    doc, indexes = sys.argv[1], [int(i) for i in sys.argv[2].split(",")]
    namespace: dict[str, object] = {"__name__": "__main__"}
    if "--session" in sys.argv:
        from pyspark.sql import SparkSession

        namespace["spark"] = SparkSession.builder.master("local[2,4]").getOrCreate()
    blocks = python_blocks(doc)
    for index in indexes:
        exec(compile(blocks[index], f"docs/{doc}", "exec"), namespace)  # noqa: S102
    handle: object = namespace.get("handle")
    summary = {"handle": handle is not None}
    if handle is not None:
        exc = handle.exception()  # type: ignore[attr-defined]
        summary.update(exception=None if exc is None else repr(exc),
                       running=handle.running,  # type: ignore[attr-defined]
                       failures=handle.report.failures)  # type: ignore[attr-defined]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
