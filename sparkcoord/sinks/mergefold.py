"""Which small files a ``merge`` commit folds into its output (issue 43 finding 4), both formats.

Every epoch's merge writes at least one new data file (the rows put), so a table merged once a
second gains 3,600 small files an hour unless something rewrites them; the commit already
rewrites the files holding changed keys, and folds in the small ones too.

Rules:
  1. A current data file under :data:`SMALL_BYTES` that the epoch does not rewrite anyway is
     small. Once there are :data:`FOLD_AT` of them, the commit reads them whole and writes
     their rows with its output, removing them in the same transaction: the rows are the
     same before and after, only the files change. Smallest first, at most
     :data:`FOLD_BUDGET` bytes of them per epoch, and never a single one (a file rewritten
     alone is not fewer files). So the number of small files stays under :data:`FOLD_AT`
     plus the epoch's own, and no epoch rewrites more than the budget for them.
  2. Not after a truncate: every file is removed anyway.

Thread model: none (a pure function of the files' paths and sizes).
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkcoord.sinks.mergefiles import KeyRange

SMALL_BYTES = 8 << 20
FOLD_AT = 4
FOLD_BUDGET = 64 << 20


def small_files(files: Sequence[KeyRange], taken: set[str]) -> list[KeyRange]:
    """Rule 1: of the table's current ``files``, the small ones to fold into this epoch's
    output, ``taken`` (the paths it rewrites anyway) left out; none below :data:`FOLD_AT`."""
    small = sorted((f for f in files if f.path not in taken and f.size < SMALL_BYTES),
                   key=lambda f: (f.size, f.path))
    if len(small) < FOLD_AT:
        return []
    out, budget = [], FOLD_BUDGET
    for f in small:
        if f.size > budget:
            break
        out.append(f)
        budget -= f.size
    return out if len(out) >= 2 else []
