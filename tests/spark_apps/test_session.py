"""The Spark configuration a run gets: loopback and quiet locally, user settings last."""

from __future__ import annotations

from pathlib import Path

from eop_spark.class_archive import java_options
from eop_spark.session import FILE_SYSTEM_CHECKPOINTS, session_conf
from tests.spark_apps.test_client_config import make_config


def test_local_runs_stay_on_loopback_and_size_shuffles_to_the_cores() -> None:
    conf = session_conf(
        make_config(spark={"master": "local[3]"}), [Path("/j/a.jar")], Path("/tmp/l.properties")
    )
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "6"
    assert conf["spark.jars"] == "/j/a.jar"
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_user_conf_wins_and_java_options_are_appended() -> None:
    config = make_config(
        spark={
            "master": "k8s://https://api:6443",
            "executor": {"instances": 3, "cores": 2},
            "conf": {
                "spark.sql.shuffle.partitions": "64",
                "spark.driver.extraJavaOptions": "-Dx=1",
            },
        }
    )
    conf = session_conf(config, [], Path("/tmp/l.properties"))
    assert conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.executor.instances"] == "3"
    assert "spark.driver.bindAddress" not in conf
    assert conf["spark.driver.extraJavaOptions"].endswith("-Dx=1")
    assert "log4j2.configurationFile" in conf["spark.driver.extraJavaOptions"]


def test_python_workers_fork_from_eops_daemon() -> None:
    conf = session_conf(make_config(), [], Path("/tmp/l.properties"))
    assert conf["spark.python.daemon.module"] == "eop_spark.worker_daemon"


def test_a_class_archive_goes_to_the_driver_jvm(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    options = java_options(archive)
    conf = session_conf(make_config(), [], Path("/tmp/l.properties"), options)
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    # An archive that does not fit this JVM is skipped, never fatal.
    assert "-Xshare:auto" in conf["spark.driver.extraJavaOptions"]
    assert java_options(None) == ""


def test_local_checkpoints_are_written_without_spawning_processes() -> None:
    manager = "spark.sql.streaming.checkpointFileManagerClass"
    local = session_conf(make_config(checkpointRoot="/data/ckpt"), [], Path("/tmp/l.properties"))
    assert local[manager] == FILE_SYSTEM_CHECKPOINTS
    remote = session_conf(
        make_config(checkpointRoot="s3a://bucket/ckpt"), [], Path("/tmp/l.properties")
    )
    assert manager not in remote  # object stores keep Spark's own choice
    mine = session_conf(
        make_config(checkpointRoot="/data/ckpt", spark={"conf": {manager: "x.Mine"}}),
        [],
        Path("/tmp/l.properties"),
    )
    assert mine[manager] == "x.Mine"
