#!/usr/bin/env bash
# The configuration `ulysses-tune recommend` picked from sweep 'quickstart-cpu' (trial #219). Expects ulysses-tune and ulysses-train on PATH (build/bin).
set -euo pipefail
cd "$(dirname "$0")"

# This machine, 4 local ranks (extra arguments: --set k=v):
exec ulysses-tune launch recommended.yaml --nproc 4 "$@"

# torchrun, one node of 4 ranks:
#   torchrun --nnodes 1 --nproc-per-node 4 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500 --no-python ulysses-train --config recommended.yaml
# SLURM, inside an allocation:
#   MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 srun --nodes 1 --ntasks-per-node 4 --kill-on-bad-exit=1 ulysses-train --config recommended.yaml
