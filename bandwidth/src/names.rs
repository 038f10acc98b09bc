//! Kernel-visible names and numbers, and the pure functions deriving per-attachment names.

use common::netlink::tc;
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
/// Name prefix of a retired IFB ("tombstone") waiting for the reaper: DEL renames our IFB to
/// this prefix + its interface index, which is unique in the namespace while the link exists, so
/// a tombstone never blocks a new IFB of the same attachment. Distinct from [`IFB_PREFIX`], so
/// nothing that looks IFBs up by name mistakes one for a live device.
pub const TOMBSTONE_PREFIX: &str = "bwdel";
/// First word of a tombstone's alias: `cni-bandwidth-deleted:<unix seconds>:<former alias or
/// name>`.
pub const TOMBSTONE_ALIAS_PREFIX: &str = "cni-bandwidth-deleted";
/// Seconds after which a tombstone counts as left over (its reaper died or never ran): then any
/// ADD, DEL or GC deletes it. A reaper normally finishes within a few tens of milliseconds.
pub const TOMBSTONE_GRACE_SECS: u64 = 10;
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

/// The IFB name the Go reference uses: `bwp` + the first 12 hex digits of
/// SHA-512(network name + container ID). It ignores the interface name, so two attachments of
/// one network in one pod collide; we only look it up (DEL, CHECK) for upgrades.
pub fn reference_ifb_name(network: &str, container_id: &str) -> String {
    hashed(&format!("{network}{container_id}"))
}

/// Our IFB name: `bwp` + 12 hex digits of SHA-512(network, container ID and interface name,
/// NUL-separated), unique per attachment.
pub fn ifb_name(owner: &Owner) -> String {
    hashed(&format!(
        "{}\0{}\0{}",
        owner.network, owner.container_id, owner.ifname
    ))
}

/// The attachment an IFB belongs to, recorded in its alias for GC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The network name.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl Owner {
    /// The alias: `cni-bandwidth:<network>:<container ID>:<ifname>`. None of the three may
    /// contain `:` (the skel validates network names, container IDs and interface names), so
    /// the alias parses back unambiguously.
    pub fn alias(&self) -> String {
        format!(
            "{ALIAS_PREFIX}:{}:{}:{}",
            self.network, self.container_id, self.ifname
        )
    }

    /// Parses an alias written by [`Owner::alias`]; `None` for anything else.
    pub fn parse_alias(alias: &str) -> Option<Owner> {
        let mut parts = alias.split(':');
        if parts.next()? != ALIAS_PREFIX {
            return None;
        }
        let owner = Owner {
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
}

/// Longest alias the kernel keeps (`IFALIASZ - 1`).
const MAX_ALIAS: usize = 255;

/// The name a retired IFB with interface index `index` gets (at most 5 + 10 = 15 bytes).
pub fn tombstone_name(index: u32) -> String {
    format!("{TOMBSTONE_PREFIX}{index}")
}

/// The alias of a tombstone retired at `retired_at` (Unix seconds), keeping what the live IFB
/// was (`was`: its owner alias, or its name when it had none, as the Go plugin's) for whoever
/// inspects the node. Cut to the kernel's 255 bytes at a character boundary.
pub fn tombstone_alias(retired_at: u64, was: &str) -> String {
    let mut alias = format!("{TOMBSTONE_ALIAS_PREFIX}:{retired_at}:{was}");
    let mut end = alias.len().min(MAX_ALIAS);
    while !alias.is_char_boundary(end) {
        end -= 1;
    }
    alias.truncate(end);
    alias
}

/// A retired IFB, as recognised by its name and alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    /// When it was retired (Unix seconds), if the alias says.
    pub retired_at: Option<u64>,
}

impl Tombstone {
    /// Recognises a tombstone: the name is [`TOMBSTONE_PREFIX`] + digits and the alias starts
    /// with [`TOMBSTONE_ALIAS_PREFIX`]. Both are required, so a foreign `bwdel…` link is never
    /// taken for one.
    pub fn parse(name: &str, alias: Option<&str>) -> Option<Tombstone> {
        let digits = name.strip_prefix(TOMBSTONE_PREFIX)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut fields = alias?.split(':');
        if fields.next()? != TOMBSTONE_ALIAS_PREFIX {
            return None;
        }
        Some(Tombstone {
            retired_at: fields.next().and_then(|t| t.parse().ok()),
        })
    }

    /// True when the tombstone is left over: older than [`TOMBSTONE_GRACE_SECS`] at `now`,
    /// from the future (the clock went back), or of unknown age.
    pub fn is_stale(&self, now: u64) -> bool {
        self.retired_at
            .is_none_or(|t| now < t || now - t >= TOMBSTONE_GRACE_SECS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(network: &str, id: &str, ifname: &str) -> Owner {
        Owner {
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
    fn ifb_names_are_unique_per_attachment_and_fit_ifnamsiz() {
        let a = ifb_name(&owner("net", "c1", "eth0"));
        let b = ifb_name(&owner("net", "c1", "net1"));
        let c = ifb_name(&owner("net", "c2", "eth0"));
        assert!(a != b && a != c && b != c);
        for name in [&a, &b, &c] {
            assert_eq!(name.len(), 15, "{name}");
            assert!(name.starts_with(IFB_PREFIX));
            assert!(name != "ifb0" && name != "ifb1");
        }
        assert_ne!(a, reference_ifb_name("net", "c1"));
        // Separators keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            ifb_name(&owner("ab", "c", "eth0")),
            ifb_name(&owner("a", "bc", "eth0"))
        );
    }

    #[test]
    fn aliases_round_trip_and_foreign_aliases_are_ignored() {
        let o = owner("k8s-pod-network", "0123abcd", "eth0");
        assert_eq!(o.alias(), "cni-bandwidth:k8s-pod-network:0123abcd:eth0");
        assert_eq!(Owner::parse_alias(&o.alias()), Some(o));
        for foreign in [
            "",
            "cni-bandwidth",
            "cni-bandwidth:a:b",
            "cni-bandwidth:a:b:c:d",
            "cni-bandwidth::b:c",
            "other:a:b:c",
        ] {
            assert_eq!(Owner::parse_alias(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn tombstones_are_recognised_by_name_and_alias_and_age() {
        let name = tombstone_name(4_294_967_295);
        assert_eq!(name, "bwdel4294967295");
        assert!(name.len() <= 15);
        assert!(!name.starts_with(IFB_PREFIX));
        let alias = tombstone_alias(1000, "cni-bandwidth:net:c1:eth0");
        assert_eq!(
            alias,
            "cni-bandwidth-deleted:1000:cni-bandwidth:net:c1:eth0"
        );
        let t = Tombstone::parse(&name, Some(&alias)).unwrap();
        assert_eq!(t.retired_at, Some(1000));
        assert!(!t.is_stale(1000 + TOMBSTONE_GRACE_SECS - 1));
        assert!(t.is_stale(1000 + TOMBSTONE_GRACE_SECS));
        assert!(t.is_stale(999), "a clock that went back");
        let unknown = Tombstone::parse("bwdel7", Some("cni-bandwidth-deleted")).unwrap();
        assert!(unknown.is_stale(0));
        for (n, a) in [
            ("bwdel7", None),
            ("bwdel7", Some("cni-bandwidth:net:c1:eth0")),
            ("bwdel", Some("cni-bandwidth-deleted:1:x")),
            ("bwdelx7", Some("cni-bandwidth-deleted:1:x")),
            ("bwp0123456789ab", Some("cni-bandwidth-deleted:1:x")),
        ] {
            assert_eq!(Tombstone::parse(n, a), None, "{n} {a:?}");
        }
        // Long aliases are cut to the kernel's limit at a character boundary.
        let long = tombstone_alias(1, &"é".repeat(200));
        assert!(long.len() <= 255 && long.len() >= 254, "{}", long.len());
    }
}
