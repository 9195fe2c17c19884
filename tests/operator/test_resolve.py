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
