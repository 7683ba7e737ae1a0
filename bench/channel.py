"""The channel from inside Spark tasks: round trip and throughput per subtask, on loopback.

The coordination service and channel server run in this (driver) process, as they run in the
runner process of a query; the clients run inside Spark tasks (executor Python workers).
- round trip: register once, then send one event and wait for its acknowledgement (which
  means: authenticated, checked, logged, on the coordinator's mailbox), one at a time;
- throughput: one task (then two at once) sends N small events pipelined and flushes; timed
  inside the task, from the first send to the last acknowledgement.
Baselines, same run, same tasks: a raw TCP echo (16 bytes out, 1 byte back) for the round
trip, and a raw TCP sink reading the same bytes as the event frames, written in bursts of 256
frames (the client's largest burst), for the throughput.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import tempfile
import threading
import time
from typing import Any

from bench.common import figure, stats


def _rtt_task(address: tuple[str, int], secret: bytes, run: str, n: int, index: int) -> list[float]:
    from sparkcoord.channel.client import ChannelClient
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", index), 0, 0))
    client.register()
    payload = pickle.dumps(("e", 0))
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.send(payload)
        client.flush()
        out.append(time.perf_counter() - t0)
    client.close()
    return out


def _raw_rtt_task(address: tuple[str, int], n: int) -> list[float]:
    out = []
    with socket.create_connection(address) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"x" * 16)
            s.recv(1)
            out.append(time.perf_counter() - t0)
    return out


def _raw_throughput_task(address: tuple[str, int], n: int, frame: bytes, burst: int = 256) -> float:
    # the same bytes as n event frames, written in bursts of the client's largest burst size
    # (one sendall per burst, as the client writes one EVENTS frame per burst)
    chunk = frame * burst
    with socket.create_connection(address) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(n // burst):
            s.sendall(chunk)
        s.sendall(frame * (n % burst))
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the sink answers after it read everything
        return n / (time.perf_counter() - t0)


class RawServer:
    """Echo (one byte per 16 received) or sink (one byte at the end): the baselines."""

    def __init__(self, mode: str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.mode = mode
        self.address = self.sock.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            pending = 0
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    if self.mode == "sink":
                        conn.sendall(b"k")
                    return
                if self.mode == "echo":
                    pending += len(data)
                    while pending >= 16:
                        conn.sendall(b"k")
                        pending -= 16

    def close(self) -> None:
        self.sock.close()


def run(preset: str, spark: Any) -> dict[str, Any]:
    from sparkcoord import OperatorCoordinator
    from sparkcoord.channel.frames import EventFrames
    from sparkcoord.channel.server import ChannelServer
    from sparkcoord.core.ids import SubtaskId, TaskAttempt
    from sparkcoord.core.restore import FRESH
    from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
    from sparkcoord.runtime.storage import CheckpointStorage

    quick = preset == "quick"
    n_rtt, n_tp = (2_000, 30_000) if quick else (10_000, 200_000)
    sc = spark.sparkContext
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        service = CoordinationService([CoordinatorSpec("op", OperatorCoordinator, 2)],
                                      CheckpointStorage(tmp))
        service.restore(FRESH)
        service.checkpoint(0)
        secret = os.urandom(32)
        server = ChannelServer(service.inbox, secret).start()
        echo, sink = RawServer("echo"), RawServer("sink")
        address, run_id = server.address, service.run_id
        frame = EventFrames(TaskAttempt(run_id, SubtaskId("op", 0), 0, 0), secret).encode(
            0, pickle.dumps(("e", 0)))
        try:
            rtt = functools.partial(_rtt_task, address, secret, run_id, n_rtt)
            results["rtt"] = stats(sum(sc.parallelize(range(2), 2).mapPartitionsWithIndex(
                lambda i, _: [rtt(i)]).collect(), []))
            raw_rtt = functools.partial(_raw_rtt_task, echo.address, n_rtt)
            results["raw_rtt"] = stats(sum(sc.parallelize(range(2), 2).mapPartitionsWithIndex(
                lambda i, _: [raw_rtt()]).collect(), []))
            # each throughput run uses its own epoch's attempts: start a fresh epoch first
            for width in (1, 2):
                service.batch_committed(service.last_sealed)
                service.checkpoint(service.last_sealed + 1)
                tp = functools.partial(_throughput_at, address, secret, service.run_id, n_tp,
                                       service.last_sealed)
                results[f"throughput_{width}"] = sc.parallelize(range(width), width).mapPartitionsWithIndex(
                    lambda i, _, tp=tp: [tp(i)]).collect()
                raw = functools.partial(_raw_throughput_task, sink.address, n_tp, frame)
                results[f"raw_throughput_{width}"] = sc.parallelize(range(width), width).mapPartitionsWithIndex(
                    lambda i, _, raw=raw: [raw()]).collect()
        finally:
            echo.close()
            sink.close()
            server.close()
            service.close()
    r, raw = results["rtt"], results["raw_rtt"]
    tp1, tp2 = results["throughput_1"][0], min(results["throughput_2"])
    figures = [
        figure("channel", "round trip from a Spark task, median", r["median"] * 1e3, "ms",
               raw["median"] * 1e3, "<= 0.5 ms", r["median"] * 1e3 <= 0.5),
        figure("channel", "round trip from a Spark task, p99", r["p99"] * 1e3, "ms", raw["p99"] * 1e3),
        figure("channel", "throughput, one subtask", tp1, "events/s", results["raw_throughput_1"][0],
               ">= 50k events/s", tp1 >= 50_000),
        figure("channel", "throughput per subtask, two at once (slower)", tp2, "events/s",
               min(results["raw_throughput_2"]), ">= 50k events/s", tp2 >= 50_000),
    ]
    notes = [f"- round trip: {r['n']} samples from 2 tasks, median {r['median'] * 1e3:.3f} ms, "
             f"p90 {r['p90'] * 1e3:.3f} ms, p99 {r['p99'] * 1e3:.3f} ms (raw TCP echo median "
             f"{raw['median'] * 1e3:.3f} ms)",
             f"- throughput: {n_tp:,} events per task, pipelined (window 1024, bursts coalesced): one task "
             f"{tp1:,.0f}/s, two tasks {', '.join(f'{v:,.0f}' for v in results['throughput_2'])}/s "
             f"(raw TCP sink of the same bytes in bursts of 256 frames: "
             f"{results['raw_throughput_1'][0]:,.0f}/s)"]
    return {"figures": figures, "raw": results, "notes": notes}


def _throughput_at(address: tuple[str, int], secret: bytes, run: str, n: int, epoch: int,
                   index: int) -> float:
    from sparkcoord.channel.client import ChannelClient
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", index), epoch, 0))
    client.register()
    payload = pickle.dumps(("e", 0))
    t0 = time.perf_counter()
    for _ in range(n):
        client.send(payload)
    client.flush()
    elapsed = time.perf_counter() - t0
    client.close()
    return n / elapsed
