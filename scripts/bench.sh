#!/usr/bin/env bash
# The benchmark: our static release binaries against Debian's Go plugins in /usr/lib/cni,
# interleaved in one run, printed as a markdown table. Arguments go to the bench binary:
#   --iterations N   timed repetitions (default 100)
#   --sizes a,b,c    "other attachments installed" series for the scale suites
#   --only x,y       suites to run (tuning, bandwidth, sbr, nft, ...)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

build_release
exec "./$release_dir/bench" "$@"
