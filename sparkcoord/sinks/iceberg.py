"""Moved to :mod:`sparkcoord.sinks.formats.iceberg.commit` (issue 44: the table formats live in
sinks/formats/); this path stays for imports and pickles of earlier versions: it is the same
module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("sparkcoord.sinks.formats.iceberg.commit")
