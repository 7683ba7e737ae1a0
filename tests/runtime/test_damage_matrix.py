"""Damaged checkpoint files: every file kind x flip / truncate / delete, at the newest and an
older epoch. Each case ends in a clear error naming the file, or in a correct restore; never in
a silent loss (issue 11; storage rule 4, subtask-state rule 4, docs/protocol.md
[restore-reads-only-verified-files]).

The job: a coordinator that keeps every event it received as its state (the events of each
batch in a state part of their own: core/stored.py, docs/protocol.md [stored-once-parts]), two
subtasks that each send 3 events per batch and keep the events they sent as their state, 4
epochs (0..3), each sealed, run and committed. Then the checkpoint directory is damaged while
quiesced, and a new run restores from committed epoch 3 on a real local directory: the
coordinator must hold all 24 events (snapshot 3 + the replayed inbound log of batch 3), each
subtask its 12.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sparkcoord import OperatorCoordinator, StoredOnce
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import SubtaskId
from sparkcoord.core.records import encode_log_entry
from sparkcoord.core.restore import RestorePoint
from sparkcoord.core.stored import snapshot_parts
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.runtime.subtask_state import SubtaskStateStore
from sparkcoord.testing import CoordinatorHarness

P = 2
EPOCHS = 4
NEWEST = EPOCHS - 1
NAME = "coordinator"


class Keeper(OperatorCoordinator):
    """Its state is every event it received, in order (one plain pickle; tests/test_inspect.py
    builds on it)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.seen: list[Any] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.seen = list(state or [])

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.seen.append(event)

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(list(self.seen))


class ChunkKeeper(Keeper):
    """The damage matrix's coordinator: a :class:`Keeper` whose state at each checkpoint holds
    the events received since the one before as a stored-once chunk (a state part), so a
    record names the parts of every earlier batch and the newest record one part no older
    record names."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.chunks: list[StoredOnce[tuple[Any, ...]]] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.chunks = list(state or [])
        self.seen = [e for chunk in self.chunks for e in chunk.value]

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        stored = sum(len(chunk.value) for chunk in self.chunks)
        if len(self.seen) > stored:
            self.chunks.append(StoredOnce(tuple(self.seen[stored:])))
        result.set_result(list(self.chunks))


def sid(subtask: int) -> SubtaskId:
    return SubtaskId(NAME, subtask)


def events_of(subtask: int, upto: int = EPOCHS) -> list[str]:
    return [f"{subtask}:{epoch}:{k}" for epoch in range(upto) for k in range(3)]


def build_job(root: Path) -> str:
    url = str(root / "ckpt")
    h = CoordinatorHarness(ChunkKeeper, P, storage_url=url)
    h.start()
    store = SubtaskStateStore.for_url(url)
    previous: int | None = None
    for epoch in range(EPOCHS):
        h.checkpoint()
        assert h.epoch == epoch
        for s in range(P):
            restored = store.read_before(sid(s), epoch, previous)
            state = pickle.loads(restored[1]) if restored is not None else []
            for k in range(3):
                h.send_from_subtask(s, f"{s}:{epoch}:{k}")
                state.append(f"{s}:{epoch}:{k}")
            store.write(sid(s), epoch, pickle.dumps(state))
        h.commit()
        previous = epoch
    h.service.close()
    return url


def restore(url: str) -> tuple[list[Any], list[Any]]:
    """A new run from committed epoch 3: the coordinator's events and each subtask's state."""
    h = CoordinatorHarness(ChunkKeeper, P, storage_url=url)
    h.start(RestorePoint(NEWEST, committed=True))
    coordinator = h.coordinator
    assert isinstance(coordinator, ChunkKeeper)
    store = SubtaskStateStore.for_url(url)
    states = []
    for s in range(P):
        found = store.read_before(sid(s), NEWEST + 1, NEWEST)
        states.append(pickle.loads(found[1]) if found is not None else None)
    return coordinator.seen, states


def expected_restore() -> tuple[list[Any], list[Any]]:
    # the coordinator saw the subtasks' events batch by batch, subtask 0's first each time
    seen = [f"{s}:{epoch}:{k}" for epoch in range(EPOCHS) for s in range(P) for k in range(3)]
    return seen, [events_of(s) for s in range(P)]


# ----------------------------------------------------------------------------------- damage
def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x01  # inside the last frame / the body's tail
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-5])


def delete(path: Path) -> None:
    path.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {"flip": flip, "truncate": truncate, "delete": delete}

def first_part_of(root: Path, epoch: int) -> str:
    """The state part the record of ``epoch`` names that the one before does not (the chunk of
    the batch before it): every later record names it too, so a restore from 3 reads it."""
    storage = CheckpointStorage(str(root))

    def names(e: int) -> set[str]:
        return set(snapshot_parts(storage.read_record(e).snapshots[NAME]))

    (name,) = names(epoch) - names(epoch - 1)
    return f"parts/{name}"


FILES: dict[str, Callable[[Path, int], str]] = {
    "record": lambda root, e: f"records/{e}.ckpt",
    "inbound log": lambda root, e: f"inbound/{e}.log",
    "log seal": lambda root, e: f"inbound/{e}.sealed",
    "subtask state": lambda root, e: f"state/{NAME}/0/{e}.state",
    "state part": first_part_of,
}

# what each case must end in: an error matching the pattern (which names the file), or a
# correct restore ("restores"); older inbound logs and seals no longer exist (pruned at the
# completion of the next batch), which the matrix checks too
EXPECTED: dict[tuple[str, str, str], str] = {
    ("record", "newest", "flip"): r"records/3\.ckpt: checksum mismatch",
    ("record", "newest", "truncate"): r"records/3\.ckpt: body is \d+ bytes, header says \d+",
    ("record", "newest", "delete"): r"checkpoint record of epoch 3 not found at .*records/3\.ckpt",
    ("record", "older", "flip"): "restores",
    ("record", "older", "truncate"): "restores",
    ("record", "older", "delete"): "restores",
    ("inbound log", "newest", "flip"): r"inbound/3\.log: checksum mismatch in the frame at byte \d+",
    ("inbound log", "newest", "truncate"): r"inbound/3\.log: the frame at byte \d+ is cut short",
    ("inbound log", "newest", "delete"): r"inbound/3\.log: the inbound log of epoch 3 is missing",
    ("inbound log", "older", "*"): "pruned",
    ("log seal", "newest", "flip"): r"inbound/3\.sealed: checksum mismatch",
    ("log seal", "newest", "truncate"): r"inbound/3\.sealed: body is \d+ bytes, header says \d+",
    ("log seal", "newest", "delete"): "restores",  # the frames alone are checked
    ("log seal", "older", "*"): "pruned",
    ("subtask state", "newest", "flip"): rf"state/{NAME}/0/3\.state: checksum mismatch",
    ("subtask state", "newest", "truncate"): rf"state/{NAME}/0/3\.state: body is \d+ bytes",
    ("subtask state", "newest", "delete"):
        rf"state/{NAME}/0/3\.state is missing: {NAME}\[0\] ran the "
        r"batch of epoch 3 with state \(its newest state file left is from epoch 2\)",
    ("subtask state", "older", "flip"): "restores",
    ("subtask state", "older", "truncate"): "restores",
    ("subtask state", "older", "delete"): "restores",
    # the restore checks every part its record names against its name ({part}: the digest)
    ("state part", "*", "flip"): r"parts/{part}: state part {part}: its bytes hash to [0-9a-f]{64}",
    ("state part", "*", "truncate"):
        r"parts/{part}: state part {part}: its bytes hash to [0-9a-f]{64}",
    ("state part", "*", "delete"): r"state part {part} not found at .*parts/{part}",
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    build_job(root)
    return root / "ckpt"


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(pristine, target)
    return target


def test_an_undamaged_checkpoint_restores_every_event_and_every_state(
        pristine: Path, tmp_path: Path) -> None:
    assert restore(str(copy_of(pristine, tmp_path))) == expected_restore()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("which", ["newest", "older"])
@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_damaged_file_is_a_clear_error_or_restores_correctly_never_a_silent_loss(
        pristine: Path, tmp_path: Path, kind: str, which: str, damage: str) -> None:
    root = copy_of(pristine, tmp_path)
    epoch = NEWEST if which == "newest" else NEWEST - 1
    path = root / FILES[kind](root, epoch)
    expected = (EXPECTED.get((kind, which, damage)) or EXPECTED.get((kind, which, "*"))
                or EXPECTED[(kind, "*", damage)]).replace("{part}", path.name)
    if expected == "pruned":
        assert not path.exists()
        return
    DAMAGE[damage](path)
    if expected == "restores":
        assert restore(str(root)) == expected_restore()
        return
    with pytest.raises(CorruptRecord) as caught:
        restore(str(root))
    message = str(caught.value)
    assert re.search(expected, message), message
    assert str(root) in message  # the file is named by its full path


def test_an_inbound_log_cut_at_a_frame_boundary_is_caught_by_its_seal(
        pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    log = root / "inbound" / f"{NEWEST}.log"
    data = log.read_bytes()
    # the last frame is subtask 1's run of three events
    from sparkcoord.core.records import decode_log

    entries, _ = decode_log(data, "log")
    last = len(encode_log_entry(entries[-1]))
    log.write_bytes(data[:-last])
    with pytest.raises(CorruptRecord, match=r"inbound/3\.log: the inbound log of epoch 3 holds "
                                            r"\d+ bytes .* but its seal .*3\.sealed says"):
        restore(str(root))


def test_a_seal_missing_after_a_crash_still_leaves_a_damaged_log_an_error(
        pristine: Path, tmp_path: Path) -> None:
    # a run that died between Spark's commit and the service learning of it wrote no seal
    root = copy_of(pristine, tmp_path)
    (root / "inbound" / f"{NEWEST}.sealed").unlink()
    truncate(root / "inbound" / f"{NEWEST}.log")
    with pytest.raises(CorruptRecord, match=r"inbound/3\.log: the frame at byte \d+ is cut short"):
        restore(str(root))


def test_a_restore_without_a_seal_writes_it_once_the_log_is_verified(
        pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    seal = root / "inbound" / f"{NEWEST}.sealed"
    original = seal.read_bytes()
    seal.unlink()
    assert restore(str(root)) == expected_restore()
    assert seal.read_bytes() == original


def test_every_state_file_of_a_stateful_subtask_deleted_is_an_error_not_a_stateless_start(
        pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    directory = root / "state" / NAME / "0"
    for name in os.listdir(directory):
        if name.endswith(".state"):
            (directory / name).unlink()
    with pytest.raises(CorruptRecord, match=r"has kept state since epoch 0 .*lineage\), but no "
                                            r"state file from before epoch 4 is left"):
        restore(str(root))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_lineage_marker_of_a_subtask_whose_states_are_gone_is_named(
        pristine: Path, tmp_path: Path, damage: str) -> None:
    root = copy_of(pristine, tmp_path)
    directory = root / "state" / NAME / "0"
    for name in os.listdir(directory):
        if name.endswith(".state"):
            (directory / name).unlink()
    DAMAGE[damage](directory / "lineage")
    with pytest.raises(CorruptRecord, match=rf"state/{NAME}/0/lineage: "):
        restore(str(root))


def test_a_damaged_lineage_marker_is_not_read_while_states_are_there(
        pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    flip(root / "state" / NAME / "0" / "lineage")
    assert restore(str(root)) == expected_restore()


def test_a_subtask_that_never_kept_state_restores_none_without_a_marker(tmp_path: Path) -> None:
    store = SubtaskStateStore.for_url(str(tmp_path))
    assert store.read_before(sid(0), 5, 4) is None
    assert not (tmp_path / "state" / NAME / "0" / "lineage").exists()


def test_a_damaged_part_no_record_names_is_not_read_and_is_swept(
        pristine: Path, tmp_path: Path) -> None:
    # a run that died between writing a part and its record left it (storage rule 3): the
    # restore does not read it, and the run's first pruning deletes it
    root = copy_of(pristine, tmp_path)
    stray = root / "parts" / ("ab" * 32)
    stray.write_bytes(b"not a pickle, and not what its name hashes")
    assert restore(str(root)) == expected_restore()
    assert not stray.exists()
    assert len(os.listdir(root / "parts")) == NEWEST  # the chunks of batches 0..2
