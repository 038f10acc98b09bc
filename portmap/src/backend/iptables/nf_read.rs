//! The reference's layout read where `iptables-nft` keeps it, in nf_tables, without exec and
//! whatever wrote it (our iptables backend, the Go plugin, with conditions outside the forms
//! `common::iptables::native` decodes): the entry rules of `CNI-HOSTPORT-DNAT` (protocol,
//! multiport list, comment, target chain) and the DNAT rules of a `CNI-DN-` chain (protocol,
//! port, host address). For the nftables backend's conflict check and for GC.

use std::collections::HashSet;
use std::net::IpAddr;

use common::nft::{CmpOp, Expr, Nft, NftError, PayloadBase, Verdict};
use netlink_packet_netfilter::nftables::MetaKey;

use super::NAT;
use crate::config::{IpFamily, PortMapping};
use crate::names;

/// Who holds one of `mappings` in the reference's layout of `family`, where the tools are
/// `iptables-nft` and so the layout is in nf_tables, read without exec: the entry rules of
/// `CNI-HOSTPORT-DNAT` name the chains that take a port (their multiport lists), and a DNAT
/// rule of such a chain with the same protocol, port and host address (or none, for both)
/// holds it. The chain `ours` is skipped. No entry chain, no holder; the legacy tools' layout
/// is not in nf_tables and is not read.
///
/// # Errors
/// nf_tables failures other than "not found".
pub fn holder_in_nf_tables<'m>(
    nft: &mut Nft,
    family: IpFamily,
    ours: &str,
    mappings: &[&'m PortMapping],
) -> Result<Option<(&'m PortMapping, String)>, NftError> {
    let table = common::iptables::native::nft_table(family.into(), NAT);
    let entries = match nft.rules(&table, names::IPT_TOPLEVEL_DNAT) {
        Ok(rules) => rules,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut looked: HashSet<String> = HashSet::new();
    for entry in entries.iter().map(|r| Entry::decode(&r.exprs)) {
        let Some(chain) = entry.chain.filter(|c| c != ours) else {
            continue;
        };
        let taken = mappings.iter().any(|m| {
            Some(m.proto.l4().number()) == entry.proto && entry.ports.contains(&m.host_port)
        });
        if !taken || !looked.insert(chain.clone()) {
            continue;
        }
        let rules = match nft.rules(&table, &chain) {
            Ok(rules) => rules,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        for dnat in rules.iter().filter_map(|r| Dnat::decode(family, &r.exprs)) {
            let held = mappings.iter().find(|m| {
                Some(m.proto.l4().number()) == dnat.proto
                    && Some(m.host_port) == dnat.port
                    && m.host_ip.addr() == dnat.daddr
            });
            if let Some(m) = held {
                let owner = match entry.comment {
                    Some(c) => format!("{c} (chain {chain})"),
                    None => format!("chain {chain}"),
                };
                return Ok(Some((m, owner)));
            }
        }
    }
    Ok(None)
}

/// An entry rule of `CNI-HOSTPORT-DNAT` as `iptables-nft` encodes it: `-p PROTO -m comment
/// --comment TEXT -m multiport --dports P,… -j CNI-DN-…`.
#[derive(Debug, Default)]
pub(super) struct Entry {
    proto: Option<u8>,
    ports: Vec<u16>,
    /// The comment, `dnat name: "<network>" id: "<id>"` where the reference wrote it.
    pub(super) comment: Option<String>,
    /// The chain it jumps to.
    pub(super) chain: Option<String>,
}

impl Entry {
    pub(super) fn decode(exprs: &[Expr]) -> Entry {
        let mut entry = Entry::default();
        for (i, e) in exprs.iter().enumerate() {
            match e {
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    ..
                } => entry.proto = cmp_after(exprs, i).and_then(|d| d.first().copied()),
                Expr::XtMatch { name, rev: 1, info } if name == "multiport" => {
                    entry.ports = multiport_ports(info);
                }
                Expr::XtMatch { name, info, .. } if name == "comment" => {
                    let end = info.iter().position(|b| *b == 0).unwrap_or(info.len());
                    entry.comment = String::from_utf8(info[..end].to_vec()).ok();
                }
                Expr::ImmediateVerdict(Verdict::Jump(chain)) => entry.chain = Some(chain.clone()),
                _ => {}
            }
        }
        entry
    }
}

/// The ports of an `xt_multiport_v1` (flags u8, count u8, ports u16[15] in host order, …).
fn multiport_ports(info: &[u8]) -> Vec<u16> {
    let count = info.get(1).map_or(0, |c| usize::from(*c).min(15));
    (0..count)
        .filter_map(|i| {
            let at = 2 + 2 * i;
            info.get(at..at + 2)
                .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        })
        .collect()
}

/// The comparison data of the `Cmp` right after the load at `i`.
fn cmp_after(exprs: &[Expr], i: usize) -> Option<&[u8]> {
    match exprs.get(i + 1) {
        Some(Expr::Cmp {
            op: CmpOp::Eq,
            data,
            ..
        }) => Some(data),
        _ => None,
    }
}

/// A DNAT rule of a `CNI-DN-` chain as `iptables-nft` encodes it: `[-d ADDR] -p PROTO -m PROTO
/// --dport PORT -j DNAT …`: a port match and no source match nor jump (the hairpin and
/// localhost rules of the chain match a source, or with `masqAll` jump to the mark chain).
#[derive(Debug, Default)]
struct Dnat {
    proto: Option<u8>,
    port: Option<u16>,
    daddr: Option<IpAddr>,
}

impl Dnat {
    fn decode(family: IpFamily, exprs: &[Expr]) -> Option<Dnat> {
        let (saddr, daddr, len) = match family {
            IpFamily::V4 => (12, 16, 4),
            IpFamily::V6 => (8, 24, 16),
        };
        let mut dnat = Dnat::default();
        for (i, e) in exprs.iter().enumerate() {
            match e {
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    ..
                } => dnat.proto = cmp_after(exprs, i).and_then(|d| d.first().copied()),
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    ..
                } if *offset == saddr => return None,
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len: l,
                    ..
                } if *offset == daddr && *l == len => {
                    dnat.daddr = cmp_after(exprs, i).and_then(|d| match d.len() {
                        4 => <[u8; 4]>::try_from(d).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(d).ok().map(IpAddr::from),
                        _ => None,
                    });
                }
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 2,
                    len: 2,
                    ..
                } => {
                    dnat.port = cmp_after(exprs, i)
                        .and_then(|d| <[u8; 2]>::try_from(d).ok())
                        .map(u16::from_be_bytes);
                }
                Expr::ImmediateVerdict(Verdict::Jump(_) | Verdict::Goto(_)) => return None,
                _ => {}
            }
        }
        dnat.port.is_some().then_some(dnat)
    }
}

/// The entry rules of `CNI-HOSTPORT-DNAT` in `family`'s table, decoded; none when the chain or
/// table does not exist (GC reads them all: its cost may grow with the node).
///
/// # Errors
/// nf_tables failures other than "not found".
pub(super) fn entries(nft: &mut Nft, family: IpFamily) -> Result<Vec<Entry>, NftError> {
    let table = common::iptables::native::nft_table(family.into(), NAT);
    match nft.rules(&table, names::IPT_TOPLEVEL_DNAT) {
        Ok(rules) => Ok(rules.iter().map(|r| Entry::decode(&r.exprs)).collect()),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_proto(n: u8) -> [Expr; 2] {
        [
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: vec![n],
            },
        ]
    }

    fn payload(base: PayloadBase, offset: u32, data: &[u8]) -> [Expr; 2] {
        [
            Expr::Payload {
                base,
                offset,
                len: u32::try_from(data.len()).unwrap(),
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: data.to_vec(),
            },
        ]
    }

    /// The expressions `nft --debug=netlink` shows for the reference's rules written by
    /// `iptables-nft` 1.8.9.
    #[test]
    fn the_reference_layout_decodes_from_iptables_nft_expressions() {
        let mut info = vec![0u8; 48];
        info[1] = 2;
        info[2..4].copy_from_slice(&8080u16.to_ne_bytes());
        info[4..6].copy_from_slice(&9090u16.to_ne_bytes());
        let mut exprs = meta_proto(6).to_vec();
        exprs.push(Expr::XtMatch {
            name: "comment".into(),
            rev: 0,
            info: b"dnat name: \"n\" id: \"c\"\0\0\0".to_vec(),
        });
        exprs.push(Expr::XtMatch {
            name: "multiport".into(),
            rev: 1,
            info,
        });
        exprs.push(Expr::Counter {
            packets: 0,
            bytes: 0,
        });
        exprs.push(Expr::ImmediateVerdict(Verdict::Jump("CNI-DN-abc".into())));
        let entry = Entry::decode(&exprs);
        assert_eq!(entry.proto, Some(6));
        assert_eq!(entry.ports, [8080, 9090]);
        assert_eq!(entry.comment.as_deref(), Some("dnat name: \"n\" id: \"c\""));
        assert_eq!(entry.chain.as_deref(), Some("CNI-DN-abc"));

        // -d 10.1.1.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80
        let mut dnat = meta_proto(6).to_vec();
        dnat.extend(payload(PayloadBase::Network, 16, &[10, 1, 1, 1]));
        dnat.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        dnat.push(Expr::Other("target".into()));
        let d = Dnat::decode(IpFamily::V4, &dnat).unwrap();
        assert_eq!(
            (d.proto, d.port, d.daddr),
            (Some(6), Some(8080), Some("10.1.1.1".parse().unwrap()))
        );
        // The hairpin rule matches a source (a /24: a 3-byte load); with masqAll it jumps to
        // the mark chain instead. Neither is a DNAT.
        let mut hairpin = meta_proto(6).to_vec();
        hairpin.extend(payload(PayloadBase::Network, 12, &[10, 0, 0]));
        hairpin.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        assert!(Dnat::decode(IpFamily::V4, &hairpin).is_none());
        let mut masq_all = meta_proto(6).to_vec();
        masq_all.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        masq_all.push(Expr::ImmediateVerdict(Verdict::Jump(
            names::IPT_SETMARK.into(),
        )));
        assert!(Dnat::decode(IpFamily::V4, &masq_all).is_none());
    }
}
