#!/usr/bin/env bash
# Create the project's virtualenv (.venv) and install eop with all extras.
# Idempotent: pip's cache makes a re-run quick.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e ".[dev]"
