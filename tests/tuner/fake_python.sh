#!/bin/sh
# A stand-in for the deepspeed backend's Python in the sweep tests. `-c CODE` (the sweep's import
# check) prints a version; `ds_ops.py prepare ... --result FILE` (the sweep's op build before the
# first trial) reports that there is nothing to build; otherwise it is one rank of `ds_trial.py
# --config RUN/run.yaml --ds-config RUN/ds_config.json`: it checks the files the real rank program
# reads (the DeepSpeed config, the tokens file run.yaml names), then runs fake_trainer.sh as the
# deepspeed backend.
[ "$1" = -c ] && { echo "0.0+fake"; exit 0; }
case $1 in
  */tuner/backends/deepspeed/ds_ops.py)
    while [ $# -gt 0 ]; do [ "$1" = --result ] && result=$2; shift; done
    printf '{"status": "ok", "extensions_dir": "%s", "ops": [], "seconds": 0.0}\n' \
      "${TMPDIR:-/tmp}" > "$result"
    exit 0 ;;
esac
script=$1 config=$3 ds_config=$5
case $script in */tuner/backends/deepspeed/ds_trial.py) ;; *) echo "error: ran $script" >&2; exit 1 ;; esac
grep -q '"sequence_parallel_size"' "$ds_config" || { echo "error: $ds_config: no DeepSpeed config" >&2; exit 1; }
tokens=$(sed -n 's/^ *source: tokens:\(.*\)$/\1/p' "$config")
[ -s "$tokens" ] || { echo "error: data.source: no tokens file in $config" >&2; exit 1; }
FAKE_BACKEND=deepspeed exec "$(dirname "$0")/fake_trainer.sh" --config "$config"
