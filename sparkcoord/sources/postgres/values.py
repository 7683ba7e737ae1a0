"""Moved to :mod:`sparkcoord.sources.postgres.core.values` (issue 44: the source's sans-IO parts in
a core of their own); this path stays for imports and pickles of earlier versions: it is the
same module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("sparkcoord.sources.postgres.core.values")
