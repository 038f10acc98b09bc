#!/usr/bin/env bash
# Runs every test: formatting and lints, pure unit tests, kernel tests in throwaway network
# namespaces, end-to-end chains with real traffic, and the conformance suite over every plugin.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy"
cargo clippy "${locked[@]}" --workspace --all-targets --quiet -- -D warnings
echo "==> cargo build (plugin binaries for the end-to-end tests, the cni crate's example plugin)"
cargo build "${locked[@]}" --workspace --bins --examples --quiet
echo "==> cargo test"
cargo test "${locked[@]}" --workspace --no-fail-fast "$@"
