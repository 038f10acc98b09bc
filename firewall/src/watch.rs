//! `firewall reconcile --watch`: [`crate::reconcile`] whenever another program deletes an
//! object of the firewall's, and whenever firewalld reloads or starts, for as long as it runs
//! (the loop: [`netfilter::watch`]).
//!
//! Its sources, all subscribed before the first reconcile:
//! - the nf_tables events of the namespace: a deletion by another program of the iptables
//!   layout's chains in `filter` (`CNI-FORWARD`, `CNI-ADMIN`, the isolation chains, or their
//!   table) or of their rules (but the admin chain's, which are the administrator's), or of
//!   anything in the nftables backend's table `inet cni_firewall` ([`is_ours`]);
//! - firewalld's `Reloaded` signal and its taking its bus name (a start or restart): its
//!   nftables backend deletes only its own table, so this is how the zone sources the
//!   firewalld backend added come back; its iptables backend flushes every table, which the
//!   events show as well.
//!
//! No system bus (a node without D-Bus, a container without its socket) is no failure: the
//! watcher logs that firewalld is not watched and watches the events alone. A bus that goes
//! away later ends the watch with status 1 (its unit restarts it).

use std::io::Write;
use std::time::Duration;

use cni::operator::OperatorError;
use netfilter::nft::Family;
use netfilter::nft::monitor::{Event, Monitor, ObjectKind};
use netfilter::watch::{self, Nudge, Nudger, Outcome, Stop, Watch};

use crate::backend::firewalld_signal::{FirewalldEvent, FirewalldSignals};
use crate::names;

/// How long the firewalld thread waits for a signal before looking whether the loop is
/// still there.
const SIGNAL_WAIT: Duration = Duration::from_secs(60);

/// Whether an nf_tables event is about an object of the firewall's (module docs).
#[must_use]
pub fn is_ours(event: &Event) -> bool {
    match event.family() {
        Some(Family::Inet) => event.table == names::NFT_TABLE,
        Some(Family::Ip | Family::Ip6) if event.table == names::FILTER_TABLE => {
            let chain = event.chain.as_deref().unwrap_or_default();
            match event.kind {
                ObjectKind::Table => true,
                ObjectKind::Chain => chain.starts_with("CNI-"),
                // The admin chain's rules are the administrator's to delete.
                ObjectKind::Rule => [
                    names::CNI_FORWARD_CHAIN,
                    names::STAGE1_CHAIN,
                    names::STAGE2_CHAIN,
                ]
                .contains(&chain),
                _ => false,
            }
        }
        _ => false,
    }
}

/// Runs `firewall reconcile --watch` until SIGTERM or SIGINT, with `reconcile` as the repair;
/// what it does goes to stderr.
///
/// # Errors
/// A source cannot be opened or read (the nf_tables socket, the bus once connected).
pub fn command(reconcile: &mut dyn FnMut(&mut dyn Write) -> Outcome) -> Result<(), OperatorError> {
    let failed = |e: watch::WatchError| OperatorError::failed(e.to_string());
    let mut log = std::io::stderr();
    // Before any thread: the bus connection's threads must inherit the blocked signals.
    let stop = Stop::on_signals().map_err(failed)?;
    let monitor = Monitor::new()
        .map_err(|e| OperatorError::failed(format!("cannot listen to nf_tables events: {e}")))?;
    let (nudger, nudges) = watch::nudges().map_err(failed)?;
    match FirewalldSignals::system() {
        Ok(signals) => {
            let _ = writeln!(
                log,
                "watch: watching the nf_tables events of this network namespace and firewalld's \
                 signals"
            );
            std::thread::Builder::new()
                .name("firewalld".to_owned())
                .spawn(move || forward(signals, &nudger))
                .map_err(|e| {
                    OperatorError::failed(format!("cannot start the firewalld thread: {e}"))
                })?;
        }
        Err(e) => {
            let _ = writeln!(
                log,
                "watch: watching the nf_tables events of this network namespace; firewalld's \
                 signals are not watched: {e}"
            );
        }
    }
    let ours = is_ours;
    Watch::new(&ours)
        .run(monitor, &stop, Some(&nudges), reconcile, &mut log)
        .map_err(failed)
}

/// Passes firewalld's announcements to the loop until the loop or the bus goes.
fn forward(mut signals: FirewalldSignals, nudger: &Nudger) {
    loop {
        let nudge = match signals.wait(SIGNAL_WAIT) {
            Ok(Some(FirewalldEvent::Reloaded)) => Nudge::Repair("firewalld reloaded".to_string()),
            Ok(Some(FirewalldEvent::Started)) => Nudge::Repair("firewalld started".to_string()),
            // Nothing meanwhile: a wake-up only to see whether the loop is still there.
            Ok(None) => continue,
            Err(e) => Nudge::Failed(format!("firewalld's signals: {e}")),
        };
        let failed = matches!(nudge, Nudge::Failed(_));
        if !nudger.send(nudge) || failed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netfilter::nft::monitor::Change::{Deleted, New};

    fn event(kind: ObjectKind, family: Family, table: &str, chain: Option<&str>) -> Event {
        Event::new(kind, Deleted, family.code(), table, chain, None)
    }

    #[test]
    fn the_firewalls_tables_chains_and_rules_are_ours_the_admins_rules_and_others_are_not() {
        use Family::*;
        use ObjectKind::*;
        let ours = [
            event(Table, Inet, "cni_firewall", None),
            event(SetElement, Inet, "cni_firewall", None),
            event(Rule, Inet, "cni_firewall", Some("attachments")),
            event(Table, Ip, "filter", None),
            event(Chain, Ip6, "filter", Some("CNI-FORWARD")),
            event(Chain, Ip, "filter", Some("CNI-ADMIN")),
            event(Chain, Ip, "filter", Some("CNI-ISOLATION-STAGE-1")),
            event(Rule, Ip, "filter", Some("CNI-FORWARD")),
            event(Rule, Ip6, "filter", Some("CNI-ISOLATION-STAGE-2")),
        ];
        for e in &ours {
            assert!(is_ours(e), "{e:?}");
        }
        let theirs = [
            event(Rule, Ip, "filter", Some("CNI-ADMIN")),
            event(Rule, Ip, "filter", Some("FORWARD")),
            event(Chain, Ip, "filter", Some("KUBE-FORWARD")),
            event(Table, Ip, "nat", None),
            event(Chain, Ip, "nat", Some("CNI-HOSTPORT-DNAT")),
            event(Table, Inet, "firewalld", None),
            event(Table, Ip, "cni_firewall", None),
        ];
        for e in &theirs {
            assert!(!is_ours(e), "{e:?}");
        }
        // The kind of change is the loop's business.
        let added = Event::new(Chain, New, Ip.code(), "filter", Some("CNI-FORWARD"), None);
        assert!(is_ours(&added));
    }
}
