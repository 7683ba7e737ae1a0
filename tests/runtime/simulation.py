"""A simulated Spark micro-batch engine driving the real coordination service, step by step.

It follows Spark's order of calls (docs/protocol.md [spark-call-order-per-trigger]
[spark-restart-call-order]): per trigger ``latestOffset(start=end(N-1))`` -> offsets/N ->
``partitions`` -> tasks -> sink commit -> commits/N; a restart's first call is
``latestOffset(end(N))`` when N committed and ``partitions(start_N, end_N)`` when it did not;
task retries keep the batch and bump the attempt number; a driver crash loses everything but
the storage (an in-memory fsspec filesystem), Spark's logs and the sink.

The coordinators and subtasks are deterministic:
  * each coordinator sends numbered events ``("x", s, k)`` to subtask s, k = 0, 1, ...,
    spontaneously and from "outside" its mailbox (like a user thread), and answers every
    subtask event with ``("r", event)``: the default-mode coordinator to the *next* subtask
    (so a task retry needs the whole-coordinator reset of rule 7), the per-subtask one to the
    sender (Flink's ``subtask_reset`` path);
  * each subtask keeps the list of events it received, restores it from the previous epoch,
    applies the epoch's events before anything else, and sends ``("y", s, epoch, i, n)`` events
    back, where n is the length of its state (deterministic given its state).

State parts (core/stored.py, docs/protocol.md [stored-once-parts]): the "cross" and "split"
coordinators keep the events they sent to each subtask and the events they took effect of as
:class:`Chunks`, stored-once chunks of ``CHUNK_ITEMS`` events plus an inline tail; the oldest
two chunks are merged when there are more than ``STORED_CHUNKS``, a chunk an event is taken out
of is rewritten, and a per-subtask reset rewinds a subtask's sent events to the chunks of a
snapshot, so parts are written at most boundaries (from the first one on) and become
unreferenced, pruned and swept as epochs pass.
(The "ask" coordinator's snapshot stays a plain pickle: scripts/soak.py reads it with
``pickle.loads``.) Storage is a :class:`SimStorage` whose files can kill the driver inside a
storage call (:data:`STORAGE_CRASH_POINTS`: between a part's write and the next part's or its
record's, between the parts and the record, after the record, and inside pruning), and the
checks hold parts to storage rule 3 and restores to the state that was sealed
(:meth:`Simulation.check_storage`, :meth:`Simulation.check_restored`).

Upgrades (core/encoding.py rule 6): a driver restart may run another sparkcoord, which
encodes the same events and requests as other bytes (here: pickle protocol 4 or 5, picked by
a generator of its own so that a seed's other steps stay as they were); a rerun's tasks then
re-send their histories in the new encoding, which must count as the same items.

Steps are picked by a seeded ``random.Random``; every failure the contract covers can be
injected between any two steps. ``check_invariants`` asserts the exactly-once outcome.
"""

from __future__ import annotations

import pickle
import posixpath
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import fsspec

from sparkcoord.coordinator import CoordinatorContext, OperatorCoordinator
from sparkcoord.core.entries import DriverClient, FinishedEntry, RequestEntry
from sparkcoord.core.errors import CorruptRecord
from sparkcoord.core.ids import NO_EPOCH, SubtaskId, TaskAttempt
from sparkcoord.core.inbound import RunDecision, Verdict
from sparkcoord.core.records import CheckpointRecord
from sparkcoord.core.stored import StoredOnce, load_snapshot, snapshot_parts
from sparkcoord.runtime import layout
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.runtime.files import Files
from sparkcoord.runtime.service import (
    CheckpointDeclined,
    CoordinationService,
    CoordinatorSpec,
    JobFailed,
    PreparedCheckpoint,
)
from sparkcoord.runtime.storage import CheckpointStorage
from sparkcoord.testing import ManualClock, ManualMailboxes

TIMEOUT_S = 10.0
CLIENT_REQUESTS = 4  # the driver program's requests per simulated job


# ------------------------------------------------------------------------------ the world
@dataclass
class World:
    """What survives a driver crash: storage, Spark's logs, the sink, external side effects."""

    url: str
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch -> (start, end)
    commits: set[int] = field(default_factory=set)
    sink: dict[int, dict[SubtaskId, list[Any]]] = field(default_factory=dict)
    # batch -> the events each subtask's surviving attempt sent in it
    committed_sends: dict[int, dict[SubtaskId, list[Any]]] = field(default_factory=dict)
    # (subtask, epoch, seq) -> the answer any attempt of any run saw for that request
    observed: dict[tuple[SubtaskId, int, int], Any] = field(default_factory=dict)
    # (subtask, epoch) -> run -> the items of that run's newest attempt whose finish the
    # service took (gate rule 6): a sink may hold its output, so a later run's worker sends
    # the same items (the contract: ``Simulation.task_step``)
    finishes: dict[tuple[SubtaskId, int], dict[int, list[Any]]] = field(default_factory=dict)
    # the same, for finishes a later attempt of the same run replaced (its task failed after
    # its finish and a retry registered): no sink holds their output, so they bind no later
    # run (decision 76, kept_at_rerun), and a later run's worker is free of them
    replaced_finishes: dict[tuple[SubtaskId, int], dict[int, list[Any]]] = field(
        default_factory=dict)
    # the driver program's client: its next request number, the one it waits for (it
    # re-sends it, also to the next run, until it gets an answer), and the answered ones
    client_next: int = 0
    client_waiting: Any = None
    client_answered: list[int] = field(default_factory=list)
    # (operator, epoch) -> coordinator effects seen by each notify_checkpoint_complete(epoch)
    completions: dict[tuple[str, int], list[list[Any]]] = field(default_factory=dict)
    # epoch -> operator -> the state its record holds (``plain``: parts as (digest, value)),
    # taken from what the coordinators handed over, when its seal returned
    sealed: dict[int, dict[str, Any]] = field(default_factory=dict)

    def last_batch(self) -> int | None:
        return max(self.offsets) if self.offsets else None


# ------------------------------------------------------------------ state parts
CHUNK_ITEMS = 2    # events per stored chunk
STORED_CHUNKS = 3  # more stored chunks than this: the oldest two are merged into one


class Chunks:
    """A list kept as :class:`StoredOnce` chunks (each a state part) plus an inline tail, as
    the enumerator's backlog and the file discovery's seen files are (decision 60). Chunks are
    immutable: taking an item out of one, or merging two, makes a new chunk, and the old one's
    part is pruned once no record present names it. Mailbox thread only."""

    __slots__ = ("chunks", "tail")

    def __init__(self, state: Any = None) -> None:
        # a snapshot (chunks, tail), or a plain list (the initial state)
        chunks, tail = state if isinstance(state, tuple) else ((), state or ())
        self.chunks: list[StoredOnce[tuple[Any, ...]]] = list(chunks)
        self.tail: list[Any] = list(tail)

    def __iter__(self) -> Iterator[Any]:
        for chunk in self.chunks:
            yield from chunk.value
        yield from self.tail

    def __len__(self) -> int:
        return sum(len(chunk.value) for chunk in self.chunks) + len(self.tail)

    def append(self, item: Any) -> None:
        self.tail.append(item)
        if len(self.tail) >= CHUNK_ITEMS:
            self.chunks.append(StoredOnce(tuple(self.tail)))
            self.tail = []
            if len(self.chunks) > STORED_CHUNKS:
                first, second = self.chunks[0], self.chunks[1]
                self.chunks[0:2] = [StoredOnce(first.value + second.value)]

    def keep(self, wanted: Callable[[Any], bool]) -> None:
        """Keep only the items ``wanted`` says; a chunk that loses items is rewritten."""
        for i in reversed(range(len(self.chunks))):
            items = self.chunks[i].value
            kept = tuple(e for e in items if wanted(e))
            if len(kept) == len(items):
                continue
            if kept:
                self.chunks[i] = StoredOnce(kept)
            else:
                del self.chunks[i]
        self.tail = [e for e in self.tail if wanted(e)]

    def snapshot(self) -> tuple[tuple[StoredOnce[tuple[Any, ...]], ...], tuple[Any, ...]]:
        return tuple(self.chunks), tuple(self.tail)


def plain(value: Any) -> Any:
    """``value`` with every part as ("part", digest, value): equal for equal states, parts
    included (the digest is the part's name in storage)."""
    if isinstance(value, StoredOnce):
        return ("part", value.digest, plain(value.value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def parts_in(value: Any) -> int:
    """How many parts ``value`` holds (not counting parts inside parts)."""
    if isinstance(value, StoredOnce):
        return 1
    if isinstance(value, dict):
        return sum(parts_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(parts_in(v) for v in value)
    return 0


# ---------------------------------------------------------------- crashing storage
class DriverCrash(BaseException):
    """The driver dies inside a storage call (a kill: no handler runs, hence not an
    Exception). The simulation catches it around the driver step and starts a new run."""


#: where a crash inside storage can be injected: (kind of file, operation, before/after it).
#: A write of a part "after" is the crash between a part's write and the next part's or its
#: record's; a record's write "before" comes after all its parts; "after" leaves a record of an
#: epoch Spark never logged (its inbound log not started); removals happen only in pruning
#: (records first, then the parts no record names). A part's write "before" is left out: before
#: the first part it is an ordinary crash, before a later one it is the "after" of the one before.
STORAGE_CRASH_POINTS = ("part write after", "record write before", "record write after",
                        "part remove before", "part remove after", "record remove after")
WRITE_CRASHES = {"part write after", "record write before", "record write after"}
PRUNE_CRASHES = {"part remove before", "part remove after", "record remove after"}


@dataclass
class CrashPlan:
    """Where the driver dies inside storage next: the ``skip``-th next operation at ``point``
    (the simulation's random source picks both). It outlives runs until it fires."""

    point: str
    skip: int


class CrashingFiles(Files):
    """The storage's file operations, which kill the driver where the simulation's
    :class:`CrashPlan` says (reads never: a restore's reads fail only on damage)."""

    def __init__(self, inner: Files, root: str, sim: Simulation) -> None:
        self.inner = inner
        self.parts_dir = posixpath.join(root, layout.PARTS) + "/"
        self.records_dir = posixpath.join(root, layout.RECORDS) + "/"
        self.sim = sim
        self.stats = sim.stats
        self.mutations = 0        # writes and removals of records and parts
        self.written_parts: set[str] = set()  # parts written since the last record

    def _kind(self, path: str) -> str | None:
        if path.startswith(self.parts_dir):
            return "part"
        if path.startswith(self.records_dir) and path.endswith(layout.RECORD_SUFFIX):
            return "record"
        return None

    def _point(self, point: str) -> None:
        plan = self.sim.storage_crash
        if plan is None or plan.point != point:
            return
        if plan.skip > 0:
            plan.skip -= 1
            return
        self.sim.storage_crash = None
        raise DriverCrash(point)

    def read(self, path: str) -> bytes:
        if self._kind(path) == "part":
            self.stats["part-files-read"] += 1
        return self.inner.read(path)

    def names(self, directory: str) -> list[str]:
        return self.inner.names(directory)

    def write_atomic(self, path: str, data: bytes, *, fsync: bool = False,
                     private: bool = False) -> None:
        kind = self._kind(path)
        if kind is None:
            self.inner.write_atomic(path, data, fsync=fsync, private=private)
            return
        self._point(f"{kind} write before")
        self.inner.write_atomic(path, data, fsync=fsync, private=private)
        self.mutations += 1
        if kind == "part":
            self.written_parts.add(posixpath.basename(path))
            self.stats["parts-written"] += 1
        else:
            self.written_parts = set()
        self._point(f"{kind} write after")

    def remove(self, path: str) -> None:
        kind = self._kind(path)
        if kind is None:
            self.inner.remove(path)
            return
        self._point(f"{kind} remove before")
        self.inner.remove(path)
        self.mutations += 1
        if kind == "part":
            self.stats["parts-deleted"] += 1
        self._point(f"{kind} remove after")


class SimStorage(CheckpointStorage):
    """The real storage on files that can crash, keeping what the checks need to explain the
    parts no record names (storage rule 3)."""

    def __init__(self, url: str, sim: Simulation) -> None:
        super().__init__(url, retain=2)
        self.files = self.crashing = CrashingFiles(self.files, self.root, sim)
        self.stats = sim.stats
        #: this run completed a pruning (its first one swept the parts of no record)
        self.pruned = False
        #: the parts the records present named when the pruning under way began
        self.pruning_names: set[str] = set()
        #: parts only a record overwritten since the last pruning named (a record of an epoch
        #: Spark never logged, left by an earlier run, replaced by this run's seal)
        self.replaced_names: set[str] = set()

    def parts_named(self) -> tuple[dict[int, set[str]], set[str]]:
        """The parts each record present names, and the parts present (one listing each)."""
        named = {}
        for epoch in self.record_epochs():
            record = self.read_record(epoch)  # raises if damaged: nothing here damages one
            named[epoch] = {n for snapshot in record.snapshots.values()
                            for n in snapshot_parts(snapshot)}
        present = {n for n in self.files.names(self._path(layout.PARTS)) if not n.startswith(".")}
        return named, present

    def write_record(self, record: CheckpointRecord,
                     parts: dict[str, StoredOnce[Any]] | None = None) -> None:
        if record.epoch in self.record_epochs():
            try:
                old = self.read_record(record.epoch)
            except CorruptRecord:
                pass
            else:
                self.replaced_names |= {n for snapshot in old.snapshots.values()
                                        for n in snapshot_parts(snapshot)}
                self.stats["garbage-record-replaced"] += 1
        super().write_record(record, parts)

    def prune(self, committed_epoch: int, operators: Sequence[SubtaskId] = ()) -> None:
        named, present = self.parts_named()
        self.pruning_names = set().union(*named.values())
        orphans = present - self.pruning_names
        super().prune(committed_epoch, operators)
        if not self.pruned and orphans:
            self.stats["orphan-parts-swept"] += len(orphans)
        self.pruned = True
        self.pruning_names = set()
        self.replaced_names = set()


# ---------------------------------------------------------------------- the coordinators
class NumberingCoordinator(OperatorCoordinator):
    """Sends numbered events; records what it sent and what it took effect of."""

    def __init__(self, context: CoordinatorContext, sim: Simulation) -> None:
        super().__init__(context)
        self.sim = sim
        self.deferred: tuple[int, Future[Any]] | None = None

    #: what it sent and its effects are :class:`Chunks` (state parts), not plain lists
    stored_parts = True

    # state: next number, sent events and effects, per subtask
    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        # the runtime hands over the state of the record it restored, parts read back (a new
        # run's restore, or a reset to the running epoch's record inside a run: rule 7)
        self.sim.check_restored(self.context.operator_id, checkpoint_id, state)
        p = self.context.parallelism
        if state is None:
            state = {"next": [0] * p, "sent": [[] for _ in range(p)], "effects": []}
        self.next = list(state["next"])
        self.sent = [self.items(x) for x in state["sent"]]
        self.effects = self.items(state["effects"])
        self.snapshots = {checkpoint_id: self.snapshot()}

    def items(self, state: Any) -> Any:
        """A list of its state: :class:`Chunks` (``stored_parts``) or a plain list."""
        return Chunks(state) if self.stored_parts else list(state)

    @staticmethod
    def items_snapshot(items: Any) -> Any:
        return items.snapshot() if isinstance(items, Chunks) else list(items)

    def snapshot(self) -> dict[str, Any]:
        return {"next": list(self.next), "sent": [self.items_snapshot(x) for x in self.sent],
                "effects": self.items_snapshot(self.effects)}

    def _send(self, subtask: int, event: Any) -> None:
        fut = self.gateway(subtask).send_event(event)
        if fut.done() and fut.exception() is not None:
            return  # refused at once: not sent
        self.sent[subtask].append(event)

    def send_next(self, subtask: int) -> None:
        """A spontaneous send (on the mailbox)."""
        if self.next[subtask] >= self.sim.numbers_per_subtask:
            return
        k = self.next[subtask]
        self.next[subtask] = k + 1
        self._send(subtask, ("x", subtask, k))

    def reply_target(self, subtask: int) -> int:
        return (subtask + 1) % self.context.parallelism

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.effects.append(event)
        self._send(self.reply_target(subtask), ("r", event))

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        if self.sim.rng.random() < self.sim.defer_probability:
            self.deferred = (checkpoint_id, result)  # completed later, from outside
            return
        self.snapshots[checkpoint_id] = self.snapshot()
        result.set_result(self.snapshot())

    def complete_deferred(self, decline: bool) -> None:
        """Complete (or fail) a deferred checkpoint future (on the mailbox, one step late)."""
        if self.deferred is None:
            return
        checkpoint_id, result = self.deferred
        self.deferred = None
        if decline:
            result.set_exception(RuntimeError(f"declined {checkpoint_id} on purpose"))
        else:
            self.snapshots[checkpoint_id] = self.snapshot()
            result.set_result(self.snapshot())

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        key = (self.context.operator_id, checkpoint_id)
        self.sim.world.completions.setdefault(key, []).append(list(self.effects))


class AskingCoordinator(NumberingCoordinator):
    """Also answers requests: each gets the next unique id, and the answer is announced to the
    *next* subtask (an answer that another subtask acts on: a retry must not change it).
    Every third answer comes later, from a parked future completed on the mailbox.
    Its snapshot has no parts (scripts/soak.py unpickles it as it is)."""

    stored_parts = False

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.next_id = (state or {}).get("next_id", 0)
        self.answers: list[tuple[Any, int]] = list((state or {}).get("answers", []))
        # ids given back by withdrawn requests: handed out again first
        self.returned: list[int] = list((state or {}).get("returned", []))
        self.client_adds: list[int] = list((state or {}).get("client_adds", []))
        self.parked: list[tuple[Future[Any], int]] = []
        super().reset_to_checkpoint(checkpoint_id, state)

    def snapshot(self) -> dict[str, Any]:
        snap = super().snapshot()
        snap["next_id"] = self.next_id
        snap["answers"] = list(self.answers)
        snap["returned"] = list(self.returned)
        snap["client_adds"] = list(self.client_adds)
        return snap

    def handle_client_request(self, request: Any) -> Any:
        """The driver program adds ``k`` (its k-th request): must take effect exactly once."""
        self.client_adds.append(request[1])
        return len(self.client_adds)

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        self.effects.append(request)
        if self.returned:
            answer = self.returned.pop(0)
        else:
            answer = self.next_id
            self.next_id += 1
        self.answers.append((request, answer))
        self._send(self.reply_target(subtask), ("a", request, answer))
        if answer % 3 == 1:
            parked: Future[Any] = Future()
            self.parked.append((parked, answer))
            return parked
        return answer

    def handle_items_withdrawn(self, subtask: int, attempt: int, withdrawn: list[Any]) -> None:
        # the surviving attempt finished without these: undo their effects, and take back the
        # id each request was given (answered or still parked), to hand it out again
        for item in withdrawn:
            assert isinstance(self.effects, list)
            self.effects.remove(item.item)
            if item.is_request:
                given = next(a for r, a in self.answers if r == item.item)
                assert not item.answered or item.answer == given, (item, given)
                self.answers.remove((item.item, given))
                self.returned.append(given)
                self.parked = [(f, a) for f, a in self.parked if a != given]

    def complete_parked(self) -> None:
        parked, self.parked = self.parked, []
        for fut, answer in parked:
            fut.set_result(answer)


class PerSubtaskCoordinator(NumberingCoordinator):
    """Only ever touches the subtask whose event it handles: uses Flink's subtask reset."""

    resets_per_subtask = True

    def reply_target(self, subtask: int) -> int:
        return subtask

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        snap = self.snapshots[checkpoint_id]
        # forget what the subtask did after the boundary; its held events failed: re-offer
        # them by rewinding the counter and the record of what was sent.
        self.next[subtask] = snap["next"][subtask]
        self.sent[subtask] = self.items(snap["sent"][subtask])
        assert isinstance(self.effects, Chunks)
        self.effects.keep(lambda e: not (e[1] == subtask and e[2] >= checkpoint_id))


# --------------------------------------------------------------------------- the tasks
class TaskFailed(Exception):
    pass


@dataclass
class Task:
    """One attempt of one subtask in one batch, advanced step by step."""

    sid: SubtaskId
    epoch: int
    number: int
    attempt: TaskAttempt
    phase: str = "register"
    state: list[Any] = field(default_factory=list)
    rows: list[Any] = field(default_factory=list)
    sends: list[Any] = field(default_factory=list)  # every item's payload, in order
    asks: set[int] = field(default_factory=set)      # the items that are requests
    pending: Future[Any] | None = None               # the answer a request waits for
    seq: int = 0
    done: bool = False
    history_length: int = 0  # the adopted history's length (registration says it)
    adopted: bool = False    # it continues a logged history (a retry, or a rerun's task)
    registered: bool = False  # a first attempt registers with its first item or its finish


# ------------------------------------------------------------------------- the simulation
class Simulation:
    """Drives one :class:`World` through runs of the real service. See the module docstring."""

    def __init__(self, seed: int, *, parallelism: int = 2, numbers_per_subtask: int = 4,
                 defer_probability: float = 0.3, tolerable_failures: int = 1,
                 per_subtask_operator: bool = True, asking_operator: bool = True,
                 upgrades: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        #: upgrades (core/encoding.py rule 6): a restart may run a sparkcoord that encodes
        #: the same items as other bytes; its own generator, so a seed's other steps stay
        self.upgrades = upgrades
        self._upgrade_rng = random.Random(seed * 7919 + 1)
        self.protocol = pickle.HIGHEST_PROTOCOL
        self.parallelism = parallelism
        self.numbers_per_subtask = numbers_per_subtask
        self.defer_probability = defer_probability
        self.world = World(url=f"memory://sparkcoord-sim/{uuid.uuid4().hex}")
        self.specs = [CoordinatorSpec("cross", lambda ctx: NumberingCoordinator(ctx, self),
                                      parallelism)]
        if per_subtask_operator:
            self.specs.append(CoordinatorSpec(
                "split", lambda ctx: PerSubtaskCoordinator(ctx, self), parallelism))
        if asking_operator:
            self.specs.append(CoordinatorSpec(
                "ask", lambda ctx: AskingCoordinator(ctx, self), parallelism))
        self.config = ServiceConfig(checkpoint_timeout_s=TIMEOUT_S,
                                    tolerable_checkpoint_failures=tolerable_failures)
        self.runs = 0
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        #: what a check on a mailbox found (an assertion there would only fail the job)
        self.violations: list[str] = []
        self.storage_crash: CrashPlan | None = None
        self._new_run()

    # --------------------------------------------------------------------------- runs
    def encode_item(self, item: Any) -> bytes:
        """A task's (or the client's) event or request as this run's sparkcoord encodes it."""
        return pickle.dumps(item, self.protocol)

    def _new_run(self) -> None:
        self.runs += 1
        if self.upgrades and self.runs > 1:
            protocol = self._upgrade_rng.choice((4, 5))
            if protocol != self.protocol:
                self.stats["upgrades"] += 1
                self.log(f"upgrade: this run encodes items with pickle protocol {protocol}")
            self.protocol = protocol
        self.mailboxes = ManualMailboxes()
        self.clock = ManualClock()
        self.storage = SimStorage(self.world.url, self)
        self._checked_mutations = -1  # the storage is checked after the run's first step
        self.service = CoordinationService(self.specs, self.storage, config=self.config,
                                           clock=self.clock, mailbox_factory=self.mailboxes,
                                           run_id=f"run{self.runs}")
        self._watch_value_comparisons()
        self.phase = "first-call"
        self.batch = -1          # the batch being constructed / run
        self.cur_end = NO_EPOCH  # end epoch of the last logged batch
        self.pending: Future[Any] | None = None
        self.record: Any = None
        self.tasks: dict[SubtaskId, Task] = {}
        self.failures_in_batch: Counter[SubtaskId] = Counter()
        self.zombies: list[Task] = []

    def _watch_value_comparisons(self) -> None:
        """Counts the re-sent items the inbox compares with the logged ones by value (a rerun
        after an upgrade re-sends its histories as other bytes), and checks that each is
        compared outside the service's lock (runtime/inbox.py rule 6)."""
        inbox, lock = self.service.inbox, self.service._lock
        compare = inbox._compare_values

        def counted(pairs: Sequence[tuple[bytes, bytes]],
                    compared: dict[tuple[bytes, bytes], bool]) -> None:
            if pairs:
                assert not lock._is_owned(), "a re-sent item compared under the inbox's lock"
                self.stats["resent-compared-by-value"] += len(pairs)
            compare(pairs, compared)
        inbox._compare_values = counted  # type: ignore[method-assign]

    def crash(self, why: str, storage_point: str | None = None) -> None:
        """The driver dies: everything volatile is lost. Spark restarts the query.
        ``storage_point``: it died inside a storage call (STORAGE_CRASH_POINTS)."""
        self.log(f"CRASH ({why}) in phase {self.phase}")
        # the end of a run: what it leaves must hold parts to rule 3, and every record Spark
        # logged that is left must restore to the state that was sealed in it
        self.check_storage(storage_point)
        self.check_logged_records()
        self.stats["crash"] += 1
        self._new_run()
        self.world.client_waiting = None  # its connection died: the client re-sends

    def log(self, line: str) -> None:
        self.trace.append(line)

    def coordinator(self, name: str) -> NumberingCoordinator | None:
        holder = self.service.holders.get(name)
        return holder.coordinator if holder is not None else None  # type: ignore[return-value]

    # ------------------------------------------------------------------------ driver
    def driver_step(self, force_checkpoint: bool = False) -> None:
        """Advance Spark's driver loop by one call (the driver may die inside a storage call
        it makes). Only driver calls write or delete records and parts: the storage is checked
        after each that did."""
        storage = self.storage
        try:
            self._driver_step(force_checkpoint)
        except DriverCrash as exc:
            self.stats["storage-crash"] += 1
            self.stats[f"storage-crash: {exc}"] += 1
            self.crash(f"injected inside storage: {exc}", storage_point=str(exc))
        else:
            if self.storage is storage and storage.crashing.mutations != self._checked_mutations:
                self._checked_mutations = storage.crashing.mutations
                self.check_storage()
        assert not self.violations, f"seed {self.seed}: {self.violations[0]}"

    def _driver_step(self, force_checkpoint: bool) -> None:
        if self.service.failure is not None:
            if "nondeterministic subtask" in self.service.failure:
                # the simulated workers keep the contract (a batch that runs again sends
                # what a finished attempt sent): the gate must never call them divergent
                self.violations.append(f"a contract-keeping worker was refused: "
                                       f"{self.service.failure}")
            self.crash(f"job failed: {self.service.failure}")
            return
        w = self.world
        if self.phase == "first-call":
            last = w.last_batch()
            if last is None or last in w.commits:
                self.batch = -1 if last is None else last
                self.cur_end = NO_EPOCH if last is None else w.offsets[last][1]
                self.service.latest_offset_called(self.cur_end)
                self.phase = "idle"
                self.log(f"run {self.runs}: first call latestOffset({self.cur_end})")
                if self.cur_end != NO_EPOCH:
                    replayed = sum(isinstance(e, RequestEntry)
                                   for e in self.storage.read_inbound_log(self.cur_end))
                    self.stats["requests-replayed"] += replayed
                    self.stats["requests-replayed-after-commit"] += replayed
                self._maybe_trigger(force_checkpoint)
            else:
                self.batch = last
                start, end = w.offsets[last]
                self.cur_end = end
                self.log(f"run {self.runs}: first call partitions({start}, {end})")
                self.record = self.service.partitions_called(start, end)
                if self.service.holders and self.service.inbox.gate is not None and \
                        self.service.inbox.gate.answers_requests("ask"):
                    self.stats["resumed-with-history"] += 1  # the rerun adopts the answers
                    # and the restored coordinators were handed the kept requests again
                    self.stats["requests-replayed"] += sum(
                        isinstance(e, RequestEntry)
                        for e in self.storage.read_uncommitted_inbound_log(end))
                self._start_tasks()
            return
        if self.phase == "idle":
            self.service.latest_offset_called(self.cur_end)
            self._maybe_trigger(force_checkpoint)
        elif self.phase == "checkpointing":
            assert self.pending is not None
            if not self.pending.done():
                return
            exc = self.pending.exception()
            if isinstance(exc, JobFailed):
                self.crash("checkpoint failed the job")
                return
            if isinstance(exc, CheckpointDeclined):
                self.stats["declined"] += 1
                self.log(f"checkpoint declined: {exc}")
                self.phase = "idle"
                return
            assert exc is None, exc
            prepared = self.pending.result()
            self.record = self.service.seal(prepared)
            w.sealed[self.record.epoch] = self._handed_over(prepared)
            self.log(f"sealed epoch {self.record.epoch} with {self.record.event_count()} events")
            self.phase = "sealed"
        elif self.phase == "sealed":
            self.batch += 1
            w.offsets[self.batch] = (self.cur_end, self.record.epoch)
            self.cur_end = self.record.epoch
            self.log(f"offsets/{self.batch} = {w.offsets[self.batch]}")
            self.phase = "logged"
        elif self.phase == "logged":
            start, end = w.offsets[self.batch]
            self.record = self.service.partitions_called(start, end)
            self._start_tasks()
        elif self.phase == "running":
            if all(t.done for t in self.tasks.values()):
                if self.batch not in w.sink:  # the parquet sink is idempotent per batch id
                    w.sink[self.batch] = {sid: list(t.rows) for sid, t in self.tasks.items()}
                w.committed_sends[self.batch] = {sid: list(t.sends) for sid, t in self.tasks.items()}
                self.phase = "sink-committed"
        elif self.phase == "sink-committed":
            w.commits.add(self.batch)
            self.log(f"commits/{self.batch}")
            self.stats["batches"] += 1
            self.tasks = {}
            self.zombies = []
            self.phase = "idle"

    def _maybe_trigger(self, force: bool) -> None:
        if not (force or self.service.has_held_events()):
            return
        checkpoint_id = self.service.next_checkpoint_id
        self.pending = self.service.trigger_checkpoint(checkpoint_id)
        self.log(f"trigger checkpoint {checkpoint_id}")
        self.phase = "checkpointing"

    def _start_tasks(self) -> None:
        self.failures_in_batch = Counter()
        self.tasks = {}
        for spec in self.specs:
            for index in range(spec.parallelism):
                sid = SubtaskId(spec.name, index)
                self.tasks[sid] = self._new_task(sid, 0)
        self.phase = "running"

    def _new_task(self, sid: SubtaskId, number: int) -> Task:
        epoch = self.cur_end
        return Task(sid, epoch, number, TaskAttempt(self.service.run_id, sid, epoch, number))

    # ------------------------------------------------------------------------- tasks
    def task_step(self, task: Task) -> None:
        """Advance one task by one step (raises TaskFailed when the service refuses it)."""
        svc = self.service
        if task.phase == "register":
            if task.number > 0 or svc.inbox.history_length(task.sid) > 0:
                # a retry, or a rerun's task that continues a kept history, registers at once
                # (as the real one does: CoordinatedPartition.continues_history); a first
                # attempt registers with its first item, or with its finish
                self._register(task)
            restored = self.storage.read_subtask_state(task.sid, task.epoch)
            task.state = pickle.loads(restored[1]) if restored else []
            task.phase = "apply"
        elif task.phase == "apply":
            # every event of the epoch, in order, before any data of the batch
            for payload in self.record.events_for(task.sid):
                event = pickle.loads(payload)
                task.state.append(event)
                task.rows.append(event)
            # one event back per numbered event received (replies start no new exchange);
            # subtasks of "ask" also ask a request with each, before it or (odd s + i) after
            count = sum(1 for e in task.rows if e[0] == "x")
            n, s, epoch = len(task.state), task.sid.index, task.epoch
            task.sends = []
            for i in range(count):
                if task.sid.operator == "ask" and (s + i) % 2:
                    # an event before the request: a history may hold events and no request
                    # yet (decision 75: such a history that did not finish binds nothing)
                    task.sends.append(("y", s, epoch, i, n))
                    task.asks.add(len(task.sends))
                    task.sends.append(("q", s, epoch, i, n))
                    continue
                if task.sid.operator == "ask":
                    task.asks.add(len(task.sends))
                    task.sends.append(("q", s, epoch, i, n))
                task.sends.append(("y", s, epoch, i, n))
            every_item = list(task.sends)
            earlier = [(run, sent) for run, sent in
                       self.world.finishes.get((task.sid, task.epoch), {}).items()
                       if run < self.runs]
            finished = min(earlier) if earlier else None
            if finished is not None:
                # the batch runs again after a restart and an attempt of an earlier run
                # finished it: a sink may hold its output. The worker keeps the contract (a
                # task that runs a batch again sends the same items: docs/protocol.md
                # [logged-finish-binds-the-rerun]) in every attempt; the gate refuses a rerun
                # that breaks it (a contract keeping worker is never refused: ``_driver_step``),
                # and tests/runtime/test_requests.py covers reruns that break it
                assert task.sends[:len(finished[1])] == finished[1], (task.attempt, finished)
                task.sends = list(finished[1])
                self.stats["rerun-after-finish"] += 1
            elif task.number == 0 and task.adopted:
                # the batch runs again after a restart and continues a history whose attempt
                # did not finish: the worker sends what that run logged and stops (a time
                # budget), or goes on past it (decision 75: a history without a finish binds
                # nothing)
                if self.rng.random() < 0.5 and len(task.sends) > task.history_length:
                    self.stats["rerun-continued-unfinished-history"] += 1
                else:
                    task.sends = task.sends[:task.history_length]
            elif task.adopted and task.history_length and self.rng.random() < 0.5:
                # a retry whose time budget runs out inside the history it adopted: what it
                # does not send again is withdrawn at its finish
                task.sends = task.sends[:self.rng.randint(0, task.history_length - 1)]
                self.stats["retry-stops-inside-history"] += 1
            elif task.sends and self.rng.random() < (0.5 if task.number else 0.1):
                # a worker with a time budget: this attempt stops after a prefix of its items
                # (a retry that asks less than the attempt whose history it adopted)
                task.sends = task.sends[:self.rng.randint(0, len(task.sends))]
            if finished is None:
                self._free_after_replaced_finish(task, every_item)
            task.phase = "send"
        elif task.phase == "send":
            if task.seq in task.asks and task.seq < len(task.sends):
                self._request_step(task)
            elif task.seq < len(task.sends):
                # a lone event or a burst (a run of consecutive events, as the channel sends)
                count = min(len(task.sends) - task.seq, self.rng.choice((1, 1, 2, 3)))
                for i in range(task.seq, task.seq + count):
                    if i in task.asks:
                        count = i - task.seq  # a burst ends before a request
                        break
                self._send_run(task, task.seq, count)
                task.seq += count
            else:
                task.phase = "finished"
        elif task.phase == "finished":
            # every attempt says how many items it sent (one that sent nothing registers with
            # it), and what it did not send of a longer history is withdrawn (gate rule 6);
            # the task waits until the coordinator took that back
            if task.pending is None:
                if not task.registered:
                    self.stats["registered-with-finish"] += 1
                self._register(task)
                task.pending = svc.inbox.attempt_finished(task.attempt, task.seq)
                task.pending.add_done_callback(
                    lambda f, t=task, n=task.seq: self._withdrawn_taken(t, n, f.result()))
                if not task.pending.done() or task.pending.result().verdict is Verdict.ACCEPT:
                    # logged (the decision may wait for the coordinator to take items back):
                    # from here on the log binds a later run to these items (gate rule 6)
                    self.world.finishes.setdefault((task.sid, task.epoch), {})[self.runs] = (
                        task.sends[:task.seq])
            if not task.pending.done():
                return
            decision, task.pending = task.pending.result(), None
            if decision.verdict is Verdict.REJECT:
                raise TaskFailed(decision.reason)
            if decision.withdrawn:
                self.stats["withdrawn"] += 1
            task.phase = "snapshot"
        elif task.phase == "snapshot":
            self.storage.write_subtask_state(task.sid, task.epoch, pickle.dumps(task.state))
            task.phase = "finish"
        elif task.phase == "finish":
            task.done = True

    def _free_after_replaced_finish(self, task: Task, every_item: list[Any]) -> None:
        """A rerun's attempt where an earlier run's attempt finished and a retry of its own run
        replaced it (the path kept_at_rerun frees): half the time it sends more or fewer
        items than that finished attempt sent (a time budget). Counts one that sends other
        items, and one that asks where that attempt asked nothing (the gate must refuse
        neither: a contract-keeping worker is never refused)."""
        for run, sent in self.world.replaced_finishes.get((task.sid, task.epoch), {}).items():
            if run >= self.runs:
                continue
            self.stats["rerun-after-replaced-finish"] += 1
            other = [n for n in range(len(every_item) + 1) if n != len(sent)]
            if task.number == 0 and other and self.rng.random() < 0.5:
                task.sends = every_item[:self.rng.choice(other)]
            if task.sends == sent:
                continue
            self.stats["rerun-free-after-replaced-finish"] += 1
            if (any(i < len(task.sends) for i in task.asks)
                    and not any(item[0] == "q" for item in sent)):
                self.stats["rerun-asks-after-replaced-unasked-finish"] += 1
            return

    def _register(self, task: Task) -> None:
        """Register ``task``'s attempt if it has not yet (a first attempt does it lazily, with
        its first item or its finish, as the real client does: channel client rule 2)."""
        if task.registered:
            return
        decision = self.service.inbox.attempt_registered(task.attempt)
        if decision.verdict is Verdict.REJECT:
            raise TaskFailed(decision.reason)
        if decision.adopted:
            self.stats["retry-adopted"] += 1  # rule 5 of the gate: no reset
        if decision.verdict is Verdict.ACCEPT and task.number > 0:
            # a retry's registration is logged before it is answered: an attempt of this run
            # that finished was retried after all, so its finish binds no later run
            replaced = self.world.finishes.get((task.sid, task.epoch), {}).pop(self.runs, None)
            if replaced is not None:
                self.world.replaced_finishes.setdefault(
                    (task.sid, task.epoch), {})[self.runs] = replaced
                self.stats["finish-replaced-by-retry"] += 1
        if task.number == 0 and not (task.phase == "register"):
            self.stats["registered-lazily"] += 1
        task.history_length = decision.history_length
        task.adopted = decision.adopted
        task.registered = True

    def _request_step(self, task: Task) -> None:
        """Ask request ``task.seq`` (or look whether its answer came): the task blocks on it."""
        if task.pending is None:
            self._register(task)
            task.pending = self.service.inbox.request_received(
                task.attempt, task.seq, self.encode_item(task.sends[task.seq]))
        if not task.pending.done():
            return
        fut, task.pending = task.pending, None
        if fut.exception() is not None:
            raise TaskFailed(str(fut.exception()))
        entry = fut.result()
        assert not entry.failed, entry
        answer = pickle.loads(entry.payload)
        self._observe(task, task.seq, answer)
        task.state.append(("ans", task.sends[task.seq], answer))
        task.rows.append(("ans", task.sends[task.seq], answer))
        task.seq += 1

    def _withdrawn_taken(self, task: Task, sent: int, decision: Any) -> None:
        # A withdrawn answer was used by no surviving attempt, so its number may be asked
        # anew and get another answer (gate rule 6). The withdrawal stands once it is logged,
        # also when the task never hears of it (it failed while waiting, or the job failed
        # before the coordinator took the items back: a restore replays it).
        seqs: list[int] = [item.seq for item in decision.withdrawn]
        if not seqs and decision.verdict is Verdict.REJECT and any(
                isinstance(e, FinishedEntry) and e.attempt == task.attempt
                for e in self.storage.read_uncommitted_inbound_log(task.epoch)):
            seqs = list(range(sent, task.history_length))
        for seq in seqs:
            self.world.observed.pop((task.sid, task.epoch, seq), None)

    def _observe(self, task: Task, seq: int, answer: Any) -> None:
        # no answer may ever change: not for a retry, not for a replayed batch (issue 12)
        key = (task.sid, task.epoch, seq)
        seen = self.world.observed.setdefault(key, answer)
        assert seen == answer, (f"seed {self.seed}: {task.attempt} got {answer} for request "
                                f"{seq}, an earlier attempt got {seen}")
        self.stats["answers"] += 1

    def _send_run(self, task: Task, first: int, count: int) -> RunDecision:
        self._register(task)
        payloads = tuple(self.encode_item(task.sends[i]) for i in range(first, first + count))
        decision = self.service.inbox.event_runs_received([(task.attempt, first, payloads)])[0]
        if decision.rejected:
            raise TaskFailed(decision.reason)
        return decision

    def fail_task(self, sid: SubtaskId, why: str) -> None:
        """The running attempt of ``sid`` fails; Spark retries it (or fails the query)."""
        old = self.tasks[sid]
        self.stats["task-failure"] += 1
        self.log(f"task {old.attempt} failed: {why}")
        self.failures_in_batch[sid] += 1
        if self.failures_in_batch[sid] >= 4:  # spark.task.maxFailures
            self.crash(f"{sid} failed 4 times")
            return
        self.zombies.append(old)
        self.tasks[sid] = self._new_task(sid, old.number + 1)

    # -------------------------------------------------------------------- random steps
    def random_step(self, faults: bool) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.15:
            self._coordinator_sends()
        elif roll < 0.35:
            self.mailboxes.run_random(rng, rng.randint(1, 6))
        elif roll < 0.55:
            self.driver_step()
        elif roll < 0.8:
            self._random_task_step(faults)
        elif roll < 0.85:
            self._complete_deferred(decline=faults and rng.random() < 0.3)
        elif roll < 0.88:
            self._complete_parked()
        elif roll < 0.9:
            self._client_step(lost=faults and rng.random() < 0.3)
        elif faults and roll > 0.96:
            self._inject_fault()
        else:
            self.mailboxes.run_all()

    def _coordinator_sends(self) -> None:
        # Like a timer of the coordinator's own (call_periodically): runs on its mailbox, so
        # its state and its sends change together.
        for spec in self.specs:
            coord = self.coordinator(spec.name)
            if coord is not None:
                subtask = self.rng.randrange(spec.parallelism)
                coord.context.run_in_coordinator_thread(lambda c=coord, s=subtask: c.send_next(s))

    def _client_step(self, lost: bool = False) -> None:
        """The driver program asks the "ask" coordinator to add its next number (or re-sends
        the request it has no answer to, with the same number: the service answers it once).
        ``lost``: an answer that came is lost on the way, so the request is sent again."""
        if "ask" not in self.service.holders:
            return
        w = self.world
        seq = w.client_next
        if seq >= CLIENT_REQUESTS:
            return
        if w.client_waiting is None or w.client_waiting.done() and (
                w.client_waiting.exception() is not None or lost):
            w.client_waiting = self.service.inbox.request_received(
                DriverClient("ask", "driver"), seq, self.encode_item(("add", seq)))
            self.stats["client-requests"] += 1
        fut = w.client_waiting
        if fut.done() and fut.exception() is None and not lost:
            w.client_answered.append(seq)
            w.client_next += 1
            w.client_waiting = None

    def _complete_parked(self) -> None:
        # the asking coordinator answers its parked requests (a later action on its mailbox)
        coord = self.coordinator("ask")
        if isinstance(coord, AskingCoordinator):
            coord.context.run_in_coordinator_thread(coord.complete_parked)

    def _complete_deferred(self, decline: bool) -> None:
        # The coordinator's own thread completes a deferred future one step late: sends queued
        # on the mailbox before this action land before the boundary, and are in the snapshot.
        for spec in self.specs:
            coord = self.coordinator(spec.name)
            if coord is not None and coord.deferred is not None:
                coord.context.run_in_coordinator_thread(
                    lambda c=coord: c.complete_deferred(decline))
                return

    def _random_task_step(self, faults: bool) -> None:
        running = [t for t in self.tasks.values() if not t.done]
        if self.phase != "running" or not running:
            self.driver_step()
            return
        task = self.rng.choice(running)
        withdrawn = self.stats["withdrawn"]
        replaced = self.stats["finish-replaced-by-retry"]
        try:
            self.task_step(task)
        except TaskFailed as exc:
            self.fail_task(task.sid, str(exc))
            return
        if faults and self.stats["finish-replaced-by-retry"] > replaced and self.rng.random() < 0.3:
            # a retry replaced a finished attempt of its run, then the driver dies before the
            # retry finishes: the batch runs again, free of that finish (decision 76)
            self.stats["crash-after-replaced-finish"] += 1
            self.crash("injected after a retry replaced a finish")
            return
        if (faults and task.phase == "snapshot" and task.seq and task.sid.operator == "ask"
                and self.rng.random() < 0.5):
            # its finish was taken, then its task failed (writing its output): the retry
            # adopts or resets, and may send less (a withdrawal)
            self.stats["failed-after-finish"] += 1
            self.fail_task(task.sid, "injected after its finish")
            return
        if (faults and task.phase == "snapshot" and not (task.seq and task.sid.operator == "ask")
                and self.rng.random() < 0.1):
            # the same for an attempt that asked nothing (its operator's log may not be kept
            # at a rerun; then only its finish is, unless this retry replaced it)
            self.stats["failed-after-finish-unasked"] += 1
            self.fail_task(task.sid, "injected after its finish")
            return
        if faults and self.stats["withdrawn"] > withdrawn and self.rng.random() < 0.4:
            # right after a withdrawal: the batch runs again from a restore that replays the
            # log with the withdrawal in it (or, once committed, the crash-idle case below)
            self.stats["crash-after-withdrawal"] += 1
            self.crash("injected after a withdrawal")
            return
        if (faults and task.phase in ("send", "finished", "snapshot") and task.seq - 1 in task.asks
                and task.pending is None and self.rng.random() < 0.2):
            # the answer was lost on the way: the task asks again, and must get the same one
            self.stats["lost-response"] += 1
            again = self.service.inbox.request_received(task.attempt, task.seq - 1,
                                                  self.encode_item(task.sends[task.seq - 1]))
            if again.done() and again.exception() is None:
                self._observe(task, task.seq - 1, pickle.loads(again.result().payload))
            return
        if (faults and task.phase == "send" and task.seq > 0 and not task.asks
                and self.rng.random() < 0.1):
            # acknowledgements were lost: the task sends its last events again, maybe in one
            # burst with new ones (a resend after a reconnect)
            self.stats["resend"] += 1
            again = self.rng.randint(1, min(task.seq, 3))
            new = self.rng.randint(0, min(2, len(task.sends) - task.seq))
            decision = self._send_run(task, task.seq - again, again + new)
            assert (decision.duplicates, decision.accepted) == (again, new), decision
            task.seq += new

    def _inject_fault(self) -> None:
        rng = self.rng
        kind = rng.choice(["task", "task", "crash", "crash-idle", "crash-idle", "fail_job", "timeout",
                           "zombie", "storage-crash"])
        if kind == "task" and self.phase == "running":
            running = [t for t in self.tasks.values() if not t.done]
            if running:
                self.fail_task(rng.choice(running).sid, "injected")
        elif kind == "crash" and self.stats["crash"] < 3:
            self.crash("injected")
        elif (kind == "crash-idle" and self.phase == "idle" and self.stats["crash"] < 4
              and self.cur_end != NO_EPOCH and any(
                  isinstance(e, RequestEntry)
                  for e in self.storage.read_uncommitted_inbound_log(self.cur_end))):
            # right after a batch with requests committed: the restore replays that batch's
            # log, its requests and their logged answers (and withdrawals) included
            if any(isinstance(e, FinishedEntry)
                   for e in self.storage.read_uncommitted_inbound_log(self.cur_end)):
                self.stats["withdrawal-replayed-after-commit"] += 1
            self.crash("injected after a commit")
        elif (kind == "storage-crash" and self.stats["storage-crash-armed"] < 3
              and self.storage_crash is None):
            # the driver will die inside the next (or the one after, ...) storage call of this
            # kind, in this run or a later one: writing a checkpoint's parts and record, or
            # pruning
            self.stats["storage-crash-armed"] += 1
            self.storage_crash = CrashPlan(rng.choice(STORAGE_CRASH_POINTS), rng.randint(0, 2))
        elif kind == "fail_job" and self.stats["fail_job"] < 2:
            coord = self.coordinator(rng.choice(self.specs).name)
            if coord is not None:
                self.stats["fail_job"] += 1
                coord.context.fail_job("injected fail_job")
        elif kind == "timeout" and self.phase == "checkpointing":
            self.stats["timeout"] += 1
            self.clock.advance(TIMEOUT_S)
        elif kind == "zombie" and self.zombies:
            # a late event from a failed attempt: must be refused
            # a late event from a failed attempt: refused once a retry has registered; before
            # that the service cannot know the attempt died, and the retry's registration
            # undoes whatever it was accepted (rule 7)
            zombie = rng.choice(self.zombies)
            if zombie.seq < len(zombie.sends) and zombie.seq not in zombie.asks:
                if not zombie.registered:  # its REGISTER frame goes out with the event
                    zombie.registered = (self.service.inbox.attempt_registered(zombie.attempt)
                                         .verdict is not Verdict.REJECT)
                superseded = self.service.inbox.live_attempt(zombie.sid) != zombie.attempt
                decision = self.service.inbox.event_received(zombie.attempt, zombie.seq,
                                                       self.encode_item(zombie.sends[zombie.seq]))
                if superseded:
                    assert decision.verdict is Verdict.REJECT, decision
                    self.stats["zombie-refused"] += 1
                elif decision.verdict is Verdict.ACCEPT:
                    zombie.seq += 1
                    self.stats["zombie-accepted-then-undone"] += 1

    # ------------------------------------------------------------------------- drain
    def drain(self, max_steps: int = 20_000) -> None:
        """Run without faults until every number is delivered and the last batch completed
        (a crash inside storage planned before still comes: most checkpoints and prunings
        of a simulation happen here)."""
        for _ in range(max_steps):
            self.mailboxes.run_all()
            self._complete_deferred(decline=False)
            self.mailboxes.run_all()
            if self.phase == "running":
                for task in list(self.tasks.values()):
                    if self.phase != "running" or task is not self.tasks.get(task.sid):
                        break  # a crash (too many task failures) replaced the run
                    while not task.done:
                        try:
                            self.task_step(task)
                        except TaskFailed as exc:
                            self.fail_task(task.sid, str(exc))
                            break
                        self.mailboxes.run_all()
                        self._complete_parked()
                        self.mailboxes.run_all()
            self._coordinator_sends()
            self.mailboxes.run_all()
            if self._quiescent():
                return
            self.driver_step()
        raise AssertionError(f"seed {self.seed}: no quiescence after {max_steps} steps")

    def _quiescent(self) -> bool:
        if self.phase != "idle" or self.service.has_held_events():
            return False
        if any(spec.name == "ask" for spec in self.specs):
            self._client_step()
            self.mailboxes.run_all()
            self._client_step()
            if self.world.client_next < CLIENT_REQUESTS:
                return False
        for spec in self.specs:
            coord = self.coordinator(spec.name)
            if coord is None or any(n < self.numbers_per_subtask for n in coord.next):
                return False
        return True

    # --------------------------------------------------------------------- state parts
    @staticmethod
    def _handed_over(prepared: PreparedCheckpoint) -> dict[str, Any]:
        """The states the coordinators handed over for a record, parts included."""
        return {name: plain(load_snapshot(snapshot, prepared.parts.__getitem__))
                if snapshot is not None else None
                for name, snapshot in prepared.snapshots.items()}

    def check_restored(self, operator: str, checkpoint_id: int, state: Any) -> None:
        """A coordinator is reset to ``checkpoint_id`` with ``state`` (its mailbox): the state
        must be the one sealed in that record, every part read back equal to the one written
        (same name, same value)."""
        self.stats["restores-checked"] += 1
        if checkpoint_id == NO_EPOCH:
            want = None
        else:
            sealed = self.world.sealed.get(checkpoint_id)
            if sealed is None:
                self.violations.append(f"{operator} reset to {checkpoint_id}, never sealed")
                return
            want = sealed.get(operator)
        got = plain(state)
        if got != want:
            self.violations.append(f"{operator} reset to {checkpoint_id} with {got}, but its "
                                   f"record was sealed with {want}")
        elif parts_in(state):
            self.stats["restores-with-parts"] += 1

    def check_storage(self, crashed_inside: str | None = None) -> None:
        """Storage rule 3 at a step boundary (or where the driver died, ``crashed_inside``):
        no record present names a missing part, ever; and once this run pruned (its first
        pruning sweeps the parts of no record), no part is left that no record present names,
        but for the ones explained below."""
        ctx = f"seed {self.seed}"
        storage = self.storage
        named, present = storage.parts_named()
        for epoch, names in named.items():
            missing = names - present
            assert not missing, (f"{ctx}: the record of epoch {epoch} names parts "
                                 f"{sorted(missing)}, which are gone")
        if not storage.pruned:
            # parts of no record may be left by an earlier run that died between a part and
            # its record, or while pruning: this run's first pruning sweeps them (checked
            # right after it), and a restore does not read them
            return
        # explained: parts only a garbage record (an epoch Spark never logged) named, which
        # this run's seal of that epoch replaced: the next pruning deletes them
        explained = set(storage.replaced_names)
        if crashed_inside in WRITE_CRASHES:
            # died between the parts of a record and the record: they are named by nothing
            # until the next run's first pruning sweeps them ("record write after" left the
            # record itself, a garbage record naming them, so none is left here)
            explained |= storage.crashing.written_parts
        if crashed_inside in PRUNE_CRASHES:
            # died while pruning: the records it deleted went first, their parts may be left
            # (no part was deleted while a record present named it: checked above); the next
            # run's first pruning sweeps them
            explained |= storage.pruning_names
        orphans = present - set().union(*named.values()) - explained
        assert not orphans, (f"{ctx}: parts {sorted(orphans)} are left that no record present "
                             f"names (records {sorted(named)}, after a pruning of run {self.runs}"
                             f"{'; died inside ' + crashed_inside if crashed_inside else ''})")

    def check_logged_records(self) -> None:
        """Every record of an epoch Spark logged that is left restores, read by a storage that
        caches nothing (every part read from its file and checked against its name), to the
        state sealed in it; the newest one (the next run's restore point) is left."""
        w = self.world
        last = w.last_batch()
        if last is None:
            return
        fresh = CheckpointStorage(w.url, retain=2)
        present = set(fresh.record_epochs())
        newest = w.offsets[last][1]
        assert newest in present, f"seed {self.seed}: the record of logged epoch {newest} is gone"
        for epoch in sorted({end for _, end in w.offsets.values()} & present):
            record = fresh.read_record(epoch)
            for name, want in w.sealed[epoch].items():
                snapshot = record.snapshots[name]
                got = plain(load_snapshot(snapshot, fresh.read_part, f"{name} of {epoch}")
                            if snapshot is not None else None)
                assert got == want, (f"seed {self.seed}: the record of epoch {epoch} reads "
                                     f"back {name} as {got}, sealed as {want}")

    # --------------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Assert the exactly-once outcome in both directions (see the module docstring)."""
        w = self.world
        ctx = f"seed {self.seed}"
        assert not self.violations, f"{ctx}: {self.violations}"
        self.check_storage()
        self.check_logged_records()
        committed = sorted(w.commits)
        assert committed, f"{ctx}: nothing committed"
        last_epoch = w.offsets[committed[-1]][1]
        record = self.storage.read_record(last_epoch)
        for spec in self.specs:
            snapshot = record.snapshots[spec.name]
            assert snapshot is not None
            snap = load_snapshot(snapshot, self.storage.read_part)
            coord = self.coordinator(spec.name)
            assert coord is not None
            for s in range(spec.parallelism):
                sid = SubtaskId(spec.name, s)
                restored = self.storage.read_subtask_state(sid, last_epoch + 1)
                state = pickle.loads(restored[1]) if restored else []
                # (1) coordinator -> subtask: the state holds exactly what the coordinator's
                # surviving snapshot says it sent before the boundary, once each, in order
                # (and, for "ask", the answers it consumed: checked below)
                received = [e for e in state if e[0] != "ans"]
                sent = list(Chunks(snap["sent"][s]))
                assert received == sent, f"{ctx}: {sid} holds {received}, coordinator sent {sent}"
                numbers = [e[2] for e in state if e[0] == "x"]
                assert numbers == list(range(self.numbers_per_subtask)), (
                    f"{ctx}: {sid} numbers {numbers}")
                # (3) the sink holds exactly what was delivered, batch by batch
                sunk = [e for b in committed for e in w.sink[b].get(sid, [])]
                assert sunk == state, f"{ctx}: sink of {sid} is {sunk}, state {state}"
                # (2) subtask -> coordinator: every event of every committed batch from the
                # surviving attempts took effect exactly once, in order
                expected = [e for b in committed for e in w.committed_sends[b].get(sid, [])]
                got = [e for e in coord.effects if e[1] == s]
                assert got == expected, f"{ctx}: {spec.name} took effect of {got} from {sid}, expected {expected}"
            if spec.name == "ask":
                # (4) requests: every id the coordinator's surviving state handed out was
                # consumed exactly once by a surviving task, and none was lost (no gap)
                consumed = sorted(
                    (e[1], e[2]) for s in range(spec.parallelism)
                    for e in self._final_state(SubtaskId(spec.name, s), last_epoch)
                    if e[0] == "ans")
                handed = sorted((tuple(r), a) for r, a in snap["answers"])
                assert [(tuple(r), a) for r, a in consumed] == handed, (
                    f"{ctx}: answers consumed {consumed}, handed out {handed}")
                # ... or was returned by a withdrawal and waits to be handed out again
                ids = sorted([a for _, a in handed] + snap["returned"])
                assert ids == list(range(snap["next_id"])), (
                    f"{ctx}: ids handed out {sorted(a for _, a in handed)}, returned "
                    f"{snap['returned']}, next {snap['next_id']}")
                # (5) client requests: every answered one took effect exactly once, in order,
                # and none that was only logged twice (the live, restored state)
                assert isinstance(coord, AskingCoordinator)
                adds = coord.client_adds
                assert adds == sorted(set(adds)), f"{ctx}: client adds {adds}"
                assert set(w.client_answered) <= set(adds), (
                    f"{ctx}: answered {w.client_answered}, in the state {adds}")
            # every notify_checkpoint_complete(N) saw all events of the batches up to N
            # exactly once, and a repeated completion (after a restart) saw the same state
            for (name, epoch), seen in w.completions.items():
                if name != spec.name:
                    continue
                want = Counter(e for b in committed if w.offsets[b][1] <= epoch
                               for sid, sends in w.committed_sends[b].items()
                               if sid.operator == name for e in sends)
                for effects in seen:
                    assert Counter(effects) == want, (
                        f"{ctx}: complete({epoch}) of {name} saw {sorted(effects)}, "
                        f"expected {sorted(want.elements())}")
                assert all(x == seen[0] for x in seen), f"{ctx}: repeated complete({epoch}) differs"

    def _final_state(self, sid: SubtaskId, last_epoch: int) -> list[Any]:
        restored = self.storage.read_subtask_state(sid, last_epoch + 1)
        return pickle.loads(restored[1]) if restored else []

    def cleanup(self) -> None:
        fs = fsspec.filesystem("memory")
        root = self.world.url[len("memory://"):]
        if fs.exists(root):
            fs.rm(root, recursive=True)
