#!/usr/bin/env bash
# The benchmark: our static release binaries against Debian's Go plugins in /usr/lib/cni,
# interleaved in one run, printed as markdown: per-verb medians, p90 and peak RSS with the
# ours/Go ratio, the scale series of portmap and firewall, and the verdict of every target of the
# plugin issues. Everything runs in throwaway network namespaces. The bench is the `bench` crate
# (bench/src/main.rs; bench/src/lib.rs says what it times and how). Arguments go to its binary:
#   --iterations N           timed repetitions per row (default 100; at most 30 per scale size)
#   --sizes a,b,c            "other attachments installed" of the scale series
#                            (default 0,100,1000,5000; 0 and each size a target names, firewall
#                            500 and portmap 1000, are added when the largest size reaches them)
#   --reference-max-size N   largest size of the series whose installs grow with N: the Go
#                            firewall's own and portmap's iptables layout (default 1000; 5000
#                            adds over an hour); larger sizes have the other series only
#   --only x,y               suites to run (tuning, bandwidth, sbr, firewall, nft,
#                            iptables-native, portmap, reconcile, memory, busy)
#   --memory-sizes a,b       stdin sizes of the memory suite, KB or with M for MB (default
#                            1M,4M,16M)
#   --memory-shapes a,b      its stdin shapes: array, nesting, routes (default all)
#   --busy-conntrack a,b     the busy node's conntrack table sizes, after its levels of 1 entry
#                            (default 20000,100000)
#   --busy-veths N           the veths on its bridge (default 100)
#   --busy-kube-rules N      the kube-proxy-style rules in its nat table (default 5000)
#   --out DIR                also write DIR/BENCHMARKS.md, DIR/bench-scale.png (gnuplot), its
#                            data and script, and every sample in DIR/bench-data.json
# The full default run takes 20-30 minutes on 2 cores; BENCHMARKS.md is made with
#   sudo scripts/bench.sh --out .
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

build_release
# The report quotes the command that made it.
BENCH_COMMAND="scripts/bench.sh"
for arg in "$@"; do
  if [[ $arg =~ ^[A-Za-z0-9_,./=:+-]+$ ]]; then
    BENCH_COMMAND+=" $arg"
  else
    BENCH_COMMAND+=" '${arg//\'/\'\\\'\'}'"
  fi
done
export BENCH_COMMAND
exec "./$release_dir/bench" "$@"
