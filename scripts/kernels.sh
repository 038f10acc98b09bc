#!/usr/bin/env bash
# The kernel matrix, outside CI: Debian's own kernel packages (bullseye's 5.10, bookworm's 6.1,
# trixie's 6.12) booted in QEMU guests by virtme-ng, with this machine's root filesystem shared
# read-only and the kernel's own modules, running the project's kernel-touching test binaries
# (built here) and the demo inside. Two more boots take modules away from the tree the guest
# sees: one without nf_tables, one without nft_fib. Writes a results table (kernel x suite).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/kernels.sh [options]

Boots Debian's kernel packages in QEMU guests (virtme-ng, without KVM unless --kvm) and runs
the project's kernel-touching suites inside each, one guest at a time. Needs root. Installs
what it lacks (qemu-system-x86, busybox-static, kmod, python3-venv; virtme-ng from PyPI in a
venv) and caches the kernels and the venv under the cache directory, outside the checkout.

  --boots LIST     boots to run, comma-separated (default: all of them, in this order):
                     5.10          bullseye's linux-image-amd64
                     6.1           bookworm's
                     6.12          trixie's
                     6.12-nonft    trixie's without nf_tables (its module removed)
                     6.12-nofib    trixie's without nft_fib (nft_fib*, removed)
  --suites LIST    the test binaries each full boot runs, as package:target (default: the
                   nf_tables ones; all: every kernel-touching one; none: only the demo and
                   the scenarios; scripts/kernels-guest.sh says which and why). The two boots without modules
                   always run their own short list.
  --cpus N         vCPUs of each guest (default 2)
  --memory SIZE    memory of each guest (default 3G)
  --timeout MIN    a guest still running after MIN minutes is killed (default 60)
  --kvm            use KVM (the default is TCG: inside these VMs a KVM guest hangs at boot)
  --cache DIR      the cache (default /var/cache/cni-rs/kernels)
  --out DIR        where the logs and the table go (default DIR/results/<date>)
  --readme         write the table into README.md, between its kernel-matrix markers: the
                   columns of the boots run are replaced, the others stay
  --fetch-only     fetch and unpack the kernels of the boots, then stop
  -h, --help       this text

The results: DIR/table.md (kernel x suite: passed/failed counts and wall time), one log per
boot (DIR/<boot>.log, the guest's console) and the guest's own files (DIR/<boot>/).
EOF
}

boots_all=(5.10 6.1 6.12 6.12-nonft 6.12-nofib)
boots=("${boots_all[@]}")
suites=
cpus=2
memory=3G
timeout_min=60
accel=tcg
cache=/var/cache/cni-rs/kernels
out=
readme=
fetch_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --boots) IFS=, read -r -a boots <<<"$2"; shift 2 ;;
    --suites) suites="$2"; shift 2 ;;
    --cpus) cpus="$2"; shift 2 ;;
    --memory) memory="$2"; shift 2 ;;
    --timeout) timeout_min="$2"; shift 2 ;;
    --kvm) accel=kvm; shift ;;
    --cache) cache="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --readme) readme=1; shift ;;
    --fetch-only) fetch_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for boot in "${boots[@]}"; do
  [[ " ${boots_all[*]} " == *" $boot "* ]] \
    || { echo "error: unknown boot $boot (known: ${boots_all[*]})" >&2; exit 2; }
done

# The project's own packages (iptables, nftables, the Go plugins…), cargo, the checkout.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
repo="$(pwd)"

# What the guests need besides: QEMU, busybox for virtme's initramfs, depmod, a venv.
declare -A host_want=(
  [qemu-system-x86]=/usr/bin/qemu-system-x86_64
  [busybox-static]=/bin/busybox
  [kmod]=/usr/sbin/depmod
  [strace]=/usr/bin/strace
)
host_missing=()
for pkg in "${!host_want[@]}"; do
  [ -e "${host_want[$pkg]}" ] || host_missing+=("$pkg")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || host_missing+=(python3-venv)
if [ ${#host_missing[@]} -gt 0 ]; then
  echo "==> installing ${host_missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${host_missing[@]}" >/dev/null
fi

mkdir -p "$cache"
venv="$cache/venv"
export PATH="$venv/bin:$PATH"
if [ ! -x "$venv/bin/vng" ]; then
  echo "==> installing virtme-ng from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet virtme-ng
fi

# The Debian mirror apt uses here (its main archive and its security archive): the kernels come
# from the same places as every other package of this machine.
mirror() { # kind: main | security
  apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 'Identifier: Packages' \
    | sort -u | awk -v kind="$1" '
      kind == "main" && $2 !~ /-/ { print $1; exit }
      kind == "security" && $2 ~ /-security$/ { print $1; exit }'
}

# Debian's kernel of `suite` (the package linux-image-amd64 depends on, the newest of the
# suite and its security updates), unpacked into $cache/<suite>/root (boot/, lib/modules/).
# Prints that root. A private apt state: the machine's own lists stay as they are.
fetch_kernel() { # suite
  local suite="$1" dir="$cache/$1" main security
  if [ -e "$dir/root/.done" ]; then
    echo "$dir/root"
    return
  fi
  main="$(mirror main)"
  security="$(mirror security)"
  [ -n "$main" ] || { echo "error: no Debian mirror in apt's sources" >&2; return 1; }
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$dir/deb"
  : >"$dir/apt/status"
  {
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $main $suite main"
    [ -z "$security" ] \
      || echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security $suite-security main"
  } >"$dir/apt/sources.list"
  local opts=(
    -o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::State::status=$dir/apt/status"
    -o "Dir::Cache=$dir/apt" -o "Dir::Cache::archives=$dir/apt/archives"
    -o APT::Architecture=amd64 -o Acquire::Languages=none -o APT::Sandbox::User=root
  )
  echo "==> fetching $suite's kernel package" >&2
  apt-get "${opts[@]}" update -qq >&2
  local pkg
  pkg="$(apt-cache "${opts[@]}" depends linux-image-amd64 \
    | awk '$1 ~ /Depends:$/ && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')"
  [ -n "$pkg" ] || { echo "error: no linux-image package in $suite" >&2; return 1; }
  rm -f "$dir"/deb/*.deb
  (cd "$dir/deb" && apt-get "${opts[@]}" download -qq "$pkg" >&2)
  rm -rf "$dir/root"
  mkdir -p "$dir/root"
  dpkg-deb -x "$dir"/deb/*.deb "$dir/root"
  # Debian's modules.dep comes from the package's postinst; the guest's modprobe needs it.
  local kver
  kver="$(ls "$(modules_dir "$dir/root")")"
  depmod -b "$(modules_base "$dir/root")" "$kver"
  echo "$pkg" >"$dir/root/.package"
  touch "$dir/root/.done"
  echo "$dir/root"
}

# The base depmod wants (-b) and the lib/modules directory of an unpacked kernel package
# (trixie's are under usr/lib/modules).
modules_base() { if [ -d "$1/usr/lib/modules" ]; then echo "$1/usr"; else echo "$1"; fi; }
modules_dir() { echo "$(modules_base "$1")/lib/modules"; }

# A copy of the unpacked kernel `root` (hard links) without the modules matching `pattern`
# (a find -name pattern, several separated by spaces), its modules.dep made anew.
without_modules() { # root, target, patterns...
  local root="$1" target="$2"
  shift 2
  if [ -e "$target/.done" ]; then
    echo "$target"
    return
  fi
  rm -rf "$target"
  cp -al "$root" "$target"
  rm -f "$target/.done"
  local p
  for p in "$@"; do
    find "$(modules_dir "$target")" -name "$p" -print -delete >&2
  done
  local kver
  kver="$(ls "$(modules_dir "$target")")"
  # The copy's index files are links to the original's: depmod must write copies of its own.
  local f
  for f in "$(modules_dir "$target")/$kver"/modules.*; do
    cp -p "$f" "$f.copy" && mv "$f.copy" "$f"
  done
  depmod -b "$(modules_base "$target")" "$kver"
  touch "$target/.done"
  echo "$target"
}

kernel_root() { # boot
  case "$1" in
    5.10) fetch_kernel bullseye ;;
    6.1) fetch_kernel bookworm ;;
    6.12) fetch_kernel trixie ;;
    6.12-nonft) without_modules "$(fetch_kernel trixie)" "$cache/trixie/root-nonft" 'nf_tables.ko*' ;;
    6.12-nofib) without_modules "$(fetch_kernel trixie)" "$cache/trixie/root-nofib" 'nft_fib*.ko*' ;;
  esac
}

if [ -n "$fetch_only" ]; then
  for boot in "${boots[@]}"; do
    echo "$boot: $(kernel_root "$boot")"
  done
  exit 0
fi

# The binaries the guests run: the plugins (debug, as the tests use them; release for the
# demo), and every test binary, listed with its suite name for the guest.
echo "==> building the plugins and the test binaries"
cargo build "${locked[@]}" --workspace --bins --examples --quiet
build_release
[ -n "$out" ] || out="$cache/results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
manifest="$out/tests.manifest"
cargo test "${locked[@]}" --workspace --no-run --quiet --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    package = m["package_id"].split("#")[0].rstrip("/").rsplit("/", 1)[-1]
    kind = t["kind"][0]
    name = "lib" if kind == "lib" else t["name"] if kind == "test" else kind + "-" + t["name"]
    print(package + ":" + name, m["executable"])
' >"$manifest"
echo "==> results in $out"

run_boot() { # boot
  local boot="$1" root kimg
  root="$(kernel_root "$boot")"
  kimg="$(ls "$root"/boot/vmlinuz-*)"
  mkdir -p "$out/$boot"
  cp "$root/.package" "$out/$boot/package"
  # The guest sees the boot's directory only (virtme-ng hides /var/cache under a tmpfs).
  cp "$manifest" "$out/$boot/tests.manifest"
  local guest_args=(--out "$out/$boot" --manifest "$out/$boot/tests.manifest"
    --release "$repo/$release_dir")
  case "$boot" in
    *-nonft) guest_args+=(--lacking nf_tables) ;;
    *-nofib) guest_args+=(--lacking nft_fib) ;;
    *) [ -z "$suites" ] || guest_args+=(--suites "$suites") ;;
  esac
  local vng_args=(
    --run "$kimg" --cpus "$cpus" --memory "$memory" --disable-monitor
    # The root is shared read-only, with writable overlays (lost at the end) over /etc, /var,
    # /tmp and the like (virtme-ng puts a tmpfs over /var/cache: the kernel's files are shared
    # again); the checkout gets an overlay too. The boot's result directory is written.
    --overlay-rwdir "$repo"
    --rodir "$root"
    --rwdir "$out/$boot"
    --cwd "$repo"
    # The console (the kernel's messages, with their times, and the guest script's lines).
    --verbose
    --exec "$repo/scripts/kernels-guest.sh ${guest_args[*]}"
  )
  [ "$accel" = kvm ] || vng_args+=(--disable-kvm)
  echo "==> booting $boot ($(cat "$root/.package"), $accel, $cpus vCPUs, $memory) at $(date -u +%H:%M:%S)"
  local start end rc=0
  start=$(date +%s)
  timeout --kill-after=30 "$((timeout_min * 60))" "$venv/bin/vng" "${vng_args[@]}" \
    </dev/null >"$out/$boot.log" 2>&1 || rc=$?
  end=$(date +%s)
  echo "$((end - start))" >"$out/$boot/wall"
  echo "$rc" >"$out/$boot/vng-rc"
  echo "    $boot: $((end - start)) s, vng exit $rc"
}

for boot in "${boots[@]}"; do
  run_boot "$boot"
done

python3 "$repo/scripts/kernels-table.py" "$out" "${boots[@]}" >"$out/table.md"
cat "$out/table.md"
if [ -n "$readme" ]; then
  python3 "$repo/scripts/kernels-table.py" --readme "$repo/README.md" "$out" "${boots[@]}"
  echo "==> README.md: the kernel table updated"
fi
