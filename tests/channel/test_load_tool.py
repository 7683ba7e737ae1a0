"""scripts/channel_load.py, the request path's profiling tool (docs/testing.md), runs and reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_load_tool_asks_from_every_process_and_reports_rate_latency_and_cpu() -> None:
    out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "channel_load.py"),
                          "--tasks", "2", "--requests", "50"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert re.search(r"^2 tasks x 50 requests, fsync off: [\d,]+ requests/s, median [\d.]+ ms, "
                     r"p99 [\d.]+ ms$", out, re.M), out
    assert re.search(r"^CPU per request: server \d+ us user \+ \d+ us system; clients \d+ us "
                     r"user \+ \d+ us system$", out, re.M), out
