#!/usr/bin/env bash
# The main job: build the plugins, then run a real chain (a Go main plugin from Debian's
# containernetworking-plugins, then ours) in throwaway network namespaces, with live traffic,
# printing what each plugin did. Leaves nothing behind, also when interrupted (Ctrl-C, a closed
# pipe such as `scripts/demo.sh | head`): the demo removes what it made before it exits.
set -euo pipefail

for arg in "$@"; do
  if [ "$arg" = "--help" ] || [ "$arg" = "-h" ]; then
    echo "usage: scripts/demo.sh"
    echo
    echo "Installs what is missing (needs root), builds the plugins (release, static) and runs"
    echo "the demo binary (tests/src/bin/demo.rs; \`demo --help\` says what it does)."
    exit 0
  fi
done

source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

build_release
exec "./$release_dir/demo" "$@"
