"""A package's public names loaded on first use (PEP 562 ``__getattr__``).

Spark's Python workers and ``sparkcoord-python`` import submodules of sparkcoord, which runs
each parent package's ``__init__`` first; a package that re-exports its API through this
imports nothing until a name is asked for (docs/decisions/032-worker-imports.md,
docs/decisions/082-compiled-python-start.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def names_on_first_use(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` (called by Python, in any thread, when a name is not
    yet in the package's namespace): imports the module ``homes`` names for it, keeps the
    value in the package and returns it."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
