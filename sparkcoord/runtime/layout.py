"""The names in a coordinated source's checkpoint directory, in one place: storage writes them,
``inspect``, the job runner and the tasks read them.

    records/<epoch>.ckpt                       checkpoint record of an epoch
    parts/<sha-256>                            a stored-once part of a coordinator's state
    inbound/<epoch>.log                        inbound log of the batch of an epoch (local fs)
    inbound/<epoch>/begin, <n>.seg             the same as segments (stores without append)
    inbound/<epoch>.sealed                     the log's length and CRC-32 when its batch committed
    state/<operator>/<index>/<epoch>.state     a subtask's state at the end of an epoch's batch
    state/<operator>/<index>/lineage           since which epoch the subtask keeps state
    lease/<generation>.json                    the job runner's lease (runtime/lease.py)
    channel.json                               the running service's address and secret
    attached.pkl                               downstream operators attached after the source
    last-failure.json                          the cause of the last run's global failure

Imports nothing (read by processes that must stay light: Spark's Python workers, ``inspect``).
Thread model: none (constants and pure functions).
"""

from __future__ import annotations

RECORDS = "records"
PARTS = "parts"
INBOUND = "inbound"
STATE = "state"
LINEAGE = "lineage"
SEGMENTS_BEGIN = "begin"
LEASE = "lease"
CHANNEL_INFO = "channel.json"
ATTACHED = "attached.pkl"
FAILURE_REPORT = "last-failure.json"

RECORD_SUFFIX = ".ckpt"
LEASE_SUFFIX = ".json"
LOG_SUFFIX = ".log"
SEAL_SUFFIX = ".sealed"
SEGMENT_SUFFIX = ".seg"
STATE_SUFFIX = ".state"


def record_name(epoch: int) -> str:
    return f"{epoch}{RECORD_SUFFIX}"


def log_name(epoch: int) -> str:
    return f"{epoch}{LOG_SUFFIX}"


def seal_name(epoch: int) -> str:
    return f"{epoch}{SEAL_SUFFIX}"


def segment_name(number: int) -> str:
    return f"{number:012d}{SEGMENT_SUFFIX}"


def state_name(epoch: int) -> str:
    return f"{epoch}{STATE_SUFFIX}"


def epoch_in(name: str, suffix: str) -> int | None:
    """The epoch a file named ``<epoch><suffix>`` is of; None for any other name (temporary
    files, checksums, a name of another kind)."""
    if not name.endswith(suffix):
        return None
    stem = name[:len(name) - len(suffix)] if suffix else name
    return int(stem) if stem.lstrip("-").isdigit() else None
