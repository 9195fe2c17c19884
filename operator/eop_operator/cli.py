"""The ``eop`` command: operator, crd, render, run.

Heavy imports (kopf, pyspark) happen inside the subcommand that needs them, so
``eop crd`` and ``eop render`` start fast and the Spark image needs no kopf.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from eop_operator.api.load import InvalidPipeline, load_pipeline_file

#: Exit code for a manifest or configuration the user must fix.
EXIT_INVALID = 2


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
        rendered = render_pipeline(pipeline, default_image=args.image, generation=args.generation)
    except (InvalidPipeline, MissingImage) as exc:
        return _fail(str(exc))
    sys.stdout.write(yaml.safe_dump_all(rendered.objects, sort_keys=False, width=100))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run one pipeline's driver (the data plane) until SIGTERM."""
    from eop_spark.runner import run

    from eop_operator.api.resolve import IdentityChanged, build_run_config
    from eop_spark.config import RunConfig

    if args.config is not None:
        try:
            config = RunConfig.from_file(args.config)
        except (OSError, ValueError) as exc:
            return _fail(f"{args.config}: {exc}")
    else:
        try:
            pipeline = load_pipeline_file(args.manifest)
            root = args.checkpoint_root or Path(".eop") / pipeline.pipeline_id
            config = build_run_config(
                pipeline, checkpoint_root=str(root), generation=args.generation or 0
            )
        except (InvalidPipeline, IdentityChanged) as exc:
            return _fail(str(exc))
    overrides: dict[str, object] = {}
    if args.checkpoint_root is not None:
        overrides["checkpoint_root"] = str(args.checkpoint_root)
    if args.generation is not None:
        overrides["generation"] = args.generation
    if overrides:
        config = config.model_copy(update=overrides)
    return run(config, log_format=args.log_format)


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the kopf operator against the current kubeconfig or in-cluster config."""
    import kopf

    from eop_operator import handlers

    handlers.OPTIONS.default_image = args.default_image
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    kopf.run(
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        standalone=True,
        liveness_endpoint=args.liveness,
    )
    return 0


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
    op.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    op.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    op.add_argument("--verbose", action="store_true")
    op.set_defaults(func=cmd_operator)

    crd = sub.add_parser("crd", help="print the generated CustomResourceDefinition")
    crd.set_defaults(func=cmd_crd)

    render = sub.add_parser("render", help="print the objects the operator would create")
    render.add_argument("manifest", type=Path)
    render.add_argument("--image", default="eop-spark:latest", help="default image to assume")
    render.add_argument("--generation", type=int, default=0, help="checkpoint generation")
    render.set_defaults(func=cmd_render)

    run = sub.add_parser("run", help="run a pipeline (the data plane) in this process")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("manifest", nargs="?", type=Path, help="an ExactlyOncePipeline manifest")
    source.add_argument("--config", type=Path, help="a resolved run.json (in the driver pod)")
    run.add_argument(
        "--checkpoint-root", type=Path, help="checkpoint root (default ./.eop/<namespace>.<name>)"
    )
    run.add_argument("--generation", type=int, help="checkpoint generation")
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``eop`` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
