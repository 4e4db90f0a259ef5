#!/bin/sh
# Peak RSS per rank for zero.stage 0, 1, 2, 3 at world 4 (dp 2 x sp 2) on CPU; prints a Markdown
# table. Run from the repository root after building ulysses-train:
#   sh reports/zero-cpu/measure.sh
set -e
here=reports/zero-cpu
torchrun=${TORCHRUN:-.venv/bin/torchrun}
echo "| zero.stage | rank 0 | rank 1 | rank 2 | rank 3 | max (MiB) |"
echo "|---|---|---|---|---|---|"
for stage in ${STAGES:-0 1 2 3}; do
  dir=$(mktemp -d)
  ZERO_RSS_DIR=$dir "$torchrun" --standalone --nproc-per-node 4 --no-python sh $here/rank_rss.sh \
    --config $here/states-dominate.yaml --set zero.stage=$stage \
    --set output.dir=$dir/out >$dir/log.txt 2>&1 || { cat $dir/log.txt; exit 1; }
  row="| $stage"
  max=0
  for r in 0 1 2 3; do
    kib=$(tail -n 1 $dir/rss-$r.txt)
    row="$row | $((kib / 1024))"
    [ "$kib" -gt "$max" ] && max=$kib
  done
  echo "$row | $((max / 1024)) |"
  rm -rf "$dir"
done
