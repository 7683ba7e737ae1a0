"""The main job (README's `sparkcoord demo`), smaller: its verdict is exactly-once."""

import io

import pytest
from rich.console import Console

from sparkcoord.demo import run_demo

pytestmark = pytest.mark.spark


def test_the_demo_survives_its_injected_failures_and_reports_exactly_once(tmp_path, spark) -> None:
    out = io.StringIO()
    assert run_demo(str(tmp_path / "demo"), fast_total=40, slow_total=4,
                    console=Console(file=out, width=120), spark=spark)
    text = out.getvalue()
    assert "VERDICT: exactly-once" in text
    assert "fail_job-fast" in text and "fail_task-fast-0" in text
    assert "query restarts: 1" in text
