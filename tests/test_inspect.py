"""``sparkcoord inspect``: what a checkpoint directory holds, read without Spark and without
private internals (sparkcoord.inspection). The run on a real Spark checkpoint is in
tests/spark/test_inspect_spark.py."""

from __future__ import annotations

import json
import os
import pickle
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from sparkcoord import OperatorCoordinator
from sparkcoord.cli import main
from sparkcoord.core.ids import SubtaskId
from sparkcoord.inspection import NotACheckpoint, inspect_checkpoint, plain_value, render_text
from sparkcoord.runtime.subtask_state import SubtaskStateStore
from sparkcoord.testing import CoordinatorHarness
from tests.runtime.test_damage_matrix import Keeper

NAME = "coordinator"
SECRET = "5ec7e75ec7e75ec7e75ec7e75ec7e75e"


class Echo(Keeper):
    """Keeps every event it received (its snapshot) and answers each with ("ack", event) to
    the subtask that sent it (so records carry events to subtasks)."""

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        super().handle_event_from_operator(subtask, attempt, event)
        self.gateway(subtask).send_event(("ack", event))


def build(url: str) -> str:
    """Epochs 0 and 1 run and commit, epoch 2 is sealed and running (one event logged).

    Subtask 0 sends "a", "b" and subtask 1 "c" in batch 0, subtask 1 "d" in batch 1, subtask 0
    "e" in batch 2; each subtask stores its state at the end of batches 0 and 1. Returns the
    run id."""
    h = CoordinatorHarness(Echo, 2, storage_url=url)
    h.start()
    store = SubtaskStateStore.for_url(url)
    h.checkpoint()
    for subtask, event in ((0, "a"), (0, "b"), (1, "c")):
        h.send_from_subtask(subtask, event)
    for s in range(2):
        store.write(SubtaskId(NAME, s), 0, pickle.dumps([s, 0]))
    h.commit()
    assert h.checkpoint() == {0: [("ack", "a"), ("ack", "b")], 1: [("ack", "c")]}
    h.send_from_subtask(1, "d")
    for s in range(2):
        store.write(SubtaskId(NAME, s), 1, pickle.dumps([s, 1]))
    h.commit()
    assert h.checkpoint() == {0: [], 1: [("ack", "d")]}
    h.send_from_subtask(0, "e")
    run = h.service.run_id
    h.service.close()
    return run


def by_epoch(items: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {item["epoch"]: item for item in items}


def test_inspect_lists_records_events_inbound_logs_seals_and_states_and_never_the_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "ckpt")
    run = build(url)
    (tmp_path / "ckpt" / "channel.json").write_text(json.dumps(
        {"host": "127.0.0.1", "port": 4242, "pid": 77, "run": run, "secret": SECRET}))
    (tmp_path / "ckpt" / "last-failure.json").write_text(json.dumps(
        {"run": run, "cause": "coordinator 'coordinator' called fail_job: out of numbers"}))

    report = inspect_checkpoint(url)
    assert report["kind"] == "source" and report["problems"] == []
    [source] = report["sources"]
    assert source["channel"] == {"run": run, "host": "127.0.0.1", "port": 4242, "pid": 77,
                                 "secret_present": True}
    assert source["last_failure"] == {
        "run": run, "cause": "coordinator 'coordinator' called fail_job: out of numbers",
        "of_latest_run": True}
    assert source["restore_point"]["status"] == "unknown"  # no Spark checkpoint next to it

    # records: epochs, events per subtask, snapshots as size and hex only
    assert source["record_epochs"] == [0, 1, 2]
    records = by_epoch(source["records"])
    assert [(e["subtask"], e["count"]) for e in records[1]["events"]] == [
        ("coordinator[0]", 2), ("coordinator[1]", 1)]
    assert [(e["subtask"], e["count"]) for e in records[2]["events"]] == [("coordinator[1]", 1)]
    assert records[0]["event_count"] == 0
    [snapshot] = records[2]["coordinators"]
    pickled = pickle.dumps(["a", "b", "c", "d"], protocol=pickle.HIGHEST_PROTOCOL)
    assert snapshot == {"name": NAME, "snapshot": {"size": len(pickled),
                                                   "head_hex": pickled[:16].hex()}}

    # inbound logs: log 0 was pruned when batch 1 committed; 1 is sealed; 2 is running
    logs = by_epoch(source["inbound_logs"])
    assert sorted(logs) == [1, 2]
    assert [(r["subtask"], r["attempt"], r["run"]) for r in logs[1]["registrations"]] == [
        ("coordinator[1]", 0, run)]
    assert [(e["subtask"], e["attempt"], e["count"]) for e in logs[1]["events"]] == [
        ("coordinator[1]", 0, 1)]
    assert logs[1]["seal"]["present"] and logs[1]["seal"]["matches"] is True
    assert logs[1]["seal"]["length"] == logs[1]["size"] > 0
    assert [(e["subtask"], e["count"]) for e in logs[2]["events"]] == [("coordinator[0]", 1)]
    assert logs[2]["seal"]["present"] is False and logs[2]["seal"]["matches"] is None

    # subtask states: epochs, lineage, newest (not decoded)
    states = {s["subtask"]: s for s in source["states"]}
    assert sorted(states) == ["coordinator[0]", "coordinator[1]"]
    for s in (0, 1):
        entry = states[f"coordinator[{s}]"]
        assert entry["epochs"] == [0, 1] and entry["lineage"] == 0
        assert entry["newest"]["epoch"] == 1
        assert entry["newest"]["state"]["size"] == len(pickle.dumps([s, 1]))
        assert "value" not in entry["newest"]["state"]

    text = render_text(report)
    for expected in ("record epochs  0, 1, 2", "events to subtasks: coordinator[0] 2, "
                     "coordinator[1] 1 (3 in all)", "1.log", "sealed, matches", "no seal",
                     f"registered coordinator[1] attempt 0 (run {run})",
                     "coordinator[0]  epochs 0, 1  lineage since 0", run, "out of numbers",
                     "no problems found"):
        assert expected in text, expected
    assert "['a', 'b', 'c', 'd']" not in text  # not decoded without --decode

    # --decode gives the values (and their repr, which the text shows)
    decoded = inspect_checkpoint(url, decode=True)
    [source_d] = decoded["sources"]
    snap = by_epoch(source_d["records"])[2]["coordinators"][0]["snapshot"]
    assert snap["value"] == ["a", "b", "c", "d"] and snap["repr"] == repr(["a", "b", "c", "d"])
    newest = {s["subtask"]: s["newest"]["state"] for s in source_d["states"]}
    assert newest["coordinator[1]"]["value"] == [1, 1]
    decoded_text = render_text(decoded)
    assert "= ['a', 'b', 'c', 'd']" in decoded_text and "= [1, 1]" in decoded_text

    # --json: one document with the same information; the CLI exits 0
    assert main(["inspect", url, "--json"]) == 0
    json_out = capsys.readouterr().out
    assert json.loads(json_out) == report
    assert main(["inspect", url, "--json", "--decode"]) == 0
    json_decoded = capsys.readouterr().out
    assert json.loads(json_decoded) == decoded
    assert main(["inspect", url]) == 0
    text_out = capsys.readouterr().out
    assert text_out == text

    for out in (text, decoded_text, json_out, json_decoded, text_out,
                json.dumps(report), json.dumps(decoded)):
        assert SECRET not in out


def test_inspect_names_a_damaged_record_and_a_truncated_log_and_still_reports_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "ckpt")
    build(url)
    record = tmp_path / "ckpt" / "records" / "1.ckpt"
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0x01
    record.write_bytes(bytes(data))
    log = tmp_path / "ckpt" / "inbound" / "1.log"
    log.write_bytes(log.read_bytes()[:-5])

    report = inspect_checkpoint(url)
    problems = {p["file"]: p["message"] for p in report["problems"]}
    assert set(problems) == {str(record), str(log)}
    assert problems[str(record)] == f"{record}: checksum mismatch (file damaged)"
    assert problems[str(log)].startswith(f"{log}: the frame at byte ")
    assert "cut short" in problems[str(log)]

    [source] = report["sources"]
    assert source["record_epochs"] == [0, 1, 2]
    records = by_epoch(source["records"])
    assert "coordinators" not in records[1] and "checksum mismatch" in records[1]["error"]
    assert [(e["subtask"], e["count"]) for e in records[2]["events"]] == [("coordinator[1]", 1)]
    assert records[0]["coordinators"][0]["name"] == NAME
    logs = by_epoch(source["inbound_logs"])
    assert "error" in logs[1] and "error" not in logs[2]
    assert [(e["subtask"], e["count"]) for e in logs[2]["events"]] == [("coordinator[0]", 1)]
    assert [s["epochs"] for s in source["states"]] == [[0, 1], [0, 1]]

    assert main(["inspect", url]) == 1
    out = capsys.readouterr().out
    assert "PROBLEMS (2)" in out and str(record) in out and str(log) in out
    assert main(["inspect", url, "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["problems"]) == 2

    # a directory that is not a checkpoint: exit code 2, a clear message, nothing created
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["inspect", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{other} is not a sparkcoord checkpoint directory (it holds cat.jpg)" in err
    assert "coordination/" in err and "records/" in err
    assert sorted(os.listdir(other)) == ["cat.jpg"]
    missing = tmp_path / "nowhere"
    assert main(["inspect", str(missing)]) == 2
    assert f"{missing}: no such directory, or an empty one" in capsys.readouterr().err
    assert not missing.exists()
    with pytest.raises(NotACheckpoint):
        inspect_checkpoint(str(other))


def spark_offsets(spark: Path, source: str, epochs: list[int], committed: int) -> None:
    """Spark's offset log as Spark writes it (v1, metadata, one line per source), and the
    commit log of the first ``committed`` batches."""
    (spark / "offsets").mkdir(parents=True)
    (spark / "commits").mkdir(parents=True)
    for batch, epoch in enumerate(epochs):
        (spark / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n'
            + json.dumps({"sparkcoord": source, "epoch": epoch}) + "\n")
        (spark / "offsets" / f".{batch}.crc").write_bytes(b"crc")  # Hadoop's checksum files
        if batch < committed:
            (spark / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_restore_point_and_batch_mapping_come_from_sparks_logs_and_decide_if_a_torn_log_is_damage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sparkcoord.inspection import spark_log
    from sparkcoord.spark.offsets import MARKER

    assert spark_log.MARKER is MARKER  # the key of our offset lines in Spark's offset log

    job = tmp_path / "job"
    url = str(job / "coordination" / "numbers")
    build(url)
    # batch 2 carries no new epoch (a no-data batch); batch 3 (epoch 2) did not commit
    spark_offsets(job / "spark", "numbers", [0, 1, 1, 2], committed=3)
    # the running batch's log lost its last bytes in a crash (a torn append)
    log = job / "coordination" / "numbers" / "inbound" / "2.log"
    log.write_bytes(log.read_bytes()[:-5])

    report = inspect_checkpoint(str(job))
    assert report["kind"] == "job" and report["spark_checkpoint"] == str(job / "spark")
    assert report["problems"] == []
    [source] = report["sources"]
    assert source["name"] == "numbers"
    assert [(b["batch"], b["epoch"], b["committed"], b["new_epoch"]) for b in source["batches"]] == [
        (0, 0, True, True), (1, 1, True, True), (2, 1, True, False), (3, 2, False, True)]
    restore = source["restore_point"]
    assert (restore["status"], restore["epoch"], restore["batch"], restore["committed"]) == (
        "uncommitted", 2, 3, False)
    logs = by_epoch(source["inbound_logs"])
    assert logs[2]["torn_tail"] is True and logs[2]["committed"] is False
    assert logs[1]["committed"] is True
    # no request was answered in epoch 2: the rerun keeps nothing of its log
    # (a registration; the torn frame, never acknowledged, is no entry)
    assert restore["kept_at_rerun"] == {"logged_entries": 1, "kept_entries": 0,
                                        "operators": [], "client_entries": 0}
    assert restore["action"] == (
        "the next run restores snapshot 2, truncates inbound log 2 (1 entry dropped: no "
        "request was answered in it) and Spark reruns batch 3")
    text = render_text(report)
    assert "restore point  epoch 2, Spark batch 3 uncommitted" in text
    assert "batch     2  epoch     1  same epoch  committed" in text
    assert "batch     3  epoch     2  new epoch   NOT committed" in text

    # the coordination directory alone finds Spark's logs next to it
    alone = inspect_checkpoint(url)
    assert alone["kind"] == "source" and alone["spark_checkpoint"] == str(job / "spark")
    assert alone["sources"][0]["restore_point"] == restore

    # once batch 3 committed, the torn log is damage, and the restore point's record must exist
    (job / "spark" / "commits" / "3").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    (job / "coordination" / "numbers" / "records" / "2.ckpt").unlink()
    report = inspect_checkpoint(str(job))
    assert report["sources"][0]["restore_point"]["status"] == "committed"
    problems = {p["file"]: p["message"] for p in report["problems"]}
    record = job / "coordination" / "numbers" / "records" / "2.ckpt"
    assert set(problems) == {str(log), str(record)}
    assert "cut short" in problems[str(log)]
    assert "missing, but the next run restores epoch 2 (Spark batch 3)" in problems[str(record)]
    assert main(["inspect", str(job)]) == 1
    capsys.readouterr()

    # Spark logged a source whose coordination directory is gone
    spark_offsets(tmp_path / "other" / "spark", "lost", [0], committed=1)
    report = inspect_checkpoint(str(tmp_path / "other"))
    assert report["sources"] == []
    assert [p["file"] for p in report["problems"]] == [str(tmp_path / "other" / "coordination" / "lost")]


def test_inspect_reads_an_object_store_checkpoint_whose_logs_are_segments_and_names_a_lost_segment() -> None:
    import uuid

    import fsspec

    url = f"memory://sparkcoord-inspect/{uuid.uuid4().hex}"
    build(url)
    [source] = inspect_checkpoint(url)["sources"]
    logs = by_epoch(source["inbound_logs"])
    assert (logs[1]["layout"], logs[1]["segments"]) == ("segments", 2)
    assert logs[1]["seal"]["matches"] is True
    assert [(e["subtask"], e["count"]) for e in logs[1]["events"]] == [("coordinator[1]", 1)]

    fs, root = fsspec.core.url_to_fs(url)
    fs.rm(f"{root}/inbound/1/000000000000.seg")
    report = inspect_checkpoint(url)
    assert [(p["file"], p["message"]) for p in report["problems"]] == [(
        f"{root}/inbound/1", f"{root}/inbound/1: segment 000000000000.seg of the inbound log "
                             "of epoch 1 is missing (segments are numbered from 0 without gaps)")]
    assert report["url"] == url
    assert render_text(report).startswith(f"checkpoint {url} (a coordinated source's directory)")


def test_inspect_counts_requests_and_client_requests_and_accepts_client_frames_after_the_seal(
        tmp_path) -> None:
    from sparkcoord.inspection import inspect_checkpoint
    from sparkcoord.testing import CoordinatorHarness

    class Answers(OperatorCoordinator):
        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            return request

        def handle_client_request(self, request: Any) -> Any:
            return request

        def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
            result.set_result(0)

    url = str(tmp_path / "coordination" / "src")
    h = CoordinatorHarness(Answers, 1, storage_url=url)
    h.start()
    h.checkpoint()
    h.request_from_subtask(0, "q")
    h.commit()
    h.ask_as_client("c").result()  # between batches: after the sealed entries
    h.service.close()
    report = inspect_checkpoint(str(tmp_path))
    logs = report["sources"][0]["inbound_logs"]
    log = next(lg for lg in logs if lg["epoch"] == 0)
    assert (log["requests"], log["responses"]) == (1, 1)
    assert (log["client_requests"], log["client_responses"]) == (1, 1)
    assert log["seal"]["matches"] is True and log["seal"]["bytes_after"] > 0
    assert report["problems"] == []


class Asked(OperatorCoordinator):
    """Answers every request with itself and keeps what it was asked (its snapshot)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.asked: list[Any] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.asked = list(state or [])

    def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
        self.asked.append(request)
        return request

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        pass

    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(list(self.asked))


def test_the_restore_point_of_an_unfinished_batch_with_answered_requests_keeps_its_log_and_replays_it(
        tmp_path: Path) -> None:
    from sparkcoord.core.restore import RestorePoint

    job = tmp_path / "job"
    url = str(job / "coordination" / "src")
    h = CoordinatorHarness(Asked, 2, storage_url=url)
    h.start()
    h.checkpoint()  # epoch 0: its batch runs, asks twice and reports once, never commits
    assert h.request_from_subtask(0, "q1") == "q1"
    h.send_from_subtask(1, "report")
    assert h.request_from_subtask(1, "q2") == "q2"
    h.service.close()
    spark_offsets(job / "spark", "src", [0], committed=0)

    [source] = inspect_checkpoint(str(job))["sources"]
    restore = source["restore_point"]
    assert (restore["status"], restore["epoch"], restore["batch"]) == ("uncommitted", 0, 0)
    logged = by_epoch(source["inbound_logs"])[0]
    kept = restore["kept_at_rerun"]
    assert kept == logged["kept_at_rerun"]
    assert kept["operators"] == [NAME] and kept["client_entries"] == 0
    assert kept["kept_entries"] == kept["logged_entries"] == logged["entries"] > 4
    assert restore["action"] == (
        f"the next run restores snapshot 0, keeps {kept['kept_entries']} of the "
        f"{kept['logged_entries']} entries of inbound log 0 (every entry of {NAME}, asked "
        f"requests in it) and hands them to the coordinators again, truncating the rest; Spark "
        f"reruns batch 0, whose tasks get the logged answers")
    assert "truncates inbound log" not in render_text(inspect_checkpoint(str(job)))

    # what a restore to that point does: the requests are handed to the coordinator again,
    # and the log keeps what the inspection said
    again = CoordinatorHarness(Asked, 2, storage_url=url)
    again.start(RestorePoint(0, committed=False))
    assert again.coordinator.asked == ["q1", "q2"]  # type: ignore[attr-defined]
    again.service.close()
    [after] = inspect_checkpoint(str(job))["sources"]
    assert by_epoch(after["inbound_logs"])[0]["entries"] == kept["kept_entries"]


def test_a_log_with_a_finished_task_is_inspected_and_says_how_many_items_it_sent(
        tmp_path: Path) -> None:
    # a task that asked a request ends its batch with a FINISHED entry (decision 47); the
    # inspection failed on it with an AssertionError (found on a soak checkpoint)
    job = tmp_path / "job"
    h = CoordinatorHarness(Asked, 2, storage_url=str(job / "coordination" / "src"))
    h.start()
    h.checkpoint()
    assert h.request_from_subtask(0, "q1") == "q1"
    h.finish_task(0)
    h.run()
    h.service.close()
    spark_offsets(job / "spark", "src", [0], committed=0)
    [source] = inspect_checkpoint(str(job))["sources"]
    [finish] = by_epoch(source["inbound_logs"])[0]["finishes"]
    assert (finish["subtask"], finish["items"]) == (f"{NAME}[0]", 1), finish
    assert "no problems found" in render_text(inspect_checkpoint(str(job)))


@dataclass(frozen=True)
class Lane:
    name: str
    window: tuple[int, int]


class Point(NamedTuple):
    x: int
    y: int


@dataclass
class QueueState:
    lanes: list[Lane]
    owners: dict[int, str]
    done: frozenset[str]
    where: Point
    blob: bytes
    nothing: None = None


def queue_state() -> QueueState:
    return QueueState([Lane("a", (0, 10)), Lane("b", (10, 20))], {0: "a", 1: "b"},
                      frozenset({"y", "x"}), Point(1, 2), b"\x00\x01")


class StatefulQueue(OperatorCoordinator):
    def checkpoint_coordinator(self, checkpoint_id: int, result: Future[Any]) -> None:
        result.set_result(queue_state())


def test_decode_gives_a_coordinators_state_as_plain_data_and_the_text_its_repr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "ckpt")
    h = CoordinatorHarness(StatefulQueue, 1, storage_url=url)
    h.start()
    h.checkpoint()
    h.commit()
    h.service.close()

    report = inspect_checkpoint(url, decode=True)
    [record] = report["sources"][0]["records"]
    snapshot = record["coordinators"][0]["snapshot"]
    expected = {"lanes": [{"name": "a", "window": [0, 10]}, {"name": "b", "window": [10, 20]}],
                "owners": {"0": "a", "1": "b"}, "done": ["x", "y"], "where": {"x": 1, "y": 2},
                "blob": repr(b"\x00\x01"), "nothing": None}
    assert snapshot["value"] == expected == plain_value(queue_state())
    # the repr of the state as stored: a frozenset read back from a pickle may iterate in
    # another order than the literal it was built from (by PYTHONHASHSEED: seed 3 did)
    assert snapshot["repr"] == repr(pickle.loads(pickle.dumps(queue_state())))
    # the report stays one JSON document: --json --decode gives the same value
    assert main(["inspect", url, "--json", "--decode"]) == 0
    assert json.loads(capsys.readouterr().out) == report
    # the text shows the repr, as before
    assert f"= {snapshot['repr']}" in render_text(report)


def test_plain_value_keeps_json_types_and_names_what_it_cannot_convert() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    assert plain_value({"a": (1, 2.5, None, True), None: {3}}) == {
        "a": [1, 2.5, None, True], "null": [3]}
    assert plain_value({(1, 2): "pair", 1: "one"}) == {"(1, 2)": "pair", "1": "one"}
    assert plain_value({1, "a"}) == sorted([1, "a"], key=repr)  # items that do not compare
    assert plain_value(cyclic) == [1, "[1, [...]]"]
    assert plain_value(Lane) == repr(Lane)  # a class, not an instance


def test_inspect_names_the_lease_holder_and_says_whether_a_new_run_would_be_refused(
        tmp_path: Path) -> None:
    import socket
    import subprocess
    import time

    from sparkcoord.core.lease import Identity
    from sparkcoord.runtime.lease import (
        CoordinationLease,
        boot_id,
        process_started,
    )

    url = str(tmp_path / "source")
    build(url)
    assert inspect_checkpoint(url)["sources"][0]["lease"] is None
    assert "lease          none" in render_text(inspect_checkpoint(url))

    # a driver program on this machine whose process runs: held, named by pid and run
    driver = subprocess.Popen(["sleep", "60"])
    try:
        started = ""
        for _ in range(100):  # /proc/<pid>/stat exists once the child is forked
            started = process_started(driver.pid) or ""
            if started:
                break
            time.sleep(0.01)
        me = Identity(socket.gethostname(), boot_id(), driver.pid, started)
        lease = CoordinationLease(url, me=me)
        lease.acquire()
        shown = inspect_checkpoint(url)["sources"][0]["lease"]
        assert shown["held"] is True and shown["pid"] == driver.pid
        assert shown["run"] == lease.run and shown["generation"] == 0
        assert f"pid {driver.pid}" in shown["holder"] and "is running" in shown["reason"]
        assert f"lease          held: pid {driver.pid}" in render_text(inspect_checkpoint(url))
    finally:
        driver.kill()
        driver.wait()
    shown = inspect_checkpoint(url)["sources"][0]["lease"]
    assert shown["held"] is False and "is gone" in shown["reason"]

    # on another machine: held while renewed within its ttl (its clock runs 31 s ahead, so
    # the killed holder above has lapsed for it), free once released or lapsed
    remote = CoordinationLease(url, me=Identity("elsewhere", "boot-x", 4242, "1"), ttl_s=30,
                               wall=lambda: time.time() + 31)
    remote.acquire()
    shown = inspect_checkpoint(url)["sources"][0]["lease"]
    assert (shown["held"], shown["host"], shown["generation"]) == (True, "elsewhere", 1)
    remote.release()
    shown = inspect_checkpoint(url)["sources"][0]["lease"]
    assert shown["held"] is False and shown["released"] is True
    assert "released" in shown["reason"]
    lapsed = CoordinationLease(url, me=Identity("elsewhere", "boot-x", 4243, "1"), ttl_s=0.5,
                               wall=lambda: time.time() - 10)
    lapsed.acquire()
    shown = inspect_checkpoint(url)["sources"][0]["lease"]
    assert (shown["held"], shown["generation"]) == (False, 2)
    assert "more than its 0.5 s" in shown["reason"]

    # a damaged lease file is a named problem; the rest is still reported
    (tmp_path / "source" / "lease" / "2.json").write_text("{not json")
    report = inspect_checkpoint(url)
    assert report["sources"][0]["lease"] is None
    assert any(p["file"].endswith("lease/2.json") and "not a lease file" in p["message"]
               for p in report["problems"])
    assert report["sources"][0]["records"]
