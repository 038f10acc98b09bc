//! The entry rules of the reference's layout read where `iptables-nft` keeps them, in
//! nf_tables, without exec and whatever wrote them (our iptables backend, the Go plugin, with
//! conditions outside the forms `netfilter::iptables::native` decodes): their comment and the
//! chain they jump to. For GC, which reads them all.

use netfilter::nft::{Expr, Nft, NftError, Verdict};

use super::NAT;
use crate::config::IpFamily;
use crate::names;

/// An entry rule of `CNI-HOSTPORT-DNAT` as `iptables-nft` encodes it: `-p PROTO -m comment
/// --comment TEXT -m multiport --dports P,… -j CNI-DN-…`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Entry {
    /// The comment, `dnat name: "<network>" id: "<id>"` where the reference wrote it.
    pub(super) comment: Option<String>,
    /// The chain it jumps to.
    pub(super) chain: Option<String>,
}

impl Entry {
    pub(super) fn decode(exprs: &[Expr]) -> Entry {
        let mut entry = Entry::default();
        for e in exprs {
            match e {
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

/// The entry rules of `CNI-HOSTPORT-DNAT` in `family`'s table, decoded; none when the chain or
/// table does not exist (GC reads them all: its cost may grow with the node).
///
/// # Errors
/// nf_tables failures other than "not found".
pub(super) fn entries(nft: &mut Nft, family: IpFamily) -> Result<Vec<Entry>, NftError> {
    let table = netfilter::iptables::native::nft_table(family.into(), NAT);
    match nft.rules(&table, names::IPT_TOPLEVEL_DNAT) {
        Ok(rules) => Ok(rules.iter().map(|r| Entry::decode(&r.exprs)).collect()),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netfilter::nft::CmpOp;
    use netlink_packet_netfilter::nftables::MetaKey;

    /// The expressions `nft --debug=netlink` shows for an entry rule written by `iptables-nft`
    /// 1.8.9.
    #[test]
    fn an_entry_rule_decodes_from_iptables_nft_expressions() {
        let exprs = vec![
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: vec![6],
            },
            Expr::XtMatch {
                name: "comment".into(),
                rev: 0,
                info: b"dnat name: \"n\" id: \"c\"\0\0\0".to_vec(),
            },
            Expr::XtMatch {
                name: "multiport".into(),
                rev: 1,
                info: vec![0u8; 48],
            },
            Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::ImmediateVerdict(Verdict::Jump("CNI-DN-abc".into())),
        ];
        assert_eq!(
            Entry::decode(&exprs),
            Entry {
                comment: Some("dnat name: \"n\" id: \"c\"".into()),
                chain: Some("CNI-DN-abc".into()),
            }
        );
    }
}
