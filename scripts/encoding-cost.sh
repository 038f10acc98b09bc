#!/usr/bin/env bash
# What a rule costs the kernel in each of the two encodings iptables-nft releases write for
# `-p tcp -m tcp --dport N`: the xtables `tcp` match 1.8.7 writes (and we write, because every
# release reads it) and the transport-header payload 1.8.8 and later write.
#
# A server namespace gets N rules that never match in nat PREROUTING (written by Debian 11's
# iptables-restore, then by Debian 12's) and one DNAT rule, which turns conntrack on: nat
# chains are walked by the first packet of each connection only. A client opens CONNS
# connections to the server; the time per connection, minus that of an empty chain, divided by
# N is one rule's cost. Needs the root filesystems the userland tests cache (run
# `cargo test -p tests --test userlands` once) and root; everything lives in two namespaces
# this script makes and deletes.
#
#   sudo ./scripts/encoding-cost.sh            # N=20000 CONNS=300, 5 rounds each
set -euo pipefail
N=${N:-20000}
CONNS=${CONNS:-300}
ROUNDS=${ROUNDS:-5}
ROOT=${CNI_RS_USERLAND_CACHE:-/var/cache/cni-rs/userlands}
for release in bullseye bookworm; do
  [ -x "$ROOT/$release/usr/sbin/iptables-restore" ] || {
    echo "error: no $ROOT/$release: run cargo test -p tests --test userlands first" >&2
    exit 1
  }
done
cli=enc-cli-$$
srv=enc-srv-$$
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
  ip netns del "$srv" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$cli"
ip netns add "$srv"
ip -n "$cli" link add v0 type veth peer name v1 netns "$srv"
ip -n "$cli" addr add 10.77.0.1/24 dev v0
ip -n "$srv" addr add 10.77.0.2/24 dev v1
ip -n "$cli" link set v0 up
ip -n "$srv" link set v1 up
ip netns exec "$srv" python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.2", 80))
s.listen(1024)
while True:
    c, _ = s.accept()
    c.close()' &
server=$!
sleep 0.5

rules() {
  echo '*nat'
  for i in $(seq 1 "$N"); do
    echo "-A PREROUTING -p tcp -m tcp --dport $((10000 + i % 50000)) -j RETURN"
  done
  echo "-A PREROUTING -p tcp -m tcp --dport 9 -j DNAT --to-destination 10.77.0.2:9"
  echo COMMIT
}

# The fastest of ROUNDS rounds, in microseconds per connection.
per_connection() {
  ip netns exec "$cli" python3 -c "
import socket, time
best = None
for _ in range($ROUNDS):
    t = time.perf_counter()
    for _ in range($CONNS):
        socket.create_connection(('10.77.0.2', 80)).close()
    us = (time.perf_counter() - t) / $CONNS * 1e6
    best = us if best is None else min(best, us)
print('%.1f' % best)"
}

empty_rules() {
  printf '*nat\n-A PREROUTING -p tcp -m tcp --dport 9 -j DNAT --to-destination 10.77.0.2:9\nCOMMIT\n'
}

for release in bullseye bookworm; do
  ip netns exec "$srv" nft flush ruleset
  empty_rules | ip netns exec "$srv" chroot "$ROOT/$release" iptables-restore
  empty=$(per_connection)
  ip netns exec "$srv" nft flush ruleset
  rules | ip netns exec "$srv" chroot "$ROOT/$release" iptables-restore
  dump=$(ip netns exec "$srv" nft --debug=netlink list chain ip nat PREROUTING 2>/dev/null)
  form=$(grep -m1 -oE 'match name tcp rev 0|payload load 2b @ transport header \+ 2' <<<"$dump")
  full=$(per_connection)
  awk -v r="$release" -v f="$form" -v e="$empty" -v t="$full" -v n="$N" 'BEGIN {
    printf "%-9s %-42s %8.1f us/connection empty, %8.1f with %d rules: %5.1f ns per rule\n",
      r, f, e, t, n, (t - e) * 1000 / n }'
done
