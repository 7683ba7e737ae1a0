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
    assert len(blocks) == 3  # the sketch, the harness example, the requests example
    namespace: dict[str, object] = {}
    for block in blocks[:2]:
        exec(compile(block, "docs/coordinators.md", "exec"), namespace)  # noqa: S102
    h = namespace["h"]
    assert h.coordinator.pending == {"next": 1}  # type: ignore[attr-defined]
    exec(compile(blocks[2], "docs/coordinators.md", "exec"), namespace)  # noqa: S102
    # the requests example: the retry got its logged split, and every split went out once
    assert namespace["h"].coordinator.left == []  # type: ignore[attr-defined]
