//! `firewall reconcile`: puts back what something else removed of the live attachments'
//! objects (`firewall-cmd --reload`, `systemctl restart nftables`, `nft flush ruleset`,
//! `iptables -F`, an `iptables-restore` of an older save), from the records every ADD keeps
//! ([`crate::backend::state`]).
//!
//! Run by an operator or a unit as root in the namespace the plugin runs in (the host's), it
//! holds the namespace's lock (so no ADD or DEL interleaves) and:
//!
//! 1. reads every record of the namespace; those of earlier versions, which do not say how
//!    they were made, are left alone, neither restored nor dropped;
//! 2. proves, with one dump of the namespace ids
//!    ([`NetnsId::gone_by_id`](netlink::census::NetnsId::gone_by_id)), which owners'
//!    namespaces are gone, and removes those attachments as DEL would (objects and record);
//! 3. asks each backend, for all the attachments it made under one configuration at once,
//!    what is missing ([`FirewallBackend::missing`](crate::backend::FirewallBackend::missing): one read of our own objects, nothing
//!    written); an attachment found lacking is first proven alive or gone in full
//!    ([`NetnsId::is_gone`](netlink::census::NetnsId::is_gone): a dead one is removed, never
//!    brought back);
//! 4. has the backend put back what is missing ([`FirewallBackend::restore`](crate::backend::FirewallBackend::restore)): the shared
//!    chains, tables and sets, and each attachment's rules, elements or sources, adding
//!    nothing that is there and touching no other program's objects.
//!
//! It prints one line per attachment restored or removed and a summary; with nothing missing
//! and nobody gone it writes nothing at all. Exit status 0 on success, 1 when something could
//! not be restored or read (with the reason on stderr).

use std::cell::OnceCell;
use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;

use cni::operator::{OperatorCommand, OperatorError};
use cni::reconcile::who;
use netlink::Netlink;

use crate::backend::state::{Made, State};
use crate::backend::{Missing, Recorded};
use crate::config::Config;
use crate::error::FirewallError;

/// What one reconcile did ([`cni::reconcile::Report`], the same for portmap's).
pub use cni::reconcile::Report;

/// The command, as `firewall --help` lists it.
pub const COMMAND: OperatorCommand = OperatorCommand {
    name: "reconcile",
    options: "[--watch]",
    summary: "put back what is missing of every live attachment's firewall objects",
    help: "Puts back what something else removed of the firewall objects of the live \
attachments of this network namespace (firewall-cmd --reload, a restart of nftables.service, \
nft flush ruleset, iptables -F, an iptables-restore of an older save), from the records each \
ADD keeps under /run/cni-firewall: the shared chains, tables and sets, and each attachment's \
accept rules (iptables), set elements (nftables), zone sources (firewalld) and bridge \
isolation rules. It adds nothing that is there and touches no other program's objects. An \
attachment whose network namespace is gone is removed, as DEL would, not restored. Records of \
earlier versions, which do not say how they were made, are left alone.

Run it as root in the network namespace the plugin runs in (the host's). It prints one line \
per attachment restored or removed, and a summary; with nothing missing it changes nothing.

--watch  Keep running: reconcile at once, then again whenever another program deletes an \
object of the firewall's (nf_tables events: nft flush ruleset, iptables-nft -F or -X, an \
iptables-restore) and whenever firewalld reloads or starts (its D-Bus signals), once the burst \
has settled (100 ms without a new one, at most 500 ms after the first). It ignores its own \
changes and the plugin's own ADD and DEL, logs what it does on stderr, and stops on SIGTERM or \
SIGINT with status 0. Changes made with the legacy iptables tools make no event. Meant for a \
service (deploy/systemd/cni-reconcile-watch@.service), never started by the plugin itself.

Exit status: 0 when everything missing was restored (with --watch: when stopped by a signal), \
1 otherwise (the reason on stderr), 2 for a wrong command line.",
};

/// Runs `firewall reconcile` with the arguments after the command.
///
/// # Errors
/// An option it does not take; a failure to read the records or the firewall; attachments
/// it could not restore.
pub fn command(args: &[String], out: &mut dyn Write) -> Result<(), OperatorError> {
    match args {
        [] => {}
        [watch] if watch == "--watch" => {
            return crate::watch::command(&mut |out| {
                reconcile(out).map_err(|e| e.to_string())?.outcome()
            });
        }
        [arg, ..] => return Err(OperatorError::usage(format!("unknown argument {arg:?}"))),
    }
    let report = reconcile(out).map_err(|e| OperatorError::failed(e.to_string()))?;
    cni::reconcile::finish(&report, out)
}

/// A recorded attachment.
struct Entry {
    /// What it needs restored: the addresses it claims.
    recorded: Recorded,
    /// How it was made.
    made: Made,
    /// The addresses of its record (also those another attachment claims now), for its DEL.
    ips: Vec<IpAddr>,
}

/// Reconciles the calling thread's namespace, printing a line per attachment restored or
/// removed on `out`.
///
/// # Errors
/// When the records cannot be read. A backend whose objects cannot be read, and attachments
/// that cannot be restored or removed, are in the report's failures.
pub fn reconcile(out: &mut dyn Write) -> Result<Report, FirewallError> {
    let state = State::for_current_netns()?;
    if state.names()?.is_empty() {
        // Nothing recorded: not even the lock file is made.
        return Ok(Report::default());
    }
    let Some(lock) = state.lock()? else {
        return Err(FirewallError::Netns(std::io::Error::other(
            "the namespace's lock is held by this process",
        )));
    };
    let mut report = Report::default();
    let mut groups: Vec<(Config, Vec<Entry>)> = Vec::new();
    let mut records = Vec::new();
    for name in state.names()? {
        let Some(record) = state.attachment(&name)? else {
            continue;
        };
        match record.made.as_ref().and_then(|m| Some((m.config()?, m))) {
            Some((config, made)) => records.push((config, made.clone(), record.ips)),
            None => {
                log::info!("{name}: recorded by an earlier version (or backend); left alone");
                report.unknown += 1;
            }
        }
    }
    // Read after the records: an id missing here was forgotten after its record was written.
    let ids = Netlink::new()
        .and_then(|mut nl| nl.nsids())
        .map(|ids| ids.into_iter().collect())
        .unwrap_or_else(|e| {
            log::warn!("cannot list the namespace ids: {e}");
            Default::default()
        });
    let shared_ips = shared_addresses(records.iter().map(|(_, _, ips)| ips.as_slice()));
    for (config, made, ips) in records {
        let owner = made.owner();
        // An address that another record lists too is this one's only if it claims it.
        let name = crate::names::state_name(&owner);
        let mut mine = Vec::new();
        for ip in &ips {
            if !shared_ips.contains(ip) || state.claimant(*ip)?.is_none_or(|c| c == name) {
                mine.push(*ip);
            }
        }
        let gone = made.netns.as_ref().is_some_and(|n| n.gone_by_id(&ids));
        let entry = Entry {
            recorded: Recorded {
                target: made.target(mine),
                owner,
            },
            made,
            ips,
        };
        if gone {
            remove(&state, &lock, &config, &entry, out, &mut report);
            continue;
        }
        match groups.iter_mut().find(|(c, _)| *c == config) {
            Some((_, entries)) => entries.push(entry),
            None => groups.push((config, vec![entry])),
        }
    }
    let census = OnceCell::new();
    for (config, entries) in groups {
        let mut backend = crate::backend_in(&config, state.under(&lock));
        let recorded: Vec<Recorded> = entries.iter().map(|e| e.recorded.clone()).collect();
        // A backend that cannot be read (firewalld stopped, say) fails its attachments only.
        let found = match backend.missing(&recorded) {
            Ok(found) => found,
            Err(e) => {
                report.failed.push(format!(
                    "{} attachment(s) of the {} backend: {e}",
                    entries.len(),
                    backend.name()
                ));
                continue;
            }
        };
        if found.is_empty() {
            report.in_place += entries.len();
            continue;
        }
        // Only the live are restored: a lacking attachment's namespace is proven first.
        let mut live = Vec::new();
        let mut lacking = Missing {
            shared: found.shared.clone(),
            attachments: Vec::new(),
        };
        for (i, what) in &found.attachments {
            let Some(entry) = entries.get(*i) else {
                continue;
            };
            if entry
                .made
                .netns
                .as_ref()
                .is_some_and(|n| n.is_gone(&census))
            {
                remove(&state, &lock, &config, entry, out, &mut report);
                continue;
            }
            lacking.attachments.push((live.len(), what.clone()));
            live.push(entry.recorded.clone());
        }
        report.in_place += entries.len() - found.attachments.len();
        if lacking.is_empty() {
            continue;
        }
        // With only shared objects missing, the backend restores them along the first one.
        let asked = if live.is_empty() { recorded } else { live };
        let outcome = match backend.restore(&asked, &lacking) {
            Ok(outcome) => outcome,
            Err(e) => {
                for (i, _) in &lacking.attachments {
                    report.failed.push(format!(
                        "{} ({}): {e}",
                        who(&asked[*i].owner),
                        backend.name()
                    ));
                }
                if lacking.attachments.is_empty() {
                    report
                        .failed
                        .push(format!("{} shared objects: {e}", backend.name()));
                }
                continue;
            }
        };
        if !lacking.shared.is_empty() {
            report.shared = true;
            let _ = writeln!(
                out,
                "restored shared objects ({} backend): {}",
                backend.name(),
                lacking.shared.join(", ")
            );
        }
        for (i, failure) in outcome {
            let Some(a) = asked.get(i) else {
                continue;
            };
            match failure {
                None => {
                    report.restored += 1;
                    let what = lacking
                        .attachments
                        .iter()
                        .find(|(j, _)| *j == i)
                        .map(|(_, w)| w.join(", "))
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "restored {} ({}): {what}",
                        who(&a.owner),
                        backend.name()
                    );
                }
                Some(e) => {
                    report
                        .failed
                        .push(format!("{} ({}): {e}", who(&a.owner), backend.name()))
                }
            }
        }
    }
    Ok(report)
}

/// The addresses that more than one of `lists` holds.
fn shared_addresses<'a>(lists: impl Iterator<Item = &'a [IpAddr]>) -> Vec<IpAddr> {
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    for list in lists {
        for ip in list {
            *seen.entry(*ip).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(ip, _)| ip)
        .collect()
}

/// Removes an attachment whose namespace is gone, as its DEL would (its objects, those
/// addresses another attachment claims aside, and its record).
fn remove(
    state: &State,
    lock: &host::lock::FileLock,
    config: &Config,
    entry: &Entry,
    out: &mut dyn Write,
    report: &mut Report,
) {
    let mut backend = crate::backend_in(config, state.under(lock));
    let owner = &entry.recorded.owner;
    let target = entry.made.target(entry.ips.clone());
    match backend.del(owner, Some(&target)) {
        Ok(()) => {
            report.dropped += 1;
            let path = entry
                .made
                .netns
                .as_ref()
                .map(|n| n.path.display().to_string())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "removed {} ({}): its network namespace {path} is gone",
                who(owner),
                backend.name()
            );
        }
        Err(e) => report.failed.push(format!(
            "{} ({}): removing it (its network namespace is gone): {e}",
            who(owner),
            backend.name()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_in_several_records_are_shared() {
        let a: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()];
        let b: Vec<IpAddr> = vec!["10.0.0.3".parse().unwrap()];
        assert_eq!(
            shared_addresses([a.as_slice(), b.as_slice()].into_iter()),
            ["10.0.0.3".parse::<IpAddr>().unwrap()]
        );
    }
}
