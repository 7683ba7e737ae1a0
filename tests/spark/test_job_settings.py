"""Settings the job runner refuses (no Spark needed: a stand-in for the session's conf)."""

import pytest

from sparkcoord.core.errors import SparkCoordError
from sparkcoord.spark.job import CoordinatedJob


class FakeConf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class FakeSpark:
    """Only what a Spark Connect session has too: ``conf`` (no sparkContext, no JVM)."""

    def __init__(self, conf):
        self.conf = FakeConf(conf)
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


def test_an_in_memory_checkpoint_directory_is_refused_with_the_reason(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"memory://x.*own memory, so a restart would find"):
        CoordinatedJob(FakeSpark({}), "memory://x")


def test_a_remote_checkpoint_directory_needs_a_spark_checkpoint_spark_can_write(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"s3://bucket/ckpt.*no file system for s3://.*"
                                         r"spark_checkpoint="):
        CoordinatedJob(FakeSpark({}), "s3://bucket/ckpt")
    job = CoordinatedJob(FakeSpark({}), "s3://bucket/ckpt/", spark_checkpoint=str(tmp_path / "q"),
                         storage_options={"anon": True})
    assert job.spark_checkpoint == str(tmp_path / "q")
    assert job.coordination_url("src") == "s3://bucket/ckpt/coordination/src"
    with pytest.raises(ValueError, match="Spark cannot write a memory:// location"):
        CoordinatedJob(FakeSpark({}), str(tmp_path), spark_checkpoint="memory://q")


def test_the_spark_checkpoint_defaults_to_a_directory_inside_a_local_checkpoint_dir(tmp_path) -> None:
    assert CoordinatedJob(FakeSpark({}), str(tmp_path)).spark_checkpoint == f"{tmp_path}/spark"
