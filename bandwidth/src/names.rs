//! Kernel-visible names and numbers, and the pure functions deriving per-attachment names.

use cni::Attachment;
use netlink::tc;
use sha2::{Digest, Sha512};

/// Prefix of every IFB device this plugin (or the Go reference) creates. Tools that sweep
/// leaked `bwp*` devices after the Go plugin (Calico's upgrade path does) find ours too.
pub const IFB_PREFIX: &str = "bwp";
/// Hex digits of the hash after [`IFB_PREFIX`]: 3 + 12 = 15 bytes, the `IFNAMSIZ` limit.
const HASH_DIGITS: usize = 12;
/// Handle of the root `tbf` qdisc, `1:` (as the reference).
pub const TBF_HANDLE: u32 = tc::handle(1, 0);
/// Priority (`pref`) of the redirect filter on the `ingress` qdisc (as the reference).
pub const FILTER_PRIORITY: u16 = 1;
/// `classid` (`flowid`) of the redirect filter, `1:1` (as the reference).
pub const FILTER_CLASSID: u32 = tc::handle(1, 1);
/// First word of the alias recording an IFB's owner.
pub const ALIAS_PREFIX: &str = "cni-bandwidth";
/// Name of the IFB device STATUS creates in a throwaway namespace.
pub const STATUS_IFB: &str = "bwpstatus0";
/// TBF latency the reference hard-codes, in milliseconds.
pub const DEFAULT_LATENCY_MS: u64 = 25;
/// Ethernet header bytes a frame adds to the MTU: TBF counts whole frames.
pub const ETHERNET_HEADER: u32 = 14;

fn hashed(input: &str) -> String {
    let digest = Sha512::digest(input.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{IFB_PREFIX}{}", &hex[..HASH_DIGITS])
}

/// The IFB name the Go reference uses, and ours: `bwp` + the first 12 hex digits of
/// SHA-512(network name + container ID). It ignores the interface name, so two attachments of
/// one network in one pod would share it; the second one takes [`fallback_ifb_name`].
pub fn reference_ifb_name(network: &str, container_id: &str) -> String {
    hashed(&format!("{network}{container_id}"))
}

/// The IFB name of an attachment whose [`reference_ifb_name`] is held by another one (the
/// same network and container, another interface): `bwp` + 12 hex digits of SHA-512(network,
/// container ID and interface name, NUL-separated), unique per attachment.
pub fn fallback_ifb_name(owner: &Attachment) -> String {
    hashed(&format!(
        "{}\0{}\0{}",
        owner.network, owner.container_id, owner.ifname
    ))
}

/// The names this attachment's IFB may have, in the order they are given out: the
/// reference's, then the fallback.
pub fn ifb_names(owner: &Attachment) -> [String; 2] {
    [
        reference_ifb_name(&owner.network, &owner.container_id),
        fallback_ifb_name(owner),
    ]
}

/// The alias: `cni-bandwidth:<network>:<container ID>:<ifname>`. None of the three may
/// contain `:` (the skel validates network names, container IDs and interface names), so
/// the alias parses back unambiguously.
pub fn alias(owner: &Attachment) -> String {
    format!(
        "{ALIAS_PREFIX}:{}:{}:{}",
        owner.network, owner.container_id, owner.ifname
    )
}

/// Parses an alias written by [`alias`]; `None` for anything else.
pub fn parse_alias(alias: &str) -> Option<Attachment> {
    let mut parts = alias.split(':');
    if parts.next()? != ALIAS_PREFIX {
        return None;
    }
    let owner = Attachment {
        network: parts.next()?.to_string(),
        container_id: parts.next()?.to_string(),
        ifname: parts.next()?.to_string(),
    };
    (parts.next().is_none()
        && !owner.network.is_empty()
        && !owner.container_id.is_empty()
        && !owner.ifname.is_empty())
    .then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(network: &str, id: &str, ifname: &str) -> Attachment {
        Attachment {
            network: network.into(),
            container_id: id.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn reference_ifb_name_matches_the_go_test_vector() {
        assert_eq!(
            reference_ifb_name("cni-plugin-bandwidth-test", "dummy"),
            "bwpa8eda89404b7"
        );
    }

    #[test]
    fn fallback_names_are_unique_per_attachment_and_fit_ifnamsiz() {
        let a = fallback_ifb_name(&owner("net", "c1", "eth0"));
        let b = fallback_ifb_name(&owner("net", "c1", "net1"));
        let c = fallback_ifb_name(&owner("net", "c2", "eth0"));
        assert!(a != b && a != c && b != c);
        for name in [&a, &b, &c] {
            assert_eq!(name.len(), 15, "{name}");
            assert!(name.starts_with(IFB_PREFIX));
        }
        // Separators keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            fallback_ifb_name(&owner("ab", "c", "eth0")),
            fallback_ifb_name(&owner("a", "bc", "eth0"))
        );
        // The reference name comes first; it ignores the interface.
        let names = ifb_names(&owner("net", "c1", "eth0"));
        assert_eq!(names, [reference_ifb_name("net", "c1"), a]);
        assert_eq!(names[0], ifb_names(&owner("net", "c1", "net1"))[0]);
        assert_ne!(names[0], names[1]);
    }

    #[test]
    fn aliases_round_trip_and_foreign_aliases_are_ignored() {
        let o = owner("k8s-pod-network", "0123abcd", "eth0");
        assert_eq!(alias(&o), "cni-bandwidth:k8s-pod-network:0123abcd:eth0");
        assert_eq!(parse_alias(&alias(&o)), Some(o));
        for foreign in [
            "",
            "cni-bandwidth",
            "cni-bandwidth:a:b",
            "cni-bandwidth:a:b:c:d",
            "cni-bandwidth::b:c",
            "other:a:b:c",
        ] {
            assert_eq!(parse_alias(foreign), None, "{foreign:?}");
        }
    }
}
