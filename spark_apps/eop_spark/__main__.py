"""Command line: ``python -m eop_spark run --config RUN.json``.

Options override the run config: ``--checkpoint-root DIR``, ``--generation N``;
``--log-format json`` writes one JSON object per log line.  Exit codes are
documented in :mod:`eop_spark.contract.errors`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from eop_spark.contract.errors import EXIT_CONFIG, one_line
from eop_spark.contract.run_config import RunConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eop_spark", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a pipeline until SIGTERM")
    run.add_argument("--config", required=True, type=Path, help="the run config (JSON)")
    run.add_argument("--checkpoint-root", help="override checkpointRoot")
    run.add_argument("--generation", type=int, help="override the checkpoint generation")
    run.add_argument("--log-format", choices=("text", "json"), default="text")
    return parser


def _config_error(message: str) -> int:
    print(f"eop: error: {one_line(message)}", file=sys.stderr)
    return EXIT_CONFIG


def load_config(path: Path, checkpoint_root: str | None, generation: int | None) -> RunConfig:
    """Read the run config and apply the command line overrides."""
    config = RunConfig.from_file(path)
    overrides: dict[str, object] = {}
    if checkpoint_root is not None:
        overrides["checkpoint_root"] = checkpoint_root
    if generation is not None:
        overrides["generation"] = generation
    if overrides:
        config = RunConfig.model_validate(config.model_dump() | overrides)
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config, args.checkpoint_root, args.generation)
    except OSError as exc:
        return _config_error(f"cannot read run config {args.config}: {exc.strerror or exc}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        return _config_error(f"invalid run config {args.config}: {problems}")

    from eop_spark.runtime.runner import run

    return run(config, log_format=args.log_format)


if __name__ == "__main__":
    sys.exit(main())
