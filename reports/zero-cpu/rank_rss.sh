#!/bin/sh
# One rank of ulysses-train under GNU time: writes this rank's peak RSS (KiB) to
# $ZERO_RSS_DIR/rss-$RANK.txt. Run by measure.sh through torchrun --no-python.
exec /usr/bin/time -f "%M" -o "$ZERO_RSS_DIR/rss-$RANK.txt" build/bin/ulysses-train "$@"
