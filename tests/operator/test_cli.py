"""The eop command as a user runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from eop_operator.cli import EXIT_INVALID, build_parser, main
from eop_spark.contract.run_config import RunConfig


def test_render_prints_the_objects(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path), "--image", "img:1"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Service", "StatefulSet"]


def test_render_of_a_bad_manifest_is_one_clear_line(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    del manifest["spec"]["sink"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "spec.sink: Field required" in err


def test_crd_prints_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "CustomResourceDefinition"


def test_operator_refuses_node_access_and_binds_eop_driver_by_default() -> None:
    args = build_parser().parse_args(["operator", "--namespace", "team-a"])
    assert (args.allow_host_network, args.allow_host_path_volumes) == (False, False)
    assert str(args.driver_role) == "Role/eop-driver"
    allowed = build_parser().parse_args(
        ["operator", "-A", "--allow-host-network", "--allow-host-path-volumes",
         "--driver-role", "ClusterRole/eop-driver"]
    )  # fmt: skip
    assert (allowed.allow_host_network, allowed.allow_host_path_volumes) == (True, True)
    assert (allowed.driver_role.kind, allowed.driver_role.name) == ("ClusterRole", "eop-driver")


def test_a_bad_driver_role_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["operator", "-A", "--driver-role", "eop-driver"])
    assert exited.value.code == EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--driver-role" in err and "Role/NAME or ClusterRole/NAME" in err


def test_operator_upgrade_parallelism_is_one_by_default_and_at_least_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["operator", "-A"]).operator_upgrade_parallelism == 1
    args = build_parser().parse_args(["operator", "-A", "--operator-upgrade-parallelism", "3"])
    assert args.operator_upgrade_parallelism == 3
    with pytest.raises(SystemExit) as exited:
        main(["operator", "-A", "--operator-upgrade-parallelism", "0"])
    assert exited.value.code == EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--operator-upgrade-parallelism" in err and "at least 1" in err


@pytest.mark.parametrize("given", ["0", "-1", "soon"])
def test_the_api_timeout_is_a_positive_number_of_seconds(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser().parse_args(["operator", "-A", "--api-timeout", "2.5"]).api_timeout == 2.5
    with pytest.raises(SystemExit) as exited:
        main(["operator", "-A", f"--api-timeout={given}"])
    assert exited.value.code == EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--api-timeout" in err and given in err


def test_render_binds_executors_to_the_given_drivers_role(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path), "--driver-role", "ClusterRole/team-eop-driver"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["roleRef"]["name"] == "team-eop-driver"


def test_run_keeps_a_manifests_checkpoint_in_its_object_storage(
    manifest: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest["spec"]["checkpoint"] = {
        "uri": "s3a://bucket/eop",
        "options": {"fs.s3a.endpoint": "http://127.0.0.1:8333"},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    started: list[RunConfig] = []
    monkeypatch.setattr(
        "eop_spark.runtime.runner.run", lambda config, **_: started.append(config) or 0
    )
    assert main(["run", str(path)]) == 0
    assert started[0].checkpoint_location == "s3a://bucket/eop/ads/clean/gen-0"
    assert started[0].spark.conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    # A URI given on the command line stays a URI (not a path with one slash).
    assert main(["run", str(path), "--checkpoint-root", "s3a://other/x", "--generation", "2"]) == 0
    assert started[1].checkpoint_location == "s3a://other/x/gen-2"


def test_metrics_listen_on_this_host_only_unless_told_an_ip_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["operator", "-A"]).metrics_address == "127.0.0.1"
    args = build_parser().parse_args(["operator", "-A", "--metrics-address", "fd00::5"])
    assert args.metrics_address == "fd00::5"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-A", "--metrics-address", "pod-ip"])
    assert "--metrics-address: not an IP address: 'pod-ip'" in capsys.readouterr().err


def test_verify_checks_a_manifest_on_the_given_brokers_over_the_given_range(
    manifest: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    checked: list[tuple[RunConfig, Any]] = []
    monkeypatch.setattr(
        "eop_spark.verify.recount.run_verify",
        lambda config, options: checked.append((config, options)) or 7,
    )
    args = ["verify", str(path), "--bootstrap-servers", "127.0.0.1:19092"]
    assert main([*args, "--to-offsets", "latest"]) == 7  # run_verify's exit code
    config, options = checked[0]
    assert config.pipeline == "ads.clean"
    assert config.source.kafka.bootstrap_servers == config.sink.kafka.bootstrap_servers
    assert config.sink.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert (options.source_from, options.source_to, options.sink_from) == (None, "latest", None)


def test_verify_of_an_input_slice_without_its_sink_start_is_one_clear_line(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["verify", str(path), "--from-offsets", "earliest"]) == EXIT_INVALID
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--from-offsets needs --sink-from-offsets" in err
