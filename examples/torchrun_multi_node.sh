#!/usr/bin/env bash
# Several nodes: run this on every node with the same HEAD (the first node's address) and RUN_ID.
set -euo pipefail
CONFIG=${1:?usage: torchrun_multi_node.sh CONFIG}
: "${HEAD:?set HEAD to the address of the first node}" "${NNODES:?set NNODES}"
torchrun --nnodes "$NNODES" --nproc-per-node "${NPROC_PER_NODE:-8}" \
  --rdzv-backend c10d --rdzv-endpoint "$HEAD:29500" --rdzv-id "${RUN_ID:-meshlm}" --max-restarts 3 \
  -m meshlm train "$CONFIG" --run-dir "${RUN_DIR:-/shared/runs/${RUN_ID:-meshlm}}" --resume auto
