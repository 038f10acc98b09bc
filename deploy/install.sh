#!/bin/sh
# Copies the plugins of this image into a node's CNI plugin directory (the one argument,
# default /host/opt/cni/bin), replacing the Go plugins of the same names.
# Each binary must answer VERSION before it goes in, and goes in by rename: a runtime that execs
# a plugin meanwhile gets the old file or the new one, never a partial copy.
set -eu
src="${CNI_META_PLUGINS_SRC:-/opt/cni-meta-plugins/bin}"
dest="${1:-/host/opt/cni/bin}"
mkdir -p "$dest"
for plugin in portmap tuning bandwidth firewall sbr; do
  tmp="$dest/.$plugin.new"
  cp "$src/$plugin" "$tmp"
  chmod 0755 "$tmp"
  if ! echo '{"cniVersion":"1.1.0"}' | CNI_COMMAND=VERSION "$tmp" >/dev/null; then
    rm -f "$tmp"
    echo "install-cni: $plugin does not run on this node; nothing replaced" >&2
    exit 1
  fi
  mv -f "$tmp" "$dest/$plugin"
  echo "install-cni: installed $dest/$plugin"
done
