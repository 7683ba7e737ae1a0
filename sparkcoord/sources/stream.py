"""Moved to :mod:`sparkcoord.sources.files.stream` (issue 44: the file source lives in its package);
this path stays for imports and pickles of earlier versions: it is the same module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("sparkcoord.sources.files.stream")
