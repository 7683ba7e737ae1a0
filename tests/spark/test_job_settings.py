"""Settings the job runner refuses (no Spark needed: a stand-in for the session's conf)."""

import pytest

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.spark.job import CoordinatedJob


class FakeConf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class FakeSpark:
    def __init__(self, conf):
        self.sparkContext = type("SC", (), {"getConf": lambda _self: FakeConf(conf)})()
        self.dataSource = type("DS", (), {"register": lambda _self, cls: None})()


def test_speculative_execution_is_refused_at_start(tmp_path) -> None:
    job = CoordinatedJob(FakeSpark({"spark.speculation": "true"}), str(tmp_path))
    with pytest.raises(SparkCoordError, match="spark.speculation"):
        job.check_cluster_settings()
    CoordinatedJob(FakeSpark({}), str(tmp_path)).check_cluster_settings()


def test_two_sources_with_one_name_are_refused(tmp_path) -> None:
    job = CoordinatedJob(FakeSpark({}), str(tmp_path))
    job._names.add("x")
    with pytest.raises(ValueError, match="already has a coordinated source named 'x'"):
        job.sources([], "a int", name="x")
