"""A real S3-compatible server for tests: moto's standalone server on loopback, one per test
session that asks for it, with helpers to reach it through s3fs."""

from __future__ import annotations

import logging
from typing import Any

CREDENTIALS = {"key": "testing", "secret": "testing"}


class S3Server:
    """moto's threaded server on 127.0.0.1 (a free port); ``storage_options`` reach it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per HTTP call
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {**CREDENTIALS, "client_kwargs": {"endpoint_url": self.endpoint,
                                                 "region_name": "us-east-1"}}

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True)

    def create_bucket(self, name: str) -> None:
        # us-east-1 takes no location constraint (s3fs's mkdir would send one)
        self.filesystem().call_s3("create_bucket", Bucket=name)

    def stop(self) -> None:
        self._server.stop()
