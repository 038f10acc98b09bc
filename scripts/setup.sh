#!/usr/bin/env bash
# Installs what the demo and the tests need, when it is missing. Sourced by demo.sh and test.sh.
# Needs root (network namespaces, netlink, apt-get).
set -euo pipefail

# The demo and the tests create network namespaces and program them: they need root. A root
# shell (a bare Debian has no sudo) runs on; anyone else is asked for sudo, keeping their PATH
# (rustup installs cargo under ~/.cargo/bin).
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    echo "==> not root: running $0 again with sudo" >&2
    exec sudo env "PATH=$PATH" ${CARGO_HOME:+"CARGO_HOME=$CARGO_HOME"} ${RUSTUP_HOME:+"RUSTUP_HOME=$RUSTUP_HOME"} \
      bash "$0" "$@"
  fi
  echo "error: run this as root (there is no sudo here): the demo and the tests create network namespaces and program them" >&2
  exit 1
fi

# Debian package -> a file it installs, so we only touch apt when something is missing.
declare -A want=(
  [iproute2]=/usr/sbin/ip
  [iptables]=/usr/sbin/iptables
  [nftables]=/usr/sbin/nft
  [iperf3]=/usr/bin/iperf3
  [curl]=/usr/bin/curl
  [util-linux]=/usr/bin/nsenter
  [make]=/usr/bin/make
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [firewalld]=/usr/sbin/firewalld
  [dbus]=/usr/bin/dbus-daemon
  # podman end to end (tests/tests/podman.rs): podman 4.3's CNI backend, runc, and busybox as
  # the container image, imported from a tarball so nothing is pulled.
  [podman]=/usr/bin/podman
  [runc]=/usr/sbin/runc
  [busybox-static]=/bin/busybox
  # The bench's plot of the scale series (BENCHMARKS.md).
  [gnuplot-nox]=/usr/bin/gnuplot-nox
  # The userland matrix (tests/tests/userlands.rs): Debian 11, 12 and 13 root filesystems,
  # made once into /var/cache/cni-rs/userlands.
  [debootstrap]=/usr/sbin/debootstrap
  # systemd-analyze checks the repair units of deploy/systemd (tests/tests/packaging.rs); the
  # package is not made the machine's init by being installed.
  [systemd]=/usr/bin/systemd-analyze
)
missing=()
for pkg in "${!want[@]}"; do
  [ -e "${want[$pkg]}" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The firewalld test runs its own firewalld in a throwaway namespace. The package must not
  # start (or enable) the machine's own: services stay down while a policy-rc.d says so.
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
  if [[ " ${missing[*]} " == *" firewalld "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable firewalld >/dev/null 2>&1 || true
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  for dir in "$HOME/.cargo/bin" /root/.cargo/bin /usr/local/cargo/bin; do
    [ -x "$dir/cargo" ] && export PATH="$dir:$PATH" && break
  done
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found: install Rust 1.89 or newer (https://rustup.rs), then rerun" >&2
  exit 1
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
locked=()
if [ -n "${CI:-}" ]; then
  locked=(--locked)
fi

# Static release binaries of the whole workspace (the demo and the bench; the tests use the debug
# build): the Makefile says how they are built and why, and for which target: musl when its
# standard library is there. Adding it needs rustup's download server; without it the build stays
# on glibc, a little slower per call.
build_release() {
  local musl
  musl="$(rustc -vV | sed -n 's/^host: //p' | sed 's/-gnu$/-musl/')"
  if command -v rustup >/dev/null 2>&1 \
    && ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
    echo "==> adding the Rust target $musl"
    timeout 120 rustup target add "$musl" >/dev/null 2>&1 \
      || echo "warning: could not add the Rust target $musl; the release binaries use glibc" >&2
  fi
  release_dir="$(make -s release-dir)"
  echo "==> building static release binaries into $release_dir"
  make -s release CARGO_FLAGS="${locked[*]} --quiet"
}
