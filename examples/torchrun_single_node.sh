#!/usr/bin/env bash
# One node, N GPUs (or CPU ranks with gloo): plain torchrun, equivalent to `meshlm train CONFIG --nproc N`.
set -euo pipefail
CONFIG=${1:-configs/debug.toml}
NPROC=${NPROC:-2}
torchrun --standalone --nproc-per-node "$NPROC" -m meshlm train "$CONFIG" \
  --run-dir "${RUN_DIR:-runs/torchrun-$(date +%Y%m%d-%H%M%S)}" --set parallel.dp_shard=-1
