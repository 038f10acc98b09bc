#!/usr/bin/env bash
# The main job: build the plugins, then run a real chain (a Go main plugin from Debian's
# containernetworking-plugins, then ours) in throwaway network namespaces, with live traffic,
# printing what each plugin did. Leaves nothing behind.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

build_release
exec "./$release_dir/demo" "$@"
