//! Pure planning: what an attachment needs (from prevResult), and for iptables the restore
//! lines that take a dumped filter table to the wanted layout. Nothing here touches the kernel.

use std::collections::HashSet;
use std::net::IpAddr;

use cni::types::CniResult;
use netfilter::iptables::{Family, IptablesError, TableDump, restore_line};
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

/// What ADD of an attachment writes in one family, in order: `head`, the accepts, `tail`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddPlan {
    /// Restore lines for the chains the table lacks (`-N`; never `:CHAIN`, which would flush
    /// an existing one) and the jumps absent anywhere in their chain (inserted first).
    pub head: Vec<String>,
    /// The attachment's accepts that `CNI-FORWARD` lacks, with their address, as the
    /// arguments of `-A CNI-FORWARD`.
    pub accepts: Vec<(IpAddr, Vec<String>)>,
    /// Restore lines for the bridge's isolation chains and rules.
    pub tail: Vec<String>,
}

impl AddPlan {
    /// True when everything is in place.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.accepts.is_empty() && self.tail.is_empty()
    }

    /// The writes other than the accepts (chains, jumps, isolation rules) as restore lines.
    #[must_use]
    pub fn skeleton_lines(&self) -> Vec<String> {
        self.head.iter().chain(&self.tail).cloned().collect()
    }

    /// The accepts as restore lines.
    ///
    /// # Errors
    /// An argument that cannot be written on a restore line.
    pub fn accept_lines(&self) -> Result<Vec<String>, IptablesError> {
        self.accepts
            .iter()
            .map(|(_, args)| restore_line("-A", CNI_FORWARD_CHAIN, args))
            .collect()
    }

    /// Every write as restore lines, in order.
    ///
    /// # Errors
    /// An argument that cannot be written on a restore line.
    pub fn lines(&self) -> Result<Vec<String>, IptablesError> {
        let mut lines = self.head.clone();
        lines.extend(self.accept_lines()?);
        lines.extend(self.tail.iter().cloned());
        Ok(lines)
    }
}

/// What makes `dump` hold what ADD of `target` needs in `family` ([`AddPlan`]): the chains
/// the dump lacks, the jumps if absent anywhere in their chain, the per-address accepts if
/// absent, and the bridge's isolation rules. Empty when everything is in place.
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn iptables_add(
    dump: &TableDump,
    family: Family,
    config: &Config,
    target: &Target,
) -> Result<AddPlan, IptablesError> {
    let mut plan = AddPlan::default();
    for chain in [CNI_FORWARD_CHAIN, config.admin_chain.as_str()] {
        if !dump.has_chain(chain) {
            plan.head.push(restore_line::<&str>("-N", chain, &[])?);
        }
    }
    let fwd = forward_jump();
    if !dump.has_rule(FORWARD_CHAIN, &fwd) {
        plan.head.push(restore_line("-I", FORWARD_CHAIN, &fwd)?);
    }
    let admin = admin_jump(&config.admin_chain);
    if !dump.has_rule(CNI_FORWARD_CHAIN, &admin) {
        plan.head
            .push(restore_line("-I", CNI_FORWARD_CHAIN, &admin)?);
    }
    for ip in target.ips_of(family) {
        for rule in ip_rules(ip) {
            if !dump.has_rule(CNI_FORWARD_CHAIN, &rule) {
                plan.accepts.push((ip, rule));
            }
        }
    }
    if let Some(bridge) = &target.bridge {
        plan.tail = iptables_isolation(dump, config.ingress, bridge)?;
    }
    // Rendered once here, so a rule that cannot be written fails before anything is done.
    plan.lines()?;
    Ok(plan)
}

/// Restore lines that add the isolation chains and rules of `bridge` under `policy` that
/// `dump` lacks (the firewalld backend uses these alone, as the reference does).
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn iptables_isolation(
    dump: &TableDump,
    policy: IngressPolicy,
    bridge: &str,
) -> Result<Vec<String>, IptablesError> {
    let mut lines = Vec::new();
    if policy == IngressPolicy::Open {
        return Ok(lines);
    }
    for chain in [STAGE1_CHAIN, STAGE2_CHAIN] {
        if !dump.has_chain(chain) {
            lines.push(restore_line::<&str>("-N", chain, &[])?);
        }
    }
    let mut added: Vec<(&str, Vec<String>)> = Vec::new();
    for (chain, place, rule) in isolation_rules(bridge, policy) {
        let pending = added.iter().any(|(c, r)| *c == chain && *r == rule);
        if dump.has_rule(chain, &rule) || pending {
            continue;
        }
        let op = if place == Place::First { "-I" } else { "-A" };
        lines.push(restore_line(op, chain, &rule)?);
        added.push((chain, rule));
    }
    Ok(lines)
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

/// The first rule CHECK finds missing in `family`; `None` when complete. Checks both jumps
/// (so the chains they jump to), this attachment's accepts and its bridge's isolation rules,
/// in the reference's order.
#[must_use]
pub fn iptables_missing(
    dump: &TableDump,
    family: Family,
    config: &Config,
    target: &Target,
) -> Option<MissingRule> {
    let mut wanted: Vec<(&str, Vec<String>)> = vec![
        (FORWARD_CHAIN, forward_jump()),
        (CNI_FORWARD_CHAIN, admin_jump(&config.admin_chain)),
    ];
    for ip in target.ips_of(family) {
        wanted.extend(ip_rules(ip).map(|r| (CNI_FORWARD_CHAIN, r)));
    }
    if let Some(bridge) = &target.bridge {
        wanted.extend(
            isolation_rules(bridge, config.ingress)
                .into_iter()
                .map(|(c, _, r)| (c, r)),
        );
    }
    let (chain, rule) = wanted
        .into_iter()
        .find(|(chain, rule)| !dump.has_rule(chain, rule))?;
    let jumps_to = rule
        .iter()
        .skip_while(|a| *a != "-j")
        .nth(1)
        .filter(|t| !BUILTIN_TARGETS.contains(&t.as_str()));
    let absent_chain = std::iter::once(chain)
        .chain(jumps_to.map(String::as_str))
        .find(|c| !dump.has_chain(c))
        .map(str::to_owned);
    Some(MissingRule {
        family,
        chain: chain.to_owned(),
        rule,
        absent_chain,
    })
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
/// rules [`iptables_missing`] checks for one attachment (both jumps, so the chains they
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

/// Restore lines deleting every copy of the per-address accepts of `ips` in `family` that
/// `dump` holds. Chains, jumps and isolation rules are shared and stay.
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn iptables_del(
    dump: &TableDump,
    family: Family,
    ips: &[IpAddr],
) -> Result<Vec<String>, IptablesError> {
    let mut lines = Vec::new();
    for ip in ips.iter().filter(|ip| Family::of(ip) == family) {
        for rule in ip_rules(*ip) {
            let copies = dump
                .rules(CNI_FORWARD_CHAIN)
                .iter()
                .filter(|r| **r == rule)
                .count();
            for _ in 0..copies {
                lines.push(restore_line("-D", CNI_FORWARD_CHAIN, &rule)?);
            }
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendChoice;

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

    #[test]
    fn add_on_an_empty_table_declares_chains_then_jumps_then_accepts() {
        let dump = TableDump::parse(EMPTY).unwrap();
        let lines = iptables_add(
            &dump,
            Family::V4,
            &config(IngressPolicy::Open),
            &target(None),
        )
        .unwrap()
        .lines()
        .unwrap();
        assert_eq!(
            lines,
            [
                "-N CNI-FORWARD",
                "-N CNI-ADMIN",
                r#"-I FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD"#,
                r#"-I CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN"#,
                "-A CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
            ]
        );
        let v6 = iptables_add(
            &dump,
            Family::V6,
            &config(IngressPolicy::Open),
            &target(None),
        )
        .unwrap()
        .lines()
        .unwrap();
        assert!(v6.contains(&"-A CNI-FORWARD -s fd01::5/128 -j ACCEPT".to_owned()));
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
        assert!(iptables_add(&dump, Family::V4, &c, &t).unwrap().is_empty());
        assert_eq!(iptables_missing(&dump, Family::V4, &c, &t), None);
        // Another address is missing, and so is the isolated policy's own rule.
        let other = Target {
            ips: vec!["10.1.0.6".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let append = iptables_add(&dump, Family::V4, &c, &other).unwrap();
        assert!(append.skeleton_lines().is_empty(), "{append:?}");
        let ip: IpAddr = "10.1.0.6".parse().unwrap();
        assert_eq!(append.accepts, ip_rules(ip).map(|rule| (ip, rule)));
        let missing = iptables_missing(&dump, Family::V4, &c, &other).unwrap();
        assert_eq!(
            missing.message(),
            "expected rule [-d 10.1.0.6/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT] not found"
        );
        assert_eq!(
            missing.details(),
            "iptables-save -t filter has no rule -A CNI-FORWARD -d 10.1.0.6/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        );
        let isolated = config(IngressPolicy::Isolated);
        let plan = iptables_add(&dump, Family::V4, &isolated, &t).unwrap();
        assert!(plan.accepts.is_empty() && !plan.skeleton_lines().is_empty());
        let lines = plan.lines().unwrap();
        assert_eq!(
            lines,
            [
                r#"-I FORWARD -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j CNI-ISOLATION-STAGE-1"#,
                r#"-I CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j CNI-ISOLATION-STAGE-2"#,
                r#"-I CNI-ISOLATION-STAGE-1 -i br0 -o br0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j DROP"#,
            ]
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
        let lines = iptables_add(&dump, Family::V4, &c, &t)
            .unwrap()
            .lines()
            .unwrap();
        assert_eq!(lines.len(), 2 + 2 + 2 + 2 + 5);
        assert!(lines[..2].iter().all(|l| l.starts_with("-N ")));
        assert!(
            lines[6..8]
                .iter()
                .all(|l| l.starts_with("-N CNI-ISOLATION"))
        );
    }

    #[test]
    fn del_removes_every_copy_of_the_accepts_and_nothing_shared() {
        let doubled = GO_SAME_BRIDGE.replace(
            "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
            "-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n-A CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT\n",
        );
        let dump = TableDump::parse(&doubled).unwrap();
        let ips = ["10.1.0.5".parse().unwrap(), "10.1.0.9".parse().unwrap()];
        let lines = iptables_del(&dump, Family::V4, &ips).unwrap();
        assert_eq!(
            lines,
            [
                "-D CNI-FORWARD -d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.5/32 -j ACCEPT",
            ]
        );
        assert!(iptables_del(&dump, Family::V6, &ips).unwrap().is_empty());
    }

    #[test]
    fn check_names_the_jumps_as_the_reference_does_and_the_absent_chain_in_details() {
        let c = config(IngressPolicy::SameBridge);
        let t = Target {
            ips: vec!["10.1.0.5".parse().unwrap()],
            bridge: Some("br0".into()),
            netns: None,
        };
        let forward_jump =
            "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD\n";
        let admin_jump = "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN\n";
        let cases: [(&[&str], &str, Option<&str>); 5] = [
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
        ];
        for (lines, msg, absent) in cases {
            let text = lines.iter().fold(GO_SAME_BRIDGE.to_owned(), |text, line| {
                assert!(text.contains(line), "{line}");
                text.replace(line, "")
            });
            let dump = TableDump::parse(&text).unwrap();
            let missing = iptables_missing(&dump, Family::V4, &c, &t).unwrap();
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
        assert!(iptables_missing(&dump, Family::V4, &c, &one).is_none());
        assert!(iptables_missing(&dump, Family::V4, &c, &two).is_some());
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
