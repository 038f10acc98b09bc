#!/bin/bash
# Regenerates the golden netlink bytes in this directory from the `nft` binary.
#
# For every case below it creates a throwaway network namespace (`unshare -n`), loads the case's
# setup ruleset, then runs `nft --debug=netlink,mnl -f -` on the single `add rule` line and keeps
# the NFT_MSG_NEWRULE message (nfgenmsg + attributes, as hex) plus libnftnl's view of it.
# Usage (root): netfilter/testdata/nft/capture.sh
set -euo pipefail
cd "$(dirname "$0")"

ip_setup='table ip t {
  set allowed { type ipv4_addr; }
  set pairs { type ipv4_addr . ipv4_addr; }
  map hostip_ports { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }
  map ports { type inet_proto . inet_service : ipv4_addr . inet_service; }
  map vm { type inet_proto : verdict; }
  chain pre { type nat hook prerouting priority dstnat; policy accept; }
  chain post { type nat hook postrouting priority srcnat; policy accept; }
  chain c { }
  chain c2 { }
}'
ip6_setup='table ip6 t {
  map hostip_ports { type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; }
  map ports { type inet_proto . inet_service : ipv6_addr . inet_service; }
  chain pre { type nat hook prerouting priority dstnat; policy accept; }
  chain post { type nat hook postrouting priority srcnat; policy accept; }
  chain c { }
}'
inet_setup='table inet t {
  chain fw { type filter hook forward priority filter; policy accept; }
  chain admin { }
}'

# name | setup variable | rule
cases='
fib_local_jump|ip_setup|add rule ip t pre fib daddr type local jump c comment "enter"
dnat_map_hostip|ip_setup|add rule ip t c dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports
dnat_map_ports|ip_setup|add rule ip t c dnat ip to meta l4proto . th dport map @ports
dnat_to_addr_port|ip_setup|add rule ip t c ip daddr 192.168.1.1 tcp dport 8080 dnat ip to 10.0.0.2:80
snat_to_addr_port|ip_setup|add rule ip t post ip saddr 10.0.0.0/8 udp dport 53 snat ip to 1.2.3.4:99
masq_pairs|ip_setup|add rule ip t post ip saddr . ip daddr @pairs masquerade
masq_oifname_ct_status|ip_setup|add rule ip t post oifname "eth0" ct status dnat masquerade
ct_state_counter_accept|ip_setup|add rule ip t c ct state established,related counter accept
ct_mark_drop|ip_setup|add rule ip t c ct mark 0x00000010 drop
iifname_mark_mask_return|ip_setup|add rule ip t c iifname "veth0" meta mark & 0x00002000 == 0x00002000 return
saddr_set_goto|ip_setup|add rule ip t c ip saddr @allowed goto c2
l4proto_vmap|ip_setup|add rule ip t c meta l4proto vmap @vm
mark_counter|ip_setup|add rule ip t c meta mark 0x00000001 counter
dnat6_map_hostip|ip6_setup|add rule ip6 t c dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip_ports
dnat6_map_ports|ip6_setup|add rule ip6 t c dnat ip6 to meta l4proto . th dport map @ports
dnat6_to_addr_port|ip6_setup|add rule ip6 t c ip6 daddr fd00::1 tcp dport 8080 dnat ip6 to [fd00::2]:80
masq6_prefix|ip6_setup|add rule ip6 t post ip6 saddr fd00::/64 masquerade
inet_saddr_accept_comment|inet_setup|add rule inet t fw ip saddr 10.88.0.5 accept comment "net/ctr/eth0"
inet_oif_daddr_ct_accept|inet_setup|add rule inet t fw oifname "cni0" ip daddr 10.88.0.0/16 ct state established,related accept
inet_ip6_daddr_jump|inet_setup|add rule inet t fw ip6 daddr fd00::5 jump admin
inet_nfproto_return|inet_setup|add rule inet t fw meta nfproto ipv6 return
prefix_unaligned_accept|ip_setup|add rule ip t c ip saddr 10.16.0.0/12 ip daddr 10.0.16.0/20 accept
inet_prefix6_unaligned_drop|inet_setup|add rule inet t fw ip6 saddr fd00::/60 drop
'

version=$(nft --version)
while IFS='|' read -r name setup rule; do
  [ -n "$name" ] || continue
  out=$(unshare -n bash -c 'nft -f - <<<"$1" && nft --debug=netlink,mnl -f - <<<"$2" 2>&1' _ "${!setup}" "$rule")
  {
    echo "# nft --debug=netlink,mnl -f - <<< '$rule'"
    echo "# ($version, in a fresh netns after loading \$$setup of capture.sh; regenerate with capture.sh)"
    grep '^  \[' <<<"$out" | sed 's/^/# /' || true
    grep '^  userdata' <<<"$out" | sed 's/^/# /' || true
    awk -f mnl2hex.awk <<<"$out" | awk '$1 == "02566" { print $2 }'
  } >"$name.golden"
done <<<"$cases"
