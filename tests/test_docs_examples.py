"""The examples of docs/coordinators.md run as written (issue 14: a newcomer's harness example
failed silently). Each ```python block is executed in order in one namespace."""

from __future__ import annotations

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_the_coordinator_sketch_and_its_harness_example_run_as_written() -> None:
    blocks = python_blocks("coordinators.md")
    # the sketch, the harness example, the requests example, a retry that asks less
    assert len(blocks) == 4
    namespace: dict[str, object] = {}
    for block in blocks[:2]:
        exec(compile(block, "docs/coordinators.md", "exec"), namespace)  # noqa: S102
    h = namespace["h"]
    assert h.coordinator.pending == {"next": 1}  # type: ignore[attr-defined]
    exec(compile(blocks[2], "docs/coordinators.md", "exec"), namespace)  # noqa: S102
    # the requests example: the retry got its logged split, and every split went out once
    assert namespace["h"].coordinator.left == []  # type: ignore[attr-defined]
    exec(compile(blocks[3], "docs/coordinators.md", "exec"), namespace)  # noqa: S102
    # a retry that asked less: "b" and "c" came back, "b" went out again, "c" is first in line
    assert namespace["h"].coordinator.items == ["c", "d"]  # type: ignore[attr-defined]


def test_the_reader_contract_example_of_sources_md_passes_on_the_range_reader() -> None:
    namespace: dict[str, object] = {"__name__": "docs_sources_example"}
    exec(compile(python_blocks("sources.md")[4], "docs/sources.md", "exec"), namespace)  # noqa: S102
    contract = namespace["TestRangeReader"]()  # type: ignore[operator]
    names = [n for n in dir(contract) if n.startswith("test_")]
    assert len(names) == 3, names
    for name in names:
        getattr(contract, name)()


#: every ```python block of docs/ that a test executes as written: (file, block index) -> test
EXECUTED = {
    ("coordinators.md", 0): "tests/test_docs_examples.py",
    ("coordinators.md", 1): "tests/test_docs_examples.py",
    ("coordinators.md", 2): "tests/test_docs_examples.py",
    ("coordinators.md", 3): "tests/test_docs_examples.py",
    ("spark.md", 0): "tests/spark/test_docs_on_spark.py",
    ("sources.md", 0): "tests/spark/test_docs_on_spark.py",
    ("sources.md", 1): "tests/spark/test_docs_on_spark.py",
    ("sources.md", 2): "tests/spark/test_file_source.py",
    ("sources.md", 3): "tests/spark/test_file_source.py",
    ("sources.md", 4): "tests/test_docs_examples.py",
    ("committer.md", 0): "tests/spark/test_committer_spark.py",
    ("committer.md", 1): "tests/spark/test_committer_spark.py",
    ("sinks.md", 0): "tests/spark/test_lake_sink.py",
    ("sinks.md", 1): "tests/spark/test_lake_sink.py",
}
SKETCH = "<!-- sketch:"


def test_every_python_example_in_the_docs_is_executed_by_a_test_or_marked_as_a_sketch() -> None:
    unexecuted = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        for index, match in enumerate(re.finditer(r"```python\n", text)):
            before = text[:match.start()].rstrip().splitlines()[-1:]
            sketch = bool(before) and before[0].lstrip().startswith(SKETCH)  # in a list too
            executed = (path.name, index) in EXECUTED
            assert not (sketch and executed), f"{path.name} block {index}: a sketch that runs?"
            if not sketch and not executed:
                unexecuted.append(f"{path.name} block {index}")
    assert unexecuted == [], (f"python examples no test executes: {unexecuted}; run them in a "
                              f"test and list them in EXECUTED, or mark them {SKETCH} ... -->")
    for name, index in EXECUTED:
        assert index < len(python_blocks(name)), f"{name} has no python block {index}"
