#!/usr/bin/env bash
# Runs inside a guest of scripts/kernels.sh (a Debian kernel booted by virtme-ng over this
# machine's root filesystem): the demo, the old-kernel expiry scenario, then the project's
# kernel-touching test binaries, each result in a file of the output directory the host reads.
# Every namespace it makes is its own guest's; nothing here runs on the host.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/kernels-guest.sh --out DIR --manifest FILE --release DIR [--suites LIST]
                                [--lacking nf_tables|nft_fib]

Meant to run inside a guest of scripts/kernels.sh, not on a machine of its own.
  --out DIR        results: summary.tsv (suite, result, passed, failed, ignored, seconds), one
                   log per suite, modprobe.log (every module the kernel asked for, with its time)
  --manifest FILE  "package:target path" per test binary (written by scripts/kernels.sh)
  --release DIR    the release binaries (the demo's)
  --suites LIST    test binaries to run, comma-separated (package:target); default:
                   the nf_tables ones (default_suites below); all: every kernel-touching
                   one (all_suites); none: no suite
  --lacking MOD    the guest's module tree lacks MOD (nf_tables or nft_fib): checks that it
                   does, and runs the suites for such a kernel instead
EOF
}

# The suites a boot runs by default: the ones whose outcome depends on the kernel's nf_tables
# (the encodings and the probe in netfilter's unit tests, the nft suite, portmap and firewall end
# to end with both backends). Under TCG a suite runs 10-250 times slower than natively, the
# exec-heavy ones most (the portmap suite: 25 s natively, 5-13 min in a guest), so the other
# kernel-touching suites are in `--suites all` only:
all_suites=(
  netfilter:lib tests:nft tests:portmap tests:firewall
  netlink:lib host:lib cni:lib portmap:lib firewall:lib tuning:lib tuning:kernel bandwidth:lib sbr:lib
  tests:lib tests:harness tests:tuning tests:bandwidth tests:sbr tests:conformance tests:faults
  tests:iptables_native tests:demo tests:diff_portmap tests:diff_firewall tests:diff_tuning
  tests:diff_bandwidth tests:diff_sbr tests:diff_podman_chain
)
# Never run in a guest, and why: tests:soak (1000 ADD/DEL cycles: hours under TCG),
# tests:concurrency (50 attachments at once: a load test), tests:hostile (property-based bad
# input, refused before any kernel call), tests:podman and tests:firewalld (podman and a
# firewalld with D-Bus; their kernel use is the nftables and iptables paths the portmap and
# firewall suites run), bench:memory and bench:bench_smoke (peak RSS and the bench:
# measurements, not kernel behaviour), tests:packaging (make install: no kernel).
default_suites=(netfilter:lib tests:nft tests:portmap tests:firewall)

out=
manifest=
release=
suites=("${default_suites[@]}")
lacking=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --manifest) manifest="$2"; shift 2 ;;
    --release) release="$2"; shift 2 ;;
    --suites) IFS=, read -r -a suites <<<"$2"; shift 2 ;;
    --lacking) lacking="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "${suites[*]}" != none ] || suites=()
[ "${suites[*]}" != all ] || suites=("${all_suites[@]}")
[ -n "$out" ] && [ -n "$manifest" ] && [ -n "$release" ] || { usage >&2; exit 2; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# It sets the kernel's modprobe helper and makes namespaces: only ever inside a virtme guest.
grep -q 'virtme_' /proc/cmdline \
  || { echo "error: this runs inside a guest of scripts/kernels.sh only" >&2; exit 2; }
export HOME=/root
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The test harness's deadline for one plugin call (tests::runtime::PLUGIN_TIMEOUT_ENV): 30 s by
# default, which a correct Go plugin outlasted under TCG (Debian's Go firewall in a 5.10 guest).
export CNI_TEST_PLUGIN_TIMEOUT=300
summary="$out/summary.tsv"
: >"$summary"

stamp() { printf '[%s up %s] ' "$(date -u +%H:%M:%S)" "$(cut -d' ' -f1 /proc/uptime)"; }
say() { echo "$(stamp)$*" | tee -a "$out/guest.log"; }
# A result row: suite, result, passed, failed, ignored, seconds, note.
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$summary"; }

say "guest: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
say "iptables: $(iptables --version), nft: $(nft --version)"

# Every module the kernel loads on demand goes through its modprobe helper: a wrapper logs the
# request, its start (uptime) and how long modprobe took, which tells module loading apart from
# our own code in a call's time.
cat >/run/modprobe-logged <<EOF
#!/bin/sh
start=\$(cut -d' ' -f1 /proc/uptime)
/sbin/modprobe "\$@"
rc=\$?
end=\$(cut -d' ' -f1 /proc/uptime)
echo "\$start \$end rc=\$rc \$*" >>"$out/modprobe.log"
exit \$rc
EOF
chmod +x /run/modprobe-logged
echo /run/modprobe-logged >/proc/sys/kernel/modprobe
: >"$out/modprobe.log"
lsmod >"$out/lsmod-boot.txt"

# A plugin binary driven by hand in namespace `host`: CNI_COMMAND, container, stdin file.
cni() { # plugin command container conf [netns]
  local plugin="$1" command="$2" container="$3" conf="$4"
  ip netns exec kg-host env -i PATH="$PATH" CNI_COMMAND="$command" CNI_CONTAINERID="$container" \
    CNI_NETNS=/run/netns/kg-ctr CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_LOG_LEVEL=debug \
    ${wrap:-} "$repo/target/debug/$plugin" <"$conf"
}

scenario_setup() {
  ip netns add kg-host && ip netns add kg-ctr \
    && ip -n kg-host link set lo up && ip -n kg-ctr link set lo up \
    && ip -n kg-host link add kg0 type veth peer name eth0 netns kg-ctr \
    && ip -n kg-host addr add 10.99.0.1/24 dev kg0 && ip -n kg-host link set kg0 up \
    && ip -n kg-ctr addr add 10.99.0.2/24 dev eth0 && ip -n kg-ctr link set eth0 up
}
scenario_teardown() { ip netns del kg-host 2>/dev/null; ip netns del kg-ctr 2>/dev/null; true; }

# The JSON config of `plugin` for container address `ip` (and host port `port`, portmap).
conf() { # file plugin ip port [extra json members]
  local prev
  prev="{\"cniVersion\":\"1.1.0\",\"interfaces\":[{\"name\":\"kg0\"},{\"name\":\"eth0\",\"sandbox\":\"/run/netns/kg-ctr\"}],\"ips\":[{\"address\":\"$3/24\",\"gateway\":\"10.99.0.1\",\"interface\":1}]}"
  case "$2" in
    portmap) echo "{\"cniVersion\":\"1.1.0\",\"name\":\"kg\",\"type\":\"portmap\",\"backend\":\"nftables\",\"runtimeConfig\":{\"portMappings\":[{\"hostPort\":$4,\"containerPort\":80,\"protocol\":\"tcp\"}]},\"prevResult\":$prev${5:-}}" >"$1" ;;
    firewall) echo "{\"cniVersion\":\"1.1.0\",\"name\":\"kg\",\"type\":\"firewall\",\"backend\":\"nftables\",\"prevResult\":$prev${5:-}}" >"$1" ;;
  esac
}

# How many of the table's lines name address `ip`: its elements (nft lists one a line).
elements_of() { # family table ip
  ip netns exec kg-host nft list table "$1" "$2" 2>/dev/null | grep -c "$3"
}

# The expiry of DEL and GC (portmap and firewall, nftables) on this kernel: whether it honoured
# the 1 ms timeout update or our post-commit lookup found the element unchanged and deleted it
# ("the kernel does not update element timeouts: deleting instead", a debug line), and that
# nothing of the attachment is left either way. Kernels before 6.5 ignore the update.
scenario_expiry() {
  local dir="$out/expiry" start failed=0 guard=0 line n
  mkdir -p "$dir"
  start=$(date +%s)
  scenario_teardown
  scenario_setup || { row expiry failed 0 1 0 0 "namespaces"; return; }
  expect_gone() { # what family table ip log
    n=$(elements_of "$2" "$3" "$4")
    if grep -q 'does not update element timeouts' "$5"; then
      guard=$((guard + 1))
      line="deleted by the post-commit guard"
    else
      line="expired by the kernel"
    fi
    if [ "$n" -eq 0 ]; then
      say "expiry: $1: $4 gone ($line)"
    else
      say "expiry: $1: $4 still has $n elements ($line)"
      failed=$((failed + 1))
    fi
  }
  local checks=0
  # portmap DEL
  conf "$dir/pm1.json" portmap 10.99.0.2 8080
  cni portmap ADD kg1 "$dir/pm1.json" >"$dir/pm-add1.out" 2>"$dir/pm-add1.err" || failed=$((failed + 1))
  n=$(elements_of ip cni_portmap 10.99.0.2)
  say "expiry: portmap ADD: $n elements of 10.99.0.2"
  [ "$n" -gt 0 ] || failed=$((failed + 1))
  cni portmap DEL kg1 "$dir/pm1.json" >"$dir/pm-del.out" 2>"$dir/pm-del.err" || failed=$((failed + 1))
  expect_gone "portmap DEL" ip cni_portmap 10.99.0.2 "$dir/pm-del.err"; checks=$((checks + 1))
  # portmap GC: kg1 stays valid, kg2 is not
  cni portmap ADD kg1 "$dir/pm1.json" >/dev/null 2>"$dir/pm-add1b.err" || failed=$((failed + 1))
  conf "$dir/pm2.json" portmap 10.99.0.3 8081
  cni portmap ADD kg2 "$dir/pm2.json" >/dev/null 2>"$dir/pm-add2.err" || failed=$((failed + 1))
  echo '{"cniVersion":"1.1.0","name":"kg","type":"portmap","cni.dev/valid-attachments":[{"containerID":"kg1","ifname":"eth0"}]}' >"$dir/pm-gc.json"
  cni portmap GC - "$dir/pm-gc.json" >"$dir/pm-gc.out" 2>"$dir/pm-gc.err" || failed=$((failed + 1))
  expect_gone "portmap GC" ip cni_portmap 10.99.0.3 "$dir/pm-gc.err"; checks=$((checks + 1))
  n=$(elements_of ip cni_portmap 10.99.0.2)
  say "expiry: portmap GC: the valid attachment keeps $n elements"
  [ "$n" -gt 0 ] || failed=$((failed + 1))
  cni portmap DEL kg1 "$dir/pm1.json" >/dev/null 2>&1 || failed=$((failed + 1))
  # firewall DEL
  conf "$dir/fw1.json" firewall 10.99.0.2
  cni firewall ADD kg1 "$dir/fw1.json" >"$dir/fw-add1.out" 2>"$dir/fw-add1.err" || failed=$((failed + 1))
  n=$(elements_of inet cni_firewall 10.99.0.2)
  say "expiry: firewall ADD: $n elements of 10.99.0.2"
  [ "$n" -gt 0 ] || failed=$((failed + 1))
  cni firewall DEL kg1 "$dir/fw1.json" >"$dir/fw-del.out" 2>"$dir/fw-del.err" || failed=$((failed + 1))
  expect_gone "firewall DEL" inet cni_firewall 10.99.0.2 "$dir/fw-del.err"; checks=$((checks + 1))
  # firewall GC
  cni firewall ADD kg1 "$dir/fw1.json" >/dev/null 2>&1 || failed=$((failed + 1))
  conf "$dir/fw2.json" firewall 10.99.0.3
  cni firewall ADD kg2 "$dir/fw2.json" >/dev/null 2>&1 || failed=$((failed + 1))
  echo '{"cniVersion":"1.1.0","name":"kg","type":"firewall","backend":"nftables","cni.dev/valid-attachments":[{"containerID":"kg1","ifname":"eth0"}]}' >"$dir/fw-gc.json"
  cni firewall GC - "$dir/fw-gc.json" >"$dir/fw-gc.out" 2>"$dir/fw-gc.err" || failed=$((failed + 1))
  expect_gone "firewall GC" inet cni_firewall 10.99.0.3 "$dir/fw-gc.err"; checks=$((checks + 1))
  n=$(elements_of inet cni_firewall 10.99.0.2)
  say "expiry: firewall GC: the valid attachment keeps $n elements"
  [ "$n" -gt 0 ] || failed=$((failed + 1))
  cni firewall DEL kg1 "$dir/fw1.json" >/dev/null 2>&1 || failed=$((failed + 1))
  scenario_teardown
  local result=passed
  [ "$failed" -eq 0 ] || result=failed
  row expiry "$result" "$checks" "$failed" 0 "$(($(date +%s) - start))" "guard deleted in $guard of $checks"
  say "expiry: $result; the post-commit guard deleted in $guard of $checks expiries"
}

# The first portmap ADD (nftables) of a fresh guest, before anything else used netfilter, with
# no deadline: its time, the module requests the kernel made meanwhile (modprobe.log) and
# their time, its netlink calls (strace, with times), then a second ADD with every module
# loaded. Tells the kernel's on-demand module loading apart from our own code.
first_add() {
  local dir="$out/first-add" t0 t1 t2 t3 rc1=0 rc2=0 before
  mkdir -p "$dir"
  scenario_teardown
  scenario_setup || { row first-add failed 0 1 0 0 "namespaces"; return; }
  conf "$dir/pm1.json" portmap 10.99.0.2 8080
  conf "$dir/pm2.json" portmap 10.99.0.3 8081
  before=$(wc -l <"$out/modprobe.log")
  t0=$(cut -d' ' -f1 /proc/uptime)
  wrap="strace -f -tt -T --seccomp-bpf -e trace=sendmsg,recvmsg,sendto,recvfrom -o $dir/add1.strace" \
    cni portmap ADD kg1 "$dir/pm1.json" >"$dir/add1.out" 2>"$dir/add1.err" || rc1=$?
  t1=$(cut -d' ' -f1 /proc/uptime)
  tail -n +"$((before + 1))" "$out/modprobe.log" >"$dir/modprobe-during-add1.log"
  t2=$(cut -d' ' -f1 /proc/uptime)
  cni portmap ADD kg2 "$dir/pm2.json" >"$dir/add2.out" 2>"$dir/add2.err" || rc2=$?
  t3=$(cut -d' ' -f1 /proc/uptime)
  cni portmap DEL kg1 "$dir/pm1.json" >/dev/null 2>&1
  cni portmap DEL kg2 "$dir/pm2.json" >/dev/null 2>&1
  scenario_teardown
  local n secs first second
  n=$(wc -l <"$dir/modprobe-during-add1.log")
  secs=$(awk '{ s += $2 - $1 } END { printf "%.1f", s }' "$dir/modprobe-during-add1.log")
  first=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  second=$(awk -v a="$t2" -v b="$t3" 'BEGIN { printf "%.2f", b - a }')
  local note="first ADD ${first} s (exit $rc1; $n module requests, ${secs} s in modprobe), second ADD ${second} s (exit $rc2)"
  say "first-add: $note"
  local result=passed
  [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] || result=failed
  row first-add "$result" "$(( (rc1 == 0) + (rc2 == 0) ))" "$(( (rc1 != 0) + (rc2 != 0) ))" 0 "$first" "$note"
}

# The demo, twice, as `scripts/demo.sh` runs it: the first run is the first netfilter use of
# this boot (every module loads on demand then), traced with timestamps.
run_demo() { # n
  local log="$out/demo-$1.log" start rc=0
  start=$(date +%s.%N)
  say "demo run $1: start"
  (cd "$repo" && timeout 600 "$release/demo") >"$log" 2>&1 || rc=$?
  local secs
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  say "demo run $1: exit $rc after $secs s"
  local result=passed
  [ "$rc" -eq 0 ] || result=failed
  row "demo-run-$1" "$result" "$([ "$rc" -eq 0 ] && echo 1 || echo 0)" \
    "$([ "$rc" -eq 0 ] && echo 0 || echo 1)" 0 "$secs" "exit $rc"
}

# One test binary from the manifest, from its crate's directory as cargo runs it.
run_suite() { # package:target [test args...]
  local suite="$1" exe dir log start rc=0
  shift
  exe="$(awk -v s="$suite" '$1 == s { print $2; exit }' "$manifest")"
  if [ -z "$exe" ]; then
    row "$suite" missing 0 0 0 0 "not in the manifest"
    return
  fi
  dir="$repo/${suite%%:*}"
  log="$out/${suite/:/-}.log"
  say "suite $suite: start"
  start=$(date +%s)
  (cd "$dir" && timeout 2400 "$exe" "$@") >"$log" 2>&1 || rc=$?
  local secs=$(($(date +%s) - start)) passed failed ignored
  passed=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^passed/) s += $i } END { print s + 0 }' "$log")
  failed=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^failed/) s += $i } END { print s + 0 }' "$log")
  ignored=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^ignored/) s += $i } END { print s + 0 }' "$log")
  local result=passed note="exit $rc"
  [ "$rc" -eq 0 ] || result=failed
  [ "$rc" -ne 124 ] || note="killed after $secs s"
  row "$suite" "$result" "$passed" "$failed" "$ignored" "$secs" "$note"
  say "suite $suite: $result, $passed passed, $failed failed, $ignored ignored, $secs s"
  [ "$failed" -eq 0 ] || grep -E '^test .* FAILED$|^---- ' "$log" | head -20 | tee -a "$out/guest.log"
}

# The boots whose module tree lacks a module: prove the lack first, then the suites that cover
# such a kernel (the filters name the tests).
lacking_module() {
  if modprobe -n -q "$lacking" 2>/dev/null || grep -qw "^$lacking" /proc/modules; then
    say "error: $lacking is loadable in this guest"
    row "lacks-$lacking" failed 0 1 0 0 "module loadable"
  else
    say "$lacking: no such module in this guest ($(modprobe -n "$lacking" 2>&1 | head -1))"
    row "lacks-$lacking" passed 1 0 0 0 "modprobe -n fails"
  fi
}

# A kernel lacking `$lacking`, driven by hand (no seccomp stand-in: the kernel itself lacks it).
# Checks: the plugins' answers (code, message) to ADD and STATUS of the nftables backends,
# DEL and GC of them succeeding as holding nothing, and portmap's auto backend mapping with the
# iptables tools (the legacy ones where nf_tables is missing, as on such a node).
scenario_lacking() {
  local dir="$out/lacking" start failed=0 checks=0 legacy="/run/legacy-tools" path
  mkdir -p "$dir" "$legacy"
  start=$(date +%s)
  for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf "/usr/sbin/${t/tables/tables-legacy}" "$legacy/$t"
  done
  path="$PATH"
  [ "$lacking" != nf_tables ] || path="$legacy:$PATH"
  scenario_teardown
  scenario_setup || { row lacking failed 0 1 0 0 "namespaces"; return; }
  # check name: the plugin's stdout holds an error whose text names $want, with code $code when
  # given (or succeeds: "ok").
  check() { # name want file [code]
    checks=$((checks + 1))
    local got
    if [ "$2" = ok ]; then
      if grep -q '"code"' "$3"; then
        failed=$((failed + 1)); say "lacking: $1: FAILED: $(tr -d '\n' <"$3")"
      else
        say "lacking: $1: succeeded"
      fi
    else
      got="$(tr -d '\n' <"$3")"
      if grep -q "\"code\": ${4:-}" "$3" && grep -q "$2" "$3"; then
        say "lacking: $1: refused as expected: $got"
      else
        failed=$((failed + 1)); say "lacking: $1: FAILED (wanted an error naming $2): $got"
      fi
    fi
  }
  local feature
  case "$lacking" in
    nf_tables) feature="the kernel has no nf_tables" ;;
    nft_fib) feature="fib" ;;
  esac
  conf "$dir/pm-nft.json" portmap 10.99.0.2 8080
  PATH="$path" cni portmap ADD kg1 "$dir/pm-nft.json" >"$dir/pm-add.out" 2>"$dir/pm-add.err"
  check "portmap ADD nftables (code 999)" "$feature" "$dir/pm-add.out" 999
  echo '{"cniVersion":"1.1.0","name":"kg","type":"portmap","backend":"nftables"}' >"$dir/pm-status.json"
  PATH="$path" cni portmap STATUS - "$dir/pm-status.json" >"$dir/pm-status.out" 2>&1
  check "portmap STATUS nftables (code 50)" "$feature" "$dir/pm-status.out" 50
  PATH="$path" cni portmap DEL kg1 "$dir/pm-nft.json" >"$dir/pm-del.out" 2>&1
  check "portmap DEL nftables" ok "$dir/pm-del.out"
  echo '{"cniVersion":"1.1.0","name":"kg","type":"portmap","backend":"nftables","cni.dev/valid-attachments":[]}' >"$dir/pm-gc.json"
  PATH="$path" cni portmap GC - "$dir/pm-gc.json" >"$dir/pm-gc.out" 2>&1
  check "portmap GC nftables" ok "$dir/pm-gc.out"
  # auto: the iptables layout
  sed 's/"backend":"nftables",//' "$dir/pm-nft.json" >"$dir/pm-auto.json"
  PATH="$path" cni portmap ADD kg2 "$dir/pm-auto.json" >"$dir/pm-auto-add.out" 2>"$dir/pm-auto-add.err"
  check "portmap ADD auto" ok "$dir/pm-auto-add.out"
  checks=$((checks + 1))
  if ip netns exec kg-host env PATH="$path" iptables-save -t nat | grep -q -- '--dport 8080 -j DNAT'; then
    say "lacking: portmap auto mapped with $(PATH="$path" iptables --version)"
  else
    failed=$((failed + 1)); say "lacking: portmap auto: no DNAT rule in $(PATH="$path" iptables --version)"
  fi
  PATH="$path" cni portmap DEL kg2 "$dir/pm-auto.json" >"$dir/pm-auto-del.out" 2>&1
  check "portmap DEL auto" ok "$dir/pm-auto-del.out"
  checks=$((checks + 1))
  if ip netns exec kg-host env PATH="$path" iptables-save -t nat | grep -q 'CNI-DN-'; then
    failed=$((failed + 1)); say "lacking: portmap auto DEL left its chain"
  fi
  # firewall, nftables
  conf "$dir/fw.json" firewall 10.99.0.2
  PATH="$path" cni firewall ADD kg1 "$dir/fw.json" >"$dir/fw-add.out" 2>"$dir/fw-add.err"
  if [ "$lacking" = nf_tables ]; then
    check "firewall ADD nftables (code 999)" "$feature" "$dir/fw-add.out" 999
    echo '{"cniVersion":"1.1.0","name":"kg","type":"firewall","backend":"nftables"}' >"$dir/fw-status.json"
    PATH="$path" cni firewall STATUS - "$dir/fw-status.json" >"$dir/fw-status.out" 2>&1
    check "firewall STATUS nftables (code 50)" "$feature" "$dir/fw-status.out" 50
    # The kernel's own answers, which tests::seccomp's second stand-in has the kernel give
    # where nf_tables is there: a batch refused with EOPNOTSUPP, a request with EINVAL.
    checks=$((checks + 1))
    local batch request
    batch="$(ip netns exec kg-host nft add table ip kgprobe 2>&1)"
    request="$(ip netns exec kg-host nft list tables 2>&1)"
    if [[ "$batch" == *"Operation not supported"* && "$request" == *"Invalid argument"* ]]; then
      say "lacking: nft: a batch refused with EOPNOTSUPP, a request with EINVAL, as the stand-in has them"
    else
      failed=$((failed + 1)); say "lacking: nft: FAILED: batch: $batch; request: $request"
    fi
  else
    # The firewall's layout uses no fib: it works on such a kernel.
    check "firewall ADD nftables" ok "$dir/fw-add.out"
  fi
  PATH="$path" cni firewall DEL kg1 "$dir/fw.json" >"$dir/fw-del.out" 2>&1
  check "firewall DEL nftables" ok "$dir/fw-del.out"
  echo '{"cniVersion":"1.1.0","name":"kg","type":"firewall","backend":"nftables","cni.dev/valid-attachments":[]}' >"$dir/fw-gc.json"
  PATH="$path" cni firewall GC - "$dir/fw-gc.json" >"$dir/fw-gc.out" 2>&1
  check "firewall GC nftables" ok "$dir/fw-gc.out"
  scenario_teardown
  local result=passed
  [ "$failed" -eq 0 ] || result=failed
  row "lacking-$lacking" "$result" "$((checks - failed))" "$failed" 0 "$(($(date +%s) - start))" ""
  say "lacking $lacking: $result, $((checks - failed)) of $checks checks"
}

if [ -n "$lacking" ]; then
  lacking_module
  scenario_lacking
  # The suites' tests of a kernel without nf_tables stand one in with seccomp (without
  # nfnetlink; nfnetlink without nf_tables); run here, the kernel lacks it too.
  if [ "$lacking" = nf_tables ]; then
    run_suite tests:portmap without_nf_tables
    run_suite tests:firewall nftables_without_nf_tables
  fi
  lsmod >"$out/lsmod-end.txt"
  dmesg >"$out/dmesg-end.txt"
  say "done"
  exit 0
fi

first_add
run_demo 1
dmesg >"$out/dmesg-after-demo-1.txt"
run_demo 2
scenario_expiry
# The suites expect what the machines they run on have: bridged traffic through the ip family's
# netfilter hooks (br_netfilter, which Kubernetes nodes load; firewall's isolation of two
# containers on the same bridge depends on it). Debian's kernels build it as a module, not
# loaded at boot.
modprobe br_netfilter && say "br_netfilter loaded: bridge-nf-call-iptables=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables)"
for suite in "${suites[@]}"; do
  case "$suite" in
    # Scale tests (10 000 mappings, 4500 stale elements): under TCG a plugin call or an nft
    # listing of that size takes minutes and holds the iptables lock over the tests beside it;
    # the bench measures scale.
    tests:portmap) run_suite "$suite" --skip ten_thousand_mappings --skip gc_removes_4500 ;;
    *) run_suite "$suite" ;;
  esac
done
lsmod >"$out/lsmod-end.txt"
dmesg >"$out/dmesg-end.txt"
say "done"
