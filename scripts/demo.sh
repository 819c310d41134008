#!/usr/bin/env bash
# The main job on the shipped sample, end to end, from a fresh machine: set up .venv, then
# `lmdata run pipelines/sample.toml` -- train a tokenizer, ingest into memmap, Parquet and
# Lance, verify, train the `tiny` model with evaluation and checkpoints, sample a text,
# bench every format. Rerunning reuses what is already done; extra arguments go to
# `lmdata run` (e.g. `bash scripts/demo.sh --fresh`, `--steps 50`, `--skip-bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/lmdata run pipelines/sample.toml "$@"
