#!/usr/bin/env bash
# The configuration `ulysses-tune recommend` picked from sweep 'cpu-ring-vs-a2a' (trial #23). Expects ulysses-tune and ulysses-train on PATH (build/bin).
# The run's outputs go under the directory it is started from (output.dir, relative).
set -euo pipefail
here=$(dirname "$0")

# This machine, 4 local ranks (extra arguments: --set k=v):
exec ulysses-tune launch "$here/recommended.yaml" --nproc 4 "$@"

# torchrun, one node of 4 ranks:
#   torchrun --standalone --nproc-per-node 4 --no-python ulysses-train --config recommended.yaml
# SLURM, inside an allocation (or submit launch.sbatch: sbatch launch.sbatch):
#   srun --nodes 1 --ntasks-per-node 4 --kill-on-bad-exit=1 ulysses-train --config recommended.yaml
