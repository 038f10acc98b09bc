//! Rules in `iptables-save`'s words ⇄ the nf_tables expressions `iptables-nft` makes of them,
//! in the one encoding every release from 1.8.7 to 1.8.11 reads back, and reading every
//! encoding those releases write.
//!
//! [`encode`] parses a rule's arguments as the tool does (options in any order, long and
//! short names, addresses with or without a prefix, numbers in any base the tool reads) and
//! expands them as `iptables-nft` would: interfaces, protocol (`meta l4proto`), source,
//! destination (payload matches, prefixes loaded to their last whole byte as the tool does),
//! then the matches in their order as xtables matches, a counter, and the target (a verdict,
//! or an xtables target). Releases differ in three of these: 1.8.8 and later write `-m tcp`/
//! `-m udp --dport` as a transport-header payload and `-m mark` as `meta mark`, which 1.8.7
//! does not read (its `iptables-save` prints such a rule without them, silently, and its
//! `save | restore` writes the rule without them); 1.8.10 and later write IPv4's `-p` as the
//! header's protocol byte and put the addresses first. So the encoder writes ports and marks
//! as the xtables matches 1.8.7 writes (`tcp`, `udp` revision 0, `mark` revision 1), which
//! every later release reads as the same line and compares equal to its own form (`iptables
//! -C` compares rules after parsing), and `-p` as `meta l4proto`, which all of them read.
//!
//! [`decode`] reads a listed rule back into `iptables-save`'s canonical arguments, from any of
//! those encodings, in any expression order: xtables or payload ports, xtables or `meta mark`
//! marks, `meta l4proto` or the IPv4 protocol byte. It refuses anything outside the forms, so
//! that a caller never mistakes another rule for one of its own. [`canonical`] is the one
//! through the other: the line `iptables-save` prints for a rule. Two encodings of one rule
//! decode to the same words, which is how a caller compares meaning rather than bytes.
//!
//! The forms: `[!] -s|-d ADDR[/PREFIX]`, `[!] -i|-o NAME[+]`, `[!] -p PROTO`, and the matches
//! `-m comment --comment TEXT`, `-m conntrack [!] --ctstate STATES`, `-m multiport --dports
//! P,…` (up to 15 single ports), `-m addrtype [!] --src-type T [!] --dst-type T`,
//! `-m mark [!] --mark V[/M]`, `-m tcp|udp [!] --dport N`, `-m sctp --dport N`; the targets
//! `ACCEPT`, `DROP`, `RETURN`, a jump (`-j CHAIN`) or goto (`-g CHAIN`) to a user chain,
//! `DNAT --to-destination ADDR[:PORT]`, `MASQUERADE`, `MARK --set-xmark V[/M]`. Options are
//! taken by their full names only: an abbreviation, or an option the tool would read as an
//! abbreviation of a loaded match's option (`--dport` after `-m multiport`, which is
//! `--dports` to the tool), is [`Unsupported`], like anything else outside these forms, for
//! the caller to write with `iptables-restore`, which accepts or refuses it as the tool does.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_netfilter::nftables::MetaKey;

use super::super::Family;
use super::xt;
use crate::nft::expr::REG_1;
use crate::nft::{CmpOp, Expr, PayloadBase, Rule, Verdict};

/// A rule outside the forms [`encode`] writes (see the module doc): the caller writes it with
/// `iptables-restore` instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("iptables rule {rule:?} is not written over nf_tables: {reason}")]
pub struct Unsupported {
    /// The rule's arguments, joined.
    pub rule: String,
    /// What is outside the supported forms.
    pub reason: String,
}

/// The targets `iptables` resolves to an extension rather than a chain of that name (iptables
/// 1.8.9's `libxt_*`/`libipt_*`/`libip6t_*` targets): a jump to one of these is not a jump.
const EXTENSION_TARGETS: [&str; 41] = [
    "AUDIT",
    "CHECKSUM",
    "CLASSIFY",
    "CLUSTERIP",
    "CONNMARK",
    "CONNSECMARK",
    "CT",
    "DNAT",
    "DNPT",
    "DSCP",
    "ECN",
    "HL",
    "HMARK",
    "IDLETIMER",
    "LED",
    "LOG",
    "MARK",
    "MASQUERADE",
    "MIRROR",
    "NETMAP",
    "NFLOG",
    "NFQUEUE",
    "NOTRACK",
    "RATEEST",
    "REDIRECT",
    "REJECT",
    "SECMARK",
    "SET",
    "SNAT",
    "SNPT",
    "SYNPROXY",
    "TCPMSS",
    "TCPOPTSTRIP",
    "TEE",
    "TOS",
    "TPROXY",
    "TRACE",
    "TTL",
    "ULOG",
    "QUEUE",
    "standard",
];

/// The longest chain name (`XT_EXTENSION_MAXNAMELEN` - 1).
const CHAIN_MAX: usize = 28;
/// The longest interface name (`IFNAMSIZ` - 1).
const IFNAME_MAX: usize = 15;

/// Protocol numbers and the names `iptables-save` prints for them.
const PROTOCOLS: [(u8, &str); 8] = [
    (1, "icmp"),
    (6, "tcp"),
    (17, "udp"),
    (50, "esp"),
    (51, "ah"),
    (58, "ipv6-icmp"),
    (132, "sctp"),
    (136, "udplite"),
];
/// The offset of the protocol field in the IPv4 header.
const IPV4_PROTOCOL: u32 = 9;
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

/// The nf_tables expressions `iptables-nft` makes of the rule `-A CHAIN <args>` in a table of
/// `family`, as a [`Rule`] to append or insert.
///
/// # Errors
/// [`Unsupported`] for a rule outside the module's forms.
pub fn encode(family: Family, args: &[String]) -> Result<Rule, Unsupported> {
    let (exprs, proto) = encode_exprs(family, args)?;
    let (number, negated) = proto.map_or((0, false), |(negated, n)| (n, negated));
    Ok(exprs
        .into_iter()
        .fold(Rule::new(), Rule::expr)
        .compat(u32::from(number), negated))
}

/// The arguments `iptables-save` prints for the rule `-A CHAIN <args>`: [`decode`] of
/// [`encode`].
///
/// # Errors
/// [`Unsupported`] for a rule outside the module's forms.
pub fn canonical(family: Family, args: &[String]) -> Result<Vec<String>, Unsupported> {
    let (exprs, _) = encode_exprs(family, args)?;
    decode(family, &exprs).ok_or_else(|| unsupported(args, "it does not read back"))
}

fn unsupported(args: &[String], reason: impl Into<String>) -> Unsupported {
    Unsupported {
        rule: args.join(" "),
        reason: reason.into(),
    }
}

/// What one parsed rule holds, in the order `iptables-nft` emits it.
#[derive(Default)]
struct Parsed<'a> {
    iif: Option<Vec<Expr>>,
    oif: Option<Vec<Expr>>,
    proto: Option<(bool, u8)>,
    src: Option<Vec<Expr>>,
    dst: Option<Vec<Expr>>,
    /// The matches in the order they were loaded, with their options.
    matches: Vec<Loaded<'a>>,
    target: Option<Expr>,
}

/// A match loaded by `-m NAME` (or implicitly by its protocol's option), and the options
/// given to it: (negated, option, value).
struct Loaded<'a> {
    name: &'a str,
    options: Vec<(bool, &'a str, &'a str)>,
}

/// The options of the matches this module writes.
fn match_options(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "comment" => &["--comment"],
        "conntrack" => &["--ctstate"],
        "multiport" => &["--dports", "--destination-ports"],
        "addrtype" => &["--src-type", "--dst-type"],
        "mark" => &["--mark"],
        "tcp" | "udp" | "sctp" => &["--dport", "--destination-port"],
        _ => return None,
    })
}

/// Every long option (without `--`) of the matches [`match_options`] knows, as the tools'
/// extensions (`libxt_*.c`, the same in 1.8.7 to 1.8.11) define them: what an abbreviation
/// may stand for.
fn all_options(name: &str) -> &'static [&'static str] {
    match name {
        "comment" => &["comment"],
        "conntrack" => &[
            "ctstate",
            "ctproto",
            "ctorigsrc",
            "ctorigdst",
            "ctreplsrc",
            "ctrepldst",
            "ctstatus",
            "ctexpire",
            "ctorigsrcport",
            "ctorigdstport",
            "ctreplsrcport",
            "ctrepldstport",
            "ctdir",
        ],
        "multiport" => &[
            "source-ports",
            "sports",
            "destination-ports",
            "dports",
            "ports",
        ],
        "addrtype" => &["src-type", "dst-type", "limit-iface-in", "limit-iface-out"],
        "mark" => &["mark"],
        "tcp" => &[
            "source-port",
            "sport",
            "destination-port",
            "dport",
            "syn",
            "tcp-flags",
            "tcp-option",
        ],
        "udp" => &["source-port", "sport", "destination-port", "dport"],
        "sctp" => &[
            "source-port",
            "sport",
            "destination-port",
            "dport",
            "chunk-types",
        ],
        _ => &[],
    }
}

fn cmp(op: CmpOp, data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: REG_1,
        op,
        data,
    }
}

fn op(negated: bool) -> CmpOp {
    if negated { CmpOp::Neq } else { CmpOp::Eq }
}

fn meta(key: MetaKey) -> Expr {
    Expr::Meta { key, dreg: REG_1 }
}

/// Source and destination offsets and the address length of `family`'s header.
fn addr_layout(family: Family) -> (u32, u32, usize) {
    match family {
        Family::V4 => (12, 16, 4),
        Family::V6 => (8, 24, 16),
    }
}

/// The rule's tokens, read front to back.
struct Tokens<'a> {
    args: &'a [String],
    at: usize,
}

impl<'a> Tokens<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let token = self.args.get(self.at)?;
        self.at += 1;
        Some(token)
    }

    fn value(&mut self, option: &str) -> Result<&'a str, Unsupported> {
        self.next()
            .ok_or_else(|| unsupported(self.args, format!("{option} needs a value")))
    }

    fn fail(&self, reason: impl Into<String>) -> Unsupported {
        unsupported(self.args, reason)
    }
}

/// A rule's `-p`: whether it is negated, and the protocol number.
type Proto = Option<(bool, u8)>;

/// The expressions of a rule, and its `-p` for [`Rule::compat`].
fn encode_exprs(family: Family, args: &[String]) -> Result<(Vec<Expr>, Proto), Unsupported> {
    let mut tokens = Tokens { args, at: 0 };
    let mut rule = Parsed::default();
    while let Some(token) = tokens.next() {
        if rule.target.is_some() {
            return Err(tokens.fail(format!("{token:?} after the target")));
        }
        let negated = token == "!";
        let option = if negated { tokens.value("!")? } else { token };
        match option {
            "-s" | "--source" | "--src" | "-d" | "--destination" | "--dst" => {
                let source = matches!(option, "-s" | "--source" | "--src");
                let value = tokens.value(option)?;
                let exprs = address(family, source, negated, value)
                    .ok_or_else(|| tokens.fail(format!("address {value:?}")))?;
                let slot = if source { &mut rule.src } else { &mut rule.dst };
                if slot.replace(exprs).is_some() {
                    return Err(tokens.fail(format!("{option} given twice")));
                }
            }
            "-i" | "--in-interface" | "-o" | "--out-interface" => {
                let input = matches!(option, "-i" | "--in-interface");
                let value = tokens.value(option)?;
                let exprs = interface(input, negated, value)
                    .ok_or_else(|| tokens.fail(format!("interface {value:?}")))?;
                let slot = if input { &mut rule.iif } else { &mut rule.oif };
                if slot.replace(exprs).is_some() {
                    return Err(tokens.fail(format!("{option} given twice")));
                }
            }
            "-p" | "--protocol" => {
                let value = tokens.value(option)?;
                let number =
                    protocol(value).ok_or_else(|| tokens.fail(format!("protocol {value:?}")))?;
                if rule.proto.replace((negated, number)).is_some() {
                    return Err(tokens.fail("-p given twice"));
                }
            }
            "-m" | "--match" if !negated => {
                let name = tokens.value(option)?;
                if match_options(name).is_none() {
                    return Err(tokens.fail(format!("match {name:?}")));
                }
                rule.matches.push(Loaded {
                    name,
                    options: Vec::new(),
                });
            }
            "-j" | "--jump" if !negated => {
                let name = tokens.value(option)?;
                rule.target = Some(parse_target(&mut tokens, family, name)?);
            }
            "-g" | "--goto" if !negated => {
                let chain = tokens.value(option)?;
                if !is_chain(chain) {
                    return Err(tokens.fail(format!("goto {chain:?}")));
                }
                rule.target = Some(Expr::ImmediateVerdict(Verdict::Goto(chain.to_owned())));
            }
            other if other.starts_with("--") => {
                // An option of a loaded match goes to the latest match that has it (the tools
                // put each new match's options first); an option of the protocol's own match
                // loads it, as `-m PROTO` would.
                let value = tokens.value(other)?;
                let knows = |name: &str| match_options(name).is_some_and(|o| o.contains(&other));
                if !rule.matches.iter().any(|m| knows(m.name)) {
                    // The tool takes an option no loaded match has by that name as the
                    // abbreviation of one a loaded match has (getopt_long), before it loads
                    // the protocol's match: `--dport` after `-m multiport` is `--dports`.
                    let long = other.trim_start_matches('-');
                    if let Some(loaded) = rule
                        .matches
                        .iter()
                        .find(|m| all_options(m.name).iter().any(|o| o.starts_with(long)))
                    {
                        return Err(tokens.fail(format!(
                            "the tool reads {other} as an abbreviation of an option of -m {}",
                            loaded.name
                        )));
                    }
                    let implicit = rule
                        .proto
                        .and_then(|(_, number)| proto_name(number))
                        .filter(|name| matches!(*name, "tcp" | "udp" | "sctp") && knows(name))
                        .ok_or_else(|| tokens.fail(format!("option {other:?}")))?;
                    rule.matches.push(Loaded {
                        name: implicit,
                        options: Vec::new(),
                    });
                }
                let Some(loaded) = rule.matches.iter_mut().rev().find(|m| knows(m.name)) else {
                    return Err(tokens.fail(format!("option {other:?}")));
                };
                if loaded.options.iter().any(|(_, o, _)| *o == other) {
                    return Err(tokens.fail(format!("{other} given twice")));
                }
                loaded.options.push((negated, other, value));
            }
            other => return Err(tokens.fail(format!("option {other:?}"))),
        }
    }
    let mut matches = Vec::new();
    for loaded in &rule.matches {
        matches.extend(build_match(&tokens, loaded, rule.proto)?);
    }
    let mut exprs = Vec::new();
    exprs.extend(rule.iif.into_iter().flatten());
    exprs.extend(rule.oif.into_iter().flatten());
    if let Some((negated, number)) = rule.proto {
        exprs.push(meta(MetaKey::L4Proto));
        exprs.push(cmp(op(negated), vec![number]));
    }
    exprs.extend(rule.src.into_iter().flatten());
    exprs.extend(rule.dst.into_iter().flatten());
    exprs.extend(matches);
    // Counters come before the target, so that each rule counts its own packets.
    exprs.push(Expr::Counter {
        packets: 0,
        bytes: 0,
    });
    exprs.extend(rule.target);
    Ok((exprs, rule.proto))
}

/// `[!] -s|-d ADDR[/PREFIX]` of `family`, as `iptables-nft` loads it: the whole bytes of the
/// prefix compared as they are, a prefix that ends inside a byte through a mask of the whole
/// address, and no expression at all for `/0`.
fn address(family: Family, source: bool, negated: bool, value: &str) -> Option<Vec<Expr>> {
    let net = parse_net(value)?;
    if Family::of(&net.addr()) != family {
        return None;
    }
    let net = net.trunc();
    let prefix = usize::from(net.prefix_len());
    if prefix == 0 {
        // The tool leaves out a match of every address; a negated one matches nothing.
        return (!negated).then(Vec::new);
    }
    let (src, dst, len) = addr_layout(family);
    let offset = if source { src } else { dst };
    let addr = crate::nft::addr_bytes(net.network());
    let payload = |len: usize| Expr::Payload {
        base: PayloadBase::Network,
        offset,
        len: u32::try_from(len).unwrap_or(u32::MAX),
        dreg: REG_1,
    };
    Some(if prefix % 8 == 0 {
        vec![
            payload(prefix / 8),
            cmp(op(negated), addr[..prefix / 8].to_vec()),
        ]
    } else {
        let mask = crate::nft::addr_bytes(net.netmask());
        vec![
            payload(len),
            Expr::Bitwise {
                sreg: REG_1,
                dreg: REG_1,
                mask,
                xor: vec![0; len],
                explicit_op: false,
            },
            cmp(op(negated), addr),
        ]
    })
}

/// `10.0.0.1`, `10.0.0.0/8`, `fd00::/64`.
fn parse_net(value: &str) -> Option<IpNet> {
    if let Ok(net) = value.parse::<IpNet>() {
        return Some(net);
    }
    value.parse::<IpAddr>().ok().map(IpNet::from)
}

/// `[!] -i|-o NAME`: compared with its terminating NUL, or without it for a `NAME+` prefix.
fn interface(input: bool, negated: bool, name: &str) -> Option<Vec<Expr>> {
    let (stem, wildcard) = match name.strip_suffix('+') {
        Some(stem) => (stem, true),
        None => (name, false),
    };
    if stem.is_empty() || name.len() > IFNAME_MAX || stem.contains(['\0', '+', '/', ' ']) {
        return None;
    }
    let mut data = stem.as_bytes().to_vec();
    if !wildcard {
        data.push(0);
    }
    let key = if input {
        MetaKey::Iifname
    } else {
        MetaKey::Oifname
    };
    Some(vec![meta(key), cmp(op(negated), data)])
}

/// A protocol by name or number, among those [`PROTOCOLS`] names.
fn protocol(value: &str) -> Option<u8> {
    let number = match value.parse::<u8>() {
        Ok(n) => n,
        Err(_) => match value {
            "icmpv6" => 58,
            name => PROTOCOLS.iter().find(|(_, n)| *n == name)?.0,
        },
    };
    PROTOCOLS
        .iter()
        .any(|(n, _)| *n == number)
        .then_some(number)
}

/// A number as the tools read it (`strtoul` base 0): `0x` hex, a leading `0` octal, else
/// decimal.
fn parse_u32(value: &str) -> Option<u32> {
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        return u32::from_str_radix(hex, 16).ok();
    }
    if value.len() > 1
        && let Some(octal) = value.strip_prefix('0')
    {
        return u32::from_str_radix(octal, 8).ok();
    }
    value.parse().ok()
}

/// `VALUE[/MASK]` (the mask all ones when absent).
fn value_mask(value: &str) -> Option<(u32, u32)> {
    match value.split_once('/') {
        Some((v, m)) => Some((parse_u32(v)?, parse_u32(m)?)),
        None => Some((parse_u32(value)?, u32::MAX)),
    }
}

/// A port: decimal, 0–65535.
fn port(value: &str) -> Option<u16> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The expressions of one loaded match, from its options.
fn build_match(
    tokens: &Tokens<'_>,
    loaded: &Loaded<'_>,
    proto: Option<(bool, u8)>,
) -> Result<Vec<Expr>, Unsupported> {
    let Loaded { name, options } = loaded;
    let name = *name;
    let known = match_options(name).unwrap_or_default();
    // The value of a match that takes exactly one option.
    let one = || match options.as_slice() {
        [(negated, _, value)] => Ok((*negated, *value)),
        _ => Err(tokens.fail(format!("-m {name} needs exactly one of {known:?}"))),
    };
    let bad = |what: &str| tokens.fail(format!("-m {name}: {what}"));
    Ok(match name {
        "comment" => {
            let (negated, text) = one()?;
            let info = xt::comment_info(text)
                .filter(|_| !negated)
                .ok_or_else(|| bad("comment"))?;
            vec![xt_match("comment", 0, info)]
        }
        "conntrack" => {
            let (negated, states) = one()?;
            let info = xt::ctstate_info(negated, states).ok_or_else(|| bad(states))?;
            vec![xt_match("conntrack", 3, info)]
        }
        "multiport" => {
            let (negated, list) = one()?;
            if negated || !proto.is_some_and(|(n, p)| !n && [TCP, UDP, SCTP].contains(&p)) {
                return Err(bad("only --dports of -p tcp, udp or sctp"));
            }
            let ports: Option<Vec<u16>> = list.split(',').map(port).collect();
            let info = ports
                .as_deref()
                .and_then(xt::multiport_info)
                .ok_or_else(|| bad(list))?;
            vec![xt_match("multiport", 1, info)]
        }
        "addrtype" => {
            let mut src = None;
            let mut dst = None;
            for (negated, option, types) in options {
                let bits = xt::addrtype_bits(types).ok_or_else(|| bad(types))?;
                if *option == "--src-type" {
                    src = Some((*negated, bits));
                } else {
                    dst = Some((*negated, bits));
                }
            }
            if options.is_empty() {
                return Err(bad("no type"));
            }
            vec![xt_match("addrtype", 1, xt::addrtype_info(src, dst))]
        }
        "mark" => {
            let (negated, value) = one()?;
            let (mark, mask) = value_mask(value).ok_or_else(|| bad(value))?;
            vec![xt_match(
                "mark",
                1,
                xt::mark_match_info(mark, mask, negated),
            )]
        }
        _ => {
            // tcp, udp, sctp: the protocol's own -p, not negated.
            let number = protocol(name).ok_or_else(|| bad("protocol"))?;
            if proto != Some((false, number)) {
                return Err(bad(&format!("needs -p {name}")));
            }
            let (negated, value) = one()?;
            let port = port(value).ok_or_else(|| bad(value))?;
            if number == SCTP {
                if negated {
                    return Err(bad("! --dport"));
                }
                vec![xt_match("sctp", 0, xt::sctp_dport_info(port))]
            } else {
                vec![xt_match(
                    name,
                    0,
                    xt::dport_info(number == TCP, port, negated),
                )]
            }
        }
    })
}

fn xt_match(name: &str, rev: u32, info: Vec<u8>) -> Expr {
    Expr::XtMatch {
        name: name.to_owned(),
        rev,
        info,
    }
}

fn xt_target(name: &str, rev: u32, info: Vec<u8>) -> Expr {
    Expr::XtTarget {
        name: name.to_owned(),
        rev,
        info,
    }
}

/// Whether `name` is a user chain a rule may jump to.
fn is_chain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= CHAIN_MAX
        && !name.starts_with(['-', '!'])
        && !name.contains(|c: char| c.is_whitespace() || c == '\0')
        && !EXTENSION_TARGETS.contains(&name)
        && !matches!(name, "ACCEPT" | "DROP" | "RETURN")
}

/// `-j NAME [target options]`.
fn parse_target(tokens: &mut Tokens<'_>, family: Family, name: &str) -> Result<Expr, Unsupported> {
    let mut option = |want: &[&str]| -> Result<&str, Unsupported> {
        match tokens.next() {
            Some(o) if want.contains(&o) => tokens.value(o),
            other => Err(tokens.fail(format!("-j {name} needs {want:?}, not {other:?}"))),
        }
    };
    Ok(match name {
        "ACCEPT" => Expr::ImmediateVerdict(Verdict::Accept),
        "DROP" => Expr::ImmediateVerdict(Verdict::Drop),
        "RETURN" => Expr::ImmediateVerdict(Verdict::Return),
        "DNAT" => {
            let to = option(&["--to-destination", "--to"])?;
            let (addr, port) = nat_destination(family, to)
                .ok_or_else(|| tokens.fail(format!("--to-destination {to:?}")))?;
            xt_target("DNAT", 2, xt::dnat_info(addr, port))
        }
        "MASQUERADE" => xt_target("MASQUERADE", 0, xt::masquerade_info(family)),
        "MARK" => {
            let value = option(&["--set-xmark"])?;
            let (mark, mask) =
                value_mask(value).ok_or_else(|| tokens.fail(format!("--set-xmark {value:?}")))?;
            xt_target("MARK", 2, xt::mark_info(mark, mask))
        }
        chain if is_chain(chain) => Expr::ImmediateVerdict(Verdict::Jump(chain.to_owned())),
        other => return Err(tokens.fail(format!("target {other:?}"))),
    })
}

/// `10.0.0.2`, `10.0.0.2:80`, `fd00::2`, `[fd00::2]:80`, of `family`.
fn nat_destination(family: Family, value: &str) -> Option<(IpAddr, Option<u16>)> {
    let (addr, port) = match family {
        Family::V4 => match value.split_once(':') {
            Some((a, p)) => (IpAddr::V4(a.parse::<Ipv4Addr>().ok()?), Some(port(p)?)),
            None => (IpAddr::V4(value.parse::<Ipv4Addr>().ok()?), None),
        },
        Family::V6 => match value.strip_prefix('[') {
            Some(rest) => {
                let (a, p) = rest.split_once("]:")?;
                (IpAddr::V6(a.parse::<Ipv6Addr>().ok()?), Some(port(p)?))
            }
            None => (IpAddr::V6(value.parse::<Ipv6Addr>().ok()?), None),
        },
    };
    Some((addr, port))
}

/// A listed rule's arguments as `iptables-save` prints them (without `-A CHAIN`), when the
/// rule is in one of the forms [`encode`] writes; `None` for anything else.
#[must_use]
pub fn decode(family: Family, exprs: &[Expr]) -> Option<Vec<String>> {
    let (saddr, daddr, addr_len) = addr_layout(family);
    let mut src = None;
    let mut dst = None;
    let mut iif = None;
    let mut oif = None;
    let mut proto: Option<(bool, u8)> = None;
    let mut matches: Vec<String> = Vec::new();
    let mut target: Option<Vec<String>> = None;
    let mut rest = exprs;
    let words = |list: &[&str]| list.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    loop {
        if target.is_some() && !rest.is_empty() {
            return None;
        }
        match rest {
            [] => break,
            // `-p` of IPv4 as iptables-nft 1.8.10 and later write it: the header's protocol
            // field, where earlier releases (and IPv6) load `meta l4proto`.
            [
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset: IPV4_PROTOCOL,
                    len: 1,
                    dreg,
                },
                Expr::Cmp { sreg, op, data },
                tail @ ..,
            ] if family == Family::V4 && *dreg == REG_1 && *sreg == REG_1 => {
                let [number] = data.as_slice() else {
                    return None;
                };
                proto_name(*number)?;
                if proto.replace((*op == CmpOp::Neq, *number)).is_some() {
                    return None;
                }
                rest = tail;
            }
            [
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len,
                    dreg,
                },
                tail @ ..,
            ] if *dreg == REG_1 => {
                let slot = match *offset {
                    o if o == saddr => &mut src,
                    o if o == daddr => &mut dst,
                    _ => return None,
                };
                let (net, negated, tail) = prefix(family, *len, addr_len, tail)?;
                if slot.replace((negated, net.to_string())).is_some() {
                    return None;
                }
                rest = tail;
            }
            [
                Expr::Meta { key, dreg },
                Expr::Cmp { sreg, op, data },
                tail @ ..,
            ] if *sreg == REG_1 && *dreg == REG_1 && *key != MetaKey::Mark => {
                let negated = *op == CmpOp::Neq;
                match key {
                    MetaKey::Iifname | MetaKey::Oifname => {
                        let slot = if *key == MetaKey::Iifname {
                            &mut iif
                        } else {
                            &mut oif
                        };
                        if slot.replace((negated, iface_name(data)?)).is_some() {
                            return None;
                        }
                    }
                    MetaKey::L4Proto => {
                        let [number] = data.as_slice() else {
                            return None;
                        };
                        proto_name(*number)?;
                        if proto.replace((negated, *number)).is_some() {
                            return None;
                        }
                    }
                    _ => return None,
                }
                rest = tail;
            }
            [
                Expr::Meta {
                    key: MetaKey::Mark,
                    dreg,
                },
                tail @ ..,
            ] if *dreg == REG_1 => {
                let (mask, tail) = match tail {
                    [
                        Expr::Bitwise {
                            sreg,
                            dreg,
                            mask,
                            xor,
                            ..
                        },
                        tail @ ..,
                    ] if *sreg == REG_1
                        && *dreg == REG_1
                        && xor.iter().all(|b| *b == 0)
                        && xor.len() == 4 =>
                    {
                        (
                            u32::from_ne_bytes(<[u8; 4]>::try_from(mask.as_slice()).ok()?),
                            tail,
                        )
                    }
                    _ => (u32::MAX, tail),
                };
                let [Expr::Cmp { sreg, op, data }, tail @ ..] = tail else {
                    return None;
                };
                if *sreg != REG_1 {
                    return None;
                }
                let mark = u32::from_ne_bytes(<[u8; 4]>::try_from(data.as_slice()).ok()?);
                matches.extend(words(&["-m", "mark"]));
                if *op == CmpOp::Neq {
                    matches.push("!".to_owned());
                }
                matches.push("--mark".to_owned());
                matches.push(mark_words(mark, mask));
                rest = tail;
            }
            [
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 2,
                    len: 2,
                    dreg,
                },
                Expr::Cmp { sreg, op, data },
                tail @ ..,
            ] if *dreg == REG_1 && *sreg == REG_1 => {
                let name = match proto {
                    Some((false, TCP)) => "tcp",
                    Some((false, UDP)) => "udp",
                    _ => return None,
                };
                let port = u16::from_be_bytes(<[u8; 2]>::try_from(data.as_slice()).ok()?);
                matches.extend(words(&["-m", name]));
                if *op == CmpOp::Neq {
                    matches.push("!".to_owned());
                }
                matches.push("--dport".to_owned());
                matches.push(port.to_string());
                rest = tail;
            }
            [Expr::XtMatch { name, rev, info }, tail @ ..] => {
                let options = match (name.as_str(), rev) {
                    ("comment", 0) => vec!["--comment".to_owned(), xt::comment(info)?],
                    ("conntrack", 3) => xt::ctstate(info)?,
                    ("multiport", 1) => {
                        if !matches!(proto, Some((false, TCP | UDP | SCTP))) {
                            return None;
                        }
                        let ports: Vec<String> = xt::multiport_dports(info)?
                            .iter()
                            .map(u16::to_string)
                            .collect();
                        vec!["--dports".to_owned(), ports.join(",")]
                    }
                    ("addrtype", 1) => xt::addrtype(info)?,
                    ("sctp", 0) if proto == Some((false, SCTP)) => {
                        vec!["--dport".to_owned(), xt::sctp_dport(info)?.to_string()]
                    }
                    ("tcp" | "udp", 0) => {
                        let tcp = name == "tcp";
                        if proto != Some((false, if tcp { TCP } else { UDP })) {
                            return None;
                        }
                        let (negated, port) = xt::dport(tcp, info)?;
                        negatable(negated, "--dport", port.to_string())
                    }
                    ("mark", 1) => {
                        let (mark, mask, negated) = xt::mark_match(info)?;
                        negatable(negated, "--mark", mark_words(mark, mask))
                    }
                    _ => return None,
                };
                matches.push("-m".to_owned());
                matches.push(name.clone());
                matches.extend(options);
                rest = tail;
            }
            [Expr::Counter { .. }, tail @ ..] => rest = tail,
            [Expr::ImmediateVerdict(verdict), tail @ ..] => {
                target = Some(match verdict {
                    Verdict::Accept => words(&["-j", "ACCEPT"]),
                    Verdict::Drop => words(&["-j", "DROP"]),
                    Verdict::Return => words(&["-j", "RETURN"]),
                    Verdict::Jump(chain) => words(&["-j", chain]),
                    Verdict::Goto(chain) => words(&["-g", chain]),
                });
                rest = tail;
            }
            [Expr::XtTarget { name, rev, info }, tail @ ..] => {
                target = Some(match (name.as_str(), rev) {
                    ("DNAT", 2) => {
                        let to = match xt::dnat(family, info)? {
                            (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
                            (a, Some(p)) => format!("{a}:{p}"),
                            (a, None) => a.to_string(),
                        };
                        words(&["-j", "DNAT", "--to-destination", &to])
                    }
                    ("MASQUERADE", 0) if *info == xt::masquerade_info(family) => {
                        words(&["-j", "MASQUERADE"])
                    }
                    ("MARK", 2) => {
                        let (mark, mask) = xt::mark(info)?;
                        words(&["-j", "MARK", "--set-xmark", &format!("{mark:#x}/{mask:#x}")])
                    }
                    _ => return None,
                });
                rest = tail;
            }
            _ => return None,
        }
    }
    let mut args = Vec::new();
    let proto = match proto {
        Some((negated, number)) => Some((negated, proto_name(number)?.to_owned())),
        None => None,
    };
    for (flag, value) in [
        ("-s", src),
        ("-d", dst),
        ("-i", iif),
        ("-o", oif),
        ("-p", proto),
    ] {
        if let Some((negated, value)) = value {
            if negated {
                args.push("!".to_owned());
            }
            args.push(flag.to_owned());
            args.push(value);
        }
    }
    args.extend(matches);
    args.extend(target.unwrap_or_default());
    Some(args)
}

/// `[!] OPTION VALUE`, as a match prints a negatable option.
fn negatable(negated: bool, option: &str, value: String) -> Vec<String> {
    let mut words = Vec::with_capacity(3);
    if negated {
        words.push("!".to_owned());
    }
    words.push(option.to_owned());
    words.push(value);
    words
}

/// `--mark`'s value as `iptables-save` prints it: `0x2000/0x2000`, or `0x1` without a mask.
fn mark_words(mark: u32, mask: u32) -> String {
    if mask == u32::MAX {
        format!("{mark:#x}")
    } else {
        format!("{mark:#x}/{mask:#x}")
    }
}

/// The prefix a network-header load of `len` bytes and what follows it compare with: the
/// loaded bytes as they are (a prefix of whole bytes), or the whole address through a mask.
/// Returns the prefix, whether the comparison is negated, and the expressions after it.
fn prefix(
    family: Family,
    len: u32,
    addr_len: usize,
    tail: &[Expr],
) -> Option<(IpNet, bool, &[Expr])> {
    let len = usize::try_from(len).ok()?;
    let (mask, rest) = match tail {
        [
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                ..
            },
            rest @ ..,
        ] if *sreg == REG_1
            && *dreg == REG_1
            && len == addr_len
            && mask.len() == addr_len
            && xor.iter().all(|b| *b == 0) =>
        {
            (Some(mask), rest)
        }
        _ => (None, tail),
    };
    let [Expr::Cmp { sreg, op, data }, rest @ ..] = rest else {
        return None;
    };
    if *sreg != REG_1 || data.len() != len || len == 0 || len > addr_len {
        return None;
    }
    let prefix_len = match mask {
        Some(mask) => {
            let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
            // A contiguous mask that ends inside a byte; data without bits outside it.
            let full = usize::try_from(ones / 8).ok()?;
            let contiguous = mask.iter().enumerate().all(|(i, b)| match i.cmp(&full) {
                std::cmp::Ordering::Less => *b == 0xff,
                std::cmp::Ordering::Equal => b.leading_ones() == b.count_ones() && *b != 0,
                std::cmp::Ordering::Greater => *b == 0,
            });
            if !contiguous || data.iter().zip(mask).any(|(d, m)| d & !m != 0) {
                return None;
            }
            ones
        }
        None => u32::try_from(len * 8).ok()?,
    };
    let mut bytes = data.clone();
    bytes.resize(addr_len, 0);
    let addr = match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes.as_slice()).ok()?)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).ok()?)),
    };
    let net = IpNet::new(addr, u8::try_from(prefix_len).ok()?).ok()?;
    Some((net, *op == CmpOp::Neq, rest))
}

/// The name `iptables-save` prints for a `-p` protocol number.
fn proto_name(number: u8) -> Option<&'static str> {
    PROTOCOLS
        .iter()
        .find(|(n, _)| *n == number)
        .map(|(_, name)| *name)
}

/// An interface match: `iptables-nft` compares the name with its terminating NUL for an exact
/// name, and without it for a `+` wildcard prefix.
fn iface_name(data: &[u8]) -> Option<String> {
    match data.split_last() {
        Some((&0, name)) if !name.contains(&0) && !name.is_empty() => {
            String::from_utf8(name.to_vec()).ok()
        }
        _ if !data.contains(&0) && !data.is_empty() => {
            String::from_utf8(data.to_vec()).ok().map(|n| n + "+")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::Family as NftFamily;

    fn addr(offset: u32, op: CmpOp, data: &[u8]) -> [Expr; 2] {
        [
            Expr::Payload {
                base: PayloadBase::Network,
                offset,
                len: u32::try_from(data.len()).unwrap(),
                dreg: REG_1,
            },
            Expr::Cmp {
                sreg: REG_1,
                op,
                data: data.to_vec(),
            },
        ]
    }

    fn iface(key: MetaKey, op: CmpOp, name: &[u8]) -> [Expr; 2] {
        [
            Expr::Meta { key, dreg: REG_1 },
            Expr::Cmp {
                sreg: REG_1,
                op,
                data: name.to_vec(),
            },
        ]
    }

    fn comment(text: &str) -> Expr {
        let mut info = text.as_bytes().to_vec();
        info.resize(256, 0);
        Expr::XtMatch {
            name: "comment".into(),
            rev: 0,
            info,
        }
    }

    fn conntrack(flags: u16, invert: u16, mask: u16) -> Expr {
        let mut info = vec![0u8; 168];
        // struct xt_conntrack_mtinfo3: match_flags, invert_flags, state_mask at 146.
        info[146..148].copy_from_slice(&flags.to_ne_bytes());
        info[148..150].copy_from_slice(&invert.to_ne_bytes());
        info[150..152].copy_from_slice(&mask.to_ne_bytes());
        Expr::XtMatch {
            name: "conntrack".into(),
            rev: 3,
            info,
        }
    }

    fn counter() -> Expr {
        Expr::Counter {
            packets: 0,
            bytes: 0,
        }
    }

    fn args(exprs: Vec<Expr>, family: Family) -> Option<String> {
        decode(family, &exprs).map(|a| a.join(" "))
    }

    #[test]
    fn the_forms_the_plugins_write_decode_in_save_order() {
        let mut exprs = addr(16, CmpOp::Eq, &[10, 1, 0, 5]).to_vec();
        exprs.extend([
            conntrack(1, 0, 6),
            counter(),
            Expr::ImmediateVerdict(Verdict::Accept),
        ]);
        assert_eq!(
            args(exprs, Family::V4).as_deref(),
            Some("-d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
        );

        let mut exprs = iface(MetaKey::Iifname, CmpOp::Eq, b"br0\0").to_vec();
        exprs.extend(iface(MetaKey::Oifname, CmpOp::Neq, b"br0\0"));
        exprs.extend([
            comment("CNI firewall plugin rules (ingressPolicy: same-bridge)"),
            counter(),
            Expr::ImmediateVerdict(Verdict::Jump("CNI-ISOLATION-STAGE-2".into())),
        ]);
        assert_eq!(
            args(exprs, Family::V4).as_deref(),
            Some(
                "-i br0 ! -o br0 -m comment --comment CNI firewall plugin rules (ingressPolicy: same-bridge) -j CNI-ISOLATION-STAGE-2"
            )
        );

        // Interfaces come after addresses, whatever the expression order.
        let mut exprs = iface(MetaKey::Oifname, CmpOp::Eq, b"veth").to_vec();
        let v6: std::net::Ipv6Addr = "fd01::5".parse().unwrap();
        exprs.extend(addr(8, CmpOp::Neq, &v6.octets()));
        exprs.extend([counter(), Expr::ImmediateVerdict(Verdict::Goto("X".into()))]);
        assert_eq!(
            args(exprs, Family::V6).as_deref(),
            Some("! -s fd01::5/128 -o veth+ -g X")
        );

        // A protocol, printed after the interfaces.
        let mut exprs = vec![Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: REG_1,
        }];
        exprs.push(Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: vec![6],
        });
        exprs.extend(iface(MetaKey::Iifname, CmpOp::Eq, b"br0\0"));
        exprs.extend([counter(), Expr::ImmediateVerdict(Verdict::Accept)]);
        assert_eq!(
            args(exprs, Family::V4).as_deref(),
            Some("-i br0 -p tcp -j ACCEPT")
        );

        // No verdict: no -j.
        assert_eq!(
            args(vec![conntrack(1, 1, 1 | 8), counter()], Family::V4).as_deref(),
            Some("-m conntrack ! --ctstate INVALID,NEW")
        );
    }

    fn strings(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn encoded_rules_are_iptables_nft_s_expressions_and_decode_back() {
        let line = "-d 10.1.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT";
        let rule = encode(Family::V4, &strings(line)).unwrap();
        let mut want = addr(16, CmpOp::Eq, &[10, 1, 0, 5]).to_vec();
        want.extend([
            conntrack(1, 0, 6),
            counter(),
            Expr::ImmediateVerdict(Verdict::Accept),
        ]);
        assert_eq!(rule.encode(NftFamily::Ip).unwrap(), want);

        for (family, table, line) in [
            (Family::V4, NftFamily::Ip, line),
            (Family::V4, NftFamily::Ip, "-s 10.1.0.5/32 -j ACCEPT"),
            (
                Family::V6,
                NftFamily::Ip6,
                "-s fd01::5/128 -d fd01::6/128 -j DROP",
            ),
            (
                Family::V6,
                NftFamily::Ip6,
                "-m conntrack --ctstate INVALID -j RETURN",
            ),
            (Family::V4, NftFamily::Ip, "-j CNI-ADMIN"),
        ] {
            let rule = encode(family, &strings(line)).unwrap();
            let exprs = rule.encode(table).unwrap();
            assert_eq!(args(exprs, family).as_deref(), Some(line), "{line}");
        }
    }

    #[test]
    fn rules_in_the_tools_words_read_back_as_save_prints_them() {
        let chain = "CNI-DN-9f6c0a1d2e3b4c5d6e7f8";
        for (family, given, saved) in [
            // The Go plugin's own token order for an entry rule.
            (
                Family::V4,
                format!(
                    "-m comment --comment dnat -m multiport -p tcp --destination-ports 8080,443 -j {chain}"
                ),
                format!("-p tcp -m comment --comment dnat -m multiport --dports 8080,443 -j {chain}"),
            ),
            (
                Family::V4,
                "-p tcp --dport 8080 -s 10.0.0.2/24 -j CNI-HOSTPORT-SETMARK".to_owned(),
                "-s 10.0.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK".to_owned(),
            ),
            (
                Family::V4,
                "-p udp -s 127.0.0.1 -d 10.1.1.1 --dport 53 -j DNAT --to-destination 10.0.0.2:53"
                    .to_owned(),
                "-s 127.0.0.1/32 -d 10.1.1.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.0.2:53"
                    .to_owned(),
            ),
            (
                Family::V6,
                "-d fd01::1 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00::2]:8080"
                    .to_owned(),
                "-d fd01::1/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00::2]:8080"
                    .to_owned(),
            ),
            (
                Family::V6,
                "-p sctp --dport 9 -s fd00::1/64 -j CNI-HOSTPORT-SETMARK".to_owned(),
                "-s fd00::/64 -p sctp -m sctp --dport 9 -j CNI-HOSTPORT-SETMARK".to_owned(),
            ),
            (
                Family::V4,
                "-m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark 0x2000/0x2000"
                    .to_owned(),
                "-m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark 0x2000/0x2000"
                    .to_owned(),
            ),
            (
                Family::V6,
                "-m mark --mark 8192/8192 -j MASQUERADE".to_owned(),
                "-m mark --mark 0x2000/0x2000 -j MASQUERADE".to_owned(),
            ),
            (
                Family::V4,
                "-m mark ! --mark 1/0xffffffff -m mark --mark 020 -g X".to_owned(),
                "-m mark ! --mark 0x1 -m mark --mark 0x10 -g X".to_owned(),
            ),
            (
                Family::V4,
                "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".to_owned(),
                "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".to_owned(),
            ),
            (
                Family::V4,
                "-p udp ! -o br+ --in-interface eth0 ! --source 10.9.1.2/20 -m tcp".to_owned(),
                String::new(),
            ),
            (
                Family::V4,
                "-p udp ! -o br+ --in-interface eth0 ! --source 10.9.1.2/20 -m udp ! --dport 1"
                    .to_owned(),
                "! -s 10.9.0.0/20 -i eth0 ! -o br+ -p udp -m udp ! --dport 1".to_owned(),
            ),
            (
                Family::V6,
                "-d fd00::/60 -s 0.0.0.0/0 -m addrtype ! --src-type LOCAL,UNICAST -j RETURN"
                    .to_owned(),
                String::new(),
            ),
            (
                Family::V6,
                "-d fd00::/60 -s ::/0 -m addrtype ! --src-type LOCAL,UNICAST -j RETURN".to_owned(),
                "-d fd00::/60 -m addrtype ! --src-type UNICAST,LOCAL -j RETURN".to_owned(),
            ),
        ] {
            let got = canonical(family, &strings_quoted(&given));
            if saved.is_empty() {
                assert!(got.is_err(), "{given}: {got:?}");
            } else {
                assert_eq!(got.unwrap(), strings_quoted(&saved), "{given}");
            }
        }
    }

    /// Splits like the tools' own command line (double quotes group).
    fn strings_quoted(line: &str) -> Vec<String> {
        crate::iptables::split_args(line).unwrap()
    }

    fn proto_meta(number: u8) -> [Expr; 2] {
        iface(MetaKey::L4Proto, CmpOp::Eq, &[number])
    }

    /// `-p` as iptables-nft 1.8.10 and later write it for IPv4.
    fn proto_payload(number: u8) -> [Expr; 2] {
        addr(IPV4_PROTOCOL, CmpOp::Eq, &[number])
    }

    /// `--dport` as 1.8.8 and later write it.
    fn dport_payload(op: CmpOp, port: u16) -> [Expr; 2] {
        [
            Expr::Payload {
                base: PayloadBase::Transport,
                offset: 2,
                len: 2,
                dreg: REG_1,
            },
            Expr::Cmp {
                sreg: REG_1,
                op,
                data: port.to_be_bytes().to_vec(),
            },
        ]
    }

    fn jump(chain: &str) -> [Expr; 2] {
        [
            counter(),
            Expr::ImmediateVerdict(Verdict::Jump(chain.into())),
        ]
    }

    fn masquerade() -> [Expr; 2] {
        [
            counter(),
            xt_target("MASQUERADE", 0, xt::masquerade_info(Family::V4)),
        ]
    }

    #[test]
    fn every_release_s_encoding_of_a_rule_decodes_to_the_same_words() {
        let src = addr(12, CmpOp::Eq, &[10, 88, 0]);
        let xt_port = xt_match("tcp", 0, xt::dport_info(true, 8080, false));
        // 1.8.7: meta l4proto, the address, an xtables tcp match.
        let v187: Vec<Expr> = [proto_meta(TCP).as_slice(), &src, &[xt_port], &jump("X")].concat();
        // 1.8.8 and 1.8.9: the port as a transport-header payload.
        let v189: Vec<Expr> = [
            proto_meta(TCP).as_slice(),
            &src,
            &dport_payload(CmpOp::Eq, 8080),
            &jump("X"),
        ]
        .concat();
        // 1.8.10 and 1.8.11: the address first, the protocol byte of the header.
        let v1811: Vec<Expr> = [
            src.as_slice(),
            &proto_payload(TCP),
            &dport_payload(CmpOp::Eq, 8080),
            &jump("X"),
        ]
        .concat();
        let line = "-s 10.88.0.0/24 -p tcp -m tcp --dport 8080 -j X";
        for exprs in [&v187, &v189, &v1811] {
            assert_eq!(args(exprs.clone(), Family::V4).as_deref(), Some(line));
        }
        // What we write is 1.8.7's, which every later release reads.
        let rule = encode(Family::V4, &strings(line)).unwrap();
        assert_eq!(rule.encode(NftFamily::Ip).unwrap(), v187);

        // A negated port, either way.
        let udp = [proto_meta(UDP).as_slice(), &dport_payload(CmpOp::Neq, 1)].concat();
        let xt_udp = [
            proto_meta(UDP).as_slice(),
            &[xt_match("udp", 0, xt::dport_info(false, 1, true))],
        ]
        .concat();
        for exprs in [udp, xt_udp.clone()] {
            assert_eq!(
                args(exprs, Family::V4).as_deref(),
                Some("-p udp -m udp ! --dport 1")
            );
        }
        let rule = encode(Family::V4, &strings("-p udp -m udp ! --dport 1")).unwrap();
        assert_eq!(rule.encode(NftFamily::Ip).unwrap()[..3], xt_udp[..]);

        // The mark: 1.8.7's xtables match, 1.8.8's meta mark through a mask.
        let xt_mark = [
            &[xt_match(
                "mark",
                1,
                xt::mark_match_info(0x2000, 0x2000, false),
            )][..],
            &masquerade(),
        ]
        .concat();
        let meta_mark = [
            &[
                meta(MetaKey::Mark),
                Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: 0x2000u32.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: false,
                },
                cmp(CmpOp::Eq, 0x2000u32.to_ne_bytes().to_vec()),
            ][..],
            &masquerade(),
        ]
        .concat();
        let line = "-m mark --mark 0x2000/0x2000 -j MASQUERADE";
        for exprs in [&xt_mark, &meta_mark] {
            assert_eq!(args(exprs.clone(), Family::V4).as_deref(), Some(line));
        }
        let rule = encode(Family::V4, &strings(line)).unwrap();
        assert_eq!(rule.encode(NftFamily::Ip).unwrap(), xt_mark);

        // IPv6 keeps meta l4proto in every release; a protocol byte is IPv4's only.
        assert_eq!(args(proto_payload(TCP).to_vec(), Family::V6), None);
        // A port of another protocol than the rule's is not one of ours.
        let wrong = [
            proto_meta(UDP).as_slice(),
            &[xt_match("tcp", 0, xt::dport_info(true, 8080, false))],
        ]
        .concat();
        assert_eq!(args(wrong, Family::V4), None);
    }

    #[test]
    fn an_option_the_tool_reads_as_an_abbreviation_is_left_to_it() {
        // After -m multiport, the tool reads --dport as --dports (given twice: refused).
        for line in [
            "-m multiport -p tcp --destination-ports 8080 --dport 8080 -j X",
            "-p tcp -m multiport --dports 80 --destination-port 8080 -j X",
            "-p tcp --dp 8080 -j X",
        ] {
            assert!(encode(Family::V4, &strings(line)).is_err(), "{line}");
        }
        // Before it, --dport loads the protocol's match.
        assert_eq!(
            canonical(
                Family::V4,
                &strings("-p tcp --dport 8080 -m multiport --dports 80 -j X")
            )
            .unwrap()
            .join(" "),
            "-p tcp -m tcp --dport 8080 -m multiport --dports 80 -j X"
        );
    }

    #[test]
    fn forms_outside_the_encoder_are_left_to_the_tools() {
        let long = format!("-m comment --comment {} -j ACCEPT", "x".repeat(256));
        let sixteen: Vec<String> = (1..=16).map(|p| p.to_string()).collect();
        let many = format!("-p tcp -m multiport --dports {} -j X", sixteen.join(","));
        for (family, line) in [
            (Family::V6, "-s 10.1.0.5/32 -j ACCEPT"),
            (Family::V4, "-s 10.1.0.0/255.255.0.0 -j ACCEPT"),
            (Family::V4, "-s host.example -j ACCEPT"),
            (Family::V4, "-s 10.0.0.1,10.0.0.2 -j ACCEPT"),
            (Family::V4, "! -s 0.0.0.0/0 -j ACCEPT"),
            (Family::V4, "-i + -j ACCEPT"),
            (Family::V4, "-i eth0 -i eth1 -j ACCEPT"),
            (Family::V4, "-i averyveryverylongname -j ACCEPT"),
            (Family::V4, "-p gre -j ACCEPT"),
            (Family::V4, "-f -j ACCEPT"),
            (Family::V4, "-m conntrack --ctstate BOGUS -j ACCEPT"),
            (Family::V4, "-m limit --limit 1/s -j ACCEPT"),
            (Family::V4, "-m tcp --dport 80 -j ACCEPT"),
            (Family::V4, "-p udp -m tcp --dport 80 -j ACCEPT"),
            (Family::V4, "-p tcp -m tcp --dport 1:2 -j ACCEPT"),
            (Family::V4, "-p tcp -m tcp --sport 1 -j ACCEPT"),
            (Family::V4, "-p tcp -m multiport ! --dports 80 -j ACCEPT"),
            (Family::V4, "-p tcp -m multiport --dports 80:90 -j ACCEPT"),
            (Family::V4, "-m multiport --dports 80 -j ACCEPT"),
            (Family::V4, &many),
            (Family::V4, &long),
            (Family::V4, "-m mark -j ACCEPT"),
            (Family::V4, "-m addrtype -j ACCEPT"),
            (Family::V4, "-j LOG"),
            (Family::V4, "-j REJECT --reject-with tcp-reset"),
            (Family::V4, "-j DNAT --to-destination 10.0.0.1-10.0.0.2"),
            (Family::V4, "-j DNAT --to-destination 10.0.0.1:80 --random"),
            (Family::V4, "-j DNAT --to-destination [fd00::1]:80"),
            (Family::V4, "-j MARK --set-mark 1"),
            (Family::V4, "-j ACCEPT -s 10.1.0.5/32"),
            (Family::V4, "-j"),
            (Family::V4, "-j a-chain-name-that-is-longer-than-28"),
        ] {
            assert!(encode(family, &strings_quoted(line)).is_err(), "{line}");
        }
    }

    #[test]
    fn anything_else_is_not_decoded() {
        let accept = Expr::ImmediateVerdict(Verdict::Accept);
        // A conntrack match that tests more than the state.
        assert_eq!(
            args(vec![conntrack(1 | 2, 0, 6), accept.clone()], Family::V4),
            None
        );
        // An unknown state bit.
        assert_eq!(args(vec![conntrack(1, 0, 1 << 12)], Family::V4), None);
        // Another extension, another revision.
        let limit = Expr::XtMatch {
            name: "limit".into(),
            rev: 0,
            info: vec![0; 32],
        };
        assert_eq!(args(vec![limit, accept.clone()], Family::V4), None);
        // A prefix (masked address), a port, an expression after the verdict.
        let mut masked = vec![Expr::Payload {
            base: PayloadBase::Network,
            offset: 12,
            len: 4,
            dreg: REG_1,
        }];
        masked.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: vec![255, 255, 0, 0],
            xor: vec![0; 4],
            explicit_op: false,
        });
        assert_eq!(args(masked, Family::V4), None);
        let mut port = vec![Expr::Payload {
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
            dreg: REG_1,
        }];
        port.push(Expr::Cmp {
            sreg: REG_1,
            op: CmpOp::Eq,
            data: vec![0, 80],
        });
        assert_eq!(args(port, Family::V4), None);
        assert_eq!(args(vec![accept.clone(), counter()], Family::V4), None);
        // A v4-sized address in an IPv6 rule.
        assert_eq!(
            args(addr(12, CmpOp::Eq, &[10, 0, 0, 1]).to_vec(), Family::V6),
            None
        );
        // Two source matches.
        let mut twice = addr(12, CmpOp::Eq, &[10, 0, 0, 1]).to_vec();
        twice.extend(addr(12, CmpOp::Eq, &[10, 0, 0, 2]));
        assert_eq!(args(twice, Family::V4), None);
    }
}
