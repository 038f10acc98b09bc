//! `portmap reconcile --watch`: portmap's reconcile whenever another program deletes an
//! object of portmap's, for as long as it runs (the loop: [`netfilter::watch`]).
//!
//! Its source is the nf_tables events of the namespace, subscribed before the first
//! reconcile: a deletion by another program of anything in the nftables layout's tables
//! (`ip cni_portmap`, `ip6 cni_portmap`), or of the iptables layout's `nat` chains
//! (`CNI-HOSTPORT-*`, `CNI-DN-*`, the legacy `CNI-SN-*`), their rules, or their table
//! ([`is_ours`]). firewalld's iptables backend flushes `nat` on a reload, which those events
//! show; its nftables backend never touches portmap's objects; so portmap needs no D-Bus.
//!
//! Wiring: [`command`] takes the reconcile to run. `portmap reconcile`'s command line hands
//! it `portmap::reconcile::reconcile` for `--watch`, exactly as `firewall reconcile --watch`
//! does with its own; that one call site is all that joins the two.

use std::io::Write;

use cni::operator::OperatorError;
use netfilter::nft::monitor::{Event, Monitor, ObjectKind};
use netfilter::watch::{Outcome, Stop, Watch};

use crate::names;

/// Whether an nf_tables event is about an object of portmap's (module docs).
#[must_use]
pub fn is_ours(event: &Event) -> bool {
    if event.table == names::NFT_TABLE {
        return event.family().is_some();
    }
    if event.table != names::IPT_NAT
        || !event
            .family()
            .is_some_and(|f| matches!(f, netfilter::nft::Family::Ip | netfilter::nft::Family::Ip6))
    {
        return false;
    }
    let chain = event.chain.as_deref().unwrap_or_default();
    match event.kind {
        ObjectKind::Table => true,
        ObjectKind::Chain | ObjectKind::Rule => {
            chain.starts_with("CNI-HOSTPORT-")
                || chain.starts_with("CNI-DN-")
                || chain.starts_with("CNI-SN-")
        }
        _ => false,
    }
}

/// Runs `portmap reconcile --watch` with `reconcile` until SIGTERM or SIGINT; what it does
/// goes to stderr. `reconcile` writes what it restored to the writer it is given and returns
/// its summary line, or why it failed.
///
/// # Errors
/// The nf_tables events cannot be listened to or read.
pub fn command(reconcile: &mut dyn FnMut(&mut dyn Write) -> Outcome) -> Result<(), OperatorError> {
    let mut log = std::io::stderr();
    let stop = Stop::on_signals().map_err(|e| OperatorError::failed(e.to_string()))?;
    let monitor = Monitor::new()
        .map_err(|e| OperatorError::failed(format!("cannot listen to nf_tables events: {e}")))?;
    let _ = writeln!(
        log,
        "watch: watching the nf_tables events of this network namespace"
    );
    let ours = is_ours;
    Watch::new(&ours)
        .run(monitor, &stop, None, reconcile, &mut log)
        .map_err(|e| OperatorError::failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netfilter::nft::Family;
    use netfilter::nft::monitor::Change::Deleted;

    fn event(kind: ObjectKind, family: Family, table: &str, chain: Option<&str>) -> Event {
        Event::new(kind, Deleted, family.code(), table, chain, None)
    }

    #[test]
    fn portmaps_tables_and_nat_chains_are_ours_the_bridges_masquerade_and_others_are_not() {
        use Family::*;
        use ObjectKind::*;
        let ours = [
            event(Table, Ip, "cni_portmap", None),
            event(SetElement, Ip6, "cni_portmap", None),
            event(Chain, Ip, "cni_portmap", Some("gate_0123")),
            event(Table, Ip, "nat", None),
            event(Chain, Ip, "nat", Some("CNI-HOSTPORT-DNAT")),
            event(Rule, Ip6, "nat", Some("CNI-HOSTPORT-MASQ")),
            event(Chain, Ip, "nat", Some("CNI-DN-0123456789abcdef01234")),
            event(Rule, Ip, "nat", Some("CNI-DN-0123456789abcdef01234")),
        ];
        for e in &ours {
            assert!(is_ours(e), "{e:?}");
        }
        let theirs = [
            // The bridge plugin's ipMasq chain and its jump.
            event(Chain, Ip, "nat", Some("CNI-3c5f1e2a4b6d8f0e1a2b3c4d")),
            event(Rule, Ip, "nat", Some("POSTROUTING")),
            event(Chain, Ip, "nat", Some("KUBE-SERVICES")),
            event(Table, Ip, "filter", None),
            event(Chain, Ip, "filter", Some("CNI-FORWARD")),
            event(Table, Inet, "nat", None),
            event(Table, Inet, "cni_firewall", None),
            // The Go plugin's nftables table is its own.
            event(Table, Ip, "cni_hostport", None),
        ];
        for e in &theirs {
            assert!(!is_ours(e), "{e:?}");
        }
    }
}
