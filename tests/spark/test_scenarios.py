"""Flink's exactly-once scenarios on real Spark (see tests/spark/scenarios.py). The soak
script runs them with many seeds: ``python scripts/soak.py``."""

import pytest

from tests.spark.scenarios import run_two_speeds

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("seed", [7])
def test_two_coordinators_at_two_speeds_with_late_futures_fail_job_and_task_retries_end_exactly_once(
        spark, tmp_path, seed: int) -> None:
    outcome = run_two_speeds(spark, str(tmp_path), seed)
    print(f"seed {seed}: {outcome}")
    assert outcome.restarts == 2, outcome  # the two fail_job calls; task retries are no restarts
    assert outcome.passed, outcome
