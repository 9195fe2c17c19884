"""The ``eop`` command: operator, crd, render, run, verify, executor, checkpoint delete.

Heavy imports (kopf, pyspark) happen inside the subcommand that needs them, so
``eop crd`` and ``eop render`` start fast and the Spark image needs no kopf.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from eop_operator.api.load import InvalidPipeline, load_pipeline_file
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.render.pod_policy import PodPolicy
from eop_operator.render.ports import HostPortRange
from eop_operator.render.rbac import DEFAULT_DRIVER_ROLE, DriverRole

if TYPE_CHECKING:
    from eop_operator.controller.context import OperatorOptions
    from eop_spark.contract.run_config import RunConfig

#: Exit code for a manifest or configuration the user must fix.
EXIT_INVALID = 2
#: Where ``/metrics`` listens unless ``--metrics-address`` says otherwise: this host only.
METRICS_ADDRESS = "127.0.0.1"


def _fail(message: str) -> int:
    print(f"eop: error: {message}", file=sys.stderr)
    return EXIT_INVALID


def cmd_crd(_: argparse.Namespace) -> int:
    """Print the generated CustomResourceDefinition."""
    from eop_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    """Print the objects the operator would create for a manifest."""
    from eop_operator.render import MissingImage, render_pipeline

    try:
        pipeline = load_pipeline_file(args.manifest)
        rendered = render_pipeline(
            pipeline,
            default_image=args.image,
            generation=args.generation,
            driver_role=args.driver_role,
        )
    except (InvalidPipeline, MissingImage) as exc:
        return _fail(str(exc))
    sys.stdout.write(yaml.safe_dump_all(rendered.objects, sort_keys=False, width=100))
    return 0


def local_checkpoint_root(pipeline: ExactlyOncePipeline) -> str:
    """Where ``eop run`` keeps a manifest's checkpoints: its object storage, else ``./.eop``."""
    from eop_operator.render import checkpoint_root

    if pipeline.spec.checkpoint.uri is not None:
        return checkpoint_root(pipeline)
    return str(Path(".eop") / pipeline.pipeline_id)


class BadRunInput(Exception):
    """A run config or manifest that cannot be read or resolved (the message says why)."""


def resolve_run_config(args: argparse.Namespace) -> RunConfig:
    """The run config of ``eop run`` and ``eop verify``: ``--config``, or the manifest resolved.

    The options ``--checkpoint-root`` and ``--generation`` (those the subcommand
    has) apply on top by the rule of ``python -m eop_spark run``
    (:meth:`RunConfig.overridden`), then ``--bootstrap-servers``.  Raises
    :class:`BadRunInput`.
    """
    from pydantic import ValidationError

    from eop_operator.api.resolve import IdentityChanged, build_run_config
    from eop_spark.contract.errors import ConfigError
    from eop_spark.contract.run_config import invalid_run_config, load_run_config

    checkpoint_root = getattr(args, "checkpoint_root", None)
    generation = getattr(args, "generation", None)
    try:
        if args.config is not None:
            config = load_run_config(
                args.config, checkpoint_root=checkpoint_root, generation=generation
            )
        else:
            pipeline = load_pipeline_file(args.manifest)
            local = build_run_config(
                pipeline, checkpoint_root=local_checkpoint_root(pipeline), generation=0
            )
            try:
                config = local.overridden(checkpoint_root=checkpoint_root, generation=generation)
            except ValidationError as exc:
                raise invalid_run_config(args.manifest, exc) from exc
    except ConfigError as exc:
        raise BadRunInput(exc.message) from exc
    except (InvalidPipeline, IdentityChanged) as exc:
        raise BadRunInput(str(exc)) from exc
    if args.bootstrap_servers:
        config = config.on_brokers(args.bootstrap_servers)
    return config


def cmd_run(args: argparse.Namespace) -> int:
    """Run one pipeline's driver (the data plane) until SIGTERM."""
    from eop_spark.runtime.runner import run

    try:
        config = resolve_run_config(args)
    except BadRunInput as exc:
        return _fail(str(exc))
    return run(config, log_format=args.log_format)


def cmd_verify(args: argparse.Namespace) -> int:
    """Recompute a pipeline's output from its committed input and compare it with the sink."""
    from eop_spark.contract.errors import ConfigError
    from eop_spark.verify.ranges import RangeOptions
    from eop_spark.verify.recount import run_verify

    try:
        options = RangeOptions(
            source_from=args.from_offsets,
            source_to=args.to_offsets,
            sink_from=args.sink_from_offsets,
        )
        config = resolve_run_config(args)
    except (BadRunInput, ConfigError) as exc:
        return _fail(str(exc))
    return run_verify(config, options)


def cmd_checkpoint_delete(args: argparse.Namespace) -> int:
    """Delete a checkpoint root in object storage (the retention Delete Job runs this)."""
    from eop_spark.runtime.checkpoint_delete import delete_checkpoint_root

    options: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _fail(f"--option {item!r}: expected NAME=VALUE")
        options[key] = value
    count = delete_checkpoint_root(args.root, options)
    print(f"deleted {count} files under {args.root}" if count else f"nothing under {args.root}")
    return 0


def cmd_executor(_: argparse.Namespace) -> int:
    """Start this executor pod's JVM (see eop_spark.runtime.executor)."""
    from eop_spark.runtime.executor import main as run_executor

    return run_executor()


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the kopf operator against the current kubeconfig or in-cluster config."""
    import asyncio

    # kopf imports the kubernetes client package, when installed, only to recognise its
    # models in handler results; the operator returns none.  Its image does not install it;
    # where it is installed (a development venv) its models stay out of memory all the same.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    import kopf

    from eop_operator.controller.context import OperatorOptions

    options = OperatorOptions(
        default_image=args.default_image,
        host_ports=args.host_ports,
        driver_role=args.driver_role,
        pod_policy=PodPolicy(
            allow_host_network=args.allow_host_network,
            allow_host_path_volumes=args.allow_host_path_volumes,
            service_accounts=frozenset(args.allow_service_account or ()),
        ),
        operator_upgrade_parallelism=args.operator_upgrade_parallelism,
        rbac_name=args.rbac_name,
        **({"api_timeout": args.api_timeout} if args.api_timeout else {}),
    )
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    try:
        return asyncio.run(_operate(args, options))
    except ValueError as exc:
        return _fail(str(exc))


#: Exit code of a replica that lost the leader lease (its pod restarts as a standby).
EXIT_LOST_LEASE = 3


def _operator_namespace(explicit: str | None) -> str:
    """Where the leader Lease lives: the option, $POD_NAMESPACE, or the pod's own namespace."""
    import os

    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return Path(_SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
    except OSError:
        raise ValueError(
            "--leader-election needs --leader-election-namespace (or $POD_NAMESPACE)"
        ) from None


_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


async def _operate(args: argparse.Namespace, options: OperatorOptions) -> int:
    """Serve metrics and liveness, wait for the leader lease if asked, then run kopf."""
    import asyncio
    import logging
    import os
    import socket
    import uuid

    import kopf

    from eop_operator import metrics
    from eop_operator.controller import registration
    from eop_operator.controller.registration import connection_info
    from eop_operator.kube.client import KubeClient
    from eop_operator.kube.lease import LeaderElector

    log = logging.getLogger("eop_operator")
    metrics_port = args.metrics_port or int(os.environ.get("EOP_METRICS_PORT", "0") or 0)
    endpoints = await metrics.serve(
        metrics=metrics.Endpoint(args.metrics_address, metrics_port, "/metrics")
        if metrics_port
        else None,
        liveness=metrics.Endpoint.parse(args.liveness) if args.liveness else None,
    )
    elector: LeaderElector | None = None
    tasks: set[asyncio.Task[None]] = set()
    try:
        if args.leader_election:
            identity = (
                f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
            )
            client = KubeClient(lambda: connection_info(kopf.OperatorSettings()))
            elector = LeaderElector(
                client,
                namespace=_operator_namespace(args.leader_election_namespace),
                name=args.leader_election_id,
                identity=identity,
                lease_duration=args.lease_duration,
                renew_deadline=args.lease_duration * 2 / 3,
                retry_period=args.lease_duration / 7.5,
            )
            await elector.acquire()
            tasks.add(asyncio.create_task(elector.hold(), name="leader lease"))
        metrics.set_leader(True)
        settings = kopf.OperatorSettings()
        registration.configure(settings)
        registry = kopf.OperatorRegistry()
        registration.register(registry)
        operator = asyncio.create_task(
            kopf.operator(
                registry=registry,
                settings=settings,
                memo=registration.memo(options, settings),
                clusterwide=args.all_namespaces,
                namespaces=args.namespace or (),
                standalone=True,
            ),
            name="kopf",
        )
        done, _ = await asyncio.wait({operator, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        if operator not in done:
            # Lost the lease: another replica may act soon. Stop now, mid-handler if need be
            # (handlers are level-based and idempotent; the next leader resumes).
            log.error("leadership lost: exiting")
            logging.shutdown()
            os._exit(EXIT_LOST_LEASE)
        operator.result()
        return 0
    finally:
        metrics.set_leader(False)
        for task in tasks:
            task.cancel()
        if elector is not None:
            await elector.release()
            await elector.client.close()
        await endpoints.cleanup()


def _at_least_one(text: str) -> int:
    """An integer option that must be 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_seconds(text: str) -> float:
    """A number of seconds that must be more than 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def _ip_address(text: str) -> str:
    """An option that must be an IP address (IPv4 or IPv6, ``0.0.0.0``/``::`` for all)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def _add_driver_role(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--driver-role",
        type=DriverRole.parse,
        default=DEFAULT_DRIVER_ROLE,
        metavar="KIND/NAME",
        help="pre-made Role (in each pipeline's namespace) or ClusterRole that drivers with "
        f"executors on Kubernetes are bound to (default {DEFAULT_DRIVER_ROLE})",
    )


def _add_run_input(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("manifest", nargs="?", type=Path, help="an ExactlyOncePipeline manifest")
    source.add_argument("--config", type=Path, help="a resolved run.json (in the driver pod)")


def _add_bootstrap_servers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="the Kafka brokers of source and sink both, instead of the manifest's "
        "(a manifest written for a cluster, against a broker on this machine)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``eop`` command."""
    parser = argparse.ArgumentParser(
        prog="eop", description="Exactly-once PySpark pipelines from Kafka on Kubernetes."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the operator (kopf)")
    scope = op.add_mutually_exclusive_group(required=True)
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    scope.add_argument(
        "--namespace", "-n", action="append", help="watch this namespace (repeatable)"
    )
    op.add_argument("--default-image", help="Spark application image for pipelines without one")
    op.add_argument(
        "--rbac-name",
        metavar="NAME",
        help="the Role and RoleBinding that grant the operator its rights in each watched "
        "namespace: they keep a finalizer while pipelines remain there, so deleting the "
        "namespace releases the pipelines first (the chart sets it in namespaced mode)",
    )
    op.add_argument(
        "--host-ports",
        type=HostPortRange.parse,
        default=HostPortRange(),
        metavar="FIRST-LAST",
        help=f"metrics ports of host-network drivers (default {HostPortRange()})",
    )
    _add_driver_role(op)
    op.add_argument(
        "--allow-host-network",
        action="store_true",
        help="run pipelines that set spec.driver.hostNetwork (refused by default)",
    )
    op.add_argument(
        "--allow-host-path-volumes",
        action="store_true",
        help="run pipelines with hostPath volumes in spec.driver.volumes (refused by default)",
    )
    op.add_argument(
        "--operator-upgrade-parallelism",
        type=_at_least_one,
        default=1,
        metavar="N",
        help="drivers restarting at once, in last-state, because this operator renders their "
        "unchanged spec differently (a new operator version or default image; default 1)",
    )
    op.add_argument(
        "--allow-service-account",
        action="append",
        metavar="NAME",
        help="let pipelines run as this ServiceAccount of their namespace "
        "(spec.serviceAccountName, the executors'; repeatable; by default a driver runs only "
        "as the account eop makes)",
    )
    op.add_argument(
        "--api-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="how long one request of the operator to the API server may take, answer "
        "included, before it counts as failed (default 30)",
    )
    op.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    op.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port at /metrics (default $EOP_METRICS_PORT)",
    )
    op.add_argument(
        "--metrics-address",
        default=METRICS_ADDRESS,
        type=_ip_address,
        metavar="IP",
        help="the address /metrics listens on: the pod's IP for a Prometheus in the cluster, "
        f"0.0.0.0 for every address (default {METRICS_ADDRESS}: this host only)",
    )
    op.add_argument(
        "--leader-election",
        action="store_true",
        help="run only while holding a Lease, so several replicas never act twice",
    )
    op.add_argument(
        "--leader-election-namespace",
        help="namespace of the Lease (default $POD_NAMESPACE, else the pod's namespace)",
    )
    op.add_argument("--leader-election-id", default="eop-operator", help="name of the Lease")
    op.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits for a silent leader before taking over",
    )
    op.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    op.add_argument("--verbose", action="store_true")
    op.set_defaults(func=cmd_operator)

    crd = sub.add_parser("crd", help="print the generated CustomResourceDefinition")
    crd.set_defaults(func=cmd_crd)

    render = sub.add_parser("render", help="print the objects the operator would create")
    render.add_argument("manifest", type=Path)
    render.add_argument("--image", default="eop-spark:latest", help="default image to assume")
    render.add_argument("--generation", type=int, default=0, help="checkpoint generation")
    _add_driver_role(render)
    render.set_defaults(func=cmd_render)

    run = sub.add_parser("run", help="run a pipeline (the data plane) in this process")
    _add_run_input(run)
    run.add_argument(
        "--checkpoint-root",
        help="checkpoint root: a directory or an s3a:// URI (default: the manifest's "
        "checkpoint.uri/<namespace>/<name>, else ./.eop/<namespace>.<name>)",
    )
    run.add_argument("--generation", type=int, help="checkpoint generation")
    _add_bootstrap_servers(run)
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.set_defaults(func=cmd_run)

    verify = sub.add_parser(
        "verify",
        help="recompute a pipeline's output from its committed input and compare it with the "
        "sink topic (exit 0: identical, 7: discrepancies; docs/verify.md)",
    )
    _add_run_input(verify)
    _add_bootstrap_servers(verify)
    offsets = 'earliest, latest, or offsets JSON such as \'{"topic": {"0": 42}}\''
    verify.add_argument(
        "--from-offsets",
        metavar="OFFSETS",
        help=f"where the input range starts ({offsets}; default earliest); needs "
        "--sink-from-offsets",
    )
    verify.add_argument(
        "--to-offsets",
        metavar="OFFSETS",
        help=f"where the input range ends ({offsets}; default: the progress group's offsets, "
        "the end of the input with visible output)",
    )
    verify.add_argument(
        "--sink-from-offsets",
        metavar="OFFSETS",
        help=f"where the sink range starts ({offsets}; default earliest)",
    )
    verify.set_defaults(func=cmd_verify)

    checkpoint = sub.add_parser("checkpoint", help="manage checkpoints in object storage")
    actions = checkpoint.add_subparsers(dest="action", required=True)
    delete = actions.add_parser(
        "delete", help="delete everything under a checkpoint root (retention Delete)"
    )
    delete.add_argument("root", help="the checkpoint root, e.g. s3a://bucket/prefix/ns/name")
    delete.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Hadoop setting such as fs.s3a.endpoint=... (repeatable); credentials come "
        "from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
    )
    delete.set_defaults(func=cmd_checkpoint_delete)
    executor = sub.add_parser(
        "executor",
        help="run a Spark executor (in the executor pods a driver with a k8s:// master makes)",
    )
    executor.set_defaults(func=cmd_executor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``eop`` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
