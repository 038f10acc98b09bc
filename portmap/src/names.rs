//! Every kernel-visible and on-disk name of the plugin, and the pure functions deriving
//! per-attachment names (the reference's SHA-512 chain names, owner comments).

use sha2::{Digest, Sha512};

/// Our nftables table, one per family (`ip cni_portmap`, `ip6 cni_portmap`).
pub const NFT_TABLE: &str = "cni_portmap";
/// `(proto . port) → (addr . port)`: mappings on every local address.
pub const MAP_PORTS: &str = "ports";
/// `(hostIP . proto . port) → (addr . port)`: mappings on one host address.
pub const MAP_HOSTIP_PORTS: &str = "hostip_ports";
/// `(proto . port) : goto <chain>`: conditioned mappings on every local address.
pub const MAP_GATED: &str = "gated_ports";
/// `(hostIP . proto . port) : goto <chain>`: conditioned mappings on one host address.
pub const MAP_HOSTIP_GATED: &str = "gated_hostip_ports";
/// `addr . addr`: container addresses whose hairpin traffic is masqueraded.
pub const SET_HAIRPIN: &str = "hairpin";
/// `ipv4_addr`: containers reachable through `127.0.0.1:hostPort` (masqueraded).
pub const SET_LOCALHOST: &str = "localhost";
/// `addr`: containers whose mapped traffic is masqueraded whatever its source (`masqAll`).
pub const SET_MASQ_ALL: &str = "masq_all";
/// Regular chain holding the map lookups.
pub const CHAIN_HOSTPORTS: &str = "hostports";
/// Base chain on `prerouting` (`dstnat`).
pub const CHAIN_PREROUTING: &str = "prerouting";
/// Base chain on `output` (`dstnat`).
pub const CHAIN_OUTPUT: &str = "output";
/// Base chain on `postrouting` (`srcnat`).
pub const CHAIN_POSTROUTING: &str = "postrouting";
/// Prefix of the per-attachment chain of a conditioned attachment.
pub const GATED_CHAIN_PREFIX: &str = "gate_";
/// Comment of the table.
pub const TABLE_COMMENT: &str = "CNI portmap plugin (rust)";

/// The Go plugin's nftables table (`ip cni_hostport`, `ip6 cni_hostport`): only cleaned up.
pub const GO_NFT_TABLE: &str = "cni_hostport";
/// The Go plugin's nftables chains that hold per-container rules.
pub const GO_NFT_CHAINS: [&str; 3] = ["hostports", "hostip_hostports", "masquerading"];

/// iptables: the shared DNAT dispatch chain.
pub const IPT_TOPLEVEL_DNAT: &str = "CNI-HOSTPORT-DNAT";
/// iptables: the shared chain marking packets to masquerade.
pub const IPT_SETMARK: &str = "CNI-HOSTPORT-SETMARK";
/// iptables: the shared masquerade chain.
pub const IPT_MASQ: &str = "CNI-HOSTPORT-MASQ";
/// iptables: the legacy shared SNAT chain (only torn down).
pub const IPT_LEGACY_SNAT: &str = "CNI-HOSTPORT-SNAT";
/// iptables: the comment of the SETMARK rule.
pub const IPT_SETMARK_COMMENT: &str = "CNI portfwd masquerade mark";
/// iptables: the comment of the POSTROUTING jump to the MASQ chain.
pub const IPT_MASQ_COMMENT: &str = "CNI portfwd requiring masquerade";
/// iptables: chains are cut to this many characters, as the reference does.
const IPT_CHAIN_MAX: usize = 28;
/// iptables: at most this many ports per `multiport` match (the kernel's limit).
pub const IPT_MULTIPORT_MAX: usize = 15;
/// iptables: comments longer than this are cut to 253 characters plus `...`.
const IPT_COMMENT_MAX: usize = 255;

/// The legacy iptables tables loaded in the reading process's namespace (IPv4).
pub const LEGACY_IPV4_TABLES: &str = "/proc/net/ip_tables_names";
/// The legacy ip6tables tables loaded in the reading process's namespace.
pub const LEGACY_IPV6_TABLES: &str = "/proc/net/ip6_tables_names";
/// The iptables table (and the nf_tables table `iptables-nft` keeps it in) of the reference's
/// layout.
pub const IPT_NAT: &str = "nat";
/// The number of conntrack entries of the reading process's namespace.
pub const CONNTRACK_COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";
/// Where per-attachment state lives; one subdirectory per network namespace.
pub const STATE_DIR: &str = "/run/cni/portmap";
/// Our own lock serialising iptables read-modify-write (never `/run/xtables.lock`).
pub const IPT_LOCK_FILE: &str = "/run/cni/portmap/iptables.lock";

/// The reference's per-attachment chain name, from `prefix` and SHA-512(`name` + `id`),
/// cut to 28 characters.
pub fn hashed_chain(prefix: &str, name: &str, id: &str) -> String {
    let digest = Sha512::digest(format!("{name}{id}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let mut chain = format!("{prefix}{hex}");
    chain.truncate(IPT_CHAIN_MAX);
    chain
}

/// `CNI-DN-<hash>`: the per-attachment DNAT chain.
pub fn dnat_chain(name: &str, id: &str) -> String {
    hashed_chain("CNI-DN-", name, id)
}

/// `CNI-SN-<hash>`: the legacy per-attachment SNAT chain (only torn down).
pub fn legacy_snat_chain(name: &str, id: &str) -> String {
    hashed_chain("CNI-SN-", name, id)
}

/// The comment of the entry rules in `CNI-HOSTPORT-DNAT`, cut as the reference cuts it.
pub fn ipt_entry_comment(name: &str, id: &str) -> String {
    let mut comment = format!("dnat name: \"{name}\" id: \"{id}\"");
    if comment.len() > IPT_COMMENT_MAX {
        let mut cut = IPT_COMMENT_MAX - 2;
        while !comment.is_char_boundary(cut) {
            cut -= 1;
        }
        comment.truncate(cut);
        comment.push_str("...");
    }
    comment
}

/// The owner of an attachment as written in nftables comments: `network/containerID/ifname`.
///
/// nftables comments hold at most 128 bytes. A longer owner keeps its first 95 bytes and ends
/// with `~` and 32 hex digits of SHA-512 of the whole owner, so it stays unique (such an owner
/// cannot be parsed back by GC, which then relies on the state files).
pub fn owner_comment(network: &str, id: &str, ifname: &str) -> String {
    let full = format!("{network}/{id}/{ifname}");
    if full.len() <= netfilter::nft::COMMENT_MAX {
        return full;
    }
    let digest = Sha512::digest(full.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let mut cut = netfilter::nft::COMMENT_MAX - 33;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hex}", &full[..cut])
}

/// The owner comment of every element and rule of `att` ([`owner_comment`]).
pub fn owner(att: &cni::Attachment) -> String {
    owner_comment(&att.network, &att.container_id, &att.ifname)
}

/// Splits an owner comment into (network, containerID, ifname), when it is not a hashed one.
pub fn parse_owner(comment: &str) -> Option<(&str, &str, &str)> {
    let mut parts = comment.splitn(3, '/');
    let (net, id, ifname) = (parts.next()?, parts.next()?, parts.next()?);
    (!ifname.contains('/')).then_some((net, id, ifname))
}

/// The per-attachment chain of a conditioned attachment: `gate_` + 24 hex digits of the owner.
pub fn gated_chain(owner: &str) -> String {
    let digest = Sha512::digest(owner.as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("{GATED_CHAIN_PREFIX}{hex}")
}

/// The prefix of the host-port index's entries.
pub const PORT_INDEX_PREFIX: &str = ".port-";

/// The state file of an attachment: `<network>:<containerID>:<ifname>.json`, a name no other
/// attachment has ([`host::store::attachment_name`]).
pub fn state_file(network: &str, id: &str, ifname: &str) -> String {
    let mut name = host::store::attachment_name(network, id, ifname);
    name.push_str(".json");
    name
}

/// The start of the state files of `network`'s container `id` ([`state_file`]).
pub fn state_file_prefix(network: &str, id: &str) -> String {
    host::store::attachment_prefix(network, Some(id))
}

/// The state file earlier versions named an attachment's, `<network>_<containerID>_<ifname>.json`,
/// still read (a node upgraded with containers running): two attachments can meet at it
/// (network `a_b` with container `c`, network `a` with container `b_c`), so it counts as an
/// attachment's only when the record in it names that attachment.
pub fn legacy_state_file(network: &str, id: &str, ifname: &str) -> String {
    format!("{network}_{id}_{ifname}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG_ID: &str = "2a6c4cb1f2a7d8e1a3f4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6";

    #[test]
    fn dnat_chain_names_match_the_reference_vectors() {
        // Vectors from the reference's portmap tests (same container ID for both networks).
        let id = "icee6giejonei6sohng6ahngee7laquohquee9shiGo7fohferakah3Feiyoolu2pei7ciPhoh7shaoX6vai3vuf0ahfaeng8yohb9ceu0daez5hashee8ooYai5wa3y";
        assert_eq!(
            dnat_chain("testNetName", id),
            "CNI-DN-bfd599665540dd91d5d28"
        );
        assert_eq!(dnat_chain("test", id), "CNI-DN-67e92b96e692a494b6b85");
    }

    #[test]
    fn owner_comment_is_plain_when_it_fits_and_hashed_when_too_long() {
        assert_eq!(owner_comment("net", "ctr", "eth0"), "net/ctr/eth0");
        assert_eq!(
            parse_owner(&owner_comment("net", LONG_ID, "eth0")),
            Some(("net", LONG_ID, "eth0"))
        );
        let long_net = "n".repeat(100);
        let a = owner_comment(&long_net, LONG_ID, "eth0");
        let b = owner_comment(&long_net, LONG_ID, "eth1");
        assert_eq!(a.len(), netfilter::nft::COMMENT_MAX);
        assert_ne!(a, b);
    }

    #[test]
    fn entry_comment_is_cut_to_256_characters_like_the_reference() {
        let long = "x".repeat(300);
        let c = ipt_entry_comment("net", &long);
        assert_eq!(c.len(), 256);
        assert!(c.ends_with("..."));
        assert_eq!(ipt_entry_comment("n", "c"), "dnat name: \"n\" id: \"c\"");
    }

    #[test]
    fn state_files_of_attachments_whose_old_names_met_are_distinct() {
        assert_eq!(state_file("net", "ctr", "eth0"), "net:ctr:eth0.json");
        assert_eq!(
            legacy_state_file("a_b", "c", "eth0"),
            legacy_state_file("a", "b_c", "eth0")
        );
        assert_ne!(
            state_file("a_b", "c", "eth0"),
            state_file("a", "b_c", "eth0")
        );
        assert!(state_file("a", "b", "eth0").starts_with(&state_file_prefix("a", "b")));
        assert!(!state_file("a", "b_c", "eth0").starts_with(&state_file_prefix("a", "b")));
    }

    #[test]
    fn gated_chain_names_are_short_and_distinct_per_owner() {
        let a = gated_chain("net/a/eth0");
        assert_eq!(a.len(), GATED_CHAIN_PREFIX.len() + 24);
        assert_ne!(a, gated_chain("net/b/eth0"));
    }
}
