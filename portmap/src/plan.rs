//! What an attachment needs, computed without touching the kernel (pure).
//!
//! [`Attachment`] names the owner; [`nft_plan`] turns a config and a container address into
//! the elements (and, with conditions, the gate chain) of one family's table.

use std::net::IpAddr;

use common::nft::{Element, NfProto, Rule, Value, Verdict};
use ipnet::IpNet;

#[cfg(test)]
use crate::config::HostIp;
use crate::config::{Conditions, Config, IpFamily, NftCondition, PortMapping};
use crate::error::PortmapError;
use crate::names;

/// Who owns the objects of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The network name.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl Attachment {
    /// The owner comment of every element and rule of this attachment.
    pub fn owner(&self) -> String {
        names::owner_comment(&self.network, &self.container_id, &self.ifname)
    }
}

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
    let owner = att.owner();
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
        let what = match host_addr {
            Some(a) => format!("{a} {}/{}", m.proto.name(), m.host_port),
            None => format!("{}/{}", m.proto.name(), m.host_port),
        };
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
                return Err(PortmapError::Config(format!(
                    "runtimeConfig.portMappings: host port {what} is mapped twice to different container ports"
                )));
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

/// The nft protocol version of a family.
pub fn nfproto(family: IpFamily) -> NfProto {
    match family {
        IpFamily::V4 => NfProto::Ipv4,
        IpFamily::V6 => NfProto::Ipv6,
    }
}

/// The host ports whose UDP conntrack entries must go after a change: (port, host address).
pub fn udp_flush_targets(config: &Config, family: IpFamily) -> Vec<(u16, Option<IpAddr>)> {
    let mut out: Vec<(u16, Option<IpAddr>)> = config
        .mappings
        .iter()
        .filter(|m| m.proto == crate::config::Proto::Udp && m.host_ip.applies_to(family))
        .map(|m| (m.host_port, m.host_ip.addr()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether any mapping applies to `family`.
pub fn has_mappings_for(config: &Config, family: IpFamily) -> bool {
    config.mappings.iter().any(|m| m.host_ip.applies_to(family))
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
    use crate::config::{BackendChoice, Proto};

    fn config(mappings: Vec<PortMapping>) -> Config {
        Config {
            network: "net".into(),
            backend: BackendChoice::Auto,
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: Conditions::None,
            conditions_v6: Conditions::None,
            mappings,
        }
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

    #[test]
    fn udp_flush_targets_are_the_udp_host_ports_of_the_family() {
        let c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(53, 53, Proto::Udp, HostIp::All),
            mapping(54, 53, Proto::Udp, HostIp::Any(IpFamily::V6)),
        ]);
        assert_eq!(udp_flush_targets(&c, IpFamily::V4), vec![(53, None)]);
        assert_eq!(
            udp_flush_targets(&c, IpFamily::V6),
            vec![(53, None), (54, None)]
        );
    }
}
