//! Every kernel-visible name (chains, comments, tables, paths, D-Bus names) in one place, and
//! the pure functions deriving per-attachment names.

use cni::Attachment;
use std::fmt::Write as _;
use std::time::Duration;

/// The iptables table everything lives in.
pub const FILTER_TABLE: &str = "filter";
/// The built-in chain our jumps are inserted into.
pub const FORWARD_CHAIN: &str = "FORWARD";
/// The reference's chain of per-container accepts.
pub const CNI_FORWARD_CHAIN: &str = "CNI-FORWARD";
/// The reference's default admin chain.
pub const DEFAULT_ADMIN_CHAIN: &str = "CNI-ADMIN";
/// Isolation stage 1 (traffic leaving an isolated bridge).
pub const STAGE1_CHAIN: &str = "CNI-ISOLATION-STAGE-1";
/// Isolation stage 2 (traffic entering an isolated bridge).
pub const STAGE2_CHAIN: &str = "CNI-ISOLATION-STAGE-2";
/// iptables' chain name limit (`XT_EXTENSION_MAXNAMELEN` - 1).
pub const IPTABLES_CHAIN_MAX: usize = 28;

/// Comment of the `FORWARD` → `CNI-FORWARD` jump.
pub const FORWARD_JUMP_COMMENT: &str = "CNI firewall plugin rules";
/// Comment of the `CNI-FORWARD` → admin jump.
pub const ADMIN_JUMP_COMMENT: &str = "CNI firewall plugin admin overrides";

/// The comment of the isolation rules of `policy` (`same-bridge` or `isolated`).
#[must_use]
pub fn isolation_comment(policy: &str) -> String {
    format!("CNI firewall plugin rules (ingressPolicy: {policy})")
}

/// The comment of the isolation rules shared by both policies (the `RETURN`s and stage 2's
/// `DROP`): the reference wrote `same-bridge` before `isolated` existed and kept it.
#[must_use]
pub fn isolation_default_comment() -> String {
    isolation_comment("same-bridge")
}

/// Our nftables table (family `inet`).
pub const NFT_TABLE: &str = "cni_firewall";
/// Base chain on the forward hook, `policy accept`.
pub const NFT_FORWARD_CHAIN: &str = "forward";
/// The operator's chain, jumped to first.
pub const NFT_ADMIN_CHAIN: &str = "admin";
/// Isolation stage 1: traffic leaving a bridge with an ingress policy.
pub const NFT_ISOLATION_CHAIN: &str = "isolation";
/// Isolation stage 2: traffic entering a bridge with an ingress policy.
pub const NFT_ISOLATION_OUT_CHAIN: &str = "isolation-out";
/// The shared accepts of the container addresses in [`NFT_SET_V4`] and [`NFT_SET_V6`].
pub const NFT_ATTACHMENTS_CHAIN: &str = "attachments";
/// The IPv4 addresses of the attachments (`type ipv4_addr`), each with its owner comment.
pub const NFT_SET_V4: &str = "containers4";
/// The IPv6 addresses of the attachments (`type ipv6_addr`), each with its owner comment.
pub const NFT_SET_V6: &str = "containers6";
/// Priority of our forward base chain: with iptables' `filter` (0).
pub const NFT_FORWARD_PRIORITY: i32 = 0;

/// Where the lock and the per-attachment state live: tmpfs, so they vanish with the rules at
/// reboot. One subdirectory per network namespace inode (the plugin's host namespace).
pub const RUN_DIR: &str = "/run/cni-firewall";
/// How long a call waits for another call's read-modify-write of the rules.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The firewalld bus name.
pub const FIREWALLD_NAME: &str = "org.fedoraproject.FirewallD1";
/// The firewalld object.
pub const FIREWALLD_PATH: &str = "/org/fedoraproject/FirewallD1";
/// The firewalld zone interface.
pub const FIREWALLD_ZONE_IFACE: &str = "org.fedoraproject.FirewallD1.zone";
/// The reference's default zone.
pub const DEFAULT_ZONE: &str = "trusted";
/// firewalld's answer to adding a source a zone already has.
pub const ZONE_ALREADY_SET: &str = "ZONE_ALREADY_SET";

/// 64-bit FNV-1a: a stable short digest for owner comments too long for nftables.
fn fnv1a64(data: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The network part of an owner comment: the name, or `#<hash>` when the whole comment would
/// not fit in nftables' 128 bytes.
fn hashed(part: &str) -> String {
    let mut out = String::from("#");
    let _ = write!(out, "{:016x}", fnv1a64(part));
    out
}

/// The owner comment of an attachment: `<network>/<containerID>/<ifname>`. Network names and
/// container IDs cannot contain `/` (skel validates both), nor can interface names. When it
/// exceeds nftables' comment limit the network becomes `#<fnv64>`, then the container ID and
/// ifname become one `#<fnv64>` as well; GC and DEL compare whole comments, so they still match.
#[must_use]
pub fn owner_comment(owner: &Attachment) -> String {
    let (network, container_id, ifname) = (&owner.network, &owner.container_id, &owner.ifname);
    let plain = format!("{network}/{container_id}/{ifname}");
    if plain.len() <= netfilter::nft::COMMENT_MAX {
        return plain;
    }
    let net = hashed(network);
    let short = format!("{net}/{container_id}/{ifname}");
    if short.len() <= netfilter::nft::COMMENT_MAX {
        return short;
    }
    format!("{net}/{}", hashed(&format!("{container_id}/{ifname}")))
}

/// Whether an owner comment belongs to `network` (in either spelling).
#[must_use]
pub fn owned_by_network(comment: &str, network: &str) -> bool {
    comment
        .split_once('/')
        .is_some_and(|(net, _)| net == network || net == hashed(network))
}

/// The state file of an attachment (IPs it was given), for DEL without prevResult and GC:
/// `<network>:<containerID>:<ifname>`, which no two attachments share
/// ([`host::store::attachment_name`]).
#[must_use]
pub fn state_name(owner: &Attachment) -> String {
    host::store::attachment_name(&owner.network, &owner.container_id, &owner.ifname)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_comments_are_plain_when_short_and_hashed_to_fit_when_long() {
        assert_eq!(
            owner_comment(&Attachment::new("net", "ctr1", "eth0")),
            "net/ctr1/eth0"
        );
        let long_net = "n".repeat(100);
        let cid = "c".repeat(64);
        let c = owner_comment(&Attachment::new(&long_net, &cid, "eth0"));
        assert!(c.len() <= 128, "{c}");
        assert!(
            c.starts_with('#') && c.ends_with(&format!("/{cid}/eth0")),
            "{c}"
        );
        assert!(owned_by_network(&c, &long_net));
        assert!(!owned_by_network(&c, "net"));
        let c = owner_comment(&Attachment::new(&long_net, "c".repeat(200), "eth0"));
        assert!(c.len() <= 128 && owned_by_network(&c, &long_net), "{c}");
        assert_ne!(
            c,
            owner_comment(&Attachment::new(&long_net, "c".repeat(200), "eth1"))
        );
        assert!(owned_by_network("net/ctr1/eth0", "net"));
        assert!(!owned_by_network("network/ctr1/eth0", "net"));
    }
}
