"""What a lake sink keeps in the checkpoint holds no credential (sparkcoord/sinks/target.py):
an option named like one, or a URL carrying a password, is refused without repeating it; an
existing table of other columns is refused naming them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkcoord.sinks.target import TableShapeError, check_table_schema, refuse_credentials


@pytest.mark.parametrize("key", [
    "aws_secret_access_key", "AWS_ACCESS_KEY_ID", "account_key", "azure_storage_account_key",
    "azure_storage_sas_key", "google_service_account_key", "catalog.adls.account-key",
    "catalog.header.Authorization", "catalog.token", "catalog.s3.secret-access-key",
    "password", "sas_token", "key",
])
def test_an_option_named_like_a_credential_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match=f"option '{key}' looks like a credential"):
        refuse_credentials({key: "value"}, "lake sink")


def test_a_url_carrying_a_password_is_refused_without_repeating_it() -> None:
    with pytest.raises(ValueError, match="'catalog.uri' looks like a credential") as raised:
        refuse_credentials({"catalog.uri": "postgresql://u:s3cret@db/cat"}, "lake sink")
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize("key,value", [
    ("catalog.uri", "sqlite:////lake/catalog.db"), ("catalog.warehouse", "s3://bucket/wh"),
    ("endpoint_url", "http://127.0.0.1:9000"), ("region", "eu-west-1"), ("jobId", "orders"),
    ("targetFileSize", "64m"), ("keys", "id"),
])
def test_plain_options_pass(key: str, value: str) -> None:
    refuse_credentials({key: value}, "lake sink")


def test_an_existing_table_of_other_columns_is_refused_naming_them() -> None:
    ours = pa.schema([("id", pa.int64()), ("name", pa.string())])
    check_table_schema("t", ours, pa.schema([("id", pa.int32()), ("name", pa.large_string())]))
    with pytest.raises(TableShapeError, match=r"not written: \['qty'\]"):
        check_table_schema("t", ours, pa.schema([("id", pa.int64()), ("name", pa.string()),
                                                 ("qty", pa.int32())]))
    with pytest.raises(TableShapeError, match="name: int64 in the table, string written"):
        check_table_schema("t", ours, pa.schema([("id", pa.int64()), ("name", pa.int64())]))
