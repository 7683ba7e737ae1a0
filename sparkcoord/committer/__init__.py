"""Commits once per committed batch: a ledger (sans-IO) and a worker that runs the commits.

See :mod:`sparkcoord.committer.ledger` for the rules and docs/sources.md ("Once per committed
batch") for the file source's ``committer``.
"""

from sparkcoord.committer.ledger import Commit, CommitLedger, LedgerState
from sparkcoord.committer.worker import CommitFunction, CommitStuck, CommitWorker

__all__ = ["Commit", "CommitFunction", "CommitLedger", "CommitStuck", "CommitWorker",
           "LedgerState"]
