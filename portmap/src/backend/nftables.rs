//! The nftables backend: one long-lived table per family, map elements per attachment.
//!
//! ```text
//! table ip cni_portmap {
//!   map hostip_ports       { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//!   map ports              { type inet_proto . inet_service : ipv4_addr . inet_service }
//!   map gated_hostip_ports { type ipv4_addr . inet_proto . inet_service : verdict }
//!   map gated_ports        { type inet_proto . inet_service : verdict }
//!   set hairpin   { type ipv4_addr . ipv4_addr }
//!   set localhost { type ipv4_addr }
//!   set masq_all  { type ipv4_addr }
//!   chain prerouting  { type nat hook prerouting priority dstnat;  fib daddr type local jump hostports }
//!   chain output      { type nat hook output priority dstnat;      fib daddr type local jump hostports }
//!   chain hostports {
//!     ip daddr . meta l4proto . th dport vmap @gated_hostip_ports
//!     dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports
//!     meta l4proto . th dport vmap @gated_ports
//!     dnat ip to meta l4proto . th dport map @ports
//!   }
//!   chain postrouting { type nat hook postrouting priority srcnat;
//!     ip saddr . ip daddr @hairpin masquerade
//!     ip saddr 127.0.0.1 ip daddr @localhost masquerade
//!     ct status dnat ip daddr @masq_all masquerade
//!   }
//!   chain gate_<hash> { <conditions> tcp dport 8080 dnat ip to 10.0.0.2:80 comment "owner" }
//! }
//! ```
//!
//! The skeleton is created once (under a lock, so two first ADDs do not both add its rules)
//! and never flushed. ADD and DEL look up and change only their own keys.

use std::net::{IpAddr, Ipv4Addr};

use common::nft::{
    Batch, Chain, ChainHook, ChainType, CtStatusFlags, DataType, Family, Nft, NftError, Rule,
    Selector, Set, Table, Value, priority,
};
use ipnet::IpNet;

use crate::config::{Config, IpFamily};
use crate::error::PortmapError;
use crate::names;
use crate::plan::{self, Attachment, NftPlan};

fn nft_err(e: NftError) -> PortmapError {
    PortmapError::Nft(e)
}

/// Our table of `family`.
pub fn table(family: IpFamily) -> Table {
    Table::new(nft_family(family), names::NFT_TABLE)
}

fn nft_family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    }
}

/// The skeleton of one family's table: declared on the first ADD of a boot only.
pub fn skeleton(batch: &mut Batch, family: IpFamily) {
    use DataType::{InetProto, InetService};
    let t = table(family);
    let addr = match family {
        IpFamily::V4 => DataType::Ipv4Addr,
        IpFamily::V6 => DataType::Ipv6Addr,
    };
    batch
        .add_table(&t)
        .add_set(
            &t,
            &Set::map(
                names::MAP_HOSTIP_PORTS,
                &[addr, InetProto, InetService],
                &[addr, InetService],
            ),
        )
        .add_set(
            &t,
            &Set::map(
                names::MAP_PORTS,
                &[InetProto, InetService],
                &[addr, InetService],
            ),
        )
        .add_set(
            &t,
            &Set::verdict_map(names::MAP_HOSTIP_GATED, &[addr, InetProto, InetService]),
        )
        .add_set(
            &t,
            &Set::verdict_map(names::MAP_GATED, &[InetProto, InetService]),
        )
        .add_set(&t, &Set::new(names::SET_HAIRPIN, &[addr, addr]))
        .add_set(&t, &Set::new(names::SET_MASQ_ALL, &[addr]));
    if family == IpFamily::V4 {
        batch.add_set(&t, &Set::new(names::SET_LOCALHOST, &[addr]));
    }
    batch
        .add_chain(&t, &Chain::regular(names::CHAIN_HOSTPORTS))
        .add_chain(
            &t,
            &Chain::base(
                names::CHAIN_PREROUTING,
                ChainType::Nat,
                ChainHook::Prerouting,
                priority::DSTNAT,
            ),
        )
        .add_chain(
            &t,
            &Chain::base(
                names::CHAIN_OUTPUT,
                ChainType::Nat,
                ChainHook::Output,
                priority::DSTNAT,
            ),
        )
        .add_chain(
            &t,
            &Chain::base(
                names::CHAIN_POSTROUTING,
                ChainType::Nat,
                ChainHook::Postrouting,
                priority::SRCNAT,
            ),
        );
    for (chain, rule) in skeleton_rules(family) {
        batch.add_rule(&t, chain, &rule);
    }
}

/// The rules of the skeleton of `family`, chain by chain in order.
fn skeleton_rules(family: IpFamily) -> Vec<(&'static str, Rule)> {
    use Selector::{MetaL4proto, ThDport};
    let (saddr, daddr) = match family {
        IpFamily::V4 => (Selector::IpSaddr, Selector::IpDaddr),
        IpFamily::V6 => (Selector::Ip6Saddr, Selector::Ip6Daddr),
    };
    let v = plan::nfproto(family);
    let mut rules = Vec::new();
    for chain in [names::CHAIN_PREROUTING, names::CHAIN_OUTPUT] {
        rules.push((
            chain,
            Rule::new().fib_daddr_local().jump(names::CHAIN_HOSTPORTS),
        ));
    }
    rules.extend([
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().vmap(&[daddr, MetaL4proto, ThDport], names::MAP_HOSTIP_GATED),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().dnat_map(v, &[daddr, MetaL4proto, ThDport], names::MAP_HOSTIP_PORTS),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().vmap(&[MetaL4proto, ThDport], names::MAP_GATED),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().dnat_map(v, &[MetaL4proto, ThDport], names::MAP_PORTS),
        ),
        (
            names::CHAIN_POSTROUTING,
            Rule::new()
                .in_set(&[saddr, daddr], names::SET_HAIRPIN)
                .masquerade(),
        ),
    ]);
    if family == IpFamily::V4 {
        rules.push((
            names::CHAIN_POSTROUTING,
            Rule::new()
                .saddr(IpAddr::V4(Ipv4Addr::LOCALHOST))
                .in_set(&[daddr], names::SET_LOCALHOST)
                .masquerade(),
        ));
    }
    rules.push((
        names::CHAIN_POSTROUTING,
        Rule::new()
            .ct_status(CtStatusFlags::DNAT)
            .in_set(&[daddr], names::SET_MASQ_ALL)
            .masquerade(),
    ));
    rules
}

/// Whether our table of `family` exists; an error when nf_tables itself is unusable.
///
/// # Errors
/// Any errno other than ENOENT (no nf_tables in the kernel, no permission).
pub fn table_exists(nft: &mut Nft, family: IpFamily) -> Result<bool, NftError> {
    nft.table_exists(&table(family))
}

/// Declares the skeleton of the families that lack it, under our lock so that two first
/// ADDs racing do not both append the shared rules.
fn ensure_skeletons(nft: &mut Nft, families: &[IpFamily]) -> Result<(), PortmapError> {
    let mut missing = Vec::new();
    for f in families {
        if !table_exists(nft, *f).map_err(nft_err)? {
            missing.push(*f);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let _lock = common::lock::FileLock::acquire(
        std::path::Path::new(names::STATE_DIR).join("nft-skeleton.lock"),
        common::lock::DEFAULT_WAIT,
    )?;
    let mut batch = Batch::new();
    for f in missing {
        if !table_exists(nft, f).map_err(nft_err)? {
            skeleton(&mut batch, f);
        }
    }
    nft.apply(&batch).map_err(nft_err)
}

/// Adds the attachment's elements for each container address, in one transaction for both
/// families; refuses host ports owned by another attachment.
///
/// # Errors
/// [`PortmapError::Conflict`] naming the owner; nftables failures. Nothing is changed then.
pub fn add(
    nft: &mut Nft,
    config: &Config,
    att: &Attachment,
    ips: &[IpNet],
) -> Result<(), PortmapError> {
    let owner = att.owner();
    let plans: Vec<(IpFamily, NftPlan)> = ips
        .iter()
        .map(|ip| Ok((IpFamily::of(ip.addr()), plan::nft_plan(config, att, *ip)?)))
        .collect::<Result<_, PortmapError>>()?;
    let families: Vec<IpFamily> = plans
        .iter()
        .filter(|(_, p)| !p.claims.is_empty())
        .map(|(f, _)| *f)
        .collect();
    if families.is_empty() {
        return Ok(());
    }
    ensure_skeletons(nft, &families)?;
    let mut batch = Batch::new();
    for (family, p) in &plans {
        let t = table(*family);
        if let Some((chain, rules)) = &p.gate {
            batch
                .add_chain(&t, &Chain::regular(chain))
                .flush_chain(&t, chain);
            for r in rules {
                batch.add_rule(&t, chain, r);
            }
        }
        for claim in &p.claims {
            for map in [claim.map, claim.twin] {
                let Some(have) = nft.element(&t, map, &claim.element.key).map_err(nft_err)? else {
                    continue;
                };
                let have_owner = have.comment.clone().unwrap_or_default();
                if have_owner != owner {
                    return Err(PortmapError::Conflict {
                        what: claim.what.clone(),
                        owner: if have_owner.is_empty() {
                            format!("an element without owner in {t} {map}")
                        } else {
                            have_owner
                        },
                    });
                }
                if map == claim.map && have.data == claim.element.data {
                    continue;
                }
                // Our own stale element (re-ADD with other data or conditions): replace it.
                batch.delete_elements(&t, map, std::slice::from_ref(&have.key));
            }
            batch.add_elements(&t, claim.map, std::slice::from_ref(&claim.element));
        }
        for (set, element) in &p.masq {
            // A pod address is unique among live pods: take over a stale element so its old
            // owner's DEL (which checks the owner) leaves ours alone.
            if let Some(have) = nft.element(&t, set, &element.key).map_err(nft_err)?
                && have.comment.as_deref() != Some(owner.as_str())
            {
                batch.delete_elements(&t, set, std::slice::from_ref(&have.key));
            }
            batch.add_elements(&t, set, std::slice::from_ref(element));
        }
    }
    nft.apply(&batch).map_err(nft_err)
}

/// Verifies that every rule of the skeleton is in its chain: without them the attachment's
/// elements forward nothing.
fn check_skeleton(nft: &mut Nft, t: &Table, family: IpFamily) -> Result<(), PortmapError> {
    let mut listed: Vec<(&str, Vec<common::nft::ListedRule>)> = Vec::new();
    for (chain, rule) in skeleton_rules(family) {
        if !listed.iter().any(|(c, _)| *c == chain) {
            let rules = nft.rules(t, chain).map_err(|e| {
                if e.is_not_found() {
                    PortmapError::Check(format!("chain {t} {chain} not found"))
                } else {
                    nft_err(e)
                }
            })?;
            listed.push((chain, rules));
        }
        let have = listed
            .iter()
            .find(|(c, _)| *c == chain)
            .map(|(_, r)| r.as_slice())
            .unwrap_or_default();
        if !have.iter().any(|r| r.is(&rule, t.family)) {
            return Err(PortmapError::Check(format!(
                "rule {t} {chain} {} not found",
                rule.to_nft()
            )));
        }
    }
    Ok(())
}

/// Verifies exactly the attachment's elements and gate chain, and the skeleton they need.
///
/// # Errors
/// [`PortmapError::Check`] naming the first missing or different object.
pub fn check(
    nft: &mut Nft,
    config: &Config,
    att: &Attachment,
    ips: &[IpNet],
) -> Result<(), PortmapError> {
    let owner = att.owner();
    for ip in ips {
        let family = IpFamily::of(ip.addr());
        let p = plan::nft_plan(config, att, *ip)?;
        if p.claims.is_empty() {
            continue;
        }
        let t = table(family);
        if !table_exists(nft, family).map_err(nft_err)? {
            return Err(PortmapError::Check(format!("table {t} not found")));
        }
        check_skeleton(nft, &t, family)?;
        for claim in &p.claims {
            let have = nft
                .element(&t, claim.map, &claim.element.key)
                .map_err(nft_err)?;
            match have {
                Some(e) if e == claim.element => {}
                Some(e) => {
                    return Err(PortmapError::Check(format!(
                        "host port {} in {t} {} is {:?} owned by {:?}, expected {:?} owned by {owner:?}",
                        claim.what, claim.map, e.data, e.comment, claim.element.data
                    )));
                }
                None => {
                    return Err(PortmapError::Check(format!(
                        "host port {} not found in {t} {}",
                        claim.what, claim.map
                    )));
                }
            }
        }
        for (set, element) in &p.masq {
            let have = nft.element(&t, set, &element.key).map_err(nft_err)?;
            if have.as_ref().and_then(|e| e.comment.as_deref()) != Some(owner.as_str()) {
                return Err(PortmapError::Check(format!(
                    "masquerade element for {} not found in {t} {set}",
                    ip.addr()
                )));
            }
        }
        if let Some((chain, rules)) = &p.gate {
            let have = nft.rules(&t, chain).map_err(|e| {
                if e.is_not_found() {
                    PortmapError::Check(format!("chain {t} {chain} not found"))
                } else {
                    nft_err(e)
                }
            })?;
            let family_code = t.family;
            if have.len() != rules.len()
                || !have.iter().zip(rules).all(|(h, r)| h.is(r, family_code))
            {
                return Err(PortmapError::Check(format!(
                    "rules of chain {t} {chain} differ from the configured conditions"
                )));
            }
        }
    }
    Ok(())
}

/// Removes the attachment's elements (only those whose comment is its owner) and gate chain,
/// knowing its plan (from the state file).
///
/// # Errors
/// nftables failures other than "not found".
pub fn del_planned(
    nft: &mut Nft,
    config: &Config,
    att: &Attachment,
    ips: &[IpNet],
) -> Result<(), PortmapError> {
    let owner = att.owner();
    let mut batch = Batch::new();
    for ip in ips {
        let family = IpFamily::of(ip.addr());
        let p = plan::nft_plan(config, att, *ip)?;
        if p.claims.is_empty() {
            continue;
        }
        let t = table(family);
        let objects = p
            .claims
            .iter()
            .map(|c| (c.map, &c.element))
            .chain(p.masq.iter().map(|(s, e)| (*s, e)));
        for (set, element) in objects {
            match nft.element(&t, set, &element.key) {
                Ok(Some(have)) if have.comment.as_deref() == Some(owner.as_str()) => {
                    batch.delete_elements(&t, set, std::slice::from_ref(&have.key));
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(nft_err(e)),
            }
        }
        if let Some((chain, _)) = &p.gate
            && nft.chain_exists(&t, chain).map_err(nft_err)?
        {
            batch.flush_chain(&t, chain).delete_chain(&t, chain);
        }
    }
    nft.apply(&batch).map_err(nft_err)
}

/// Every map and set of our tables, for the listing paths (DEL without state, GC).
const ALL_SETS: [&str; 7] = [
    names::MAP_HOSTIP_PORTS,
    names::MAP_PORTS,
    names::MAP_HOSTIP_GATED,
    names::MAP_GATED,
    names::SET_HAIRPIN,
    names::SET_LOCALHOST,
    names::SET_MASQ_ALL,
];

/// Removes every element (and gate chain) whose owner `doomed` accepts, by listing our tables:
/// the rare path of a DEL without state, and GC.
///
/// # Errors
/// nftables failures other than "not found".
pub fn del_listed(nft: &mut Nft, doomed: &dyn Fn(&str) -> bool) -> Result<usize, PortmapError> {
    let mut batch = Batch::new();
    let mut chains = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let t = table(family);
        if !table_exists(nft, family).map_err(nft_err)? {
            continue;
        }
        for set in ALL_SETS {
            let elements = match nft.elements(&t, set) {
                Ok(e) => e,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(nft_err(e)),
            };
            let keys: Vec<Vec<Value>> = elements
                .iter()
                .filter(|e| e.comment.as_deref().is_some_and(doomed))
                .map(|e| {
                    if let Some(common::nft::ElementData::Verdict(common::nft::Verdict::Goto(c))) =
                        &e.data
                        && !chains.contains(&(family, c.clone()))
                    {
                        chains.push((family, c.clone()));
                    }
                    e.key.clone()
                })
                .collect();
            if !keys.is_empty() {
                batch.delete_elements(&t, set, &keys);
            }
        }
    }
    for (family, chain) in &chains {
        batch
            .flush_chain(&table(*family), chain)
            .delete_chain(&table(*family), chain);
    }
    let n = batch.len();
    nft.apply(&batch).map_err(nft_err)?;
    Ok(n)
}

/// Removes the Go plugin's nftables rules of this container (comment == container ID) from
/// `cni_hostport`, in both families, when that table exists.
///
/// # Errors
/// nftables failures other than "not found".
pub fn del_go_rules(nft: &mut Nft, container_id: &str) -> Result<(), PortmapError> {
    let mut batch = Batch::new();
    for family in [Family::Ip, Family::Ip6] {
        let t = Table::new(family, names::GO_NFT_TABLE);
        if !nft.table_exists(&t).map_err(nft_err)? {
            continue;
        }
        for chain in names::GO_NFT_CHAINS {
            let rules = match nft.rules(&t, chain) {
                Ok(r) => r,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(nft_err(e)),
            };
            for r in rules
                .iter()
                .filter(|r| r.comment.as_deref() == Some(container_id))
            {
                batch.delete_rule(&t, chain, r.handle);
            }
        }
    }
    nft.apply(&batch).map_err(nft_err)
}
