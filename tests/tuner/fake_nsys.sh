#!/bin/sh
# A stand-in for Nsight Systems in the campaign's dry run (CPU, no nsys):
#   fake_nsys.sh profile [opts] -o OUT CMD...   runs CMD and writes OUT.nsys-rep
#   fake_nsys.sh export [opts] --output FILE R  writes the known export of nsys_sync_fixture.py
# so `ulysses-tune profile` and scripts/campaign/nsys_syncs.py run end to end. Every call is
# logged to $FAKE_NSYS_LOG when set. Needs python3 (or $FAKE_NSYS_PYTHON) with sqlite3.
here=$(cd "$(dirname "$0")" && pwd)
[ -n "${FAKE_NSYS_LOG:-}" ] && echo "nsys $*" >> "$FAKE_NSYS_LOG"
cmd="$1"; shift
if [ "$cmd" = profile ]; then
  out=""
  while [ $# -gt 0 ]; do
    case "$1" in
      -o|-t) [ "$1" = -o ] && out="$2"; shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  "$@" || exit $?
  echo "fake report" > "$out.nsys-rep"
elif [ "$cmd" = export ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = --output ]; then
      rm -f "$2"
      "${FAKE_NSYS_PYTHON:-python3}" "$here/nsys_sync_fixture.py" "$2" || exit 1
    fi
    shift
  done
elif [ "$cmd" = --version ]; then
  echo "fake nsys (tests/tuner/fake_nsys.sh)"
fi
