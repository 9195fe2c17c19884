"""The Spark configuration a run gets: loopback and quiet locally, user settings last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eop_spark.runtime.session import (
    FILE_SYSTEM_CHECKPOINTS,
    OBJECT_STORE_CHECKPOINTS,
    SCRATCH_ENV,
    prepare_scratch,
    session_conf,
)
from eop_spark.speedups.class_archive import java_options
from eop_spark.speedups.malloc_tuning import TUNABLES_ENV, glibc_tunables
from tests.spark_apps.kafka.test_client_config import make_config


def test_local_runs_stay_on_loopback_and_size_shuffles_to_the_cores() -> None:
    conf = session_conf(
        make_config(spark={"master": "local[3]"}), [Path("/j/a.jar")], Path("/tmp/l.properties")
    )
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "6"
    assert conf["spark.jars"] == "/j/a.jar"
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_no_driver_serves_the_spark_ui_unless_its_spec_asks_and_none_can_kill_from_it() -> None:
    on_pods = {"master": "k8s://https://api:6443"}
    conf = session_conf(make_config(spark=on_pods), [], Path("/tmp/l.properties"))
    assert conf["spark.ui.enabled"] == "false"  # it would listen on the pod's IP
    asked = {"spark.ui.enabled": "true", "spark.ui.killEnabled": "true"}
    conf = session_conf(make_config(spark={**on_pods, "conf": asked}), [], Path("/tmp/l.p"))
    assert (conf["spark.ui.enabled"], conf["spark.ui.killEnabled"]) == ("true", "false")


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


def test_executor_jvms_keep_freed_memory_unless_the_user_says_otherwise() -> None:
    kubernetes = {"master": "k8s://https://api:6443", "executor": {"instances": 2, "cores": 1}}
    conf = session_conf(make_config(spark=kubernetes), [], Path("/tmp/l.properties"))
    assert conf[f"spark.executorEnv.{TUNABLES_ENV}"] == glibc_tunables()
    mine = {**kubernetes, "conf": {f"spark.executorEnv.{TUNABLES_ENV}": "glibc.x=1"}}
    conf = session_conf(make_config(spark=mine), [], Path("/tmp/l.properties"))
    assert conf[f"spark.executorEnv.{TUNABLES_ENV}"] == "glibc.x=1"


def test_python_workers_fork_from_eops_daemon() -> None:
    conf = session_conf(make_config(), [], Path("/tmp/l.properties"))
    assert conf["spark.python.daemon.module"] == "eop_spark.speedups.worker_daemon"


def test_eop_no_worker_daemon_leaves_pysparks_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOP_NO_WORKER_DAEMON", "1")
    conf = session_conf(make_config(), [], Path("/tmp/l.properties"))
    assert "spark.python.daemon.module" not in conf


def test_a_class_archive_goes_to_the_driver_jvm(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    options = java_options(archive)
    conf = session_conf(make_config(), [], Path("/tmp/l.properties"), options)
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    # An archive that does not fit this JVM is skipped, never fatal.
    assert "-Xshare:auto" in conf["spark.driver.extraJavaOptions"]
    assert java_options(None) == ""


def test_each_checkpoint_store_gets_the_file_manager_that_writes_it_safely() -> None:
    manager = "spark.sql.streaming.checkpointFileManagerClass"
    local = session_conf(make_config(checkpointRoot="/data/ckpt"), [], Path("/tmp/l.properties"))
    assert local[manager] == FILE_SYSTEM_CHECKPOINTS
    # S3 has no rename: each file is one upload that appears whole or not at all.
    remote = session_conf(
        make_config(checkpointRoot="s3a://bucket/ckpt"), [], Path("/tmp/l.properties")
    )
    assert remote[manager] == OBJECT_STORE_CHECKPOINTS
    hdfs = session_conf(make_config(checkpointRoot="hdfs://nn/ckpt"), [], Path("/tmp/l.properties"))
    assert manager not in hdfs  # a file system with renames keeps Spark's own choice
    mine = session_conf(
        make_config(checkpointRoot="/data/ckpt", spark={"conf": {manager: "x.Mine"}}),
        [],
        Path("/tmp/l.properties"),
    )
    assert mine[manager] == "x.Mine"


def test_scratch_left_by_a_killed_driver_is_removed_and_becomes_sparks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scratch = tmp_path / "spark"
    jars = scratch / "spark-0a1b" / "userFiles-2c3d"
    jars.mkdir(parents=True)
    (jars / "kafka-clients.jar").write_bytes(b"x" * 2_000_000)
    (scratch / "blockmgr-4e5f").mkdir()
    outside = tmp_path / "keep"
    outside.mkdir()
    (scratch / "link").symlink_to(outside)
    monkeypatch.setenv(SCRATCH_ENV, str(scratch))
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    caplog.set_level("INFO", logger="eop_spark.runtime.session")
    assert prepare_scratch() == scratch
    assert list(scratch.iterdir()) == []
    assert outside.is_dir()  # a link is removed, never followed
    assert os.environ["SPARK_LOCAL_DIRS"] == str(scratch)
    assert "removed 3 entries (2.0 MB) an earlier driver left in" in caplog.text


def test_scratch_is_created_and_user_local_dirs_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path / "new"))
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/data/spark")
    assert prepare_scratch() == tmp_path / "new"
    assert (tmp_path / "new").is_dir()
    assert os.environ["SPARK_LOCAL_DIRS"] == "/data/spark"
    monkeypatch.delenv(SCRATCH_ENV)
    assert prepare_scratch() is None


def test_the_runners_own_settings_hold_over_a_run_configuration_not_made_by_eop() -> None:
    # A spec cannot hold these (the API server refuses them); a hand-written run.json could.
    mine = {
        "spark.master": "local[64]",
        "spark.driver.memory": "64g",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.ui.killEnabled": "true",
        "spark.sql.shuffle.partitions": "64",
    }
    local = make_config(spark={"master": "local[3]", "driver": {"memory": "2g"}, "conf": mine})
    conf = session_conf(local, [], Path("/tmp/l.properties"))
    assert conf["spark.master"] == "local[3]"
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.killEnabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "64"  # not eop's: the user's wins
    # With executors as pods, their RPC stays authenticated and encrypted.
    off = {"spark.authenticate": "false", "spark.network.crypto.enabled": "false"}
    pods = make_config(spark={"master": "k8s://https://api:6443", "conf": off})
    conf = session_conf(pods, [], Path("/tmp/l.properties"))
    assert conf["spark.authenticate"] == conf["spark.network.crypto.enabled"] == "true"
    assert conf["spark.io.encryption.enabled"] == "true"
