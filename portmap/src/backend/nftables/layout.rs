//! The nftables layout rendered from the plan, and what a call changes, computed without
//! touching the kernel (pure).
//!
//! [`nft_plan`] turns a config and a container address into
//! the elements (and, with conditions, the gate chain) of one family's table. [`nft_add`] and
//! [`nft_del`] turn plans and what the kernel holds at their keys ([`Observed`]) into the
//! changes of one transaction ([`NftOp`]), refusing a host port another owner holds.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use netfilter::nft::{Element, ElementData, Rule, Value, Verdict};

#[cfg(test)]
use crate::config::HostIp;
use cni::Attachment;

use crate::config::{Conditions, Config, IpFamily, NftCondition, PortMapping};
use crate::error::PortmapError;
use crate::names;

/// One DNAT element of a map: the claim of a host port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The map holding it.
    pub map: &'static str,
    /// The map that must not hold the same key (the gated twin of a plain map and back).
    pub twin: &'static str,
    /// The element, with its owner comment.
    pub element: Element,
    /// `tcp/8080` or `10.1.1.1 tcp/8080`, for messages.
    pub what: String,
}

/// The nftables objects of one attachment in one family's table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftPlan {
    /// The DNAT claims, in mapping order, without duplicates.
    pub claims: Vec<Claim>,
    /// Elements of the masquerade sets: (set, element).
    pub masq: Vec<(&'static str, Element)>,
    /// With conditions: the gate chain and its rules.
    pub gate: Option<(String, Vec<Rule>)>,
}

fn addr_value(a: IpAddr) -> Value {
    a.into()
}

/// The nftables plan for `family`, whose container address is `ip`.
///
/// # Errors
/// Code 7 when two mappings claim the same host port with different targets.
pub fn nft_plan(config: &Config, att: &Attachment, ip: IpNet) -> Result<NftPlan, PortmapError> {
    let family = IpFamily::of(ip.addr());
    let owner = names::owner(att);
    let conditions = match config.conditions(family) {
        Conditions::Nftables(c) if !c.is_empty() => Some(c.clone()),
        _ => None,
    };
    let gate_name = names::gated_chain(&owner);
    let mut plan = NftPlan::default();
    let mut gate_rules = Vec::new();
    let mut seen: Vec<(Vec<Value>, u16)> = Vec::new();
    let mappings: Vec<&PortMapping> = config
        .mappings
        .iter()
        .filter(|m| m.host_ip.applies_to(family))
        .collect();
    for m in &mappings {
        let host_addr = m.host_ip.addr();
        let mut key = Vec::new();
        if let Some(a) = host_addr {
            key.push(addr_value(a));
        }
        key.push(m.proto.l4().into());
        key.push(Value::Port(m.host_port));
        let what = m.host_port_name();
        let (plain, gated) = if host_addr.is_some() {
            (names::MAP_HOSTIP_PORTS, names::MAP_HOSTIP_GATED)
        } else {
            (names::MAP_PORTS, names::MAP_GATED)
        };
        let (map, twin, element) = if conditions.is_some() {
            let element = Element::new(key.clone())
                .to_verdict(Verdict::Goto(gate_name.clone()))
                .comment(&owner);
            (gated, plain, element)
        } else {
            let element = Element::new(key.clone())
                .to([addr_value(ip.addr()), Value::Port(m.container_port)])
                .comment(&owner);
            (plain, gated, element)
        };
        if let Some((_, port)) = seen.iter().find(|(k, _)| *k == key) {
            // A repeated mapping is harmless; one host port to two targets is not.
            if *port != m.container_port {
                return Err(PortmapError::Config {
                    msg: format!("host port {what} is mapped twice to different container ports"),
                    details: format!(
                        "runtimeConfig.portMappings maps it to {port} and to {}",
                        m.container_port
                    ),
                });
            }
            continue;
        }
        seen.push((key.clone(), m.container_port));
        if let Some(conds) = &conditions {
            let mut rule = Rule::new();
            if let Some(a) = host_addr {
                rule = rule.daddr(a);
            }
            rule = apply_conditions(rule, conds)
                .dport(m.proto.l4(), m.host_port)
                .dnat_to(ip.addr(), Some(m.container_port))
                .comment(&owner);
            gate_rules.push(rule);
        }
        plan.claims.push(Claim {
            map,
            twin,
            element,
            what,
        });
    }
    if plan.claims.is_empty() {
        return Ok(plan);
    }
    if let Some(_conds) = conditions {
        plan.gate = Some((gate_name, gate_rules));
    }
    let addr = addr_value(ip.addr());
    if config.snat {
        plan.masq.push((
            names::SET_HAIRPIN,
            Element::new([addr.clone(), addr.clone()]).comment(&owner),
        ));
        if family == IpFamily::V4 && !config.masq_all {
            plan.masq.push((
                names::SET_LOCALHOST,
                Element::new([addr.clone()]).comment(&owner),
            ));
        }
        if config.masq_all {
            plan.masq
                .push((names::SET_MASQ_ALL, Element::new([addr]).comment(&owner)));
        }
    }
    Ok(plan)
}

fn apply_conditions(mut rule: Rule, conds: &[NftCondition]) -> Rule {
    for c in conds {
        rule = match c {
            NftCondition::Saddr(n) => rule.saddr(*n),
            NftCondition::Daddr(n) => rule.daddr(*n),
            NftCondition::IifName(n) => rule.iifname(n),
            NftCondition::OifName(n) => rule.oifname(n),
            NftCondition::Mark(m) => rule.mark(*m),
        };
    }
    rule
}

/// One change to our nftables tables, in the order a transaction makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftOp {
    /// Remove the element at this key (only ever one the plan saw with its owner's comment):
    /// by expiry where [`removal_expires`] says so, else by deletion.
    DelElement {
        /// The table's family.
        family: IpFamily,
        /// The map or set.
        set: &'static str,
        /// The element as found (its key, and the data an expiry must repeat).
        element: Element,
    },
    /// Flush and delete a gate chain (after the elements that jump to it).
    DelChain {
        /// The table's family.
        family: IpFamily,
        /// The chain.
        chain: String,
    },
    /// Declare a gate chain, empty it and fill it with `rules`.
    PutChain {
        /// The table's family.
        family: IpFamily,
        /// The chain.
        chain: String,
        /// Its rules, in order.
        rules: Vec<Rule>,
    },
    /// Add an element (after the gate chain it jumps to).
    AddElement {
        /// The table's family.
        family: IpFamily,
        /// The map or set.
        set: &'static str,
        /// The element, with its owner comment.
        element: Element,
    },
}

impl NftOp {
    /// Deletions first (so a key can be freed and taken in one transaction, and a chain is
    /// deleted only once nothing jumps to it), then the chains the new elements jump to.
    fn rank(&self) -> u8 {
        match self {
            NftOp::DelElement { .. } => 0,
            NftOp::DelChain { .. } => 1,
            NftOp::PutChain { .. } => 2,
            NftOp::AddElement { .. } => 3,
        }
    }
}

/// What the kernel holds at the keys plans look at: elements found by key, gate chains found
/// by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Elements found: (family, map or set, element with its data and comment).
    pub elements: Vec<(IpFamily, &'static str, Element)>,
    /// Gate chains that exist.
    pub chains: Vec<(IpFamily, String)>,
}

impl Observed {
    /// The element of `set` with `key`, if it was found.
    pub fn element(&self, family: IpFamily, set: &str, key: &[Value]) -> Option<&Element> {
        self.elements
            .iter()
            .find(|(f, s, e)| *f == family && *s == set && e.key == key)
            .map(|(_, _, e)| e)
    }

    /// Whether the gate chain exists.
    pub fn has_chain(&self, family: IpFamily, chain: &str) -> bool {
        self.chains.iter().any(|(f, c)| *f == family && c == chain)
    }
}

/// The keys an ADD or DEL of `plan` looks up: every claim in its map and in the twin map,
/// every masquerade element in its set.
pub fn lookups(plan: &NftPlan) -> Vec<(&'static str, &[Value])> {
    let mut keys = Vec::new();
    for claim in &plan.claims {
        keys.push((claim.map, claim.element.key.as_slice()));
        keys.push((claim.twin, claim.element.key.as_slice()));
    }
    for (set, element) in &plan.masq {
        keys.push((*set, element.key.as_slice()));
    }
    keys
}

/// The other owners holding a key that `plans` claim (in the claim's map or its twin), in
/// the order met: the attachments an ADD conflicts with, unless they are gone.
pub fn foreign_owners(owner: &str, plans: &[(IpFamily, NftPlan)], seen: &Observed) -> Vec<String> {
    let mut owners: Vec<String> = Vec::new();
    for (family, plan) in plans {
        for claim in &plan.claims {
            for map in [claim.map, claim.twin] {
                let held = seen
                    .element(*family, map, &claim.element.key)
                    .and_then(|e| e.comment.as_deref())
                    .filter(|c| !c.is_empty() && *c != owner);
                if let Some(c) = held
                    && !owners.iter().any(|o| o == c)
                {
                    owners.push(c.to_string());
                }
            }
        }
    }
    owners
}

/// The changes of an ADD of `plans` by `owner`: refuses a host port that another owner (or an
/// element without owner) holds in the claim's map or its twin, unless that owner is one of
/// `gone` (owner comment and plans of an attachment whose namespace is gone), whose objects
/// are then removed in the same transaction; replaces the owner's own stale elements (a
/// re-ADD with other data or conditions); takes over masquerade elements of the same pod
/// address (an address is unique among live pods, and the old owner's DEL checks the owner,
/// so it leaves ours alone); adds only what is not there already.
///
/// # Errors
/// [`PortmapError::Conflict`] naming the first host port held by another owner.
pub fn nft_add(
    owner: &str,
    plans: &[(IpFamily, NftPlan)],
    seen: &Observed,
    gone: &[(String, Vec<(IpFamily, NftPlan)>)],
) -> Result<Vec<NftOp>, PortmapError> {
    let mut ops = Vec::new();
    for (gone_owner, gone_plans) in gone {
        ops.extend(nft_del(gone_owner, gone_plans, seen));
    }
    let is_gone = |o: &str| gone.iter().any(|(g, _)| g == o);
    for (family, plan) in plans {
        let family = *family;
        if let Some((chain, rules)) = &plan.gate {
            ops.push(NftOp::PutChain {
                family,
                chain: chain.clone(),
                rules: rules.clone(),
            });
        }
        for claim in &plan.claims {
            let mut present = false;
            for map in [claim.map, claim.twin] {
                let Some(have) = seen.element(family, map, &claim.element.key) else {
                    continue;
                };
                let have_owner = have.comment.as_deref().unwrap_or_default();
                if have_owner != owner && !is_gone(have_owner) {
                    return Err(PortmapError::Conflict {
                        what: claim.what.clone(),
                        owner: if have_owner.is_empty() {
                            format!(
                                "an element without owner in {} {} {map}",
                                netfilter::nft::Family::from(family).name(),
                                names::NFT_TABLE
                            )
                        } else {
                            have_owner.to_string()
                        },
                    });
                }
                if map == claim.map && *have == claim.element {
                    present = true;
                    continue;
                }
                ops.push(NftOp::DelElement {
                    family,
                    set: map,
                    element: have.clone(),
                });
            }
            if !present {
                ops.push(NftOp::AddElement {
                    family,
                    set: claim.map,
                    element: claim.element.clone(),
                });
            }
        }
        for (set, element) in &plan.masq {
            match seen.element(family, set, &element.key) {
                Some(have) if have == element => continue,
                Some(have) => ops.push(NftOp::DelElement {
                    family,
                    set,
                    element: have.clone(),
                }),
                None => {}
            }
            ops.push(NftOp::AddElement {
                family,
                set,
                element: element.clone(),
            });
        }
    }
    Ok(ordered(ops))
}

/// `ops` in transaction order ([`NftOp::rank`]), each deletion once: a key or chain freed
/// twice (by a gone owner's removal and by the claim taking it) would fail the transaction.
fn ordered(mut ops: Vec<NftOp>) -> Vec<NftOp> {
    ops.sort_by_key(NftOp::rank);
    let mut deleted: HashSet<(IpFamily, &str, Vec<Value>)> = HashSet::new();
    let mut chains: HashSet<(IpFamily, String)> = HashSet::new();
    ops.retain(|op| match op {
        NftOp::DelElement {
            family,
            set,
            element,
        } => deleted.insert((*family, set, element.key.clone())),
        NftOp::DelChain { family, chain } => chains.insert((*family, chain.clone())),
        NftOp::PutChain { .. } | NftOp::AddElement { .. } => true,
    });
    ops
}

/// The changes of a DEL of `plans` by `owner`: its elements that still carry its comment (a
/// key another owner took over stays) and its gate chains.
pub fn nft_del(owner: &str, plans: &[(IpFamily, NftPlan)], seen: &Observed) -> Vec<NftOp> {
    let mut ops = Vec::new();
    for (family, plan) in plans {
        let family = *family;
        let objects = plan
            .claims
            .iter()
            .map(|c| (c.map, &c.element))
            .chain(plan.masq.iter().map(|(s, e)| (*s, e)));
        for (set, element) in objects {
            if let Some(have) = seen.element(family, set, &element.key)
                && have.comment.as_deref() == Some(owner)
            {
                ops.push(NftOp::DelElement {
                    family,
                    set,
                    element: have.clone(),
                });
            }
        }
        if let Some((chain, _)) = &plan.gate
            && seen.has_chain(family, chain)
        {
            ops.push(NftOp::DelChain {
                family,
                chain: chain.clone(),
            });
        }
    }
    ordered(ops)
}

/// Whether the removal of `element` from `set` (a [`NftOp::DelElement`] of `ops`) can be an
/// expiry (a 1 ms timeout, which spares the call the wait a deletion costs at the socket's
/// close): not when `ops` add the same key again (adding an element that exists changes
/// nothing, so the timeout would remove the new one), nor for a verdict element that jumps to
/// a chain (the chain's deletion in the same transaction needs it gone).
pub fn removal_expires(ops: &[NftOp], family: IpFamily, set: &str, element: &Element) -> bool {
    let re_added = ops.iter().any(|op| {
        matches!(op, NftOp::AddElement { family: f, set: s, element: e }
            if *f == family && *s == set && e.key == element.key)
    });
    !re_added && !jumps_to_chain(element)
}

/// Whether `element` is a verdict that jumps to a chain (a gate element): its removal is a
/// deletion, in the transaction that deletes the chain.
pub fn jumps_to_chain(element: &Element) -> bool {
    matches!(
        &element.data,
        Some(ElementData::Verdict(Verdict::Goto(_) | Verdict::Jump(_)))
    )
}

#[cfg(test)]
fn mapping(
    host_port: u16,
    container_port: u16,
    proto: crate::config::Proto,
    host_ip: HostIp,
) -> PortMapping {
    PortMapping {
        host_port,
        container_port,
        proto,
        host_ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Proto;

    fn config(mappings: Vec<PortMapping>) -> Config {
        crate::config::test_config(mappings)
    }

    fn att() -> Attachment {
        Attachment {
            network: "net".into(),
            container_id: "ctr".into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn plan_puts_plain_mappings_in_the_port_maps_with_the_owner() {
        let c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(
                53,
                53,
                Proto::Udp,
                HostIp::Addr("10.1.1.1".parse().unwrap()),
            ),
            mapping(9, 9, Proto::Udp, HostIp::Addr("fd00::1".parse().unwrap())),
        ]);
        let p = nft_plan(&c, &att(), "10.0.0.2/24".parse().unwrap()).unwrap();
        assert_eq!(p.claims.len(), 2, "the v6 hostIP is skipped for v4");
        assert_eq!(p.claims[0].map, names::MAP_PORTS);
        assert_eq!(p.claims[0].what, "tcp/8080");
        assert_eq!(p.claims[0].element.comment.as_deref(), Some("net/ctr/eth0"));
        assert_eq!(p.claims[1].map, names::MAP_HOSTIP_PORTS);
        assert_eq!(p.claims[1].what, "10.1.1.1 udp/53");
        let sets: Vec<&str> = p.masq.iter().map(|(s, _)| *s).collect();
        assert_eq!(sets, [names::SET_HAIRPIN, names::SET_LOCALHOST]);
        assert!(p.gate.is_none());
    }

    #[test]
    fn plan_for_v6_has_no_localhost_element_and_masq_all_replaces_it() {
        let mut c = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        c.masq_all = true;
        let p = nft_plan(&c, &att(), "fd00::2/64".parse().unwrap()).unwrap();
        let sets: Vec<&str> = p.masq.iter().map(|(s, _)| *s).collect();
        assert_eq!(sets, [names::SET_HAIRPIN, names::SET_MASQ_ALL]);
        c.snat = false;
        assert!(
            nft_plan(&c, &att(), "fd00::2/64".parse().unwrap())
                .unwrap()
                .masq
                .is_empty()
        );
    }

    #[test]
    fn plan_with_conditions_uses_the_gated_maps_and_a_gate_chain() {
        let mut c = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        c.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("eth0".into())]);
        let p = nft_plan(&c, &att(), "10.0.0.2/24".parse().unwrap()).unwrap();
        assert_eq!(p.claims[0].map, names::MAP_GATED);
        assert_eq!(p.claims[0].twin, names::MAP_PORTS);
        let (chain, rules) = p.gate.unwrap();
        assert_eq!(chain, names::gated_chain("net/ctr/eth0"));
        assert_eq!(
            rules[0].to_nft(),
            "iifname \"eth0\" tcp dport 8080 dnat ip to 10.0.0.2:80 comment \"net/ctr/eth0\""
        );
    }

    #[test]
    fn plan_drops_repeated_mappings_and_refuses_one_port_to_two_targets() {
        let c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(8080, 80, Proto::Tcp, HostIp::All),
        ]);
        assert_eq!(
            nft_plan(&c, &att(), "10.0.0.2/24".parse().unwrap())
                .unwrap()
                .claims
                .len(),
            1
        );
        let c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(8080, 81, Proto::Tcp, HostIp::All),
        ]);
        assert!(nft_plan(&c, &att(), "10.0.0.2/24".parse().unwrap()).is_err());
    }

    fn other() -> Attachment {
        Attachment {
            container_id: "other".into(),
            ..att()
        }
    }

    fn v4_plan(c: &Config, a: &Attachment) -> Vec<(IpFamily, NftPlan)> {
        vec![(
            IpFamily::V4,
            nft_plan(c, a, "10.0.0.2/24".parse().unwrap()).unwrap(),
        )]
    }

    /// What an ADD of `plans` left in the kernel.
    fn made(plans: &[(IpFamily, NftPlan)], seen: &Observed) -> Observed {
        made_by(&att(), plans, seen)
    }

    /// What an ADD of `plans` by `by` left in the kernel.
    fn made_by(by: &Attachment, plans: &[(IpFamily, NftPlan)], seen: &Observed) -> Observed {
        let mut after = seen.clone();
        for op in nft_add(&names::owner(by), plans, seen, &[]).unwrap() {
            match op {
                NftOp::AddElement {
                    family,
                    set,
                    element,
                } => after.elements.push((family, set, element)),
                NftOp::PutChain { family, chain, .. } => after.chains.push((family, chain)),
                NftOp::DelElement {
                    family,
                    set,
                    element,
                } => after
                    .elements
                    .retain(|(f, s, e)| !(*f == family && *s == set && e.key == element.key)),
                NftOp::DelChain { family, chain } => {
                    after.chains.retain(|(f, c)| !(*f == family && *c == chain));
                }
            }
        }
        after
    }

    fn kinds(ops: &[NftOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                NftOp::DelElement { set, .. } => format!("del {set}"),
                NftOp::DelChain { chain, .. } => format!("delchain {chain}"),
                NftOp::PutChain { chain, .. } => format!("putchain {chain}"),
                NftOp::AddElement { set, .. } => format!("add {set}"),
            })
            .collect()
    }

    /// A TCP mapping on every address and a UDP one on 10.1.1.1.
    fn plain_and_host_ip() -> Config {
        config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(
                53,
                53,
                Proto::Udp,
                HostIp::Addr("10.1.1.1".parse().unwrap()),
            ),
        ])
    }

    #[test]
    fn add_on_empty_maps_adds_every_claim_and_masquerade_element() {
        let c = plain_and_host_ip();
        let ops = nft_add(
            &names::owner(&att()),
            &v4_plan(&c, &att()),
            &Observed::default(),
            &[],
        )
        .unwrap();
        assert_eq!(
            kinds(&ops),
            [
                "add ports",
                "add hostip_ports",
                "add hairpin",
                "add localhost"
            ]
        );
    }

    #[test]
    fn a_repeated_add_changes_nothing() {
        let c = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        let plans = v4_plan(&c, &att());
        let after = made(&plans, &Observed::default());
        assert_eq!(
            nft_add(&names::owner(&att()), &plans, &after, &[]).unwrap(),
            []
        );
    }

    #[test]
    fn add_refuses_a_port_another_owner_holds_in_the_map_or_its_twin() {
        let c = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        let seen = made_by(&other(), &v4_plan(&c, &other()), &Observed::default());
        let err = nft_add(&names::owner(&att()), &v4_plan(&c, &att()), &seen, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "host port tcp/8080 is already mapped by net/other/eth0"
        );
        // The same key in the gated twin (the other owner has conditions) is a conflict too.
        let mut gated = c.clone();
        gated.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("x".into())]);
        let seen = Observed {
            elements: v4_plan(&gated, &other())[0]
                .1
                .claims
                .iter()
                .map(|cl| (IpFamily::V4, cl.map, cl.element.clone()))
                .collect(),
            chains: Vec::new(),
        };
        assert!(matches!(
            nft_add(&names::owner(&att()), &v4_plan(&c, &att()), &seen, &[]),
            Err(PortmapError::Conflict { owner, .. }) if owner == "net/other/eth0"
        ));
        // An element without owner (made by hand) is never taken.
        let mut bare = seen.clone();
        bare.elements[0].2.comment = None;
        assert!(matches!(
            nft_add(&names::owner(&att()), &v4_plan(&c, &att()), &bare, &[]),
            Err(PortmapError::Conflict { owner, .. }) if owner.starts_with("an element without owner")
        ));
    }

    #[test]
    fn a_re_add_with_other_targets_or_conditions_replaces_the_owners_elements() {
        let old = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        let after = made(&v4_plan(&old, &att()), &Observed::default());
        let new = config(vec![mapping(8080, 81, Proto::Tcp, HostIp::All)]);
        let ops = nft_add(&names::owner(&att()), &v4_plan(&new, &att()), &after, &[]).unwrap();
        assert_eq!(kinds(&ops), ["del ports", "add ports"]);
        let mut gated = old.clone();
        gated.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("x".into())]);
        let ops = nft_add(&names::owner(&att()), &v4_plan(&gated, &att()), &after, &[]).unwrap();
        let chain = names::gated_chain(&names::owner(&att()));
        assert_eq!(
            kinds(&ops),
            [
                "del ports".to_string(),
                format!("putchain {chain}"),
                "add gated_ports".to_string()
            ]
        );
    }

    #[test]
    fn add_takes_over_the_masquerade_element_of_a_stale_owner_of_the_address() {
        let c = config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]);
        let mut seen = Observed::default();
        for (set, element) in &v4_plan(
            &config(vec![mapping(9, 9, Proto::Tcp, HostIp::All)]),
            &other(),
        )[0]
        .1
        .masq
        {
            seen.elements.push((IpFamily::V4, set, element.clone()));
        }
        let ops = nft_add(&names::owner(&att()), &v4_plan(&c, &att()), &seen, &[]).unwrap();
        assert_eq!(
            kinds(&ops),
            [
                "del hairpin",
                "del localhost",
                "add ports",
                "add hairpin",
                "add localhost"
            ]
        );
    }

    #[test]
    fn a_gone_owner_loses_all_its_objects_in_the_transaction_that_takes_its_port() {
        // The other owner maps 8080 and 9090 with conditions, on the same pod address (a
        // vanished pod's address reused).
        let mut theirs = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(9090, 90, Proto::Tcp, HostIp::All),
        ]);
        theirs.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("x".into())]);
        let their_plans = v4_plan(&theirs, &other());
        let seen = made_by(&other(), &their_plans, &Observed::default());
        let ours = v4_plan(
            &config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]),
            &att(),
        );
        assert_eq!(
            foreign_owners(&names::owner(&att()), &ours, &seen),
            [names::owner(&other())]
        );
        // Live: refused, as before.
        assert!(matches!(
            nft_add(&names::owner(&att()), &ours, &seen, &[]),
            Err(PortmapError::Conflict { .. })
        ));
        // Gone: its elements (both ports, the masquerade ones once) and its gate chain go, in
        // the same ops as ours.
        let gone = vec![(names::owner(&other()), their_plans)];
        let ops = nft_add(&names::owner(&att()), &ours, &seen, &gone).unwrap();
        let chain = names::gated_chain(&names::owner(&other()));
        assert_eq!(
            kinds(&ops),
            [
                "del gated_ports".to_string(),
                "del gated_ports".to_string(),
                "del hairpin".to_string(),
                "del localhost".to_string(),
                format!("delchain {chain}"),
                "add ports".to_string(),
                "add hairpin".to_string(),
                "add localhost".to_string(),
            ]
        );
    }

    #[test]
    fn del_removes_only_what_still_carries_the_owner_and_existing_gate_chains() {
        let mut c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(8081, 80, Proto::Tcp, HostIp::All),
        ]);
        c.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("x".into())]);
        let plans = v4_plan(&c, &att());
        let mut after = made(&plans, &Observed::default());
        // Another owner took 8081 over meanwhile.
        for (_, _, e) in &mut after.elements {
            if e.key.contains(&Value::Port(8081)) {
                e.comment = Some(names::owner(&other()));
            }
        }
        let ops = nft_del(&names::owner(&att()), &plans, &after);
        let chain = names::gated_chain(&names::owner(&att()));
        assert_eq!(
            kinds(&ops),
            [
                "del gated_ports".to_string(),
                "del hairpin".to_string(),
                "del localhost".to_string(),
                format!("delchain {chain}")
            ]
        );
        after.chains.clear();
        assert!(
            !kinds(&nft_del(&names::owner(&att()), &plans, &after))
                .iter()
                .any(|k| k.starts_with("delchain"))
        );
        assert_eq!(
            nft_del(&names::owner(&att()), &plans, &Observed::default()),
            []
        );
    }

    /// The removals of `ops`: set, and whether it is an expiry.
    fn removals(ops: &[NftOp]) -> Vec<(&'static str, bool)> {
        ops.iter()
            .filter_map(|op| match op {
                NftOp::DelElement {
                    family,
                    set,
                    element,
                } => Some((*set, removal_expires(ops, *family, set, element))),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn removals_expire_unless_the_key_is_added_again_or_the_element_jumps_to_a_chain() {
        // DEL of plain mappings: every element expires, with the data it was found with.
        let c = plain_and_host_ip();
        let plans = v4_plan(&c, &att());
        let after = made(&plans, &Observed::default());
        let ops = nft_del(&names::owner(&att()), &plans, &after);
        assert_eq!(
            removals(&ops),
            [
                ("ports", true),
                ("hostip_ports", true),
                ("hairpin", true),
                ("localhost", true)
            ]
        );
        for op in &ops {
            if let NftOp::DelElement { set, element, .. } = op {
                assert_eq!(
                    after.element(IpFamily::V4, set, &element.key),
                    Some(element)
                );
            }
        }
        // A re-ADD with another target replaces the element at the same key: a deletion, as
        // the transaction adds the key again.
        let new = config(vec![mapping(8080, 81, Proto::Tcp, HostIp::All)]);
        let single = made(
            &v4_plan(
                &config(vec![mapping(8080, 80, Proto::Tcp, HostIp::All)]),
                &att(),
            ),
            &Observed::default(),
        );
        let ops = nft_add(&names::owner(&att()), &v4_plan(&new, &att()), &single, &[]).unwrap();
        assert_eq!(removals(&ops), [("ports", false)]);
        // A re-ADD that moves the mapping to the gated map: the old key in the plain map is
        // not added again there, so it expires.
        let mut gated = new.clone();
        gated.conditions_v4 = Conditions::Nftables(vec![NftCondition::IifName("x".into())]);
        let ops = nft_add(
            &names::owner(&att()),
            &v4_plan(&gated, &att()),
            &single,
            &[],
        )
        .unwrap();
        assert_eq!(removals(&ops), [("ports", true)]);
        // DEL with conditions: the gated element goes with its chain, by deletion.
        let plans = v4_plan(&gated, &att());
        let after = made(&plans, &Observed::default());
        let ops = nft_del(&names::owner(&att()), &plans, &after);
        assert_eq!(
            removals(&ops),
            [
                ("gated_ports", false),
                ("hairpin", true),
                ("localhost", true)
            ]
        );
    }
}
