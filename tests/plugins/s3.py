"""pytest plugin: a real S3-compatible object store (SeaweedFS) from devenv/s3.py.

Fixtures:

* ``s3_server`` (session): builds ``weed`` if needed (``devenv/build-tools.sh seaweedfs``, a
  no-op when cached) and fetches the S3A jars Spark needs (``devenv/fetch-jars.sh s3a``),
  starts a :class:`devenv.s3.S3Server` in a temp dir on free loopback ports, and returns once
  an object round-trips; stopped at the end of the session. ``credentials_env()`` gives the
  AWS SDK's variables, ``hadoop_options()`` the ``fs.s3a.*`` settings (a pipeline's
  ``checkpoint.options``); ``list_keys``, ``delete_prefix``, ``put_object`` speak its S3 API.
* ``s3_bucket`` (function): a fresh bucket's name, deleted with its objects afterwards.

Nothing is built or started unless a test requests one of them. Tests that request
``s3_server`` (directly or through ``s3_bucket``) get the ``s3`` mark automatically, so
``-m "not s3"`` deselects them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devenv.s3 import S3Server, s3a_jars


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the object store ``s3``."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A running SeaweedFS S3 gateway shared by the whole session (log: ``s3_server.log_path``)."""
    s3a_jars()  # fetched now, not in the first runner a test times
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh bucket on the session's S3 server; deleted, with what it holds, afterwards."""
    s3_server.start()  # a test that stopped the shared server leaves it restartable
    bucket = f"eop-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    yield bucket
    s3_server.delete_bucket(bucket)
