"""Identity: the transactional id prefix never changes over a pipeline's life."""

from __future__ import annotations

from typing import Any

import pytest

from eop_operator.api.load import load_pipeline
from eop_operator.api.resolve import IdentityChanged, build_run_config, resolve_identity


def test_default_identity_is_derived_from_namespace_and_name(manifest: dict[str, Any]) -> None:
    identity = resolve_identity(load_pipeline(manifest))
    assert identity.transactional_id_prefix == "eop.ads.clean"
    assert identity.progress_group == "eop.ads.clean"


def test_setting_a_prefix_after_the_fact_is_refused(manifest: dict[str, Any]) -> None:
    manifest["status"] = {"transactionalIdPrefix": "eop.ads.clean"}
    manifest["spec"]["transactions"] = {"idPrefix": "team-a.clean"}
    with pytest.raises(IdentityChanged, match="cannot change"):
        resolve_identity(load_pipeline(manifest))


def test_run_config_uses_the_generation_directory(manifest: dict[str, Any]) -> None:
    config = build_run_config(load_pipeline(manifest), checkpoint_root="/cp/", generation=3)
    assert config.checkpoint_location == "/cp/gen-3"


def test_eops_spark_settings_hold_over_a_conf_that_slipped_past_the_api(
    manifest: dict[str, Any],
) -> None:
    # The API server and load_pipeline refuse these; a pipeline built another way keeps none.
    pipeline = load_pipeline(manifest)
    slipped = {
        "spark.kubernetes.executor.podTemplateFile": "/tmp/mine.yaml",
        "spark.kubernetes.driver.volumes.hostPath.root.mount.path": "/host",
        "spark.sql.shuffle.partitions": "64",
    }
    spark = pipeline.spec.spark.model_copy(update={"conf": slipped})
    pipeline = pipeline.model_copy(
        update={"spec": pipeline.spec.model_copy(update={"spark": spark})}
    )
    eops = {"spark.kubernetes.executor.podTemplateFile": "/etc/eop/executor-pod.yaml"}
    config = build_run_config(pipeline, checkpoint_root="/cp", generation=0, extra_spark_conf=eops)
    assert config.spark.conf == {**eops, "spark.sql.shuffle.partitions": "64"}
