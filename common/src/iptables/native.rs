//! Reading chains of an `iptables-nft` table over nf_tables netlink instead of `iptables-save`.
//!
//! `iptables-save` formats the whole table, so its cost grows with every rule in it (20–30 ms
//! at 2000 rules here), while a caller usually needs a handful of chains. Where the iptables
//! tools are the nf_tables variant, their rules are nf_tables rules, and the few forms the
//! plugins write decode back to `iptables-save`'s canonical arguments exactly. A chain holding
//! a rule outside those forms makes the whole read give up, so the caller falls back to
//! `iptables-save` rather than guess.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use netlink_packet_netfilter::nftables::MetaKey;

use super::{Family, TableDump};
use crate::nft::{
    CmpOp, Expr, Family as NftFamily, Nft, NftError, PayloadBase, Rule, Table, Verdict,
};

/// Whether `<family>-restore` on `PATH` is the nf_tables variant (`xtables-nft-multi` or an
/// `*-nft-restore`, through any chain of symlinks such as Debian's alternatives).
/// Resolved once per process and family: ADD asks before starting the restore and again
/// before reading.
#[must_use]
pub fn writes_nf_tables(family: Family) -> bool {
    static V4: OnceLock<bool> = OnceLock::new();
    static V6: OnceLock<bool> = OnceLock::new();
    match family {
        Family::V4 => *V4.get_or_init(|| resolve_nf_tables(family)),
        Family::V6 => *V6.get_or_init(|| resolve_nf_tables(family)),
    }
}

fn resolve_nf_tables(family: Family) -> bool {
    let program = format!("{}-restore", family.prefix());
    let Some(found) = on_path(&program) else {
        return false;
    };
    let Ok(real) = std::fs::canonicalize(found) else {
        return false;
    };
    real.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "xtables-nft-multi" || n.ends_with("-nft-restore"))
}

/// Where `program` is on `PATH`, if it is.
#[must_use]
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| Path::new(candidate).exists())
}

/// Which rules of a chain a read needs.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'a> {
    /// Every rule.
    All,
    /// Only the rules whose netlink encoding contains one of these byte strings (an address
    /// in network byte order, a chain name…): a rule a caller looks for necessarily contains
    /// its address or its jump target, so leaving the others out answers "is this rule
    /// there?" exactly, while a chain of thousands costs the kernel's listing but not their
    /// decoding. An empty list reads whether the chain exists and nothing else.
    Containing(&'a [Vec<u8>]),
    /// Only the first rule containing one of these byte strings, if any: the listing stops
    /// there ([`Nft::first_rule_containing`]), so a rule near the top of a chain of thousands
    /// costs a handful of rules' listing. A caller that needs every such rule wants
    /// [`Wanted::Containing`].
    FirstContaining(&'a [Vec<u8>]),
}

/// The nf_tables table `iptables-nft` keeps `family`'s iptables table `name` in: `ip NAME` or
/// `ip6 NAME`.
#[must_use]
pub fn nft_table(family: Family, name: &str) -> Table {
    Table::new(
        match family {
            Family::V4 => NftFamily::Ip,
            Family::V6 => NftFamily::Ip6,
        },
        name,
    )
}

/// The rules of `chains` in `table` of `family`, as `iptables-save` would print them, left
/// out as each chain's [`Wanted`] says; chains that do not exist are absent from the dump.
/// `None` when a rule read is not in a form [`rule_args`] knows.
///
/// # Errors
/// When nf_tables cannot be asked.
pub fn snapshot(
    family: Family,
    table: &str,
    chains: &[(&str, Wanted<'_>)],
) -> Result<Option<TableDump>, NftError> {
    let mut nft = Nft::new()?;
    let table = nft_table(family, table);
    let mut dump = TableDump::default();
    for (chain, wanted) in chains {
        let listed = match wanted {
            Wanted::All => nft.rules(&table, chain),
            Wanted::Containing(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                nft.rules_containing(&table, chain, &needles)
            }
            Wanted::FirstContaining(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                Nft::first_rule_containing(&table, chain, &needles).map(Vec::from_iter)
            }
        };
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let mut rules = Vec::with_capacity(listed.len());
        for rule in listed {
            // iptables-nft keeps `-m comment` as an xtables match; a rule comment in user data
            // was written by something else.
            let args = match rule.comment {
                None => rule_args(family, &rule.exprs),
                Some(_) => None,
            };
            match args {
                Some(args) => rules.push(args),
                None => {
                    log::debug!("{table} {chain}: rule {} is not decoded", rule.handle);
                    return Ok(None);
                }
            }
        }
        dump.chains.push((*chain).to_owned());
        dump.rules.insert((*chain).to_owned(), rules);
    }
    Ok(Some(dump))
}

/// A rule's arguments as `iptables-save` prints them (without `-A CHAIN`), when the rule is
/// how `iptables-nft` encodes one of: `[!] -s ADDR`, `[!] -d ADDR` (host addresses),
/// `[!] -i IFACE`, `[!] -o IFACE`, `[!] -p tcp|udp|icmp|…` (without a protocol match such as
/// `-m tcp`), `-m comment --comment TEXT`,
/// `-m conntrack [!] --ctstate STATES`, and a verdict (`-j ACCEPT|DROP|RETURN|CHAIN`,
/// `-g CHAIN`). `None` for anything else.
#[must_use]
pub fn rule_args(family: Family, exprs: &[Expr]) -> Option<Vec<String>> {
    let (saddr, daddr, addr_len) = match family {
        Family::V4 => (12, 16, 4),
        Family::V6 => (8, 24, 16),
    };
    let mut src = None;
    let mut dst = None;
    let mut iif = None;
    let mut oif = None;
    let mut proto = None;
    let mut matches: Vec<String> = Vec::new();
    let mut target: Option<Vec<String>> = None;
    let mut rest = exprs;
    loop {
        if target.is_some() && !rest.is_empty() {
            return None;
        }
        match rest {
            [] => break,
            [
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len,
                    dreg,
                },
                Expr::Cmp { sreg, op, data },
                tail @ ..,
            ] if sreg == dreg && *len == addr_len && data.len() == addr_len as usize => {
                let slot = match *offset {
                    o if o == saddr => &mut src,
                    o if o == daddr => &mut dst,
                    _ => return None,
                };
                if slot.is_some() {
                    return None;
                }
                *slot = Some((*op == CmpOp::Neq, host_cidr(data)?));
                rest = tail;
            }
            [
                Expr::Meta { key, dreg },
                Expr::Cmp { sreg, op, data },
                tail @ ..,
            ] if sreg == dreg => {
                let (slot, value) = match key {
                    MetaKey::Iifname => (&mut iif, iface_name(data)?),
                    MetaKey::Oifname => (&mut oif, iface_name(data)?),
                    MetaKey::L4Proto => (&mut proto, proto_name(data)?.to_owned()),
                    _ => return None,
                };
                if slot.is_some() {
                    return None;
                }
                *slot = Some((*op == CmpOp::Neq, value));
                rest = tail;
            }
            [Expr::XtMatch { name, rev, info }, tail @ ..] => {
                matches.push("-m".to_owned());
                matches.push(name.clone());
                match (name.as_str(), rev) {
                    ("comment", 0) => {
                        matches.push("--comment".to_owned());
                        matches.push(c_string(info)?);
                    }
                    ("conntrack", 3) => matches.extend(ctstate(info)?),
                    _ => return None,
                }
                rest = tail;
            }
            [Expr::Counter { .. }, tail @ ..] => rest = tail,
            [Expr::ImmediateVerdict(verdict), tail @ ..] => {
                target = Some(match verdict {
                    Verdict::Accept => vec!["-j".into(), "ACCEPT".into()],
                    Verdict::Drop => vec!["-j".into(), "DROP".into()],
                    Verdict::Return => vec!["-j".into(), "RETURN".into()],
                    Verdict::Jump(chain) => vec!["-j".into(), chain.clone()],
                    Verdict::Goto(chain) => vec!["-g".into(), chain.clone()],
                });
                rest = tail;
            }
            _ => return None,
        }
    }
    let mut args = Vec::new();
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

/// `10.0.0.2/32` or `fd00::2/128` from an address in network byte order.
fn host_cidr(data: &[u8]) -> Option<String> {
    if let Ok(v4) = <[u8; 4]>::try_from(data) {
        return Some(format!("{}/32", IpAddr::from(Ipv4Addr::from(v4))));
    }
    let v6 = <[u8; 16]>::try_from(data).ok()?;
    Some(format!("{}/128", Ipv6Addr::from(v6)))
}

/// The name `iptables-save` prints for a `-p` protocol number (its own table of names).
fn proto_name(data: &[u8]) -> Option<&'static str> {
    Some(match data {
        [1] => "icmp",
        [6] => "tcp",
        [17] => "udp",
        [50] => "esp",
        [51] => "ah",
        [58] => "ipv6-icmp",
        [132] => "sctp",
        [136] => "udplite",
        _ => return None,
    })
}

/// An interface match: `iptables-nft` compares the name with its terminating NUL for an exact
/// name, and without it for a `+` wildcard prefix.
fn iface_name(data: &[u8]) -> Option<String> {
    match data.split_last() {
        Some((&0, name)) if !name.contains(&0) && !name.is_empty() => {
            String::from_utf8(name.to_vec()).ok()
        }
        _ if !data.contains(&0) => String::from_utf8(data.to_vec()).ok().map(|n| n + "+"),
        _ => None,
    }
}

/// The NUL-terminated string at the start of an `xt_comment_info`.
fn c_string(info: &[u8]) -> Option<String> {
    let end = info.iter().position(|b| *b == 0)?;
    String::from_utf8(info[..end].to_vec()).ok()
}

// `struct xt_conntrack_mtinfo3` (linux/netfilter/xt_conntrack.h): eight 16-byte addresses and
// masks, two u32 expiry bounds, five u16 (l4proto and ports), then the flags, all host order.
const CT_MATCH_FLAGS: usize = 146;
const CT_INVERT_FLAGS: usize = 148;
const CT_STATE_MASK: usize = 150;
const XT_CONNTRACK_STATE: u16 = 1;
/// The states in the order `iptables-save` prints them, with their `XT_CONNTRACK_STATE_*` bit.
const CT_STATES: [(&str, u16); 7] = [
    ("INVALID", 1),
    ("NEW", 1 << 3),
    ("RELATED", 1 << 2),
    ("ESTABLISHED", 1 << 1),
    ("UNTRACKED", 1 << 8),
    ("SNAT", 1 << 6),
    ("DNAT", 1 << 7),
];

/// `[!] --ctstate A,B` from a revision-3 conntrack match that tests the state and nothing else.
fn ctstate(info: &[u8]) -> Option<Vec<String>> {
    let u16_at = |at: usize| {
        info.get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let (flags, invert, mask) = (
        u16_at(CT_MATCH_FLAGS)?,
        u16_at(CT_INVERT_FLAGS)?,
        u16_at(CT_STATE_MASK)?,
    );
    if flags != XT_CONNTRACK_STATE || invert & !XT_CONNTRACK_STATE != 0 || mask == 0 {
        return None;
    }
    let known = CT_STATES.iter().fold(0, |all, (_, bit)| all | bit);
    if mask & !known != 0 {
        return None;
    }
    let states: Vec<&str> = CT_STATES
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(name, _)| *name)
        .collect();
    let mut args = Vec::new();
    if invert != 0 {
        args.push("!".to_owned());
    }
    args.push("--ctstate".to_owned());
    args.push(states.join(","));
    Some(args)
}

/// `XT_ALIGN(sizeof(struct xt_conntrack_mtinfo3))` on 64-bit machines: the `info` length
/// `iptables-nft` sends and the kernel lists.
const CT_INFO_LEN: usize = 168;

/// The revision-3 conntrack match info that `-m conntrack --ctstate A,B` makes.
fn ctstate_info(states: &str) -> Option<Vec<u8>> {
    let mut mask = 0u16;
    for state in states.split(',') {
        mask |= CT_STATES.iter().find(|(name, _)| *name == state)?.1;
    }
    let mut info = vec![0; CT_INFO_LEN];
    info[CT_MATCH_FLAGS..CT_MATCH_FLAGS + 2].copy_from_slice(&XT_CONNTRACK_STATE.to_ne_bytes());
    info[CT_STATE_MASK..CT_STATE_MASK + 2].copy_from_slice(&mask.to_ne_bytes());
    Some(info)
}

/// The nf_tables rule that `iptables-nft` makes of `-A CHAIN <args>`, expression for
/// expression, for the forms the plugins append: `[-s ADDR] [-d ADDR]` (host addresses of
/// `family`), `[-m conntrack --ctstate STATES]`, then `-j ACCEPT|DROP|RETURN|CHAIN`, with the
/// counter `iptables-nft` puts before every verdict. [`rule_args`] decodes it back to `args`.
/// `None` for any other form, which the caller leaves to `iptables-restore`.
#[must_use]
pub fn encode_rule(family: Family, args: &[String]) -> Option<Rule> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut rest = args.as_slice();
    let mut rule = Rule::new();
    if let ["-s", addr, tail @ ..] = rest {
        rule = rule.saddr(host_addr(family, addr)?);
        rest = tail;
    }
    if let ["-d", addr, tail @ ..] = rest {
        rule = rule.daddr(host_addr(family, addr)?);
        rest = tail;
    }
    if let ["-m", "conntrack", "--ctstate", states, tail @ ..] = rest {
        rule = rule.xt_match("conntrack", 3, ctstate_info(states)?);
        rest = tail;
    }
    let rule = rule.counter();
    Some(match rest {
        ["-j", "ACCEPT"] => rule.accept(),
        ["-j", "DROP"] => rule.drop(),
        ["-j", "RETURN"] => rule.ret(),
        ["-j", chain] if !chain.is_empty() && !chain.starts_with('-') => rule.jump(chain),
        _ => return None,
    })
}

/// The address of `10.0.0.2/32` or `fd00::2/128` (the form `iptables-save` prints a host
/// in), when it is of `family`.
fn host_addr(family: Family, cidr: &str) -> Option<IpAddr> {
    let net: ipnet::IpNet = cidr.parse().ok()?;
    let addr = net.addr();
    (net.prefix_len() == net.max_prefix_len() && Family::of(&addr) == family).then_some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::expr::REG_1;

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
        info[CT_MATCH_FLAGS..CT_MATCH_FLAGS + 2].copy_from_slice(&flags.to_ne_bytes());
        info[CT_INVERT_FLAGS..CT_INVERT_FLAGS + 2].copy_from_slice(&invert.to_ne_bytes());
        info[CT_STATE_MASK..CT_STATE_MASK + 2].copy_from_slice(&mask.to_ne_bytes());
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
        rule_args(family, &exprs).map(|a| a.join(" "))
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
        let rule = encode_rule(Family::V4, &strings(line)).unwrap();
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
            let rule = encode_rule(family, &strings(line)).unwrap();
            let exprs = rule.encode(table).unwrap();
            assert_eq!(args(exprs, family).as_deref(), Some(line), "{line}");
        }
    }

    #[test]
    fn forms_outside_the_encoder_are_left_to_the_tools() {
        for (family, line) in [
            (Family::V4, "-s 10.1.0.0/16 -j ACCEPT"),
            (Family::V6, "-s 10.1.0.5/32 -j ACCEPT"),
            (Family::V4, "-d 10.1.0.5/32 -s 10.1.0.6/32 -j ACCEPT"),
            (Family::V4, "! -s 10.1.0.5/32 -j ACCEPT"),
            (Family::V4, "-i br0 -j ACCEPT"),
            (Family::V4, "-m conntrack --ctstate BOGUS -j ACCEPT"),
            (Family::V4, "-m conntrack ! --ctstate NEW -j ACCEPT"),
            (Family::V4, "-m comment --comment x -j ACCEPT"),
            (Family::V4, "-s 10.1.0.5/32"),
            (Family::V4, "-s 10.1.0.5/32 -g X"),
            (Family::V4, "-j ACCEPT -s 10.1.0.5/32"),
        ] {
            assert!(encode_rule(family, &strings(line)).is_none(), "{line}");
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
