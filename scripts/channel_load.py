"""Load on the request path without Spark: P processes ask one coordinator back to back.

A profiling tool for the channel and the coordination service (decisions 45 and 46), not a
benchmark with a target (that is ``bench/run.py --only requests``, on Spark): the real
``CoordinationService`` and ``ChannelServer`` in this process, ``P`` forked processes each
running ``ChannelClient.request`` ``N`` times, fsync off unless ``--fsync``. It prints the
rate over the whole run, the round trip's median and p99, and the CPU time per request of
the server process and of the clients (user and system), so that a change to the path can be
measured in a minute without a Spark session:

    .venv/bin/python scripts/channel_load.py --tasks 8 --requests 10000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ask(address: tuple[str, int], secret: bytes, run: str, n: int, index: int,
         out: Any) -> None:
    # one client process: register, ask n times, report samples and CPU times
    from sparkcoord.channel.client import ChannelClient
    from sparkcoord.core.ids import SubtaskId, TaskAttempt

    client = ChannelClient(address, secret, TaskAttempt(run, SubtaskId("op", index), 0, 0))
    client.register()
    payload = pickle.dumps(("next", index))
    before = os.times()
    samples = []
    start = time.time()
    for _ in range(n):
        t0 = time.perf_counter()
        client.request(payload, 30.0)
        samples.append(time.perf_counter() - t0)
    end = time.time()
    after = os.times()
    client.close()
    out.put((samples, start, end, after.user - before.user, after.system - before.system))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tasks", type=int, default=8, help="client processes asking at once")
    ap.add_argument("--requests", type=int, default=10_000, help="requests per client")
    ap.add_argument("--fsync", action="store_true", help="fsync the inbound log")
    args = ap.parse_args()

    from sparkcoord import OperatorCoordinator
    from sparkcoord.channel.server import ChannelServer
    from sparkcoord.core.restore import FRESH
    from sparkcoord.runtime.service import CoordinationService, CoordinatorSpec
    from sparkcoord.runtime.storage import CheckpointStorage

    class Counter(OperatorCoordinator):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            self.count = 0

        def handle_request(self, subtask: int, attempt: int, request: Any) -> Any:
            self.count += 1
            return self.count

    ctx = mp.get_context("fork")  # the clients need nothing of this process but the address
    with tempfile.TemporaryDirectory() as tmp:
        service = CoordinationService([CoordinatorSpec("op", Counter, args.tasks)],
                                      CheckpointStorage(tmp, fsync=args.fsync))
        service.restore(FRESH)
        service.checkpoint(0)
        secret = os.urandom(32)
        server = ChannelServer(service.inbox, secret).start()
        try:
            out = ctx.Queue()
            before = os.times()
            procs = [ctx.Process(target=_ask, args=(server.address, secret, service.run_id,
                                                    args.requests, i, out))
                     for i in range(args.tasks)]
            for p in procs:
                p.start()
            results = [out.get() for _ in procs]
            for p in procs:
                p.join()
            after = os.times()
        finally:
            server.close()
            service.close()
    samples = sorted(s for r in results for s in r[0])
    n = len(samples)
    span = max(r[2] for r in results) - min(r[1] for r in results)
    us = 1e6 / n
    print(f"{args.tasks} tasks x {args.requests:,} requests, fsync {'on' if args.fsync else 'off'}: "
          f"{n / span:,.0f} requests/s, median {statistics.median(samples) * 1e3:.3f} ms, "
          f"p99 {samples[int(n * 0.99)] * 1e3:.3f} ms")
    print(f"CPU per request: server {(after.user - before.user) * us:.0f} us user + "
          f"{(after.system - before.system) * us:.0f} us system; clients "
          f"{sum(r[3] for r in results) * us:.0f} us user + {sum(r[4] for r in results) * us:.0f} "
          f"us system")
    return 0


if __name__ == "__main__":
    sys.exit(main())
