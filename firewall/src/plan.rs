//! Pure planning: what an attachment needs (from prevResult), and for iptables the layout it
//! wants in the `filter` table as the one writer's plan ([`iptables_part`]: chains and rules
//! in the tools' words), what CHECK names when the writer finds part of it absent, and the
//! accepts DEL deletes. Nothing here touches the kernel.

use std::collections::HashSet;
use std::net::IpAddr;

use cni::types::CniResult;
use netfilter::iptables::native::{Lookup, RuleSpec};
use netfilter::iptables::writer::{Absent, Part, Unrule};
use netfilter::iptables::{Family, TableDump, restore_line};
use netlink::census::NetnsId;

use crate::config::{Config, IngressPolicy};
use crate::error::FirewallError;
use crate::names::{
    ADMIN_JUMP_COMMENT, CNI_FORWARD_CHAIN, FORWARD_CHAIN, FORWARD_JUMP_COMMENT, STAGE1_CHAIN,
    STAGE2_CHAIN, isolation_comment, isolation_default_comment,
};

/// What one attachment needs opened: its addresses and, for an ingress policy, its bridge.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    /// Every address of prevResult (as the reference: all IPs, whatever their interface),
    /// without duplicates, in order.
    pub ips: Vec<IpAddr>,
    /// The bridge (`interfaces[0].name`) when an ingress policy other than `open` is set.
    pub bridge: Option<String>,
    /// The owner's network namespace, which an ADD records with the attachment so that
    /// `reconcile` can tell whether it is gone; `None` for other verbs.
    pub netns: Option<NetnsId>,
}

impl Target {
    /// The target of an ADD or CHECK.
    ///
    /// # Errors
    /// When the policy needs a bridge and prevResult names none (the reference's messages).
    pub fn from_result(result: &CniResult, config: &Config) -> Result<Target, FirewallError> {
        let bridge = match config.ingress {
            IngressPolicy::Open => None,
            policy => Some(bridge_name(result, policy)?),
        };
        Ok(Target {
            ips: Target::addresses(result),
            bridge,
            netns: None,
        })
    }

    /// Every address of `result` (all IPs, whatever their interface), without duplicates.
    #[must_use]
    pub fn addresses(result: &CniResult) -> Vec<IpAddr> {
        let mut ips = Vec::new();
        for ip in &result.ips {
            let addr = ip.address.addr();
            if !ips.contains(&addr) {
                ips.push(addr);
            }
        }
        ips
    }

    /// The addresses of one family.
    pub fn ips_of(&self, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
        self.ips
            .iter()
            .copied()
            .filter(move |ip| Family::of(ip) == family)
    }

    /// The families that have addresses (IPv4 first).
    #[must_use]
    pub fn families(&self) -> Vec<Family> {
        Family::BOTH
            .into_iter()
            .filter(|f| self.ips_of(*f).next().is_some())
            .collect()
    }
}

fn bridge_name(result: &CniResult, policy: IngressPolicy) -> Result<String, FirewallError> {
    let Some(first) = result.interfaces.first() else {
        return Err(FirewallError::NoInterface {
            policy: policy.name(),
        });
    };
    if first.name.is_empty() {
        return Err(FirewallError::EmptyBridgeName);
    }
    Ok(first.name.clone())
}

/// `10.0.0.2/32` or `fd00::2/128`, as iptables-save prints a host address.
#[must_use]
pub fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// A rule: its chain and its arguments in iptables-save's canonical form.
pub type IptRule = (&'static str, Vec<String>);

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// `FORWARD`'s jump to `CNI-FORWARD`.
#[must_use]
pub fn forward_jump() -> Vec<String> {
    args(&[
        "-m",
        "comment",
        "--comment",
        FORWARD_JUMP_COMMENT,
        "-j",
        CNI_FORWARD_CHAIN,
    ])
}

/// `CNI-FORWARD`'s jump to the admin chain.
#[must_use]
pub fn admin_jump(admin: &str) -> Vec<String> {
    args(&[
        "-m",
        "comment",
        "--comment",
        ADMIN_JUMP_COMMENT,
        "-j",
        admin,
    ])
}

/// The two per-address accepts (return traffic to the address, anything from it).
#[must_use]
pub fn ip_rules(ip: IpAddr) -> [Vec<String>; 2] {
    let cidr = host_cidr(ip);
    [
        args(&[
            "-d",
            &cidr,
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ]),
        args(&["-s", &cidr, "-j", "ACCEPT"]),
    ]
}

/// Where a skeleton or isolation rule goes when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    First,
    Last,
}

/// The isolation rules of a bridge under `policy`, in the order the reference ensures them.
fn isolation_rules(bridge: &str, policy: IngressPolicy) -> Vec<(&'static str, Place, Vec<String>)> {
    let own = isolation_comment(policy.name());
    let shared = isolation_default_comment();
    let mut rules = vec![
        (
            FORWARD_CHAIN,
            Place::First,
            args(&["-m", "comment", "--comment", &own, "-j", STAGE1_CHAIN]),
        ),
        (
            STAGE1_CHAIN,
            Place::First,
            args(&[
                "-i",
                bridge,
                "!",
                "-o",
                bridge,
                "-m",
                "comment",
                "--comment",
                &own,
                "-j",
                STAGE2_CHAIN,
            ]),
        ),
    ];
    if policy == IngressPolicy::Isolated {
        rules.push((
            STAGE1_CHAIN,
            Place::First,
            args(&[
                "-i",
                bridge,
                "-o",
                bridge,
                "-m",
                "comment",
                "--comment",
                &own,
                "-j",
                "DROP",
            ]),
        ));
    }
    let ret = args(&["-m", "comment", "--comment", &shared, "-j", "RETURN"]);
    rules.push((STAGE1_CHAIN, Place::Last, ret.clone()));
    rules.push((
        STAGE2_CHAIN,
        Place::First,
        args(&[
            "-o",
            bridge,
            "-m",
            "comment",
            "--comment",
            &shared,
            "-j",
            "DROP",
        ]),
    ));
    rules.push((STAGE2_CHAIN, Place::Last, ret));
    rules
}

/// The layout ADD of `target` wants in `family`'s `filter` table, in the reference's order
/// (CHECK verifies the same): the chains `CNI-FORWARD` and the admin chain, the jumps to them
/// (inserted first where absent), the two accepts of each address of the family (appended,
/// their handles recorded), and the bridge's isolation chains and rules. With `fresh` (an
/// attachment none of whose addresses the state knows, so none of its accepts is there but
/// for copies something else wrote), the accepts are not looked for and the admin jump only
/// as the chain's first jump to it, so that the listing of `CNI-FORWARD`, which grows with the
/// attachments, stops near its top.
#[must_use]
pub fn iptables_part(family: Family, config: &Config, target: &Target, fresh: bool) -> Part {
    let mut chains = vec![CNI_FORWARD_CHAIN.to_owned(), config.admin_chain.clone()];
    let lookup = |when_fresh| if fresh { when_fresh } else { Lookup::Listed };
    let mut rules = vec![
        RuleSpec::insert(FORWARD_CHAIN, &forward_jump()),
        RuleSpec::insert(CNI_FORWARD_CHAIN, &admin_jump(&config.admin_chain))
            .looked_up(lookup(Lookup::First)),
    ];
    for ip in target.ips_of(family) {
        rules.extend(ip_rules(ip).map(|rule| {
            RuleSpec::append_recorded(CNI_FORWARD_CHAIN, &rule).looked_up(lookup(Lookup::Absent))
        }));
    }
    if let Some(bridge) = target
        .bridge
        .as_deref()
        .filter(|_| config.ingress != IngressPolicy::Open)
    {
        chains.extend([STAGE1_CHAIN.to_owned(), STAGE2_CHAIN.to_owned()]);
        rules.extend(isolation_specs(bridge, config.ingress));
    }
    Part {
        family,
        chains,
        rules,
    }
}

/// The address of each accept of [`iptables_part`] (its rules marked recorded, in order).
#[must_use]
pub fn accept_ips(family: Family, target: &Target) -> Vec<IpAddr> {
    target.ips_of(family).flat_map(|ip| [ip, ip]).collect()
}

/// The accepts of `ips` in `family` (those of other families left out), every copy of which
/// DEL deletes from `CNI-FORWARD`, or exactly those of `recorded`. Chains, jumps and isolation
/// rules are shared and stay.
#[must_use]
pub fn iptables_unrule(
    family: Family,
    ips: &[IpAddr],
    recorded: Option<netfilter::iptables::native::Recorded>,
) -> Unrule {
    Unrule {
        family,
        chain: CNI_FORWARD_CHAIN.to_owned(),
        rules: ips
            .iter()
            .filter(|ip| Family::of(ip) == family)
            .flat_map(|ip| ip_rules(*ip))
            .collect(),
        recorded,
    }
}

/// The isolation chains and rules of `target`'s bridge under `config`'s policy in `family`'s
/// `filter` table, for the firewalld backend, which writes these alone (as the reference
/// does); `None` without a policy or a bridge.
#[must_use]
pub fn isolation_part(family: Family, config: &Config, target: &Target) -> Option<Part> {
    let bridge = target
        .bridge
        .as_deref()
        .filter(|_| config.ingress != IngressPolicy::Open)?;
    Some(Part {
        family,
        chains: vec![STAGE1_CHAIN.to_owned(), STAGE2_CHAIN.to_owned()],
        rules: isolation_specs(bridge, config.ingress),
    })
}

/// [`isolation_rules`] as the writer's rules.
fn isolation_specs(bridge: &str, policy: IngressPolicy) -> Vec<RuleSpec> {
    isolation_rules(bridge, policy)
        .into_iter()
        .map(|(chain, place, rule)| match place {
            Place::First => RuleSpec::insert(chain, &rule),
            Place::Last => RuleSpec::append(chain, &rule),
        })
        .collect()
}

/// A rule CHECK did not find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingRule {
    /// The family.
    pub family: Family,
    /// Its chain.
    pub chain: String,
    /// Its arguments.
    pub rule: Vec<String>,
    /// The chain that does not exist, when that is why: the rule's own, or the one it jumps to.
    pub absent_chain: Option<String>,
}

impl MissingRule {
    /// The reference's message for the rules it checks (`expected FORWARD rule [...] not
    /// found` for the jump to `CNI-FORWARD`, `expected CNI-FORWARD rule [...] not found` for
    /// the admin jump, `expected rule [...] not found` for an accept: Go's `%v` of the
    /// arguments), and the same form naming the chain for the isolation rules, which only we
    /// check.
    #[must_use]
    pub fn message(&self) -> String {
        let args = format!("[{}]", self.rule.join(" "));
        let is_accept =
            self.chain == CNI_FORWARD_CHAIN && self.rule.last().is_some_and(|t| t == "ACCEPT");
        if is_accept {
            format!("expected rule {args} not found")
        } else {
            format!("expected {} rule {args} not found", self.chain)
        }
    }

    /// Where it was looked for, and the chain that is absent, if one is.
    #[must_use]
    pub fn details(&self) -> String {
        let place = format!("{}-save -t filter", self.family);
        let rule = restore_line("-A", &self.chain, &self.rule)
            .unwrap_or_else(|_| format!("-A {} {}", self.chain, self.rule.join(" ")));
        match &self.absent_chain {
            Some(chain) => format!("{place} has no chain {chain}, so no rule {rule}"),
            None => format!("{place} has no rule {rule}"),
        }
    }
}

/// The first rule of `part` ([`iptables_part`]) CHECK finds missing, in the reference's
/// order; `None` when complete. `absent` is the writer's answer for a part
/// ([`netfilter::iptables::writer::Writer::missing`]): asked of the whole part first (one
/// read), and only when something is absent of each rule in turn, with the chains it is in
/// and jumps to, so that the rule named is the first missing one and the chain named the
/// first of those two that is absent.
///
/// # Errors
/// `absent`'s.
pub fn iptables_missing<E>(
    part: &Part,
    mut absent: impl FnMut(&Part) -> Result<Option<Absent>, E>,
) -> Result<Option<MissingRule>, E> {
    let Some(whole) = absent(part)? else {
        return Ok(None);
    };
    for rule in &part.rules {
        let target = rule
            .args
            .iter()
            .skip_while(|a| *a != "-j")
            .nth(1)
            .filter(|t| !BUILTIN_TARGETS.contains(&t.as_str()));
        let chains = std::iter::once(&rule.chain)
            .chain(target)
            .filter(|c| part.chains.contains(c))
            .cloned()
            .collect();
        let one = Part {
            family: part.family,
            chains,
            rules: vec![rule.clone()],
        };
        if let Some(found) = absent(&one)? {
            return Ok(Some(missing_rule(part.family, rule, found)));
        }
    }
    // Put back in between the two reads: name what the first found.
    let rule = match &whole {
        Absent::Rule { index, .. } => part.rules.get(*index),
        Absent::Chain(chain) => part
            .rules
            .iter()
            .find(|r| r.chain == *chain || r.args.last() == Some(chain)),
    };
    Ok(rule.map(|rule| missing_rule(part.family, rule, whole)))
}

/// What CHECK names of `rule`, found absent as `absent` says.
fn missing_rule(family: Family, rule: &RuleSpec, absent: Absent) -> MissingRule {
    MissingRule {
        family,
        chain: rule.chain.clone(),
        rule: rule.args.clone(),
        absent_chain: match absent {
            Absent::Chain(chain) => Some(chain),
            Absent::Rule { .. } => None,
        },
    }
}

/// Targets that are not chains.
const BUILTIN_TARGETS: [&str; 3] = ["ACCEPT", "DROP", "RETURN"];

/// What a dumped table lacks of many attachments' rules ([`iptables_lacking`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lacking {
    /// The shared rules that are missing, described (`FORWARD jump to CNI-FORWARD`).
    pub shared: Vec<String>,
    /// The targets (their indices) that lack a rule of their own, with what they lack
    /// (`accepts of 10.0.0.2`, `isolation of br0`).
    pub targets: Vec<(usize, Vec<String>)>,
}

/// What `dump` lacks in `family` of what ADD made for each of `targets` under `config`: the
/// rules CHECK looks for of one attachment ([`iptables_part`]) (both jumps, so the chains they
/// jump to; the accepts; the bridge's isolation rules), looked up in one index of the dump,
/// so that thousands of attachments cost one pass over their chains.
#[must_use]
pub fn iptables_lacking(
    dump: &TableDump,
    family: Family,
    config: &Config,
    targets: &[&Target],
) -> Lacking {
    let mut index: HashSet<(&str, &[String])> = HashSet::new();
    for chain in dump.chains() {
        for rule in dump.rules(chain) {
            index.insert((chain.as_str(), rule.as_slice()));
        }
    }
    let has = |chain: &str, rule: &[String]| index.contains(&(chain, rule));
    let mut lacking = Lacking::default();
    if !has(FORWARD_CHAIN, &forward_jump()) {
        lacking
            .shared
            .push(format!("{FORWARD_CHAIN} jump to {CNI_FORWARD_CHAIN}"));
    }
    if !has(CNI_FORWARD_CHAIN, &admin_jump(&config.admin_chain))
        || !dump.has_chain(&config.admin_chain)
    {
        lacking.shared.push(format!(
            "{CNI_FORWARD_CHAIN} jump to {}",
            config.admin_chain
        ));
    }
    let mut isolation: Vec<(&str, bool)> = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        // ADD writes in the families the attachment has addresses of, its isolation too.
        if target.ips_of(family).next().is_none() {
            continue;
        }
        let mut what = Vec::new();
        for ip in target.ips_of(family) {
            if ip_rules(ip).iter().any(|r| !has(CNI_FORWARD_CHAIN, r)) {
                what.push(format!("accepts of {ip}"));
            }
        }
        if let Some(bridge) = target.bridge.as_deref() {
            let complete = match isolation.iter().find(|(b, _)| *b == bridge) {
                Some((_, complete)) => *complete,
                None => {
                    let complete = isolation_rules(bridge, config.ingress)
                        .iter()
                        .all(|(chain, _, rule)| has(chain, rule));
                    isolation.push((bridge, complete));
                    complete
                }
            };
            if !complete {
                what.push(format!("isolation of {bridge}"));
            }
        }
        if !what.is_empty() {
            lacking.targets.push((i, what));
        }
    }
    lacking
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendChoice;
    use netfilter::iptables::writer::{absent_in, deletion_lines, ensure_lines};

    fn config(ingress: IngressPolicy) -> Config {
        Config {
            backend: BackendChoice::Iptables,
            admin_chain: "CNI-ADMIN".into(),
            zone: "trusted".into(),
            ingress,
        }
    }

    fn target(bridge: Option<&str>) -> Target {
        Target {
            ips: vec!["10.1.0.5".parse().unwrap(), "fd01::5".parse().unwrap()],
            bridge: bridge.map(str::to_owned),
            netns: None,
        }
    }

    const EMPTY: &str =
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";

    /// The filter table Go firewall v1.1.1 leaves after ADD of 10.1.0.5 with `same-bridge`
    /// on `br0` (captured with iptables-save in a scratch namespace).
    const GO_SAME_BRIDGE: &str = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-ADMIN - [0:0]
:CNI-FORWARD - [0:0]
:CNI-ISOLATION-STAGE-1 - [0:0]
:CNI-ISOLATION-STAGE-2 - [0:0]
-A FORWARD -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j CNI-ISOLATION-STAGE-1
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
-A CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT
-A CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j CNI-ISOLATION-STAGE-2
-A CNI-ISOLATION-STAGE-1 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j RETURN
-A CNI-ISOLATION-STAGE-2 -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j DROP
-A CNI-ISOLATION-STAGE-2 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j RETURN
COMMIT
"#;

    /// The restore lines with which the tools' writer takes `dump` to `part`.
    fn lines(dump: &TableDump, part: &Part) -> Vec<String> {
        ensure_lines(dump, part).unwrap().0
    }

    /// CHECK's answer on `dump`, as the tools' writer finds it.
    fn missing(dump: &TableDump, part: &Part) -> Option<MissingRule> {
        iptables_missing(part, |p| Ok::<_, ()>(absent_in(dump, p))).unwrap()
    }

    #[test]
    fn add_on_an_empty_table_declares_chains_then_jumps_then_accepts() {
        let dump = TableDump::parse(EMPTY).unwrap();
        let part = iptables_part(
            Family::V4,
            &config(IngressPolicy::Open),
            &target(None),
            false,
        );
        assert_eq!(
            lines(&dump, &part),
            [
                "-N CNI-FORWARD",
                "-N CNI-ADMIN",
                r#"-I FORWARD 1 -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD"#,
                r#"-I CNI-FORWARD 1 -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN"#,
                "-A CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
            ]
        );
        let v6 = iptables_part(
            Family::V6,
            &config(IngressPolicy::Open),
            &target(None),
            false,
        );
        assert!(lines(&dump, &v6).contains(&"-A CNI-FORWARD -s fd01::5/128 -j ACCEPT".to_owned()));
        // The accepts are the recorded rules, for their addresses in order.
        let recorded: Vec<&RuleSpec> = part.rules.iter().filter(|r| r.recorded).collect();
        assert_eq!(recorded.len(), 2);
        assert!(
            recorded
                .iter()
                .all(|r| r.args.contains(&"10.1.0.5/32".to_owned()))
        );
        let ip: IpAddr = "10.1.0.5".parse().unwrap();
        assert_eq!(accept_ips(Family::V4, &target(None)), [ip, ip]);
    }

    #[test]
    fn an_add_the_state_does_not_know_looks_for_neither_its_accepts_nor_beyond_the_admin_jump() {
        let c = config(IngressPolicy::Open);
        let fresh = iptables_part(Family::V4, &c, &target(None), true);
        let known = iptables_part(Family::V4, &c, &target(None), false);
        let lookups = |part: &Part| part.rules.iter().map(|r| r.lookup).collect::<Vec<_>>();
        assert_eq!(
            lookups(&fresh),
            [
                Lookup::Listed,
                Lookup::First,
                Lookup::Absent,
                Lookup::Absent
            ]
        );
        assert!(lookups(&known).iter().all(|l| *l == Lookup::Listed));
        // The rules are the same.
        let rules = |part: &Part| {
            part.rules
                .iter()
                .map(|r| (r.chain.clone(), r.args.clone(), r.position, r.recorded))
                .collect::<Vec<_>>()
        };
        assert_eq!(rules(&fresh), rules(&known));
    }

    #[test]
    fn add_over_the_go_layout_is_a_no_op_and_check_finds_everything() {
        let dump = TableDump::parse(GO_SAME_BRIDGE).unwrap();
        let c = config(IngressPolicy::SameBridge);
        let t = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let part = iptables_part(Family::V4, &c, &t, false);
        assert!(lines(&dump, &part).is_empty());
        assert_eq!(missing(&dump, &part), None);
        // Another address is missing, and so is the isolated policy's own rule.
        let other = Target {
            ips: vec!["10.1.0.6".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let other_part = iptables_part(Family::V4, &c, &other, false);
        let ip: IpAddr = "10.1.0.6".parse().unwrap();
        let accepts: Vec<String> = ip_rules(ip)
            .iter()
            .map(|rule| restore_line("-A", CNI_FORWARD_CHAIN, rule).unwrap())
            .collect();
        assert_eq!(lines(&dump, &other_part), accepts);
        let missing_rule = missing(&dump, &other_part).unwrap();
        assert_eq!(
            missing_rule.message(),
            "expected rule [-d 10.1.0.6/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT] not found"
        );
        assert_eq!(
            missing_rule.details(),
            "iptables-save -t filter has no rule -A CNI-FORWARD -d 10.1.0.6/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        );
        let isolated = config(IngressPolicy::Isolated);
        let isolated_part = iptables_part(Family::V4, &isolated, &t, false);
        assert_eq!(
            lines(&dump, &isolated_part),
            [
                r#"-I FORWARD 1 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j CNI-ISOLATION-STAGE-1"#,
                r#"-I CNI-ISOLATION-STAGE-1 1 -i br0 ! -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j CNI-ISOLATION-STAGE-2"#,
                r#"-I CNI-ISOLATION-STAGE-1 1 -i br0 -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j DROP"#,
            ]
        );
    }

    #[test]
    fn firewalld_writes_the_isolation_rules_alone_and_nothing_without_a_policy() {
        let t = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let same_bridge = config(IngressPolicy::SameBridge);
        let part = isolation_part(Family::V4, &same_bridge, &t).unwrap();
        let whole = iptables_part(Family::V4, &same_bridge, &t, false);
        assert_eq!(part.chains, whole.chains[2..]);
        assert_eq!(part.rules, whole.rules[4..]);
        let go = TableDump::parse(GO_SAME_BRIDGE).unwrap();
        assert!(lines(&go, &part).is_empty());
        assert_eq!(lines(&TableDump::parse(EMPTY).unwrap(), &part).len(), 2 + 5);
        assert_eq!(
            isolation_part(Family::V4, &config(IngressPolicy::Open), &t),
            None
        );
        assert_eq!(
            isolation_part(Family::V4, &same_bridge, &target(None)),
            None
        );
    }

    #[test]
    fn add_on_an_empty_table_with_same_bridge_rebuilds_the_go_layout_in_order() {
        let dump = TableDump::parse(EMPTY).unwrap();
        let c = config(IngressPolicy::SameBridge);
        let t = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let lines = lines(&dump, &iptables_part(Family::V4, &c, &t, false));
        assert_eq!(lines.len(), 4 + 2 + 2 + 5);
        assert_eq!(
            lines[..4],
            [
                "-N CNI-FORWARD",
                "-N CNI-ADMIN",
                "-N CNI-ISOLATION-STAGE-1",
                "-N CNI-ISOLATION-STAGE-2",
            ]
        );
        // Applied in order, they leave the Go plugin's table.
        let mut rules: Vec<(String, Vec<String>)> = Vec::new();
        for line in &lines[4..] {
            let words = netfilter::iptables::split_args(line).unwrap();
            match words.as_slice() {
                [op, chain, pos, rest @ ..] if op == "-I" && pos == "1" => {
                    let at = rules
                        .iter()
                        .position(|(c, _)| c == chain)
                        .unwrap_or(rules.len());
                    rules.insert(at, (chain.clone(), rest.to_vec()));
                }
                [op, chain, rest @ ..] if op == "-A" => {
                    let at = rules
                        .iter()
                        .rposition(|(c, _)| c == chain)
                        .map_or(rules.len(), |i| i + 1);
                    rules.insert(at, (chain.clone(), rest.to_vec()));
                }
                _ => panic!("{line}"),
            }
        }
        let go = TableDump::parse(GO_SAME_BRIDGE).unwrap();
        for chain in ["FORWARD", CNI_FORWARD_CHAIN, STAGE1_CHAIN, STAGE2_CHAIN] {
            let ours: Vec<Vec<String>> = rules
                .iter()
                .filter(|(c, _)| c == chain)
                .map(|(_, r)| r.clone())
                .collect();
            assert_eq!(ours, go.rules(chain), "{chain}");
        }
    }

    #[test]
    fn del_removes_every_copy_of_the_accepts_and_nothing_shared() {
        let doubled = GO_SAME_BRIDGE.replace(
            "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
            "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
        );
        let dump = TableDump::parse(&doubled).unwrap();
        let ips = ["10.1.0.5".parse().unwrap(), "10.1.0.9".parse().unwrap()];
        let v4 = iptables_unrule(Family::V4, &ips, None);
        let lines = deletion_lines(&dump, &[&v4]).unwrap();
        assert_eq!(
            lines,
            [
                "-D CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
            ]
        );
        let v6 = iptables_unrule(Family::V6, &ips, None);
        assert!(v6.rules.is_empty());
        assert!(deletion_lines(&dump, &[&v6]).unwrap().is_empty());
    }

    #[test]
    fn check_names_the_jumps_as_the_reference_does_and_the_absent_chain_in_details() {
        let c = config(IngressPolicy::SameBridge);
        let t = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let part = iptables_part(Family::V4, &c, &t, false);
        let forward_jump =
            "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD\n";
        let admin_jump = "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN\n";
        let stage1 = [
            ":CNI-ISOLATION-STAGE-1 - [0:0]\n",
            "-A FORWARD -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-1\n",
            "-A CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2\n",
            "-A CNI-ISOLATION-STAGE-1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j RETURN\n",
        ];
        let cases: [(&[&str], &str, Option<&str>); 7] = [
            (
                &[forward_jump],
                "expected FORWARD rule [-m comment --comment CNI firewall plugin rules -j CNI-FORWARD] not found",
                None,
            ),
            (
                &[
                    ":CNI-FORWARD - [0:0]\n",
                    forward_jump,
                    admin_jump,
                    "-A CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
                    "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
                ],
                "expected FORWARD rule [-m comment --comment CNI firewall plugin rules -j CNI-FORWARD] not found",
                Some("CNI-FORWARD"),
            ),
            (
                &[":CNI-ADMIN - [0:0]\n", admin_jump],
                "expected CNI-FORWARD rule [-m comment --comment CNI firewall plugin admin overrides -j CNI-ADMIN] not found",
                Some("CNI-ADMIN"),
            ),
            (
                &["-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n"],
                "expected rule [-s 10.1.0.5/32 -j ACCEPT] not found",
                None,
            ),
            (
                &[
                    "-A CNI-ISOLATION-STAGE-2 -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j DROP\n",
                ],
                "expected CNI-ISOLATION-STAGE-2 rule [-o br0 -m comment --comment CNI firewall plugin rules (ingressPolicy: same-bridge) -j DROP] not found",
                None,
            ),
            // A missing chain is not named before an earlier rule that is missing too: the
            // first missing rule of the reference's order is.
            (
                &[
                    stage1[0],
                    stage1[1],
                    stage1[2],
                    stage1[3],
                    "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
                ],
                "expected rule [-s 10.1.0.5/32 -j ACCEPT] not found",
                None,
            ),
            (
                &stage1,
                "expected FORWARD rule [-m comment --comment CNI firewall plugin rules (ingressPolicy: same-bridge) -j CNI-ISOLATION-STAGE-1] not found",
                Some("CNI-ISOLATION-STAGE-1"),
            ),
        ];
        for (lines, msg, absent) in cases {
            let text = lines.iter().fold(GO_SAME_BRIDGE.to_owned(), |text, line| {
                assert!(text.contains(line), "{line}");
                text.replace(line, "")
            });
            let dump = TableDump::parse(&text).unwrap();
            let missing = missing(&dump, &part).unwrap();
            assert_eq!(missing.message(), msg);
            assert_eq!(missing.absent_chain.as_deref(), absent);
            if let Some(chain) = absent {
                assert!(
                    missing.details().contains(&format!("has no chain {chain}")),
                    "{}",
                    missing.details()
                );
            }
        }
    }

    #[test]
    fn a_policy_without_a_bridge_in_prev_result_is_the_references_error() {
        let result = CniResult::default();
        let err = Target::from_result(&result, &config(IngressPolicy::Isolated)).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"interface needs to be set for ingress policy "isolated", make sure to chain "firewall" plugin with "bridge""#
        );
        let unnamed = CniResult {
            interfaces: vec![cni::types::Interface::default()],
            ..CniResult::default()
        };
        let err = Target::from_result(&unnamed, &config(IngressPolicy::SameBridge)).unwrap_err();
        assert_eq!(err.to_string(), "got empty bridge name");
        assert_eq!(
            Target::from_result(&result, &config(IngressPolicy::Open)).unwrap(),
            Target::default()
        );
    }

    #[test]
    fn lacking_finds_what_each_of_many_attachments_misses_in_one_index() {
        let c = config(IngressPolicy::SameBridge);
        let one = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let two = Target {
            ips: vec!["10.1.0.6".parse().unwrap(), "fd01::6".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        // What Go's ADD of `one` made: nothing of `one` lacks, `two` its accepts.
        let dump = TableDump::parse(GO_SAME_BRIDGE).unwrap();
        let lacking = iptables_lacking(&dump, Family::V4, &c, &[&one, &two]);
        assert_eq!(
            lacking,
            Lacking {
                shared: Vec::new(),
                targets: vec![(1, vec!["accepts of 10.1.0.6".to_owned()])],
            }
        );
        // Each agrees with the one-attachment CHECK.
        assert!(missing(&dump, &iptables_part(Family::V4, &c, &one, false)).is_none());
        assert!(missing(&dump, &iptables_part(Family::V4, &c, &two, false)).is_some());
        // A flushed table lacks everything, the shared jumps included.
        let empty = TableDump::parse(EMPTY).unwrap();
        let lacking = iptables_lacking(&empty, Family::V4, &c, &[&one, &two]);
        assert_eq!(
            lacking.shared,
            [
                "FORWARD jump to CNI-FORWARD",
                "CNI-FORWARD jump to CNI-ADMIN"
            ]
        );
        assert_eq!(
            lacking.targets,
            [
                (
                    0,
                    vec![
                        "accepts of 10.1.0.5".to_owned(),
                        "isolation of br0".to_owned()
                    ]
                ),
                (
                    1,
                    vec![
                        "accepts of 10.1.0.6".to_owned(),
                        "isolation of br0".to_owned()
                    ]
                ),
            ]
        );
        // Only the family's own addresses are looked for, and the isolation of those that
        // have some (the dump stands for an ip6 table that has the isolation rules).
        let lacking = iptables_lacking(&dump, Family::V6, &c, &[&one, &two]);
        assert_eq!(
            lacking.targets,
            [(1, vec!["accepts of fd01::6".to_owned()])]
        );
        let lacking = iptables_lacking(&empty, Family::V6, &c, &[&one]);
        assert!(lacking.targets.is_empty(), "{lacking:?}");
    }
}
