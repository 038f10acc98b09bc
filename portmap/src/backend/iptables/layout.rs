//! The reference's iptables layout rendered from the plan (pure): the rules of an
//! attachment's `CNI-DN-<hash>` chain, its entry rules in `CNI-HOSTPORT-DNAT` and the shared
//! skeleton, computed in `iptables-save`'s canonical form (addresses with their prefix,
//! `-s`/`-d` first, `-m tcp` after `-p tcp`, `--dports` for multiport) as the parts the writer
//! takes ([`netfilter::iptables::writer`]), so what exists is recognised and only what is
//! missing is written; and what CHECK misses named as the reference names it, with its own
//! words for the rules ([`go_dnat_rules`]).

use std::net::IpAddr;

use cni::conf::GcAttachment as Valid;
use ipnet::IpNet;
use netfilter::iptables::native::RuleSpec;
use netfilter::iptables::writer::{Absent, Part, Unchain};

use crate::config::{Conditions, Config, IpFamily, PortMapping, Proto};
use crate::error::PortmapError;
use crate::names;
use crate::state::State;

/// The iptables table of the layout.
pub const NAT: &str = names::IPT_NAT;

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

/// `1<<bit` as the reference prints it: `0x2000/0x2000`.
pub fn mark_def(bit: u32) -> String {
    let m = 1u32 << bit;
    format!("{m:#x}/{m:#x}")
}

/// An address or prefix as `iptables-save` prints it (`10.0.0.0/24`, `1.2.3.4/32`).
fn canonical_net(s: &str) -> String {
    if let Ok(net) = s.parse::<IpNet>() {
        return net.trunc().to_string();
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return IpNet::from(a).to_string();
    }
    s.to_string()
}

/// Moves `[!] -s/-d/-i/-o X` to the front (in that order), as `iptables-save` prints them.
fn canonical_conditions(conds: &[String]) -> (Vec<String>, Vec<String>) {
    let mut front: Vec<(usize, Vec<String>)> = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < conds.len() {
        let neg = conds[i] == "!";
        let at = if neg { i + 1 } else { i };
        let opt = conds.get(at).map(String::as_str);
        let rank = match opt {
            Some("-s" | "--source" | "--src") => Some(0),
            Some("-d" | "--destination" | "--dst") => Some(1),
            Some("-i" | "--in-interface") => Some(2),
            Some("-o" | "--out-interface") => Some(3),
            _ => None,
        };
        match (rank, conds.get(at + 1)) {
            (Some(rank), Some(value)) => {
                let mut part = Vec::new();
                if neg {
                    part.push("!".to_string());
                }
                let short = ["-s", "-d", "-i", "-o"][rank];
                part.push(short.to_string());
                part.push(if rank < 2 {
                    canonical_net(value)
                } else {
                    value.clone()
                });
                front.push((rank, part));
                i = at + 2;
            }
            _ => {
                rest.push(conds[i].clone());
                i += 1;
            }
        }
    }
    front.sort_by_key(|(rank, _)| *rank);
    (front.into_iter().flat_map(|(_, p)| p).collect(), rest)
}

/// One rule of the attachment's chain before it is worded: for a mapping, the hairpin and
/// localhost mark rules (`src`: the source, as the reference words it) and the DNAT rule
/// (`src` none).
struct ChainRule<'c> {
    m: &'c PortMapping,
    src: Option<String>,
    target: Vec<String>,
}

/// The rules of the `CNI-DN-<hash>` chain for container address `ip`, in mapping order, as
/// the reference computes them: per mapping of the address's family, with `snat` a hairpin
/// mark rule (the container's CIDR, every source with `masqAll`) and for IPv4 without
/// `masqAll` a localhost one, then the DNAT rule.
fn chain_rules(config: &Config, ip: IpNet) -> Vec<ChainRule<'_>> {
    let fam = IpFamily::of(ip.addr());
    let mark_chain = config
        .external_set_mark_chain
        .clone()
        .unwrap_or_else(|| names::IPT_SETMARK.to_string());
    let mut rules = Vec::new();
    for m in config.mappings.iter().filter(|m| m.host_ip.applies_to(fam)) {
        if config.snat {
            let src = match (config.masq_all, fam) {
                (false, _) => ip.to_string(),
                (true, IpFamily::V4) => "0.0.0.0/0".to_string(),
                (true, IpFamily::V6) => "::/0".to_string(),
            };
            let mark = args(&["-j", &mark_chain]);
            rules.push(ChainRule {
                m,
                src: Some(src),
                target: mark.clone(),
            });
            if fam == IpFamily::V4 && !config.masq_all {
                rules.push(ChainRule {
                    m,
                    src: Some("127.0.0.1".to_string()),
                    target: mark,
                });
            }
        }
        let to = match ip.addr() {
            IpAddr::V4(a) => format!("{a}:{}", m.container_port),
            IpAddr::V6(a) => format!("[{a}]:{}", m.container_port),
        };
        rules.push(ChainRule {
            m,
            src: None,
            target: args(&["-j", "DNAT", "--to-destination", &to]),
        });
    }
    rules
}

/// The rules of the `CNI-DN-<hash>` chain for container address `ip`, in mapping order, in
/// `iptables-save`'s words (`-s 0.0.0.0/0` is left out, as the tool prints it).
pub fn dnat_rules(config: &Config, ip: IpNet) -> Vec<Vec<String>> {
    chain_rules(config, ip)
        .into_iter()
        .map(|r| {
            let mut rule = Vec::new();
            if let Some(src) = r.src.map(|s| canonical_net(&s))
                && !src.ends_with("/0")
            {
                rule.extend(["-s".to_string(), src]);
            }
            if let Some(a) = r.m.host_ip.addr() {
                rule.extend(["-d".to_string(), IpNet::from(a).to_string()]);
            }
            let (proto, port) = (r.m.proto.name(), r.m.host_port.to_string());
            rule.extend(args(&["-p", proto, "-m", proto, "--dport", &port]));
            rule.extend(r.target);
            rule
        })
        .collect()
}

/// The rules of [`dnat_rules`] in the reference's own words, `-p P --dport N [-d H] [-s S]
/// -j …`, for the messages that list them as it does.
pub fn go_dnat_rules(config: &Config, ip: IpNet) -> Vec<Vec<String>> {
    chain_rules(config, ip)
        .into_iter()
        .map(|r| {
            let port = r.m.host_port.to_string();
            let mut rule = args(&["-p", r.m.proto.name(), "--dport", &port]);
            if let Some(a) = r.m.host_ip.addr() {
                rule.extend(["-d".to_string(), a.to_string()]);
            }
            if let Some(src) = r.src {
                rule.extend(["-s".to_string(), src]);
            }
            rule.extend(r.target);
            rule
        })
        .collect()
}

/// The host ports of each protocol, as the entry rules list them: protocols sorted by name
/// (`sctp`, `tcp`, `udp`, as the reference sorts them), each with its ports in chunks of 15
/// in mapping order (duplicates and wrong-family hostIP entries included, as the reference
/// does).
fn entry_ports(config: &Config) -> Vec<(Proto, String)> {
    let mut protos: Vec<Proto> = config.mappings.iter().map(|m| m.proto).collect();
    protos.sort_unstable_by_key(|p| p.name());
    protos.dedup();
    let mut out = Vec::new();
    for proto in protos {
        let ports: Vec<String> = config
            .mappings
            .iter()
            .filter(|m| m.proto == proto)
            .map(|m| m.host_port.to_string())
            .collect();
        for chunk in ports.chunks(names::IPT_MULTIPORT_MAX) {
            out.push((proto, chunk.join(",")));
        }
    }
    out
}

/// The entry rules in `CNI-HOSTPORT-DNAT` in `iptables-save`'s words (with `-j CNI-DN-…`).
pub fn entry_rules(config: &Config, container_id: &str, fam: IpFamily) -> Vec<Vec<String>> {
    let chain = names::dnat_chain(&config.network, container_id);
    let comment = names::ipt_entry_comment(&config.network, container_id);
    let (front, rest) = match config.conditions(fam) {
        Conditions::Iptables(c) => canonical_conditions(c),
        _ => (Vec::new(), Vec::new()),
    };
    entry_ports(config)
        .into_iter()
        .map(|(proto, ports)| {
            let mut r = front.clone();
            r.extend(args(&[
                "-p",
                proto.name(),
                "-m",
                "comment",
                "--comment",
                &comment,
                "-m",
                "multiport",
                "--dports",
                &ports,
            ]));
            r.extend(rest.iter().cloned());
            r.extend(args(&["-j", &chain]));
            r
        })
        .collect()
}

/// The entry rules in the reference's own words, without the jump (as its CHECK lists them).
fn go_entry_rules(config: &Config, container_id: &str, fam: IpFamily) -> Vec<Vec<String>> {
    let comment = names::ipt_entry_comment(&config.network, container_id);
    let conditions = match config.conditions(fam) {
        Conditions::Iptables(c) => c.as_slice(),
        _ => &[],
    };
    entry_ports(config)
        .into_iter()
        .map(|(proto, ports)| {
            let mut r = args(&[
                "-m",
                "comment",
                "--comment",
                &comment,
                "-m",
                "multiport",
                "-p",
                proto.name(),
                "--destination-ports",
                &ports,
            ]);
            r.extend(conditions.iter().cloned());
            r
        })
        .collect()
}

/// The shared regular chains the layout needs.
pub fn shared_chains(config: &Config) -> Vec<&'static str> {
    if config.snat && config.external_set_mark_chain.is_none() {
        vec![
            names::IPT_SETMARK,
            names::IPT_MASQ,
            names::IPT_TOPLEVEL_DNAT,
        ]
    } else {
        vec![names::IPT_TOPLEVEL_DNAT]
    }
}

/// The shared chains' rules and the jumps into them from the built-in chains, in the order
/// the reference makes them: with `snat` (and no external mark chain) the mark rule, the
/// masquerade rule and its jump at the top of `POSTROUTING`; then the jumps to
/// `CNI-HOSTPORT-DNAT` from `PREROUTING` and `OUTPUT`.
pub fn skeleton(config: &Config) -> Vec<RuleSpec> {
    let mut specs = Vec::new();
    if config.snat && config.external_set_mark_chain.is_none() {
        let mark = mark_def(config.mark_masq_bit);
        specs.push(RuleSpec::append(
            names::IPT_SETMARK,
            &args(&[
                "-m",
                "comment",
                "--comment",
                names::IPT_SETMARK_COMMENT,
                "-j",
                "MARK",
                "--set-xmark",
                &mark,
            ]),
        ));
        specs.push(RuleSpec::append(
            names::IPT_MASQ,
            &args(&["-m", "mark", "--mark", &mark, "-j", "MASQUERADE"]),
        ));
        specs.push(RuleSpec::insert(
            "POSTROUTING",
            &args(&[
                "-m",
                "comment",
                "--comment",
                names::IPT_MASQ_COMMENT,
                "-j",
                names::IPT_MASQ,
            ]),
        ));
    }
    for entry in ["PREROUTING", "OUTPUT"] {
        specs.push(RuleSpec::append(
            entry,
            &args(&[
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                names::IPT_TOPLEVEL_DNAT,
            ]),
        ));
    }
    specs
}

/// The attachment's chain and its rules for container address `ip`: the chain's rules, then
/// its entry rules (recorded: their handles go into the state).
pub fn attachment(config: &Config, container_id: &str, ip: IpNet) -> (String, Vec<RuleSpec>) {
    let chain = names::dnat_chain(&config.network, container_id);
    let fam = IpFamily::of(ip.addr());
    let mut specs: Vec<RuleSpec> = dnat_rules(config, ip)
        .iter()
        .map(|r| RuleSpec::append(&chain, r))
        .collect();
    specs.extend(
        entry_rules(config, container_id, fam)
            .iter()
            .map(|r| RuleSpec::append_recorded(names::IPT_TOPLEVEL_DNAT, r)),
    );
    (chain, specs)
}

/// What `ip`'s family's table should hold for the attachment: the shared chains and the
/// attachment's chain, the skeleton's rules and the attachment's (its entry rules recorded).
pub fn add_part(config: &Config, container_id: &str, ip: IpNet) -> Part {
    let (chain, specs) = attachment(config, container_id, ip);
    let mut chains: Vec<String> = shared_chains(config)
        .iter()
        .map(|c| (*c).to_string())
        .collect();
    chains.push(chain);
    let mut rules = skeleton(config);
    rules.extend(specs);
    Part {
        family: IpFamily::of(ip.addr()).into(),
        chains,
        rules,
    }
}

/// The attachment's own objects in `ip`'s family, as CHECK looks for them first: its chain,
/// the chain's rules, its entry rules.
pub fn own_part(config: &Config, container_id: &str, ip: IpNet) -> Part {
    let (chain, rules) = attachment(config, container_id, ip);
    Part {
        family: IpFamily::of(ip.addr()).into(),
        chains: vec![chain],
        rules,
    }
}

/// The shared objects the attachment needs in `family`, as CHECK looks for them after its own.
pub fn shared_part(config: &Config, family: IpFamily) -> Part {
    Part {
        family: family.into(),
        chains: shared_chains(config)
            .iter()
            .map(|c| (*c).to_string())
            .collect(),
        rules: skeleton(config),
    }
}

/// The removal of the chains of `network`'s container `container_id` in `families` (its
/// `CNI-DN-<hash>` and the legacy `CNI-SN-<hash>`) with the rules jumping to them, the entry
/// rules found by the handles `record` holds where it has them.
pub fn unchains(
    network: &str,
    container_id: &str,
    families: &[IpFamily],
    record: Option<&State>,
) -> Vec<Unchain> {
    let dnat = names::dnat_chain(network, container_id);
    let snat = names::legacy_snat_chain(network, container_id);
    let mut removals = Vec::new();
    for family in families {
        removals.push(Unchain {
            family: (*family).into(),
            from: names::IPT_TOPLEVEL_DNAT.to_string(),
            chain: dnat.clone(),
            recorded: record.and_then(|r| r.recorded(*family)).cloned(),
        });
        removals.push(Unchain {
            family: (*family).into(),
            from: names::IPT_LEGACY_SNAT.to_string(),
            chain: snat.clone(),
            recorded: None,
        });
    }
    removals
}

/// What CHECK found missing of an attachment in one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Its chain.
    Chain,
    /// One of its chain's rules, as `iptables-save` prints it.
    Rule(Vec<String>),
    /// One of its entry rules, as `iptables-save` prints it.
    Entry(Vec<String>),
    /// A shared chain or rule it needs: `chain X`, or `rule -A X …` as `iptables-save` prints
    /// it (the reference does not check these; the words are ours).
    Shared(String),
}

/// CHECK's error for what is `missing` of the attachment in `ip`'s family: the reference's
/// message, listing the chain's or the entry rules in its own words as it does, with the rule
/// missing in details as `iptables-save` prints it.
pub fn check_error(
    config: &Config,
    container_id: &str,
    ip: IpNet,
    missing: &Missing,
) -> PortmapError {
    let fam = IpFamily::of(ip.addr());
    let which = match fam {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    };
    let chain = names::dnat_chain(&config.network, container_id);
    let go_list = |rules: &[Vec<String>]| {
        let inner: Vec<String> = rules.iter().map(|r| format!("[{}]", r.join(" "))).collect();
        format!("[{}]", inner.join(" "))
    };
    let missing_rule = |chain: &str, rule: &[String]| {
        let line = netfilter::iptables::restore_line("-A", chain, rule)
            .unwrap_or_else(|_| format!("-A {chain} {}", rule.join(" ")));
        format!("rule {line} not found")
    };
    let (what, details) = match missing {
        Missing::Chain => (
            format!("chain {chain} not found in iptables table {NAT}"),
            String::new(),
        ),
        Missing::Rule(rule) => (
            format!(
                "rule {} in chain {chain} not found in table {NAT}",
                go_list(&go_dnat_rules(config, ip))
            ),
            missing_rule(&chain, rule),
        ),
        Missing::Entry(rule) => (
            format!(
                "rule {} in chain {} not found in table {NAT}",
                go_list(&go_entry_rules(config, container_id, fam)),
                names::IPT_TOPLEVEL_DNAT
            ),
            missing_rule(names::IPT_TOPLEVEL_DNAT, rule),
        ),
        Missing::Shared(object) => (format!("{object} not found in table {NAT}"), String::new()),
    };
    PortmapError::CheckDetailed {
        msg: format!("could not check {which} dnat: {what}"),
        details,
    }
}

/// What CHECK names for `absent`, the first object of the attachment's [`own_part`] the
/// table lacks.
pub fn own_missing(own: &Part, absent: Absent) -> Missing {
    match absent {
        Absent::Chain(_) => Missing::Chain,
        Absent::Rule { index, args } if Some(&own.rules[index].chain) == own.chains.first() => {
            Missing::Rule(args)
        }
        Absent::Rule { args, .. } => Missing::Entry(args),
    }
}

/// What CHECK names for `absent`, the first object of a [`shared_part`] the table lacks.
pub fn shared_absent(shared: &Part, absent: Absent) -> Missing {
    match absent {
        Absent::Chain(chain) => shared_missing(None, Some(&chain)),
        Absent::Rule { index, .. } => shared_missing(shared.rules.get(index), None),
    }
}

/// A shared object CHECK found missing, as [`Missing::Shared`] names it.
fn shared_missing(spec: Option<&RuleSpec>, chain: Option<&str>) -> Missing {
    match (chain, spec) {
        (Some(chain), _) => Missing::Shared(format!("chain {chain}")),
        (None, Some(spec)) => {
            let line = netfilter::iptables::restore_line("-A", &spec.chain, &spec.args)
                .unwrap_or_else(|_| format!("-A {} {}", spec.chain, spec.args.join(" ")));
            Missing::Shared(format!("rule {line}"))
        }
        (None, None) => Missing::Shared("a shared chain".to_string()),
    }
}

/// The containers of `network` named by the entry rules' `comments` that are not valid.
pub fn stale_containers<'c>(
    comments: impl Iterator<Item = &'c str>,
    network: &str,
    valid: &[Valid],
) -> Vec<String> {
    let prefix = format!("dnat name: \"{network}\" id: \"");
    let mut stale: Vec<String> = Vec::new();
    for comment in comments {
        let Some(id) = comment
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix('"'))
        else {
            continue;
        };
        if !valid.iter().any(|a| a.container_id == id) && !stale.iter().any(|s| s == id) {
            stale.push(id.to_string());
        }
    }
    stale
}

/// The reference's failure to remove the layout of an attachment in `family`.
pub fn teardown_error(family: IpFamily, cause: &dyn std::fmt::Display) -> PortmapError {
    PortmapError::Teardown {
        family: match family {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        },
        cause: cause.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostIp;
    use crate::ports;
    use netfilter::iptables::TableDump;
    use netfilter::iptables::writer;

    fn config(mappings: Vec<PortMapping>) -> Config {
        crate::config::test_config(mappings)
    }

    fn m(host_port: u16, container_port: u16, proto: Proto, host_ip: HostIp) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            proto,
            host_ip,
        }
    }

    fn joined(rules: &[Vec<String>]) -> Vec<String> {
        rules.iter().map(|r| r.join(" ")).collect()
    }

    #[test]
    fn mark_bits_print_like_the_reference() {
        assert_eq!(mark_def(13), "0x2000/0x2000");
        assert_eq!(mark_def(5), "0x20/0x20");
    }

    #[test]
    fn dnat_rules_cover_hairpin_localhost_and_dnat_in_save_form() {
        let c = config(vec![
            m(8080, 80, Proto::Tcp, HostIp::All),
            m(
                53,
                53,
                Proto::Udp,
                HostIp::Addr("10.1.1.1".parse().unwrap()),
            ),
            m(9, 9, Proto::Udp, HostIp::Addr("fd00::1".parse().unwrap())),
        ]);
        assert_eq!(
            joined(&dnat_rules(&c, "10.0.0.2/24".parse().unwrap())),
            [
                "-s 10.0.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80",
                "-s 10.0.0.0/24 -d 10.1.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -d 10.1.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK",
                "-d 10.1.1.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.0.2:53",
            ]
        );
        let mut c = config(vec![m(8080, 80, Proto::Tcp, HostIp::All)]);
        c.masq_all = true;
        c.external_set_mark_chain = Some("KUBE-MARK-MASQ".into());
        assert_eq!(
            joined(&dnat_rules(&c, "fd00::2/64".parse().unwrap())),
            [
                "-p tcp -m tcp --dport 8080 -j KUBE-MARK-MASQ",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80",
            ]
        );
        c.snat = false;
        assert_eq!(dnat_rules(&c, "fd00::2/64".parse().unwrap()).len(), 1);
    }

    #[test]
    fn the_reference_s_words_list_the_same_rules_as_it_prints_them() {
        let c = config(vec![
            m(8080, 80, Proto::Tcp, HostIp::All),
            m(
                8443,
                443,
                Proto::Tcp,
                HostIp::Addr("10.98.0.1".parse().unwrap()),
            ),
        ]);
        let ip: IpNet = "10.96.0.2/24".parse().unwrap();
        assert_eq!(
            joined(&go_dnat_rules(&c, ip)),
            [
                "-p tcp --dport 8080 -s 10.96.0.2/24 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 8080 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 8080 -j DNAT --to-destination 10.96.0.2:80",
                "-p tcp --dport 8443 -d 10.98.0.1 -s 10.96.0.2/24 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 8443 -d 10.98.0.1 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 8443 -d 10.98.0.1 -j DNAT --to-destination 10.96.0.2:443",
            ]
        );
        let dnat = dnat_rules(&c, ip);
        let err = check_error(&c, "ctr", ip, &Missing::Rule(dnat[0].clone())).to_string();
        assert!(
            err.starts_with(
                "could not check ipv4 dnat: rule [[-p tcp --dport 8080 -s 10.96.0.2/24 -j CNI-HOSTPORT-SETMARK] [-p tcp"
            ),
            "{err}"
        );
        assert!(
            err.ends_with(&format!(
                "10.96.0.2:443]] in chain {} not found in table nat",
                names::dnat_chain("net", "ctr")
            )),
            "{err}"
        );
        assert_eq!(
            check_error(&c, "ctr", ip, &Missing::Entry(Vec::new())).to_string(),
            "could not check ipv4 dnat: rule [[-m comment --comment dnat name: \"net\" id: \"ctr\" -m multiport -p tcp --destination-ports 8080,8443]] in chain CNI-HOSTPORT-DNAT not found in table nat"
        );
        assert_eq!(
            check_error(&c, "ctr", ip, &Missing::Chain).to_string(),
            format!(
                "could not check ipv4 dnat: chain {} not found in iptables table nat",
                names::dnat_chain("net", "ctr")
            )
        );
    }

    #[test]
    fn entry_rules_group_per_protocol_sorted_by_name_in_chunks_of_15_with_conditions() {
        let mut maps: Vec<PortMapping> = (1..=16)
            .map(|p| m(p, 80, Proto::Udp, HostIp::All))
            .collect();
        maps.push(m(8080, 80, Proto::Tcp, HostIp::All));
        maps.push(m(3868, 3868, Proto::Sctp, HostIp::All));
        let mut c = config(maps);
        c.conditions_v4 = Conditions::Iptables(vec![
            "-m".into(),
            "mark".into(),
            "--mark".into(),
            "0x1".into(),
            "-s".into(),
            "10.0.0.1".into(),
        ]);
        let rules = joined(&entry_rules(&c, "ctr", IpFamily::V4));
        let chain = names::dnat_chain("net", "ctr");
        assert_eq!(rules.len(), 4);
        assert!(rules[0].contains("-p sctp "), "{}", rules[0]);
        assert_eq!(
            rules[1],
            format!(
                "-s 10.0.0.1/32 -p tcp -m comment --comment dnat name: \"net\" id: \"ctr\" -m multiport --dports 8080 -m mark --mark 0x1 -j {chain}"
            )
        );
        assert!(rules[2].contains("--dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 "));
        assert!(rules[3].contains("--dports 16 "));
    }

    #[test]
    fn the_skeleton_follows_snat_and_the_external_mark_chain() {
        let mut c = config(Vec::new());
        assert_eq!(
            shared_chains(&c),
            netfilter::iptables::fixtures::SHARED_CHAINS
        );
        let specs = skeleton(&c);
        // The reference's skeleton, as every test writes it.
        assert_eq!(specs, netfilter::iptables::fixtures::skeleton());
        assert_eq!(specs.len(), 5);
        assert_eq!(specs[2].chain, "POSTROUTING");
        assert_eq!(
            specs[2].position,
            netfilter::iptables::native::Position::Insert
        );
        c.external_set_mark_chain = Some("KUBE-MARK-MASQ".into());
        assert_eq!(shared_chains(&c), [names::IPT_TOPLEVEL_DNAT]);
        assert_eq!(skeleton(&c).len(), 2);
    }

    /// What the tools' writer writes for an ADD from `dump`, refusing another attachment's
    /// chain that DNATs one of the ports (as the ADD does where the table is read whole).
    fn add_lines(
        dump: &TableDump,
        config: &Config,
        container_id: &str,
        ip: IpNet,
    ) -> Result<Vec<String>, PortmapError> {
        let fam = IpFamily::of(ip.addr());
        if let Some((chain, m)) = ports::table_holders(dump, config, container_id, fam).first() {
            return Err(ports::table_refusal(dump, chain, m));
        }
        let part = add_part(config, container_id, ip);
        Ok(writer::ensure_lines(dump, &part)
            .map_err(PortmapError::Iptables)?
            .0)
    }

    /// What CHECK finds missing first in `dump`, as the tools' writer reads it.
    fn check_dump(
        dump: &TableDump,
        config: &Config,
        container_id: &str,
        ip: IpNet,
    ) -> Option<Missing> {
        let own = own_part(config, container_id, ip);
        if let Some(absent) = writer::absent_in(dump, &own) {
            return Some(own_missing(&own, absent));
        }
        let shared = shared_part(config, IpFamily::of(ip.addr()));
        writer::absent_in(dump, &shared).map(|absent| shared_absent(&shared, absent))
    }

    fn tcp(host_port: u16) -> PortMapping {
        m(host_port, 80, Proto::Tcp, HostIp::All)
    }

    #[test]
    fn check_names_a_missing_shared_object_as_the_dump_shows_it() {
        let shared = shared_part(&config(Vec::new()), IpFamily::V4);
        assert_eq!(
            shared_absent(&shared, Absent::Chain("CNI-HOSTPORT-MASQ".into())),
            Missing::Shared("chain CNI-HOSTPORT-MASQ".into())
        );
        let insert = shared
            .rules
            .iter()
            .position(|r| r.chain == "POSTROUTING")
            .unwrap();
        assert_eq!(
            shared_absent(&shared, Absent::Rule { index: insert, args: Vec::new() }),
            Missing::Shared(
                "rule -A POSTROUTING -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ".into()
            )
        );
        let masq = shared
            .rules
            .iter()
            .position(|r| r.chain == "CNI-HOSTPORT-MASQ")
            .unwrap();
        assert_eq!(
            shared_absent(
                &shared,
                Absent::Rule {
                    index: masq,
                    args: Vec::new()
                }
            ),
            Missing::Shared(
                "rule -A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE".into()
            )
        );
    }

    /// The dump an `iptables-save` prints after `lines` (restore lines of [`add_lines`]) are
    /// applied to a table with only the built-in chains.
    fn applied(lines: &[String]) -> TableDump {
        let mut text = String::from(
            ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
        );
        for l in lines {
            if let Some(n) = l.strip_prefix("-N ") {
                text.push_str(&format!(":{n} - [0:0]\n"));
            }
        }
        for l in lines {
            if let Some(r) = l.strip_prefix("-I POSTROUTING 1 ") {
                text.push_str(&format!("-A POSTROUTING {r}\n"));
            } else if l.starts_with("-A ") {
                text.push_str(&format!("{l}\n"));
            }
        }
        TableDump::parse(&text).unwrap()
    }

    /// CHECK (and the ADD plan it shares) of an attachment with 20 000 mappings, 60 000 rules
    /// in its chain: each rule is looked up once, not compared with every other. Comparing
    /// each with each took minutes here; it finishes in well under a second.
    #[test]
    fn check_and_add_of_an_attachment_with_20000_mappings_are_linear() {
        let maps: Vec<PortMapping> = (1..=20_000).map(tcp).collect();
        let c = config(maps);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = applied(&[]);
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        // The shared chains and rules (8), the chain, 3 rules per mapping, 1 entry per 15.
        assert_eq!(lines.len(), 8 + 1 + 60_000 + 20_000_usize.div_ceil(15));
        let full = applied(&lines);
        assert_eq!(check_dump(&full, &c, "ctr", ip), None);
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
    }

    #[test]
    fn add_lines_create_only_what_the_dump_lacks_and_check_names_what_is_missing() {
        let c = config(vec![tcp(8080)]);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = applied(&[]);
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        let chain = names::dnat_chain("net", "ctr");
        assert_eq!(lines[0], "-N CNI-HOSTPORT-SETMARK");
        assert!(lines.contains(&"-I POSTROUTING 1 -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ".to_string()));
        assert!(lines.contains(&format!("-N {chain}")));
        assert_eq!(check_dump(&empty, &c, "ctr", ip), Some(Missing::Chain));
        let full = applied(&lines);
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
        // Without its DNAT rule, then without its entry rule, then without a shared jump.
        let without = |line: &str| {
            let kept: Vec<String> = lines
                .iter()
                .filter(|l| !l.contains(line))
                .cloned()
                .collect();
            check_dump(&applied(&kept), &c, "ctr", ip)
        };
        assert!(
            matches!(without("-j DNAT"), Some(Missing::Rule(r)) if r.contains(&"DNAT".to_string()))
        );
        assert!(matches!(without("--dports 8080"), Some(Missing::Entry(_))));
        assert_eq!(
            without("-A OUTPUT"),
            Some(Missing::Shared(
                "rule -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".into()
            ))
        );
        let removals = unchains("net", "ctr", &[IpFamily::V4], None);
        let removals: Vec<&Unchain> = removals.iter().collect();
        let del = writer::removal_lines(&full, &removals).unwrap();
        assert_eq!(del.len(), 3, "{del:?}");
        assert!(del[0].starts_with("-D CNI-HOSTPORT-DNAT -p tcp"));
        assert_eq!(del[1], format!("-F {chain}"));
    }
}
