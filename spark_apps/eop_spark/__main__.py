"""Command line: ``python -m eop_spark run --config RUN.json``.

Options override the run config: ``--checkpoint-root DIR``, ``--generation N``;
``--log-format json`` writes one JSON object per log line.  The same rules as
``eop run --config`` (the image's entry): both read the config with
:func:`eop_spark.contract.run_config.load_run_config`.  Exit codes are
documented in :mod:`eop_spark.contract.errors`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.run_config import load_run_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eop_spark", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a pipeline until SIGTERM")
    run.add_argument("--config", required=True, type=Path, help="the run config (JSON)")
    run.add_argument("--checkpoint-root", help="override checkpointRoot")
    run.add_argument("--generation", type=int, help="override the checkpoint generation")
    run.add_argument("--log-format", choices=("text", "json"), default="text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        config = load_run_config(
            args.config, checkpoint_root=args.checkpoint_root, generation=args.generation
        )
    except ConfigError as exc:
        print(f"eop: error: {exc.message}", file=sys.stderr)
        return exc.exit_code

    from eop_spark.runtime.runner import run

    return run(config, log_format=args.log_format)


if __name__ == "__main__":
    sys.exit(main())
