"""Moved to :mod:`sparkcoord.sources.postgres.io.catalog` (issue 44: the source's I/O in a package
of its own); this path stays for imports and pickles of earlier versions: it is the same
module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("sparkcoord.sources.postgres.io.catalog")
