"""The dependency rules: the core is sans-IO, and dependencies point inward."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "sparkcoord"

# layer -> sparkcoord packages it may import (besides itself)
ALLOWED_INTERNAL = {
    "core": set(),
    "coordinator": {"core"},
    "operator": {"core"},
    "runtime": {"core", "coordinator"},
    "testing": {"core", "coordinator", "runtime"},
    "channel": {"core"},
    "spark": {"core", "coordinator", "operator", "runtime", "channel"},
    "committer": {"core"},
    "sources": {"core", "coordinator", "operator", "runtime", "channel", "spark", "committer"},
    "inspection": {"core", "runtime", "spark"},
}
#: the split framework of sources/ (what any source is built on): it knows no file source and
#: no Spark (a source reaches Spark through the adapter, in its own builder module)
SOURCE_FRAMEWORK = ("splits", "reader", "enumerator", "alignment", "backlog", "values")
FILE_SOURCE = ("files", "stream", "parsing", "seen", "tail")
FORBIDDEN_IN_CORE = {"pyspark", "socket", "threading", "asyncio", "time", "concurrent",
                     "os", "fsspec", "selectors", "subprocess", "multiprocessing", "signal",
                     "pathlib", "io", "random", "datetime", "_thread", "queue", "logging"}


def imported_modules(path: pathlib.Path, nested: bool = True) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (``nested``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree) if nested else tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def layer_of(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem != "__init__" else "root"


def modules_of(layer: str) -> list[pathlib.Path]:
    target = PACKAGE / layer
    return sorted(target.rglob("*.py")) if target.is_dir() else [PACKAGE / f"{layer}.py"]


@pytest.mark.parametrize("path", modules_of("core"), ids=lambda p: p.name)
def test_core_modules_import_no_io_threads_clock_or_spark(path: pathlib.Path) -> None:
    bad = {m for m in imported_modules(path) if m.split(".")[0] in FORBIDDEN_IN_CORE}
    assert not bad, f"{path.name} imports {sorted(bad)}; the core must stay sans-IO"


@pytest.mark.parametrize("layer", sorted(ALLOWED_INTERNAL))
def test_dependencies_point_inward(layer: str) -> None:
    for path in modules_of(layer):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] != "sparkcoord" or len(parts) < 2:
                continue
            target = parts[1]
            if target == layer:
                continue
            assert target in ALLOWED_INTERNAL[layer], (
                f"{path.relative_to(PACKAGE)} (layer {layer}) imports {module}")


def test_the_checker_sees_imports_in_a_module() -> None:
    # guard against a checker that silently finds nothing
    assert "sparkcoord.core.errors" in imported_modules(PACKAGE / "core" / "valve.py")
    assert "pickle" in imported_modules(PACKAGE / "core" / "codec.py")


@pytest.mark.parametrize("name", SOURCE_FRAMEWORK)
def test_the_split_framework_imports_no_file_source_and_no_spark(name: str) -> None:
    path = PACKAGE / "sources" / f"{name}.py"
    for module in imported_modules(path, nested=True):
        parts = module.split(".")
        assert parts[0] != "pyspark", f"sources/{name}.py imports {module}"
        assert parts[:2] != ["sparkcoord", "spark"], f"sources/{name}.py imports {module}"
        assert not (parts[:2] == ["sparkcoord", "sources"] and len(parts) > 2
                    and parts[2] in FILE_SOURCE), f"sources/{name}.py imports {module}"
