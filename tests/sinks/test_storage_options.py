"""One mapping of a lake sink's storage options, given to s3fs, delta-rs and pyiceberg's FileIO
each in its own names (sparkcoord/sinks/target.py ``storage_options_for``); a credential in
it is refused without repeating it, nested ones too."""

from __future__ import annotations

from typing import Any

import pytest

from sparkcoord.sinks.target import storage_options_for

ENDPOINT = "http://127.0.0.1:9000"


@pytest.mark.parametrize("options", [
    {"endpoint_url": ENDPOINT, "region": "eu-west-1"},
    {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_REGION": "eu-west-1"},
    {"s3.endpoint": ENDPOINT, "s3.region": "eu-west-1"},
    {"client_kwargs": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1"}},
])
def test_an_endpoint_and_a_region_by_any_name_reach_every_library_in_its_names(
        options: dict[str, Any]) -> None:
    assert storage_options_for("fsspec", options) == {
        "endpoint_url": ENDPOINT, "client_kwargs": {"region_name": "eu-west-1"}}
    # delta-rs refuses http unless allowed: an http endpoint allows it
    assert storage_options_for("delta", options) == {
        "AWS_ENDPOINT_URL": ENDPOINT, "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    assert storage_options_for("iceberg", options) == {
        "s3.endpoint": ENDPOINT, "s3.region": "eu-west-1"}


def test_a_library_prefix_or_an_aws_name_goes_to_one_library_and_the_rest_to_both() -> None:
    options = {"fsspec.anon": False, "delta.timeout": "30s", "AWS_S3_ALLOW_UNSAFE_RENAME": True,
               "allow_http": "true", "endpoint": "https://s3.example", "max_retries": 3}
    assert storage_options_for("fsspec", options) == {
        "anon": False, "max_retries": 3, "endpoint_url": "https://s3.example"}
    assert storage_options_for("delta", options) == {
        "timeout": "30s", "AWS_S3_ALLOW_UNSAFE_RENAME": "true", "max_retries": "3",
        "AWS_ALLOW_HTTP": "true", "AWS_ENDPOINT_URL": "https://s3.example"}
    assert storage_options_for("iceberg", options) == {"s3.endpoint": "https://s3.example"}


def test_the_translation_is_stable_on_its_own_output() -> None:
    options = {"endpoint": ENDPOINT, "region": "us-east-1", "fsspec.anon": True}
    for library in ("fsspec", "delta"):
        once = storage_options_for(library, options)
        assert storage_options_for(library, once) == once


def test_two_names_of_one_setting_with_different_values_are_refused() -> None:
    with pytest.raises(ValueError, match="'endpoint' and 'AWS_ENDPOINT_URL' name the same"):
        storage_options_for("fsspec", {"endpoint": ENDPOINT, "AWS_ENDPOINT_URL": "http://b"})
    assert storage_options_for("fsspec", {"endpoint": ENDPOINT, "AWS_ENDPOINT_URL": ENDPOINT})
    with pytest.raises(ValueError, match="use fsspec, delta or iceberg"):
        storage_options_for("gcs", {})


def test_a_lake_sink_refuses_a_credential_in_its_storage_options_without_repeating_it() -> None:
    from sparkcoord.sinks import LakeSink

    secret = "do-not-show-me"
    sink: Any = LakeSink(job=None).format("delta")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'client_kwargs.aws_secret_access_key' looks like a "
                                         "credential") as raised:
        sink.storage_options(client_kwargs={"aws_secret_access_key": secret})
    assert secret not in str(raised.value)
    with pytest.raises(ValueError, match="'AWS_SECRET_ACCESS_KEY' looks like a credential"):
        sink.storage_options(AWS_SECRET_ACCESS_KEY=secret)
    with pytest.raises(ValueError, match="name the same setting") as raised:
        sink.storage_options(endpoint_url=ENDPOINT).storage_options(AWS_ENDPOINT_URL="http://b")
    sink.storage_options(region="us-east-1")  # a plain one passes


def test_an_iceberg_sinks_storage_endpoint_that_differs_from_its_catalogs_is_refused() -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkcoord.sinks.stream import LakeSink

    class Frame:  # what operator_spec reads of a DataFrame before the check
        schema = StructType([StructField("id", LongType())])

    sink: Any = (LakeSink(job=None).format("iceberg")  # type: ignore[arg-type]
                 .storage_options(endpoint_url=ENDPOINT)
                 .option("catalog.s3.endpoint", "http://elsewhere:9000"))
    with pytest.raises(ValueError, match="storage option s3.endpoint is 'http://127.0.0.1:9000'"
                                         ", option catalog.s3.endpoint 'http://elsewhere:9000'"):
        sink.operator_spec(Frame(), "lake.events")


def test_the_delta_committer_reads_its_log_with_the_tasks_fsspec_options_untranslated(
        tmp_path: Any) -> None:
    # found by a review: the log read translated delta-rs's names back and lost what only
    # fsspec knows (client_kwargs such as verify), so a store the tasks reached was not
    # reachable from the committer's log read
    import pyarrow as pa

    from sparkcoord.sinks.target import SinkTarget

    fsspec_form = {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"verify": False}}
    target = SinkTarget("delta", "s3://b/t", "job", pa.schema([("id", pa.int64())]),
                        "s3://b/t", storage_options=fsspec_form,
                        delta_options=storage_options_for("delta", fsspec_form))
    committer = target.committer()
    assert committer.fsspec_options == fsspec_form
    assert committer.storage_options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
